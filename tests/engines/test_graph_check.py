"""The manifest against its graph at load: every dimension the runtime sizes by, tampered in
a real exported engine of each graph form, is refused naming the field and both values."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from rung.engines import load_engine
from rung.engines.errors import EngineError
from rung.engines.graph_check import initializer_shapes
from rung.engines.manifest import HEAD_MAJOR, KV_LAYOUT

pytestmark = pytest.mark.integration

Edit = Callable[[dict[str, Any]], None]


def _set(section: str, key: str, value: Any) -> Edit:
    return lambda d: d[section].update({key: value})


def _tensor(kind: str, name: str, key: str, value: Any) -> Edit:
    def edit(d: dict[str, Any]) -> None:
        next(t for t in d[kind] if t["name"] == name)[key] = value
    return edit


def _drop_last_output(d: dict[str, Any]) -> None:
    d["outputs"].pop()


def _swap_layout(d: dict[str, Any]) -> None:
    d["kv"]["layout"] = KV_LAYOUT if d["kv"]["layout"] == HEAD_MAJOR else HEAD_MAJOR


def _swap_graph(d: dict[str, Any]) -> None:
    d["step"]["graph"] = "generic" if d["step"]["graph"] == "fused" else "fused"


def _swap_widening(d: dict[str, Any]) -> None:
    d["step"]["min_positions"] = 3 - d["step"]["min_positions"]


# (case, edit, field named, manifest value shown, graph value shown)
TAMPERED: list[tuple[str, Edit, str, str, str]] = [
    ("vocab_size", _set("dims", "vocab_size", 301), "dims.vocab_size", "301", "300 entries"),
    ("num_layers", _set("dims", "num_layers", 3), "dims.num_layers", "3", "for 2 layers"),
    ("num_kv_heads", _set("dims", "num_kv_heads", 4), "dims.num_kv_heads", "4", "has 2"),
    ("head_dim", _set("dims", "head_dim", 8), "dims.head_dim", "8", "has 16"),
    ("hidden_size", _set("dims", "hidden_size", 128), "dims.hidden_size", "128", "64 columns"),
    ("max_seq", _set("dims", "max_seq", 4096), "dims.max_seq", "4096", "128 positions"),
    ("kv dtype", _set("kv", "dtype", "float16"), "kv.dtype", "manifest says float16",
     "graph KV input is tensor(float)"),
    ("kv layout", _swap_layout, "kv.layout", "'", "the graph's inputs are those of"),
    ("step graph", _swap_graph, "step.graph", "'", "KV layout"),
    ("step widening", _swap_widening, "step.min_positions", "is ", "input attention_positions"),
    ("kv scales", _set("kv", "scale_layout", "per_token_per_head"), "kv.scale_layout",
     "'per_token_per_head'", "has no KV scale inputs"),
    ("input dtype", _tensor("inputs", "input_ids", "dtype", "int32"),
     "inputs[input_ids].dtype", "'int32'", "the graph's is int64"),
    ("output shape", _tensor("outputs", "logits", "shape", ["B", "K", 512]),
     "outputs[logits].shape", "512", "[B, K, 300]"),
    ("output name", _tensor("outputs", "logits", "name", "scores"), "outputs entry",
     "'scores'", "no output of that name"),
    ("output missing", _drop_last_output, "outputs", "logits", "is not among them"),
]


@pytest.fixture(params=["fused", "generic"])
def engine_dir(request: pytest.FixtureRequest, engines: dict[str, Path],
               generic_engines: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of a real exported llama engine (head_dim 16, 2 KV heads, 2 layers, vocab 300,
    hidden 64, max_seq 128) in either graph form."""
    src = (engines if request.param == "fused" else generic_engines)["llama"]
    dst = tmp_path / "engine"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow
