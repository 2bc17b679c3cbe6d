"""Continuous batching on a real engine: sequences that join and leave between steps give
the tokens they give alone."""

from __future__ import annotations

import sys
from collections.abc import Hashable
from pathlib import Path

import numpy as np
import pytest

from rung.engines import AnyEngine, load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.errors import GenerationError
from rung.engines.generate import generate
from rung.engines.grammar import Constraint, GrammarCompiler
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration
TEXTS = ["The pump is running.", "Öltemperatur 85 °C, Druck 3,5",
         "Conveyor 3 stopped on an overload trip at 14:02, reset twice",
         "Valve", "Hydraulic unit: pressure low, filter differential high"]


@pytest.fixture
def loaded(engines: dict[str, Path]) -> tuple[AnyEngine, Tokenizer]:
    engine = load_engine(engines["llama"])
    return engine, Tokenizer.load(engines["llama"], engine.manifest.tokenizer)


def _params(i: int) -> SamplingParams:
    # different lengths, so rows leave at different steps; one sampled row
    return SamplingParams(max_tokens=6 + 5 * i, temperature=0.8 if i == 2 else 0.0, seed=i)


def test_joining_and_leaving_equals_alone(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    prompts = [tok.encode(t) for t in TEXTS]
    alone = [generate(engine, tok, [p], _params(i))[0].token_ids
             for i, p in enumerate(prompts)]
    dec = BatchDecoder(engine, tok, rows=2, prefill_chunk=4)   # chunked prefill as well
    waiting = list(range(len(prompts)))
    got: dict[int, list[int]] = {}
    joined_mid_decode = 0
    while waiting or dec.active:
        while waiting and dec.free:
            i = waiting.pop(0)
            joined_mid_decode += dec.active > 0
            dec.add(i, prompts[i], _params(i))
        for tag, gen in dec.step():
            assert isinstance(tag, int)
            got[tag] = gen.token_ids
            assert gen.prompt_tokens == len(prompts[tag]) and gen.ttft_ms > 0
    assert got == dict(enumerate(alone))
    assert joined_mid_decode >= 2          # rows were filled while others were decoding
    # free rows keep what the last sequence in them held (the hot tier)
    assert dec.free == 2 and [len(h) for h in dec.held] == dec.cache.lengths.tolist()
    assert all(n > 0 for n in dec.cache.lengths)


def test_one_prompt_budget_per_step(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    """Rows joining together share ``prefill_chunk`` prompt tokens a step, the first to join
    first: no step feeds more, none is wasted, and each row's tokens are its tokens alone."""
    engine, tok = loaded
    prompts = [tok.encode(t) for t in TEXTS[:4]]
    alone = [generate(engine, tok, [p], _params(i))[0].token_ids
             for i, p in enumerate(prompts)]
    budget = 7
    dec = BatchDecoder(engine, tok, rows=4, prefill_chunk=budget)
    for i, p in enumerate(prompts):
        dec.add(i, p, _params(i))
    fed: list[int] = []          # prompt tokens fed, per step
    left: list[int] = []         # prompt tokens still to feed before it
    first_step: list[int] = []
    schedule = dec._schedule

    def recording() -> tuple[list[list[int]], list[int]]:
        chunks, scored = schedule()
        prefilling = [s is not None and s.fed < len(s.prompt) for s in dec.seqs]
        left.append(sum(len(s.prompt) - s.fed for s in dec.seqs if s is not None))
        fed.append(sum(len(c) for c, p in zip(chunks, prefilling, strict=True) if p))
        if not first_step:
            first_step.extend(len(c) for c in chunks)
        return chunks, scored

    dec._schedule = recording   # type: ignore[method-assign]
    got: dict[Hashable, list[int]] = {}
    while dec.active:
        got.update((tag, gen.token_ids) for tag, gen in dec.step())
    assert got == dict(enumerate(alone))
    # every step feeds what the budget allows of what is left, and never more
    assert fed == [min(budget, n) for n in left]
    assert sum(fed) == sum(len(p) for p in prompts)
    # the row that joined first is fed first
    assert first_step[0] == min(budget, len(prompts[0])) and first_step[3] == 0


def test_run_returns_when_a_row_is_wanted(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    import threading

    engine, tok = loaded
    dec = BatchDecoder(engine, tok, rows=2)
    dec.add("a", tok.encode(TEXTS[0]), SamplingParams(max_tokens=30))
    wanted = threading.Event()
    wanted.set()                           # a request is waiting for the free row
    assert dec.run(wanted) == [] and dec.steps == 1
    done = dec.run()                       # no interruption: until the sequence ends
    assert [tag for tag, _ in done] == ["a"] and dec.active == 0


def test_refusals(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    dec = BatchDecoder(engine, tok, rows=1)
    with pytest.raises(GenerationError):
        dec.add(0, [], SamplingParams())
    with pytest.raises(GenerationError):
        dec.add(0, [1] * engine.manifest.dims.max_seq, SamplingParams())
    dec.add(0, tok.encode("x"), SamplingParams(max_tokens=2))
    with pytest.raises(GenerationError, match="no free row"):
        dec.add(1, tok.encode("y"), SamplingParams())


SCHEMA = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}


def _constraint(engines: dict[str, Path], engine: AnyEngine, tok: Tokenizer) -> Constraint:
    compiler = GrammarCompiler(engines["llama"] / "tokenizer.json", tok.eos_token_ids,
                               engine.manifest.dims.vocab_size)
    return compiler.constraint(compiler.compile(SCHEMA))


def _drain(dec: BatchDecoder) -> dict[Hashable, Generation]:
    got: dict[Hashable, Generation] = {}
    while dec.active:
        got.update(dec.run())
    return got


def test_extreme_sampling_row_beside_normal_rows(loaded: tuple[AnyEngine, Tokenizer],
                                                 engines: dict[str, Path]) -> None:
    """A denormal temperature decodes as greedy, a maximal one as uniform, with or without a
    grammar mask, and the rows beside them give what they give alone."""
    engine, tok = loaded
    prompts = [tok.encode(t) for t in TEXTS[:4]]
    params = [SamplingParams(max_tokens=14, temperature=5e-324, seed=0),
              SamplingParams(max_tokens=14, temperature=0.8, seed=1),
              SamplingParams(max_tokens=14, temperature=sys.float_info.max, top_k=10**9,
                             seed=2),
              SamplingParams(max_tokens=14, temperature=5e-324, top_p=1e-300, seed=3)]
    greedy = SamplingParams(max_tokens=14)
    expected = [generate(engine, tok, [prompts[0]], greedy)[0].token_ids,
                generate(engine, tok, [prompts[1]], params[1])[0].token_ids,
                generate(engine, tok, [prompts[2]], params[2])[0].token_ids,
                generate(engine, tok, [prompts[3]], greedy,
                         constraints=[_constraint(engines, engine, tok)])[0].token_ids]
    dec = BatchDecoder(engine, tok, rows=4)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        dec.add(i, prompt, p, _constraint(engines, engine, tok) if i == 3 else None)
    got = _drain(dec)
    assert set(got) == {0, 1, 2, 3}
    assert all(g.finish_reason in ("stop", "length") and g.error is None
               for g in got.values()), {tag: g.error for tag, g in got.items()}
    assert {tag: g.token_ids for tag, g in got.items()} == dict(enumerate(expected))
    assert len(set(got[2].token_ids)) > 4          # uniform over the vocabulary, not greedy


def test_a_failing_row_fails_alone(loaded: tuple[AnyEngine, Tokenizer],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a row's token step raises, that row leaves with finish_reason "error" and
    the reason; the others decode on as if alone."""
    engine, tok = loaded
    prompts = [tok.encode(t) for t in TEXTS[:3]]
    params = [SamplingParams(max_tokens=10 + i, temperature=0.7 * i, seed=i) for i in range(3)]
    alone = [generate(engine, tok, [p], pr)[0].token_ids
             for p, pr in zip(prompts, params, strict=True)]
    dec = BatchDecoder(engine, tok, rows=3)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        dec.add(i, prompt, p)
    calls = []

    def broken(logits: np.ndarray, allowed: np.ndarray | None = None) -> int:
        calls.append(1)
        if len(calls) > 2:
            raise IndexError("index -1 is out of bounds for axis 0 with size 0")
        return 5

    seq = dec.seqs[1]
    assert seq is not None
    monkeypatch.setattr(seq.row.sampler, "sample", broken)
    got = _drain(dec)
    assert got[1].finish_reason == "error" and got[1].token_ids == [5, 5]
    assert got[1].error == "IndexError: index -1 is out of bounds for axis 0 with size 0"
    assert [got[0].token_ids, got[2].token_ids] == [alone[0], alone[2]]
    assert got[0].error is None and got[2].error is None
    assert dec.free == 3 and dec.held[1] == [] and dec.cache.lengths[1] == 0
    assert dec.held[0] and dec.held[2]
