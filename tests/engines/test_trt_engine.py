"""The TensorRT engine where no GPU is: its chunked prefill plan (run through the ONNX engine,
which shares the forward semantics), the backend registry, and clear refusals. The engine
itself runs in tests/gpu."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from rung.engines import BACKENDS, Engine, engine_options, load_engine
from rung.engines.errors import EngineError
from rung.engines.manifest import TrtPlan, sha256_file, xxh3_file
from rung.engines.onnx_engine import EngineOptions
from rung.engines.trt_engine import TrtOptions, chunk_plan

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
HAVE_ORT_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _chunked(engine: Engine, cache: object, tokens: np.ndarray, n_new: np.ndarray,
             index: np.ndarray, chunk: int) -> np.ndarray:
    """TrtEngine.forward's loop over chunk_plan, with another engine's forward."""
    out = np.zeros((*index.shape, engine.manifest.dims.vocab_size), np.float32)
    for c in chunk_plan(tokens.shape[1], chunk, n_new, index):
        part = engine.forward(cache, tokens[:, c.start:c.start + c.width],  # type: ignore[arg-type]
                              c.n_new, c.logits_index)
        out = np.where(c.inside[..., None], part, out)
    return out


def test_chunked_prefill_equals_one_call(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["llama"])
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 290, (2, 20))
    n_new = np.array([20, 13], np.int64)
    index = np.stack([np.arange(20), np.minimum(np.arange(20), 12)])   # every valid position
    whole, parts = engine.new_cache(2), engine.new_cache(2)
    expect = engine.forward(whole, tokens, n_new, index)
    got = _chunked(engine, parts, tokens, n_new, index, chunk=8)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-4 * np.abs(expect).max())
    assert parts.lengths.tolist() == whole.lengths.tolist() == [20, 13]
    for row, n in enumerate(n_new):
        a, b = whole.read_block(row, 0, int(n)), parts.read_block(row, 0, int(n))
        for name in a:
            np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-5, err_msg=name)


def test_chunk_plan_covers_every_position_once() -> None:
    index = np.array([[0, 7, 8, 19]])
    plan = chunk_plan(20, 8, np.array([20]), index)
    assert [(c.start, c.width, int(c.n_new[0])) for c in plan] == [(0, 8, 8), (8, 8, 8),
                                                                   (16, 4, 4)]
    assert np.stack([c.inside for c in plan]).sum(axis=0).tolist() == [[1, 1, 1, 1]]
    assert plan[1].logits_index.tolist() == [[0, 0, 0, 0]]  # outside: clipped, unused
    assert plan[2].logits_index.tolist() == [[0, 0, 0, 3]]


def test_trt_backend_is_registered_lazily() -> None:
    assert BACKENDS["trt"] == "rung.engines.trt_engine:TrtEngine"


def test_engine_without_a_plan_is_refused(engines: dict[str, Path]) -> None:
    with pytest.raises(EngineError, match="has no TensorRT plan") as e:
        load_engine(engines["qwen3"], "trt")
    assert e.value.hint is not None and "--target trt" in e.value.hint


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here")
def test_plan_without_tensorrt_names_the_package(engines: dict[str, Path],
                                                 tmp_path: Path) -> None:
    engine_dir = tmp_path / "engine"
    shutil.copytree(engines["qwen3"], engine_dir)
    (engine_dir / "model.plan").write_bytes(b"plan stand-in: never deserialized here")
    path = engine_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["artifacts"]["model.plan"] = sha256_file(engine_dir / "model.plan")
    data["xxh3"]["model.plan"] = xxh3_file(engine_dir / "model.plan")
    data["trt"] = dataclasses.asdict(TrtPlan(
        "model.plan", "10.3.0", "8.7", "Orin", "fp16", "fp16", "--kv fp16 as asked", 4, 64,
        {"decode": {}, "prefill": {}}))
    data["kv"]["layout"] = "position_major_SBHD"
    path.write_text(json.dumps(data))
    with pytest.raises(EngineError, match="needs the tensorrt Python package") as e:
        load_engine(engine_dir, "trt")
    assert e.value.hint is not None and "pip install 'rung[trt]'" in e.value.hint


def test_engine_options_per_backend() -> None:
    assert engine_options("onnx") == EngineOptions(provider="cpu")
    assert engine_options("onnx", "cpu", threads=2, prepack=True) == EngineOptions(
        provider="cpu", threads=2, prepack=True)
    assert engine_options("trt") == TrtOptions()
    with pytest.raises(EngineError, match="onnx backend only"):
        engine_options("trt", "cuda")
    with pytest.raises(EngineError, match="unknown engine backend 'tensorrt'"):
        engine_options("tensorrt")


@pytest.mark.skipif(HAVE_ORT_CUDA, reason="ONNX Runtime has its CUDA provider here")
def test_provider_cuda_refused_without_the_cuda_provider() -> None:
    with pytest.raises(EngineError, match="no CUDAExecutionProvider") as e:
        engine_options("onnx", "cuda")
    assert "CPUExecutionProvider" in e.value.message
    assert e.value.hint is not None and "onnxruntime-gpu" in e.value.hint
