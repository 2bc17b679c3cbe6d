"""Tests for rung.engines.sampler: SamplingParams, Sampler and StopChecker."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rung.engines import load_engine
from rung.engines.errors import GenerationError
from rung.engines.grammar import GrammarCompiler
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
    with pytest.raises(GenerationError, match="no token is allowed: every logit is masked"):
        sampler.sample(_logits(), np.zeros(V, dtype=bool))
    with pytest.raises(GenerationError, match="no token is allowed: every logit is -inf"):
        sampler.sample(np.full(V, -np.inf))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_allowed_tokens_all_at_minus_inf_count_as_equal(temperature: float) -> None:
    logits = _logits(4)
    logits[[3, 7]] = -np.inf
    allowed = np.zeros(V, dtype=bool)
    allowed[[3, 7]] = True
    draws = _draws(SamplingParams(temperature=temperature, seed=0), logits, 200)
    assert not {3, 7} & set(draws)                     # unmasked: never an -inf token
    sampler = Sampler(SamplingParams(temperature=temperature, seed=0))
    masked = {sampler.sample(logits, allowed) for _ in range(200)}
    assert masked == ({3} if temperature == 0.0 else {3, 7})


def test_bad_inputs_raise() -> None:
    sampler = Sampler(SamplingParams(temperature=1.0))
    with pytest.raises(GenerationError, match="1-D"):
        sampler.sample(np.zeros((2, V)))
    with pytest.raises(GenerationError, match="NaN"):
        sampler.sample(np.full(V, np.nan))
    with pytest.raises(GenerationError, match="mask"):
        sampler.sample(_logits(), np.ones(V - 1, dtype=bool))


# -- extreme values: sampling is total ---------------------------------------------------
# every value SamplingParams accepts, at and near its edges
TEMPERATURES = [0.0, 5e-324, 1e-320, 1e-300, 1e-12, 0.7, 1e12, 1e300, 1e308,
                sys.float_info.max]
TOP_PS = [1e-300, 5e-324, 1e-9, 0.5, 1.0 - 1e-16, 1.0]
TOP_KS = [0, 1, 2, 299, 10**9]
ROWS = ["real", "all negative", "huge", "float32 extremes", "with -inf", "one finite",
        "+inf"]
MASKS = [None, "grammar", "one token", "two tokens", "all but -inf"]


@pytest.fixture(scope="module")
def real(engines: dict[str, Path]) -> dict[str, np.ndarray]:
    """Rows of a real engine's logits [V] (and the same pushed to extremes), and real
    grammar masks over its vocabulary."""
    engine = load_engine(engines["llama"])
    ids = np.arange(5, 21, dtype=np.int64)[None]
    logits = engine.forward(engine.new_cache(1), ids, np.array([16]),
                            np.arange(16, dtype=np.int64)[None])[0]          # [16, V]
    row = logits[5].astype(np.float64)
    vocab = row.shape[0]
    with_inf = row.copy()
    with_inf[::3] = -np.inf
    one = np.full(vocab, -np.inf)
    one[int(np.argmin(row))] = -1e300
    plus_inf = row.copy()
    plus_inf[[4, 9]] = np.inf
    rows = {"real": row, "all negative": row - row.max() - 40.0,   # the old IndexError
            "huge": row / np.abs(row).max() * 1e308,
            "float32 extremes": np.where(row > np.median(row), 3.4e38, -3.4e38),
            "with -inf": with_inf, "one finite": one, "+inf": plus_inf}
    compiler = GrammarCompiler(engines["llama"] / "tokenizer.json",
                               engine.manifest.tokenizer.eos_token_ids, vocab)
    grammar = compiler.constraint(compiler.compile(
        {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}))
    grammar.allowed()
    grammar.consume(int(np.flatnonzero(grammar.allowed())[0]))   # inside the object
    masks: dict[str, np.ndarray | None] = {"grammar": grammar.allowed(), None: None}
    for name, ids_ in (("one token", [int(np.argmin(row))]), ("two tokens", [0, 6])):
        m = np.zeros(vocab, dtype=bool)
        m[ids_] = True
        masks[name] = m
    masks["all but -inf"] = ~np.isneginf(with_inf)
    return {**{f"row:{k}": v for k, v in rows.items()},
            **{f"mask:{k}": v for k, v in masks.items() if v is not None}}


def _greedy_set(x: np.ndarray) -> set[int]:
    return set(np.flatnonzero(x == x.max()).tolist())


@pytest.mark.integration
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("row_name", ROWS)
@pytest.mark.slow
def test_every_accepted_value_samples(real: dict[str, np.ndarray], row_name: str,
                                      mask_name: str | None) -> None:
    logits = real[f"row:{row_name}"]
    mask = None if mask_name is None else real[f"mask:{mask_name}"]
    allowed = np.ones(logits.shape[0], bool) if mask is None else mask
    x = np.where(allowed, logits, -np.inf)
    if np.isneginf(x).all():              # the mask's tokens count as equal
        x = np.where(allowed, 0.0, -np.inf)
    reachable = ~np.isneginf(x)
    best = _greedy_set(x)
    for t, top_p, top_k in itertools.product(TEMPERATURES, TOP_PS, TOP_KS):
        sampler = Sampler(SamplingParams(temperature=t, top_p=top_p, top_k=top_k, seed=1))
        for _ in range(4):
            tok = sampler.sample(logits.astype(np.float32) if row_name == "real" else logits,
                                 mask)
            where = f"T={t!r} top_p={top_p!r} top_k={top_k} -> {tok}"
            assert 0 <= tok < logits.shape[0] and allowed[tok] and reachable[tok], where
            if t <= 1e-300 or top_k == 1 or top_p <= 1e-300:
                assert tok in best, where   # the quotient underflows: greedy


def test_denormal_temperature_on_negative_logits_is_greedy() -> None:
    logits = np.array([-3.0, -1.5, -2.0, -1.5000001], dtype=np.float32)
    for t in (5e-324, 1e-300, sys.float_info.min):
        assert _draws(SamplingParams(temperature=t, seed=0), logits, 20) == [1] * 20


@pytest.mark.parametrize("temperature", [1e308, sys.float_info.max])
def test_huge_temperature_is_uniform_over_allowed(temperature: float) -> None:
    logits = _logits(5) * 1e30
    logits[::2] = -np.inf
    allowed = np.zeros(V, dtype=bool)
    allowed[[1, 3, 5, 8, 10]] = True                 # 8 and 10 are masked by -inf
    sampler = Sampler(SamplingParams(temperature=temperature, seed=0))
    draws = [sampler.sample(logits, allowed) for _ in range(3000)]
    freq = np.bincount(draws, minlength=V)[[1, 3, 5]] / len(draws)
    assert set(draws) == {1, 3, 5} and np.allclose(freq, 1 / 3, atol=0.04)
    spread = {sampler.sample(logits) for _ in range(3000)}
    assert spread == set(range(1, V, 2))             # every finite logit, no -inf one


def test_huge_logits_keep_their_order() -> None:
    logits = np.array([-1.7e308, 1.7e308, 1.6e308, -np.inf])
    for t in (1.0, 1e300, 1e308):
        draws = _draws(SamplingParams(temperature=t, seed=0), logits, 400)
        assert 1 in draws and 3 not in draws
    # temperature 1e308: (1.7e308 - -1.7e308) / 1e308 = 3.4 apart, both still drawn
    draws = _draws(SamplingParams(temperature=1e308, seed=0), logits, 2000)
    assert 0 in draws and 2 in draws and draws.count(1) > draws.count(0)


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
