"""``rung export --target trt`` without a GPU: the KV decision, the weight check, the
optimization profiles, and the export itself where TensorRT is missing (the ONNX engine is
still written and serves)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rung.daemon.cli import main
from rung.engines import load_engine
from rung.engines.errors import ExportError
from rung.engines.manifest import TensorSpec, load_manifest
from rung.export.trt_build import decide_kv, generic_graph, plan_weights, profile_shapes

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.mark.parametrize("cc", [(8, 9), (9, 0), (10, 0), (11, 0), (12, 0)])
def test_fp8_kept_on_ada_hopper_and_newer(cc: tuple[int, int]) -> None:
    d = decide_kv("fp8", cc, device="L4")
    assert d.kv == "fp8" and f"{cc[0]}.{cc[1]}" in d.reason


@pytest.mark.parametrize("cc", [(8, 7), (8, 6), (8, 0), (7, 5)])
def test_fp8_below_8_9_is_refused_naming_the_capability(cc: tuple[int, int]) -> None:
    with pytest.raises(ExportError) as e:
        decide_kv("fp8", cc, device="Orin")
    assert f"Orin is {cc[0]}.{cc[1]}" in e.value.message and "8.9" in e.value.message
    assert e.value.hint is not None and "--trt-kv-fallback fp16" in e.value.hint


def test_fp8_on_orin_falls_back_to_fp16_when_asked() -> None:
    d = decide_kv("fp8", (8, 7), "fp16", device="Orin")
    assert d.kv == "fp16"
    assert "Orin (compute capability 8.7) has no FP8" in d.reason and "fallback" in d.reason


@pytest.mark.parametrize("kv", ["fp16", "fp32"])
def test_other_kv_dtypes_kept_on_any_gpu(kv: str) -> None:
    assert decide_kv(kv, (7, 5)).kv == kv


def test_unknown_fallback_refused() -> None:
    with pytest.raises(ExportError, match="--trt-kv-fallback bf16"):
        decide_kv("fp8", (8, 7), "bf16")


def test_int_weights_refused_float_weights_kept() -> None:
    assert [plan_weights(w) for w in ("fp16", "fp32")] == ["fp16", "fp32"]
    for w in ("int8", "int4"):
        with pytest.raises(ExportError, match="MatMulNBits") as e:
            plan_weights(w)
        assert e.value.hint is not None and "--weights fp16" in e.value.hint


def _io(layers: int = 2, kv_heads: int = 2, head_dim: int = 16) -> list[TensorSpec]:
    """The inputs of a gated fp8 graph, as export/onnx_graph.py io_specs writes them."""
    kv: list[str | int] = ["P", "B", kv_heads, head_dim]
    specs = [TensorSpec("input_ids", "int64", ["B", "S"]),
             TensorSpec("position_ids", "int64", ["B", "S"]),
             TensorSpec("past_lengths", "int64", ["B"]),
             TensorSpec("logits_index", "int64", ["B", "K"]),
             TensorSpec("ffn_allow_skip", "bool", [])]
    for i in range(layers):
        for part in ("key", "value"):
            specs.append(TensorSpec(f"past_{part}_{i}", "float8_e4m3fn", kv))
            specs.append(TensorSpec(f"past_{part}_{i}_scale", "float32", kv[:3]))
    return specs


def test_profiles_cover_decode_and_chunked_prefill() -> None:
    shapes = profile_shapes(_io(), max_seq=128, max_batch=4, chunk=32)
    assert list(shapes) == ["decode", "prefill"]  # plan order: profile 0 decodes
    decode, prefill = shapes["decode"], shapes["prefill"]
    assert "ffn_allow_skip" not in decode  # a static scalar needs no profile
    assert decode["input_ids"] == [[1, 1], [1, 1], [4, 1]]
    assert decode["logits_index"] == [[1, 1], [1, 1], [4, 1]]
    assert decode["past_lengths"] == [[1], [1], [4]]
    assert decode["past_key_1"] == [[1, 1, 2, 16], [64, 1, 2, 16], [128, 4, 2, 16]]
    assert decode["past_value_0_scale"] == [[1, 1, 2], [64, 1, 2], [128, 4, 2]]
    assert prefill["input_ids"] == [[1, 1], [1, 32], [4, 32]]
    assert prefill["logits_index"] == [[1, 1], [1, 1], [4, 32]]
    assert prefill["past_key_0"] == [[1, 1, 2, 16], [1, 1, 2, 16], [128, 4, 2, 16]]
    assert set(decode) == set(prefill) == {s.name for s in _io()} - {"ffn_allow_skip"}


@pytest.mark.parametrize(("batch", "chunk"), [(0, 16), (4, 0), (4, 129)])
def test_profiles_refuse_bad_batch_or_chunk(batch: int, chunk: int) -> None:
    with pytest.raises(ExportError, match="out of range"):
        profile_shapes(_io(), max_seq=128, max_batch=batch, chunk=chunk)


def test_profiles_refuse_unknown_dims() -> None:
    with pytest.raises(ExportError, match="dim 'T'"):
        profile_shapes([TensorSpec("mask", "bool", ["B", "T"])], 128, 4, 16)


@dataclass(frozen=True)
class _Graphs:
    graph: str = "auto"


@dataclass(frozen=True)
class _NoGraphs:
    kv: str = "fp8"


def test_generic_graph_for_tensorrt() -> None:
    assert generic_graph(_Graphs()).graph == "generic"  # type: ignore[arg-type,attr-defined]
    assert generic_graph(_NoGraphs()) == _NoGraphs()  # type: ignore[arg-type,comparison-overlap]
    with pytest.raises(ExportError, match="--graph fused"):
        generic_graph(_Graphs("fused"))  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here")
def test_export_without_tensorrt_leaves_a_serving_onnx_engine(
        checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine"
    rc = main(["export", str(checkpoints["qwen3"][0]), "-o", str(out), "--target", "trt",
               "--max-seq", "64", "--kv", "fp16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("rung: error: --target trt needs the tensorrt "
                                          "Python package")
    assert f"the ONNX engine in {out} is complete" in err[-1]
    assert "pip install 'rung[trt]'" in err[-1] and "JetPack" in err[-1]
    m = load_manifest(out)
    assert m.trt is None and m.weights == "fp16"  # --target trt exports fp16 weights
    assert m.kv.dtype == "float16"
    assert m.parity is not None and m.parity.passed
    engine = load_engine(out, "onnx")
    logits = engine.forward(engine.new_cache(1), np.array([[5, 6, 7]]), np.array([3]))
    assert logits.shape == (1, 1, m.dims.vocab_size) and np.isfinite(logits).all()


@pytest.mark.integration
def test_quantized_weights_refused_before_anything_is_written(
        checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine"
    rc = main(["export", str(checkpoints["qwen3"][0]), "-o", str(out), "--target", "trt",
               "--weights", "int4"])
    err = capsys.readouterr().err
    assert rc == 1 and "--weights int4 is not available with --target trt" in err
    assert not out.exists()
