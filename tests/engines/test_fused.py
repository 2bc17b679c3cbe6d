"""The fused graph (GroupQueryAttention & co., head-major KV appended in place) against the
generic graph of the same checkpoint: same logits, same KV, for every step shape the
daemon's continuous batch produces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from rung.engines import AnyEngine, load_engine
from rung.engines.errors import EngineError, ExportError
from rung.engines.kv import KVCache
from rung.export.exporter import ExportOptions, export
from tests.checkpoints import CASES

pytestmark = pytest.mark.integration

# (tokens per row) for consecutive steps: ragged prefill, a row idle while others run, a row
# joining with a chunk while others decode, single-token decode
STEPS = [[5, 3, 0], [1, 4, 6], [1, 0, 1], [2, 1, 1], [1, 1, 1]]


def _run(engine: AnyEngine, cache: KVCache, steps: list[list[int]],
         seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for n in steps:
        n_new = np.array(n, np.int64)
        tokens = rng.integers(5, 300, (len(n), max(n))).astype(np.int64)
        every = np.tile(np.arange(max(n), dtype=np.int64), (len(n), 1))
        logits = engine.forward(cache, tokens, n_new, every)
        out.append([logits[b, :k] for b, k in enumerate(n)])
    return out


def _same_as_generic(fused_dir: Path, generic_dir: Path, steps: list[list[int]],
                     max_seq: int | None = None) -> tuple[KVCache, KVCache]:
    """Run ``steps`` through both graph forms, asserting equal logits; their caches."""
    engines = load_engine(fused_dir), load_engine(generic_dir)
    caches = [e.new_cache(len(steps[0]), max_seq) for e in engines]
    got, want = (_run(e, c, steps) for e, c in zip(engines, caches, strict=True))
    for step_got, step_want in zip(got, want, strict=True):
        for a, b in zip(step_got, step_want, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    return caches[0], caches[1]


def _blocks(cache: KVCache) -> list[dict[str, np.ndarray]]:
    return [cache.read_block(b, 0, int(cache.lengths[b])) for b in range(cache.batch)]


@pytest.mark.parametrize("arch", list(CASES))
def test_fused_equals_generic(arch: str, engines: dict[str, Path],
                              generic_engines: dict[str, Path]) -> None:
    fused, generic = _same_as_generic(engines[arch], generic_engines[arch], STEPS)
    assert fused.layout == "head_major_BHSD" and generic.layout == "position_major_SBHD"
    np.testing.assert_array_equal(fused.lengths, generic.lengths)
    for a, b in zip(_blocks(fused), _blocks(generic), strict=True):
        for name in b:
            np.testing.assert_allclose(a[name], b[name], atol=1e-5, rtol=1e-5)


def test_kv_is_appended_in_place(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["llama"])
    cache = engine.new_cache(2, 32)
    before = {name: buf for name, buf in cache.buffers.items()}
    _run(engine, cache, [[4, 2], [1, 1]])
    for name, buf in cache.buffers.items():
        assert buf is before[name] and buf.shape == (2, 2, 32, 16)
        assert np.abs(buf[0, :, :5]).sum() > 0 and not buf[0, :, 5:].any()
        assert np.abs(buf[1, :, :3]).sum() > 0 and not buf[1, :, 3:].any()
    with pytest.raises(EngineError, match="position-major"):
        cache.past()


def test_cache_of_the_other_layout_is_refused(engines: dict[str, Path],
                                              generic_engines: dict[str, Path]) -> None:
    fused, generic = load_engine(engines["llama"]), load_engine(generic_engines["llama"])
    for engine, other in ((fused, generic), (generic, fused)):
        with pytest.raises(EngineError, match="KV cache holds float32 .*allocate it"):
            engine.forward(other.new_cache(1), np.array([[5, 6]]), np.array([2]))


@pytest.mark.parametrize("steps,lengths", [
    # a row near max_seq shares a step with a longer chunk: row 0 at 14 of 16, S = 6
    ([[14, 2], [1, 6], [1, 1]], [16, 9]),
    # a full-length chunk beside an empty idle row (the kernel counts that row as one)
    ([[16, 0], [0, 3]], [16, 3]),
])
def test_chunks_without_room_in_every_row_run_rows_apart(
        steps: list[list[int]], lengths: list[int], engines: dict[str, Path],
        generic_engines: dict[str, Path]) -> None:
    """The kernel wants room for the padded chunk in every row; where there is none the
    engine runs the rows one by one, with the generic graph's results."""
    fused, _ = _same_as_generic(engines["qwen2"], generic_engines["qwen2"], steps, 16)
    assert fused.lengths.tolist() == lengths


