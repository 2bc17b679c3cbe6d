"""The graph rewritten for TensorRT computes what the exported one does: both run through
ONNX Runtime on the CPU, fed the same tokens, and every logit and KV byte is compared."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from rung.engines.errors import ExportError
from rung.engines.manifest import load_manifest
from rung.engines.onnx_engine import OnnxEngine
from rung.export import exporter
from rung.export.exporter import ExportOptions, export
from rung.export.trt_build import generic_graph
from rung.export.trt_graph import FP8, TRT_OPSET, graphs, prepare

pytestmark = pytest.mark.integration
PROMPT = [3, 17, 42, 99, 7, 250, 11]
DECODE = [5, 77, 123]


def _export(hf: Path, out: Path, kv: str) -> Path:
    export(hf, out, generic_graph(ExportOptions(kv=kv, max_seq=64, verify=False)))
    return out


@pytest.fixture(scope="module")
def fp8_engine(checkpoints: dict[str, tuple[Path, Any]],
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(checkpoints["qwen2"][0], tmp_path_factory.mktemp("trt-fp8"), "fp8")


@pytest.fixture(scope="module")
def gated_engine(checkpoints: dict[str, tuple[Path, Any]],
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FFN gates that always skip where allowed (the If's then-branch) and run otherwise."""
    real = exporter.prepare_gates

    def forced(ckpt: Any, opts: ExportOptions,
               held: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
        ckpt.model.add_ffn_gates()
        with torch.no_grad():
            for layer in ckpt.model.model.layers:
                layer.mlp.ffn_gate.proj.bias.fill_(5.0)
        return {"mode": "forced"}, {"requested": "forced", "mode": "forced",
                                    "reason": "gates forced open by the test"}

    exporter.prepare_gates = forced
    try:
        return _export(checkpoints["llama"][0], tmp_path_factory.mktemp("trt-gated"), "fp32")
    finally:
        exporter.prepare_gates = real


def _twins(engine_dir: Path) -> tuple[OnnxEngine, OnnxEngine]:
    """The exported graph and its TensorRT form (saved beside it, weights shared)."""
    m = load_manifest(engine_dir)
    # at the graph's own opset: ONNX Runtime lacks opset-20 Shape kernels for FP8 inputs
    onnx.save(prepare(engine_dir / m.graph_file, opset=None), str(engine_dir / "trt.onnx"))
    return (OnnxEngine(engine_dir, m),
            OnnxEngine(engine_dir, dataclasses.replace(m, graph_file="trt.onnx")))


def _run(engine: OnnxEngine, allow_skip: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    cache = engine.new_cache(1)
    n = len(PROMPT)
    logits = [engine.forward(cache, np.array([PROMPT]), np.array([n]), np.arange(n)[None])[0]]
    for t in DECODE:
        logits.append(engine.forward(cache, np.array([[t]]), np.ones(1, np.int64),
                                     allow_skip=allow_skip)[0])
    return np.concatenate(logits), cache.read_block(0, 0, n + len(DECODE))


def _assert_same(a: OnnxEngine, b: OnnxEngine, allow_skip: bool = False) -> None:
    (la, kv_a), (lb, kv_b) = _run(a, allow_skip), _run(b, allow_skip)
    np.testing.assert_allclose(lb, la, rtol=0, atol=1e-5 * np.abs(la).max())
    assert kv_a.keys() == kv_b.keys()
    for name in kv_a:
        np.testing.assert_array_equal(kv_b[name], kv_a[name], err_msg=name)


def test_fp8_casts_become_qdq_with_the_same_bytes(fp8_engine: Path) -> None:
    original, rewritten = _twins(fp8_engine)
    _assert_same(original, rewritten)
    proto = onnx.load(str(fp8_engine / "trt.onnx"), load_external_data=False)
    nodes = [n for g in graphs(proto.graph) for n in g.node]
    assert not [n for n in nodes if n.op_type == "Cast"
                and any(a.name == "to" and a.i == FP8 for a in n.attribute)]
    layers = load_manifest(fp8_engine).dims.num_layers
    assert sum(n.op_type == "QuantizeLinear" for n in nodes) == 2 * layers  # new K, V
    assert sum(n.op_type == "DequantizeLinear" for n in nodes) == 4 * layers  # + past K, V
    onnx.checker.check_model(str(fp8_engine / "trt.onnx"))  # by path: weights beside it
    declared = prepare(fp8_engine / "model.onnx")  # what TensorRT's parser gets
    assert [i.version for i in declared.opset_import if i.domain in ("", "ai.onnx")] == [
        TRT_OPSET]
    onnx.save(declared, str(fp8_engine / "trt20.onnx"))
    onnx.checker.check_model(str(fp8_engine / "trt20.onnx"))


@pytest.mark.parametrize("allow_skip", [True, False])
def test_ffn_branches_named_apart_and_taken_alike(gated_engine: Path, allow_skip: bool) -> None:
    original, rewritten = _twins(gated_engine)
    _assert_same(original, rewritten, allow_skip)
    layers = original.dims.num_layers
    expect = [len(DECODE) if allow_skip else 0] * layers
    assert original.ffn_skips is not None and rewritten.ffn_skips is not None
    assert original.ffn_skips.tolist() == rewritten.ffn_skips.tolist() == expect
    proto = onnx.load(str(gated_engine / "trt.onnx"), load_external_data=False)
    ifs = [n for n in proto.graph.node if n.op_type == "If"]
    assert len(ifs) == layers
    for node in ifs:
        branch = {a.name: a.g for a in node.attribute}
        then = [o.name for o in branch["then_branch"].output]
        assert then != [o.name for o in branch["else_branch"].output]
        assert then[0].endswith("_then")


def test_ops_tensorrt_cannot_import_are_refused(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft",
                            K=32, N=8, bits=4, block_size=32)
    graph = helper.make_graph([node], "g", [x], [y])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(ExportError, match="TensorRT cannot import ops of com.microsoft") as e:
        prepare(path)
    assert e.value.hint is not None and "--weights fp16" in e.value.hint
