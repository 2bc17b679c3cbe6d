"""Engines exported with fp16 and fp8 KV: buffers, sizes, refusal of mismatches, and decode
accuracy against the fp32-KV engine on every architecture (the outlier model included)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rung.engines import AnyEngine, load_engine
from rung.engines.errors import EngineError
from rung.engines.kv import KVCache
from rung.export.exporter import ExportOptions, export
from rung.export.verify import logit_metrics
from tests.checkpoints import CASES

pytestmark = pytest.mark.integration

# Stated tolerance of fp8 KV against fp32 KV on the tiny random models (teacher-forced
# decode, 4 prompts x 24 steps): mean KL of next-token distributions and mean relative
# logit error. Random weights are harsher than trained ones; the bench reports the
# numbers on the Qwen2.5-0.5B-shaped model.
FP8_MAX_MEAN_KL = 0.02
FP8_MAX_MEAN_REL = 0.1


@pytest.fixture(scope="module")
def kv_engines(checkpoints: dict[str, tuple[Path, Any]],
               tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    out = {}
    for arch, (path, _) in checkpoints.items():
        for kv in ("fp16", "fp8"):
            d = tmp_path_factory.mktemp(f"engine-{arch}-{kv}")
            export(path, d, ExportOptions(max_seq=128, kv=kv))
            out[arch, kv] = d
    return out


def _teacher_forced(engine: AnyEngine, prompts: np.ndarray, steps: int) -> np.ndarray:
    """Prefill the first half, then feed the rest one token per step; logits [N, V]."""
    b, n = prompts.shape
    cache = engine.new_cache(b)
    first = n - steps
    out = [engine.forward(cache, prompts[:, :first], np.full(b, first))[:, -1]]
    for t in range(first, n - 1):
        out.append(engine.forward(cache, prompts[:, t:t + 1], np.ones(b, np.int64))[:, -1])
    return np.concatenate(out)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(CASES))
def test_fp8_decode_within_tolerance_of_fp32(arch: str, engines: dict[str, Path],
                                             kv_engines: dict[tuple[str, str], Path]) -> None:
    prompts = np.random.default_rng(5).integers(5, 300, (4, 40))
    ref = _teacher_forced(load_engine(engines[arch]), prompts, 24)
    got = _teacher_forced(load_engine(kv_engines[arch, "fp8"]), prompts, 24)
    m = logit_metrics(ref, got)
    assert m["mean_kl"] < FP8_MAX_MEAN_KL, m
    assert m["mean_rel_logit_err"] < FP8_MAX_MEAN_REL, m
    half = logit_metrics(ref, _teacher_forced(load_engine(kv_engines[arch, "fp16"]),
                                              prompts, 24))
    assert half["mean_kl"] < 1e-4 and half["mean_kl"] < m["mean_kl"], half


@pytest.mark.parametrize("kv,dtype,storage", [("fp16", "float16", np.float16),
                                              ("fp8", "float8_e4m3fn", np.uint8)])
@pytest.mark.slow
def test_manifest_kv_dtype_sizes_the_buffers(kv: str, dtype: str, storage: type,
                                             kv_engines: dict[tuple[str, str], Path]) -> None:
    engine = load_engine(kv_engines["qwen2", kv])
    m = engine.manifest
    assert m.kv.dtype == dtype
    cache = engine.new_cache(3, 64)
    shape = (3, 2, 64, 16) if kv == "fp16" else (64, 3, 2, 16)   # fused: head-major
    assert cache.keys[0].dtype == storage and cache.keys[0].shape == shape
    d = m.dims
    per_layer = 2 * d.num_kv_heads * d.head_dim * np.dtype(storage).itemsize
    if kv == "fp8":
        assert m.kv.scale_layout == "per_token_per_head"
        assert cache.buffers["key_0_scale"].shape == (64, 3, 2)
        per_layer += 2 * d.num_kv_heads * 4
    assert cache.bytes_per_token == per_layer * d.num_layers == m.kv.bytes_per_token(d)
    assert m.kv.accuracy is not None and 0 <= m.kv.accuracy["mean_kl"] < 1


def test_fp8_is_a_quarter_of_fp32_plus_scales(engines: dict[str, Path],
                                              kv_engines: dict[tuple[str, str], Path]) -> None:
    d = load_engine(engines["qwen3"]).manifest.dims
    b32 = load_engine(engines["qwen3"]).manifest.kv.bytes_per_token(d)
    b8 = load_engine(kv_engines["qwen3", "fp8"]).manifest.kv.bytes_per_token(d)
    assert b8 == b32 // 4 + 2 * d.num_layers * d.num_kv_heads * 4


def test_fp8_prefill_then_decode_equals_one_prefill(
        kv_engines: dict[tuple[str, str], Path]) -> None:
    engine = load_engine(kv_engines["llama", "fp8"])
    ids = np.random.default_rng(1).integers(5, 300, 20)
    full = engine.new_cache(1)
    ref = engine.forward(full, ids[None], np.array([20]), np.arange(20)[None])[0]
    cache = engine.new_cache(1)
    steps = [engine.forward(cache, ids[None, :8], np.array([8]), np.arange(8)[None])[0]]
    for t in range(8, 20):
        steps.append(engine.forward(cache, ids[None, t:t + 1], np.array([1]))[0])
    np.testing.assert_allclose(np.concatenate(steps), ref, atol=1e-4, rtol=0)
    # the cache holds what one prefill stores (kernels for S=1 and S=20 may differ in the
    # last float bit, which can move an fp8 code by one step)
    for name, buf in cache.buffers.items():
        if name.endswith("_scale"):
            np.testing.assert_allclose(buf[:20], full.buffers[name][:20], rtol=1e-5)
        else:
            assert (buf[:20] == full.buffers[name][:20]).mean() > 0.99, name


def test_cache_of_wrong_dtype_is_refused(kv_engines: dict[tuple[str, str], Path]) -> None:
    engine = load_engine(kv_engines["mistral", "fp8"])
    d = engine.manifest.dims
    wrong = KVCache(d.num_layers, 1, 32, d.num_kv_heads, d.head_dim, "float32")
    with pytest.raises(EngineError, match="KV cache holds float32.*reads float8_e4m3fn"):
        engine.forward(wrong, np.array([[5, 6]]), np.array([2]))


def test_manifest_disagreeing_with_graph_is_refused(
        kv_engines: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    dst = tmp_path / "engine"
    shutil.copytree(kv_engines["qwen3", "fp8"], dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["kv"]["dtype"], m["kv"]["scale_layout"] = "float32", None
    (dst / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(EngineError, match="graph KV input is tensor.float8e4m3fn., manifest "
                                          "says float32"):
        load_engine(dst)
