"""Tests for rung.engines.sampler: SamplingParams, Sampler and StopChecker."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rung.engines.errors import GenerationError
from rung.engines.sampler import Sampler, SamplingParams, StopChecker

V = 64


def _logits(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=V).astype(np.float32) * 3.0


def _draws(params: SamplingParams, logits: np.ndarray, n: int = 200) -> list[int]:
    sampler = Sampler(params)
    return [sampler.sample(logits) for _ in range(n)]


# -- SamplingParams ----------------------------------------------------------------------
def test_defaults_are_greedy() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.seed, p.max_tokens, p.stop) == \
        (0.0, 0, 1.0, None, 256, ())


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", -1.0),
    ("top_k", -1),
    ("max_tokens", 0),
    ("stop", ("",)),
])
def test_invalid_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(GenerationError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_stop_list_becomes_tuple() -> None:
    p = SamplingParams(stop=["\n\n"])  # type: ignore[arg-type]
    assert p.stop == ("\n\n",)
    hash(p)


# -- Sampler -----------------------------------------------------------------------------
def test_greedy_is_argmax_first_max() -> None:
    logits = np.array([0.0, 2.0, 5.0, 5.0, 1.0], dtype=np.float32)
    assert Sampler(SamplingParams()).sample(logits) == 2
    assert all(t == 2 for t in _draws(SamplingParams(temperature=0.0), logits, 5))


def test_seeded_sampling_is_reproducible() -> None:
    params = SamplingParams(temperature=1.0, seed=1234)
    logits = _logits()
    assert _draws(params, logits) == _draws(params, logits)


def test_different_seeds_differ_on_flat_distribution() -> None:
    flat = np.zeros(V, dtype=np.float32)
    a = _draws(SamplingParams(temperature=1.0, seed=1), flat)
    b = _draws(SamplingParams(temperature=1.0, seed=2), flat)
    assert a != b
    assert len(set(a)) > V // 2  # actually spread over the vocabulary


def test_top_k_one_equals_greedy() -> None:
    for seed in range(5):
        logits = _logits(seed)
        draws = _draws(SamplingParams(temperature=1.5, top_k=1, seed=seed), logits, 50)
        assert set(draws) == {int(np.argmax(logits))}


def test_tiny_top_p_equals_greedy() -> None:
    for seed in range(5):
        logits = _logits(seed)
        draws = _draws(SamplingParams(temperature=2.0, top_p=1e-6, seed=seed), logits, 50)
        assert set(draws) == {int(np.argmax(logits))}


def test_top_k_restricts_to_k_largest() -> None:
    logits = _logits(7)
    top3 = set(np.argsort(-logits)[:3].tolist())
    draws = _draws(SamplingParams(temperature=5.0, top_k=3, seed=0), logits, 300)
    assert set(draws) == top3


def test_top_p_keeps_smallest_nucleus() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.79, seed=0), logits, 500)
    assert set(draws) == {0, 1}  # 0.5 + 0.3 reaches 0.79; token 2 never drawn
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.81, seed=0), logits, 500)
    assert set(draws) == {0, 1, 2}


def test_sampling_follows_distribution() -> None:
    probs = np.array([0.7, 0.2, 0.1])
    draws = _draws(SamplingParams(temperature=1.0, seed=3), np.log(probs), 5000)
    freq = np.bincount(draws, minlength=3) / len(draws)
    assert np.allclose(freq, probs, atol=0.03)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_allowed_mask_respected(temperature: float) -> None:
    logits = _logits(3)
    allowed = np.zeros(V, dtype=bool)
    allowed[[5, 17, 40]] = True
    draws = _draws(SamplingParams(temperature=temperature, seed=0), logits, 300)
    assert set(draws) - {5, 17, 40}  # without the mask other tokens come up
    sampler = Sampler(SamplingParams(temperature=temperature, seed=0))
    masked = {sampler.sample(logits, allowed) for _ in range(300)}
    assert masked <= {5, 17, 40}
    if temperature == 0.0:
        assert masked == {int(np.argmax(np.where(allowed, logits, -np.inf)))}


def test_single_allowed_token_even_at_minus_inf_elsewhere() -> None:
    logits = np.full(V, -np.inf)
    logits[9] = -1e30
    assert Sampler(SamplingParams(temperature=0.7, seed=0)).sample(logits) == 9


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_all_masked_raises(temperature: float) -> None:
    sampler = Sampler(SamplingParams(temperature=temperature))
    with pytest.raises(GenerationError, match="no token is allowed"):
        sampler.sample(_logits(), np.zeros(V, dtype=bool))


def test_bad_inputs_raise() -> None:
    sampler = Sampler(SamplingParams(temperature=1.0))
    with pytest.raises(GenerationError, match="1-D"):
        sampler.sample(np.zeros((2, V)))
    with pytest.raises(GenerationError, match="NaN"):
        sampler.sample(np.full(V, np.nan))
    with pytest.raises(GenerationError, match="mask"):
        sampler.sample(_logits(), np.ones(V - 1, dtype=bool))


# -- StopChecker -------------------------------------------------------------------------
def test_stop_on_eos() -> None:
    checker = StopChecker(eos_ids=[1, 7], stop=(), max_tokens=10)
    assert checker.check(5, "abc", 1) is None
    assert checker.check(7, "abc", 2) == "stop"


def test_stop_on_length() -> None:
    checker = StopChecker(eos_ids=[1], stop=(), max_tokens=3)
    assert checker.check(5, "a", 2) is None
    assert checker.check(5, "ab", 3) == "length"
    assert checker.check(1, "ab", 3) == "stop"  # eos wins over length


def test_stop_string_split_over_tokens() -> None:
    checker = StopChecker(eos_ids=[], stop=("END", "\n\n"), max_tokens=100)
    text = ""
    reasons = []
    for piece in ["Öl: 85 °C", " E", "N", "D tail"]:
        text += piece
        reasons.append(checker.check(0, text, len(reasons) + 1))
    assert reasons == [None, None, None, "stop"]
    assert checker.truncate(text) == "Öl: 85 °C "


def test_stop_string_only_searches_tail() -> None:
    checker = StopChecker(eos_ids=[], stop=("STOP",), max_tokens=100)
    assert checker.check(0, "x" * 1000, 1) is None
    # a match entirely inside text already searched is not found again; new tail is
    assert checker.check(0, "x" * 1000 + "ST", 2) is None
    assert checker.check(0, "x" * 1000 + "STOP", 3) == "stop"


def test_truncate_earliest_stop() -> None:
    checker = StopChecker(eos_ids=[], stop=("B", "A"), max_tokens=5)
    assert checker.truncate("xxAyyB") == "xx"
    assert checker.truncate("no stop here") == "no stop here"
    assert StopChecker([], (), 5).truncate("abc") == "abc"


def test_serving_path_imports_no_torch() -> None:
    code = ("import sys, rung.engines.sampler; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
