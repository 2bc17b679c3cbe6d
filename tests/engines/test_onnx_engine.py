"""The ONNX Runtime engine with its KV cache: incremental decode equals one long prefill,
batches equal single rows, capacity errors are clear."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rung.engines import load_engine
from rung.engines.errors import EngineError
from rung.engines.onnx_engine import EngineOptions, OnnxEngine

pytestmark = pytest.mark.integration


def _ids(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 300, n).astype(np.int64)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefill_10_decode_20_equals_prefill_30(arch: str, engines: dict[str, Path]) -> None:
    engine = load_engine(engines[arch])
    ids = _ids(30)
    full = engine.new_cache(1)
    every = np.arange(30, dtype=np.int64)[None]
    ref = engine.forward(full, ids[None], np.array([30]), every)[0]         # [30, V]
    cache = engine.new_cache(1)
    steps = [engine.forward(cache, ids[None, :10], np.array([10]),
                            np.arange(10, dtype=np.int64)[None])[0]]
    for t in range(10, 30):
        steps.append(engine.forward(cache, ids[None, t:t + 1], np.array([1]))[0])
    np.testing.assert_allclose(np.concatenate(steps), ref, atol=1e-4, rtol=0)
    # the cache holds exactly what the long prefill computed
    for layer in range(engine.manifest.dims.num_layers):
        np.testing.assert_allclose(cache.keys[layer][:30], full.keys[layer][:30], atol=1e-5)
    assert int(cache.lengths[0]) == 30


def test_batch_of_different_lengths_equals_each_alone(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["qwen2"])
    prompts = [_ids(7, 2), _ids(19, 3)]
    alone = []
    for p in prompts:
        cache = engine.new_cache(1)
        logits = [engine.forward(cache, p[None], np.array([len(p)]))[0, -1]]
        for _ in range(8):
            nxt = np.array([[logits[-1].argmax()]])
            logits.append(engine.forward(cache, nxt, np.array([1]))[0, -1])
        alone.append(np.stack(logits))
    cache = engine.new_cache(2)
    tokens = np.zeros((2, 19), np.int64)
    tokens[0, :7], tokens[1] = prompts[0], prompts[1]
    logits = [engine.forward(cache, tokens, np.array([7, 19]))[:, -1]]
    for _ in range(8):
        logits.append(engine.forward(cache, logits[-1].argmax(-1)[:, None],
                                     np.array([1, 1]))[:, -1])
    batched = np.stack(logits, axis=1)                                       # [2, 9, V]
    for b in range(2):
        np.testing.assert_allclose(batched[b], alone[b], atol=1e-4, rtol=0)
    assert cache.lengths.tolist() == [15, 27]


def test_idle_row_does_not_grow(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["mistral"])
    cache = engine.new_cache(2)
    engine.forward(cache, np.stack([_ids(4), _ids(4, 2)]), np.array([4, 4]))
    engine.forward(cache, np.array([[9], [9]]), np.array([1, 0]))
    assert cache.lengths.tolist() == [5, 4]


def test_cache_full_is_a_clear_error(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["llama"])
    cache = engine.new_cache(1, max_seq=16)
    engine.forward(cache, _ids(16)[None], np.array([16]))
    with pytest.raises(EngineError, match="exceed max_seq 16"):
        engine.forward(cache, np.array([[5]]), np.array([1]))


def test_batch_mismatch(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["llama"])
    with pytest.raises(EngineError, match="batch 2 does not match"):
        engine.forward(engine.new_cache(1), np.zeros((2, 3), np.int64), np.array([3, 3]))


def test_kv_bytes_per_token(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["qwen3"])
    d = engine.manifest.dims
    expected = 2 * d.num_layers * d.num_kv_heads * d.head_dim * 4
    assert engine.new_cache(2, 32).bytes_per_token == expected
    assert engine.manifest.kv.bytes_per_token(d) == expected


def test_past_is_a_view_not_a_copy(generic_engines: dict[str, Path]) -> None:
    engine = load_engine(generic_engines["llama"])
    cache = engine.new_cache(2)
    engine.forward(cache, np.stack([_ids(5), _ids(5, 3)]), np.array([5, 3]))
    k = cache.past()["key_0"]
    assert k.shape[0] == 5 and np.shares_memory(k, cache.keys[0]) and k.flags.c_contiguous


def test_unknown_provider(engines: dict[str, Path]) -> None:
    from rung.engines.manifest import load_manifest

    with pytest.raises(EngineError, match="unknown provider 'tpu'"):
        OnnxEngine(engines["llama"], load_manifest(engines["llama"]), EngineOptions("tpu"))


def test_unknown_backend(engines: dict[str, Path]) -> None:
    with pytest.raises(EngineError, match="unknown engine backend"):
        load_engine(engines["llama"], backend="tensorrt-llm")


def _packs(engine: OnnxEngine) -> bool:
    """Whether ONNX Runtime was left to prepack the engine's weights."""
    try:
        off = engine.session.get_session_options().get_session_config_entry(
            "session.disable_prepacking")
    except RuntimeError:   # never set
        return True
    return off != "1"


@pytest.mark.parametrize("max_batch,decode,packs", [
    (1, "plain", False),   # one token per step: fp32 weights read as they lie
    (1, "auto", True),     # fast decoding checks drafts: steps of several tokens
    (1, "fast", True),
    (4, "plain", True),    # several rows per step
])
def test_float_weights_are_prepacked_where_steps_hold_several_tokens(
        engines: dict[str, Path], max_batch: int, decode: str, packs: bool) -> None:
    engine = load_engine(engines["llama"], options=EngineOptions(max_batch=max_batch,
                                                                 decode=decode))
    assert _packs(engine) is packs


@pytest.mark.slow
def test_a_gated_engine_decoding_plain_under_auto_is_not_prepacked(gated_engine: Path) -> None:
    """auto decodes a gated engine plain (drafts would run its FFNs unskipped), one token a
    step: its fp32 weights stay unpacked; an explicit prepack wins either way."""
    assert not _packs(load_engine(gated_engine, options=EngineOptions(decode="auto")))
    assert _packs(load_engine(gated_engine, options=EngineOptions(decode="auto", prepack=True)))