def test_quantized_table_names_the_hidden_size(tmp_path: Path) -> None:
    """An int8/int4 engine's embedding table is 8-bit codes [V, blocks, block]: the hidden
    size the manifest states is checked against blocks x block."""
    from rung.engines.graph_check import GraphSignature, check_manifest, session_signature
    from rung.engines.manifest import load_manifest

    engine = load_engine(_int4_engine(tmp_path))
    m = engine.manifest
    sig = session_signature(engine.session, tmp_path / "engine" / m.graph_file)
    assert "embed_tokens.weight_Q8" in sig.initializers
    check_manifest(m, sig, "here")                  # as exported: accepted
    wrong = dataclasses.replace(m, dims=dataclasses.replace(m.dims, hidden_size=128))
    with pytest.raises(EngineError, match=r"dims.hidden_size is 128.*64 columns"):
        check_manifest(wrong, GraphSignature(sig.inputs, sig.outputs, sig.initializers),
                       "here")
    assert load_manifest(tmp_path / "engine").dims.hidden_size == 64


def _int4_engine(tmp_path: Path) -> Path:
    from rung.export.exporter import ExportOptions, export
    from tests.checkpoints import save_checkpoint

    src = tmp_path / "hf"
    save_checkpoint("llama", src)
    export(src, tmp_path / "engine", ExportOptions(weights="int4", max_seq=128,
                                                   quality_budget=10.0))
    return tmp_path / "engine"


def test_untampered_engine_loads(engine_dir: Path) -> None:
    engine = load_engine(engine_dir)
    d = engine.manifest.dims
    assert (d.vocab_size, d.num_layers, d.num_kv_heads, d.head_dim, d.hidden_size,
            d.max_seq) == (300, 2, 2, 16, 64, 128)


@pytest.mark.parametrize(("case", "edit", "field", "ours", "theirs"), TAMPERED,
                         ids=[t[0] for t in TAMPERED])
def test_tampered_manifest_is_refused(engine_dir: Path, case: str, edit: Edit, field: str,
                                      ours: str, theirs: str) -> None:
    path = engine_dir / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))      # the manifest is not among its own checksums
    with pytest.raises(EngineError) as e:
        load_engine(engine_dir)
    message = e.value.message
    assert field in message and ours in message and theirs in message, message
    assert str(engine_dir / "model.onnx") in message
    assert e.value.hint is not None and "re-export the engine" in e.value.hint


@pytest.fixture(scope="module")
def fp8_engine(checkpoints: dict[str, tuple[Path, Any]],
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generic graph with fp8 KV: its KV inputs carry per-token-per-head scales."""
    from rung.export.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("engine-fp8")
    export(checkpoints["llama"][0], out, ExportOptions(kv="fp8", max_seq=128, graph="generic"))
    return out


@pytest.mark.parametrize(("scale_layout", "graph_says"), [
    (None, "has KV scale inputs"), ("per_tensor", "has KV scale inputs")])
def test_fp8_scales_must_match(fp8_engine: Path, tmp_path: Path, scale_layout: str | None,
                               graph_says: str) -> None:
    dst = tmp_path / "engine"
    shutil.copytree(fp8_engine, dst)
    load_engine(dst)
    data = json.loads((dst / "manifest.json").read_text())
    data["kv"]["scale_layout"] = scale_layout
    (dst / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(EngineError, match=f"manifest kv.scale_layout is {scale_layout!r}, "
                                          f"but the graph {graph_says}"):
        load_engine(dst)


@pytest.mark.parametrize("form", ["fused", "generic"])
def test_initializer_shapes_read_without_onnx(form: str, engines: dict[str, Path],
                                              generic_engines: dict[str, Path],
                                              tmp_path: Path) -> None:
    graph = (engines if form == "fused" else generic_engines)["qwen3"] / "model.onnx"
    proto = onnx.load(str(graph), load_external_data=False)
    expected = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    assert initializer_shapes(graph) == expected and expected["rope_cos"][0] == 128
    inline = tmp_path / "inline.onnx"      # every weight inside the graph file
    onnx.save_model(onnx.load(str(graph)), str(inline))
    assert initializer_shapes(inline) == expected
    (tmp_path / "not.onnx").write_bytes(b"\xff" * 64)
    assert initializer_shapes(tmp_path / "not.onnx") == {}
    assert initializer_shapes(tmp_path / "missing.onnx") == {}


def test_serving_path_imports_no_onnx() -> None:
    code = ("import sys, rung.engines.onnx_engine; "
            "assert 'onnx' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
