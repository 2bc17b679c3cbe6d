"""The TensorRT engine against the ONNX engine on the CPU, on tiny real models: logits of
prefill (chunked and not), decode with rows of different lengths, KV blocks out of and into
device memory, the FFN ``If`` as a TensorRT conditional, fp8 against fp16 KV, and the plan's
refusals. Runs only where TensorRT and an NVIDIA GPU are (bench/gpu_check.sh)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rung.engines import load_engine
from rung.engines.errors import EngineError, ExportError
from rung.engines.generate import generate
from rung.engines.kv_store import ColdStore
from rung.engines.manifest import load_manifest
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from tests.gpu.conftest import compute_capability, trt_missing

WHY = trt_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
REL = 3e-2   # fp16 plan against ONNX Runtime's CPU kernels, relative to the largest logit


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(got, ref, rtol=0, atol=REL * float(np.abs(ref).max()))
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def _pair(engine_dir: Path) -> tuple[Any, Any]:
    return load_engine(engine_dir, "onnx"), load_engine(engine_dir, "trt")


def _steps(engine: Any, tokens: np.ndarray, n_new: np.ndarray, decode: int) -> np.ndarray:
    """Prefill (every position scored) then ``decode`` teacher-forced steps of all rows."""
    b, s = tokens.shape
    cache = engine.new_cache(b)
    index = np.minimum(np.arange(s)[None], (n_new - 1)[:, None])
    out = [engine.forward(cache, tokens, n_new, index)]
    rng = np.random.default_rng(7)
    for _ in range(decode):
        out.append(engine.forward(cache, rng.integers(3, 290, (b, 1)), np.ones(b, np.int64)))
    return np.concatenate(out, axis=1)


def test_plan_is_recorded_checked_and_loads(trt_export: Any) -> None:
    engine_dir = trt_export()
    m = load_manifest(engine_dir)
    assert m.trt is not None and m.trt.plan_file in m.artifacts
    cc = compute_capability()
    assert m.trt.compute_capability == f"{cc[0]}.{cc[1]}" and m.trt.weights == "fp16"
    assert list(m.trt.profiles) == ["decode", "prefill"] and m.trt.prefill_chunk == 16
    assert m.trt.parity is not None and m.trt.parity["argmax_agreement"] >= 0.9
    assert load_engine(engine_dir, "trt").backend == "trt"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefill_and_decode_match_onnx(trt_export: Any, arch: str) -> None:
    ref, trt = _pair(trt_export(arch))
    tokens = np.random.default_rng(0).integers(3, 290, (1, 12))
    _close(_steps(trt, tokens, np.array([12]), 8), _steps(ref, tokens, np.array([12]), 8))


def test_rows_of_different_lengths(trt_export: Any) -> None:
    ref, trt = _pair(trt_export())
    tokens = np.random.default_rng(1).integers(3, 290, (3, 10))
    n_new = np.array([10, 4, 7])
    _close(_steps(trt, tokens, n_new, 5), _steps(ref, tokens, n_new, 5))


def test_long_prompt_runs_in_chunks(trt_export: Any) -> None:
    ref, trt = _pair(trt_export())
    tokens = np.random.default_rng(2).integers(3, 290, (2, 45))   # chunk 16: three calls
    n_new = np.array([45, 30])
    _close(_steps(trt, tokens, n_new, 3), _steps(ref, tokens, n_new, 3))


def test_kv_blocks_leave_and_enter_device_memory(trt_export: Any) -> None:
    ref, trt = _pair(trt_export())
    ids = np.random.default_rng(3).integers(3, 290, (1, 64))
    cache = trt.new_cache(1)
    trt.forward(cache, ids, np.array([64]))
    block = cache.read_block(0, 0, 64)
    again = trt.new_cache(1)
    again.write_block(0, 0, block)
    again.restore(0, 64)
    assert all(np.array_equal(again.read_block(0, 0, 64)[k], v) for k, v in block.items())
    nxt = np.array([[9]])
    one = trt.forward(cache, nxt, np.ones(1, np.int64))
    np.testing.assert_array_equal(trt.forward(again, nxt, np.ones(1, np.int64)), one)
    cpu = ref.new_cache(1)   # the same block continues on the CPU engine (cold tier format)
    cpu.write_block(0, 0, block)
    cpu.restore(0, 64)
    _close(ref.forward(cpu, nxt, np.ones(1, np.int64)), one)


def test_generate_restores_prefixes_from_the_cold_tier(trt_export: Any, tmp_path: Path) -> None:
    engine_dir = trt_export()
    trt = load_engine(engine_dir, "trt")
    tok = Tokenizer.load(engine_dir, trt.manifest.tokenizer)
    prefix = PrefixCache(ColdStore(trt.manifest.engine_id, 64 << 20), trt.manifest.engine_id,
                         block=16)
    ids = list(np.random.default_rng(4).integers(3, 290, 40))
    params = SamplingParams(max_tokens=8)
    (first,) = generate(trt, tok, [ids], params, prefix=prefix)
    (second,) = generate(trt, tok, [ids], params, prefix=prefix)
    assert second.cached_tokens >= 32 and second.token_ids == first.token_ids


def _gated(checkpoints: dict[str, tuple[Path, Any]], out: Path, bias: float,
           monkeypatch: pytest.MonkeyPatch) -> Path:
    from rung.export import exporter
    from rung.export.exporter import ExportOptions
    from rung.export.trt_build import TrtBuildOptions, export_trt

    def forced(ckpt: Any, opts: ExportOptions,
               held: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
        ckpt.model.add_ffn_gates()
        with torch.no_grad():
            for layer in ckpt.model.model.layers:
                layer.mlp.ffn_gate.proj.bias.fill_(bias)
        return {"mode": "forced"}, {"requested": "forced", "mode": "forced", "reason": "test"}

    monkeypatch.setattr(exporter, "prepare_gates", forced)
    export_trt(checkpoints["llama"][0], out, ExportOptions(weights="fp16", kv="fp16",
                                                           max_seq=64),
               TrtBuildOptions(max_batch=2, prefill_chunk=16))
    return out


@pytest.mark.parametrize(("bias", "skips"), [(5.0, True), (-5.0, False)])
def test_ffn_if_runs_as_a_tensorrt_conditional(checkpoints: dict[str, tuple[Path, Any]],
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               bias: float, skips: bool) -> None:
    ref, trt = _pair(_gated(checkpoints, tmp_path / "gated", bias, monkeypatch))
    outs = []
    for engine in (ref, trt):
        cache = engine.new_cache(1)
        engine.forward(cache, np.array([[5, 6, 7, 8]]), np.array([4]))
        outs.append(np.concatenate([engine.forward(cache, np.array([[t]]), np.ones(1, np.int64),
                                                   allow_skip=True) for t in (9, 10, 11)]))
    _close(outs[1], outs[0])
    assert trt.ffn_steps == 3
    assert trt.ffn_skips.tolist() == ref.ffn_skips.tolist() == [3 if skips else 0] * 2


def test_fp8_kv_or_its_fallback(trt_export: Any) -> None:
    if compute_capability() < (8, 9):
        m = load_manifest(trt_export("qwen2", "fp32", "fp8"))
        assert m.kv.dtype == "float16" and m.trt is not None and "no FP8" in m.trt.kv_reason
        from rung.export.trt_build import decide_kv

        with pytest.raises(ExportError, match="8.9"):
            decide_kv("fp8", compute_capability())
        return
    fp8, fp16 = trt_export("qwen2", "fp32", "fp8"), trt_export("qwen2", "fp32", "fp16")
    assert load_manifest(fp8).kv.dtype == "float8_e4m3fn"
    tokens = np.random.default_rng(5).integers(3, 290, (1, 20))
    runs = {}
    for name, d in (("fp8", fp8), ("fp16", fp16)):
        ref, trt = _pair(d)
        runs[name] = _steps(trt, tokens, np.array([20]), 6)
        _close(runs[name], _steps(ref, tokens, np.array([20]), 6))
        assert trt.new_cache(1).bytes_per_token == ref.new_cache(1).bytes_per_token
    assert (load_engine(fp8, "trt").new_cache(1).bytes_per_token
            < load_engine(fp16, "trt").new_cache(1).bytes_per_token)


def test_fp16_weights_with_fp8_kv(trt_export: Any) -> None:
    if compute_capability() < (8, 9):
        pytest.skip("no FP8 on this GPU")
    ref, trt = _pair(trt_export("qwen2", "fp16", "fp8"))
    tokens = np.random.default_rng(6).integers(3, 290, (1, 20))
    _close(_steps(trt, tokens, np.array([20]), 6), _steps(ref, tokens, np.array([20]), 6))


def test_plan_refused_on_another_gpu_and_above_its_batch(trt_export: Any,
                                                         tmp_path: Path) -> None:
    engine_dir = tmp_path / "engine"
    shutil.copytree(trt_export(), engine_dir)
    with pytest.raises(EngineError, match="max batch 4"):
        load_engine(engine_dir, "trt").new_cache(5)
    path = engine_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["trt"]["compute_capability"] = "1.0"
    path.write_text(json.dumps(data))
    with pytest.raises(EngineError, match="built for compute capability 1.0") as e:
        load_engine(engine_dir, "trt")
    assert e.value.hint is not None and "--target trt" in e.value.hint
