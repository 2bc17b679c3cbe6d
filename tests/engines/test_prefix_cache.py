"""Prefix reuse on a real engine: restored KV gives exactly the output of a full prefill
(greedy), from RAM, from disk after a restart, after a partial match, and in place in the
decode loop's own rows (the hot tier), in both graph forms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rung.engines import AnyEngine, load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.generate import generate
from rung.engines.kv_store import ColdStore
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration
BLOCK = 16


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def loaded(request: pytest.FixtureRequest,
           engines: dict[str, Path]) -> tuple[AnyEngine, Tokenizer]:
    engine = load_engine(engines[request.param])
    return engine, Tokenizer.load(engines[request.param], engine.manifest.tokenizer)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(5, 300, n).tolist()


def _run(engine: AnyEngine, tok: Tokenizer, prompt: list[int],
         prefix: PrefixCache | None = None) -> Generation:
    (g,) = generate(engine, tok, [prompt], SamplingParams(max_tokens=12), prefix=prefix)
    return g


def _store(engine: AnyEngine, state_dir: Path | None = None) -> PrefixCache:
    store = ColdStore(engine.manifest.engine_id, 1 << 24, state_dir=state_dir)
    return PrefixCache(store, engine.manifest.engine_id, block=BLOCK)


def test_ram_restore_gives_the_same_greedy_output(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    prompt = _prompt(1, 70)
    plain = _run(engine, tok, prompt)
    prefix = _store(engine)
    first = _run(engine, tok, prompt, prefix)
    second = _run(engine, tok, prompt, prefix)
    assert first.cached_tokens == 0 and second.cached_tokens == 64
    assert plain.token_ids == first.token_ids == second.token_ids


def test_disk_restore_after_restart(loaded: tuple[AnyEngine, Tokenizer], tmp_path: Path) -> None:
    engine, tok = loaded
    prompt = _prompt(2, 50)
    plain = _run(engine, tok, prompt)
    first = _store(engine, tmp_path)
    _run(engine, tok, prompt, first)
    assert first.store.close()                            # the process exits cleanly
    restarted = _store(engine, tmp_path)                  # a new process: disk only
    again = _run(engine, tok, prompt, restarted)
    assert again.cached_tokens == 48 and again.token_ids == plain.token_ids
    assert restarted.store.stats()["hits_disk"] >= 1


def test_partial_prefix_then_suffix_prefill(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    shared = _prompt(3, 40)
    prefix = _store(engine)
    _run(engine, tok, shared + _prompt(4, 20), prefix)
    other = shared + _prompt(5, 25)
    got = _run(engine, tok, other, prefix)
    assert got.cached_tokens == 32                          # two full shared blocks
    assert got.token_ids == _run(engine, tok, other).token_ids


def test_different_conversations_do_not_see_each_other(
        loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    prefix = _store(engine)
    a, b = _prompt(6, 40), _prompt(7, 40)
    _run(engine, tok, a, prefix)
    got_b = _run(engine, tok, b, prefix)
    assert got_b.cached_tokens == 0
    assert got_b.token_ids == _run(engine, tok, b).token_ids


def _decode(decoder: BatchDecoder, prompt: list[int], tag: str) -> Generation:
    decoder.add(tag, prompt, SamplingParams(max_tokens=6))
    done: dict[object, Generation] = {}
    while decoder.active:
        done.update(decoder.step())
    return done[tag]


@pytest.mark.parametrize("graph", ["fused", "generic"])
def test_a_free_row_continues_in_place(graph: str, engines: dict[str, Path],
                                       generic_engines: dict[str, Path]) -> None:
    """The hot tier: a row keeps what the sequence that left it held; a prompt sharing a
    prefix with it continues there, without a copy, and decodes exactly as from scratch."""
    path = (engines if graph == "fused" else generic_engines)["llama"]
    engine = load_engine(path)
    tok = Tokenizer.load(path, engine.manifest.tokenizer)
    decoder = BatchDecoder(engine, tok, 2)
    prompt = _prompt(8, 30)
    g = _decode(decoder, prompt, "a")
    assert g.cached_tokens == 0
    other = _decode(decoder, _prompt(10, 12), "b")   # the other free row: "a" stays held
    assert other.cached_tokens == 0
    follow = prompt + g.token_ids + _prompt(9, 7)
    g2 = _decode(decoder, follow, "c")
    # the last generated token was sampled, never fed: its KV is not in the row
    assert g2.cached_tokens == len(prompt) + len(g.token_ids) - 1
    plain = generate(engine, tok, [follow], SamplingParams(max_tokens=6))[0]
    assert g2.token_ids == plain.token_ids
    # a diverging prompt reuses the shared head only, and is still exact
    fork = prompt[:20] + _prompt(11, 9)
    g3 = _decode(decoder, fork, "d")
    assert g3.cached_tokens == 20
    assert g3.token_ids == generate(engine, tok, [fork], SamplingParams(max_tokens=6))[0].token_ids


def test_the_cold_tier_wins_when_it_holds_more(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    prefix = _store(engine)
    long = _prompt(12, 70)
    decoder = BatchDecoder(engine, tok, 1, prefix)
    _decode(decoder, long, "a")                  # its blocks reach the cold tier
    _decode(decoder, _prompt(13, 20), "b")      # the one row now holds something else
    again = _decode(decoder, long + [7, 8], "c")
    assert again.cached_tokens == 64             # four blocks restored from the cold tier


def test_warm_pins_and_serves_a_fixed_prompt_head(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    prefix = _store(engine)
    head = _prompt(11, 40)
    assert prefix.warm(engine, head) == 32
    assert prefix.store.stats()["entries_pinned"] == 2
    request = head + _prompt(12, 9)
    got = _run(engine, tok, request, prefix)
    assert got.cached_tokens == 32
    assert got.token_ids == _run(engine, tok, request).token_ids
