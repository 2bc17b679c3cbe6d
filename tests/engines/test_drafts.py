"""Fast decoding: grammar-forced and prompt-lookup drafts checked by the model in the same
step give token for token what plain decoding gives, in fewer steps; in both graph forms,
fp32 and fp8 KV, in a continuous batch whose rows feed different numbers of tokens; the
KV of rejected drafts is dropped and only accepted tokens reach the cold tier."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import pytest

from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import AnyEngine, load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.drafts import LOOKUP_NGRAMS, Lookup, propose
from rung.engines.generate import generate
from rung.engines.kv_store import ColdStore
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer
from rung.tools.corpus import generate as corpus

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_lookup_continues_the_latest_earlier_occurrence() -> None:
    ctx = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 4, 5, 6, 7]
    assert Lookup(ctx).drafts(3) == [3, 4, 5]        # after the latest earlier 5 6 7
    assert Lookup([1, 2, 3]).drafts(4) == []         # nothing earlier
    assert Lookup([9, 1, 2, 9, 1]).drafts(2) == [2, 9]   # a 2-gram when no 3-gram repeats
    assert propose(Lookup([1, 2, 1, 2]), None, room=0) == ([], False)


def _scan(context: list[int], k: int) -> list[int]:
    """The lookup by a scan of the whole context, latest occurrence first."""
    for n in LOOKUP_NGRAMS:
        if len(context) > n:
            for start in range(len(context) - n - 1, -1, -1):
                if context[start:start + n] == context[-n:]:
                    return context[start + n:start + n + k]
    return []


def test_lookup_index_grown_token_by_token_matches_a_scan() -> None:
    import random

    rnd = random.Random(7)
    for trial in range(40):
        vocab = rnd.choice((2, 3, 5, 50))
        prompt = [rnd.randrange(vocab) for _ in range(rnd.randrange(0, 30))]
        index, context = Lookup(prompt), list(prompt)
        for _ in range(60):
            k = rnd.randrange(1, 9)
            assert index.drafts(k) == _scan(context, k), (trial, context)
            more = [rnd.randrange(vocab) for _ in range(rnd.randrange(1, 4))]
            index.extend(more)
            context += more
        assert index.tokens == context


@pytest.fixture(scope="module")
def ungated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo model without FFN gates (drafts run FFNs unskipped: exactness needs no
    gates), as the fused graph with fp32 KV, the generic graph with fp8 KV, and the fused
    graph with int4 weights (exact through padded lone tokens)."""
    from rung.export.exporter import ExportOptions, export

    out = {}
    for name, opts in (("fused-fp32", ExportOptions(kv="fp32", ffn_skip="off")),
                       ("generic-fp8", ExportOptions(kv="fp8", ffn_skip="off",
                                                     graph="generic")),
                       ("fused-int4", ExportOptions(kv="fp32", ffn_skip="off",
                                                    weights="int4"))):
        out[name] = tmp_path_factory.mktemp(name)
        export(ROOT / "models" / "edge-tiny", out[name], opts)
    return out


def _runner(path: Path) -> TaskRunner:
    engine = load_engine(path)
    return TaskRunner(engine, Tokenizer.load(path, engine.manifest.tokenizer), load_tasks(),
                      path)


@pytest.mark.parametrize("form", ["fused-fp32", "generic-fp8", "fused-int4"])
def test_structured_answers_are_identical_in_fewer_steps(ungated: dict[str, Path],
                                                         form: str) -> None:
    runner = _runner(ungated[form])
    samples = corpus(6, seed=1000)   # two per task
    plain_steps = fast_steps = accepted = forced = 0
    for s in samples:
        answers = []
        for fast in (False, True):
            p = runner.prepare(s["task"], s["input"], SamplingParams())
            assert not isinstance(p, type(None)) and hasattr(p, "ids")
            (g,) = generate(runner.engine, runner.tokenizer, [p.ids], [p.params],
                            constraints=[p.constraint], fast=fast)
            answers.append(g)
        plain, fast_g = answers
        assert fast_g.token_ids == plain.token_ids and fast_g.text == plain.text
        assert plain.steps == len(plain.token_ids) and plain.drafted_tokens == 0
        plain_steps += plain.steps
        fast_steps += fast_g.steps
        accepted += fast_g.accepted_tokens
        forced += fast_g.forced_tokens
        assert fast_g.steps + fast_g.accepted_tokens == len(fast_g.token_ids)
    assert fast_steps < 0.75 * plain_steps, (fast_steps, plain_steps)
    assert accepted > 0 and forced > 0


def _drain(dec: BatchDecoder) -> dict[Hashable, Generation]:
    out: dict[Hashable, Generation] = {}
    while dec.active:
        out.update(dec.step())
    return out


@pytest.mark.parametrize("form", ["fused-fp32", "fused-int4"])
def test_a_batch_of_rows_with_different_drafts(ungated: dict[str, Path], form: str) -> None:
    """Four rows in one continuous batch, fast: each row feeds its own number of tokens
    per step (one sampled row feeds none), rows join mid-way; every row gives what it gives
    alone with plain decoding, and a row's KV holds exactly its accepted tokens."""
    runner = _runner(ungated[form])
    engine: AnyEngine = runner.engine
    samples = corpus(4, seed=1001)
    prepared = [runner.prepare(s["task"], s["input"],
                               SamplingParams(temperature=0.9 if i == 3 else 0.0, seed=i))
                for i, s in enumerate(samples)]
    alone = {}
    for i, s in enumerate(samples):
        p = runner.prepare(s["task"], s["input"],
                           SamplingParams(temperature=0.9 if i == 3 else 0.0, seed=i))
        (alone[i],) = generate(engine, runner.tokenizer, [p.ids], [p.params],
                               constraints=[p.constraint])
    store = ColdStore(engine.manifest.engine_id, 1 << 26)
    prefix = PrefixCache(store, engine.manifest.engine_id, block=16)
    dec = BatchDecoder(engine, runner.tokenizer, 4, prefix, prefill_chunk=64, fast=True)
    for i, p in enumerate(prepared[:2]):
        dec.add(i, p.ids, p.params, p.constraint)
    got: dict[Hashable, Generation] = {}
    for _ in range(3):
        got.update(dec.step())
    for i, p in enumerate(prepared[2:], start=2):   # join while the others decode
        dec.add(i, p.ids, p.params, p.constraint)
    got.update(_drain(dec))
    for i in range(4):
        assert got[i].token_ids == alone[i].token_ids, i
    assert got[3].drafted_tokens == 0                     # sampled: one token per step
    assert sum(got[i].accepted_tokens for i in range(3)) > 0
    for b, held in enumerate(dec.held):   # free rows hold their accepted tokens exactly
        assert int(dec.cache.lengths[b]) == len(held)
    # the cold tier got the blocks of prompts and accepted tokens only: a prompt that
    # continues an answer restores them and decodes as if prefilled
    i = 0
    follow = prepared[i].ids + got[i].token_ids[:-1]
    cold = prefix.available(follow)
    assert cold >= 16 and cold % 16 == 0