def test_blocks_move_between_layouts(engines: dict[str, Path],
                                     generic_engines: dict[str, Path]) -> None:
    """A block read from one layout, written into the other, serves the same next step."""
    fused, generic = load_engine(engines["mistral"]), load_engine(generic_engines["mistral"])
    src = fused.new_cache(2)
    _run(fused, src, [[3, 9]])
    block = src.read_block(1, 0, 8)
    assert block["key_0"].shape == (8, 1, 16)
    for engine in (fused, generic):
        dst = engine.new_cache(1)
        dst.write_block(0, 0, block)
        dst.restore(0, 8)
        np.testing.assert_array_equal(dst.read_block(0, 0, 8)["value_1"], block["value_1"])
    one, two = fused.new_cache(1), generic.new_cache(1)
    for cache in (one, two):
        cache.write_block(0, 0, block)
        cache.restore(0, 8)
    tok = np.array([[42]])
    np.testing.assert_allclose(fused.forward(one, tok, np.array([1])),
                               generic.forward(two, tok, np.array([1])), atol=1e-4, rtol=0)


def _ops(engine_dir: Path) -> dict[str, int]:
    proto = onnx.load(str(engine_dir / "model.onnx"), load_external_data=False)
    ops: dict[str, int] = {}
    for node in proto.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_graph_is_fused(arch: str, engines: dict[str, Path],
                        generic_engines: dict[str, Path]) -> None:
    ops, generic = _ops(engines[arch]), _ops(generic_engines[arch])
    layers = 2
    assert ops["GroupQueryAttention"] == layers
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers - 1
    assert ops["FusedMatMul"] == 4 * layers and ops["Gemm"] == 1  # qkv, o, gate_up, down; head
    assert "Softmax" not in ops and "Transpose" not in ops
    assert sum(ops.values()) * 2 < sum(generic.values())


@pytest.mark.parametrize("opts,match", [
    (dict(kv="fp8", graph="fused"), "--graph fused takes fp32/fp16 KV"),
    (dict(kv="fp32", weights="fp16", graph="fused"), "--graph fused takes"),
    (dict(kv="fp32", graph="fast"), "--graph fast is not available"),
])
def test_fused_refused_where_it_does_not_apply(opts: dict[str, Any], match: str,
                                               checkpoints: dict[str, tuple[Path, Any]],
                                               tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=match):
        export(checkpoints["llama"][0], tmp_path, ExportOptions(max_seq=64, **opts))
    assert not (tmp_path / "manifest.json").exists()


def test_fused_graph_refuses_a_gpu_provider(engines: dict[str, Path]) -> None:
    from rung.engines.manifest import load_manifest
    from rung.engines.onnx_engine import EngineOptions, OnnxEngine

    with pytest.raises(EngineError, match="fused graph runs on provider cpu") as e:
        OnnxEngine(engines["llama"], load_manifest(engines["llama"]),
                   EngineOptions(provider="cuda"))
    assert e.value.hint is not None and "--graph generic" in e.value.hint


def test_auto_is_generic_for_fp8_kv(checkpoints: dict[str, tuple[Path, Any]],
                                   tmp_path: Path) -> None:
    m = export(checkpoints["llama"][0], tmp_path, ExportOptions(kv="fp8", max_seq=64))
    assert m.kv.layout == "position_major_SBHD"
    assert "past_lengths" in [t.name for t in m.inputs]


def test_fp16_cache_is_used_in_place(checkpoints: dict[str, tuple[Path, Any]],
                                     tmp_path: Path) -> None:
    """With an fp16 cache the kernel runs in fp16: ONNX Runtime inserts no casts of the
    whole buffers (which made every step's cost follow the capacity, not the context), and
    the step appends into the bound buffers themselves."""
    import onnxruntime as ort

    out = tmp_path / "engine"
    m = export(checkpoints["llama"][0], out, ExportOptions(kv="fp16", max_seq=64))
    assert m.kv.layout == "head_major_BHSD" and m.parity is not None and m.parity.passed
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out / m.graph_file), so, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph
    readers = {n.op_type for n in graph.node for x in n.input if x.startswith("past_")}
    writers = {n.op_type for n in graph.node for x in n.output if x.startswith("present_")}
    assert readers == writers == {"GroupQueryAttention"}
    engine = load_engine(out)
    cache = engine.new_cache(2, 64)
    before = dict(cache.buffers)
    _run(engine, cache, [[4, 2], [1, 1]])
    for name, buf in cache.buffers.items():
        assert buf is before[name] and buf.dtype == np.float16
        assert np.abs(buf[0, :, :5]).sum() > 0 and not buf[0, :, 5:].any()
