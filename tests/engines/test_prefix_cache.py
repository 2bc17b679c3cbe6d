"""Prefix and hot-slot reuse on a real engine: restored KV gives exactly the output of a
full prefill (greedy), from RAM, from disk after a restart, and after a partial match."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rung.engines import Engine, load_engine
from rung.engines.generate import Generation, generate
from rung.engines.kv_store import ColdStore
from rung.engines.prefix_cache import HotSlots, PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration
BLOCK = 16


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def loaded(request: pytest.FixtureRequest,
           engines: dict[str, Path]) -> tuple[Engine, Tokenizer]:
    engine = load_engine(engines[request.param])
    return engine, Tokenizer.load(engines[request.param], engine.manifest.tokenizer)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(5, 300, n).tolist()


def _run(engine: Engine, tok: Tokenizer, prompt: list[int],
         prefix: PrefixCache | None = None) -> Generation:
    (g,) = generate(engine, tok, [prompt], SamplingParams(max_tokens=12), prefix=prefix)
    return g


def _store(engine: Engine, state_dir: Path | None = None) -> PrefixCache:
    store = ColdStore(engine.manifest.engine_id, 1 << 24, state_dir=state_dir)
    return PrefixCache(store, engine.manifest.engine_id, block=BLOCK)


def test_ram_restore_gives_the_same_greedy_output(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    prompt = _prompt(1, 70)
    plain = _run(engine, tok, prompt)
    prefix = _store(engine)
    first = _run(engine, tok, prompt, prefix)
    second = _run(engine, tok, prompt, prefix)
    assert first.cached_tokens == 0 and second.cached_tokens == 64
    assert plain.token_ids == first.token_ids == second.token_ids


def test_disk_restore_after_restart(loaded: tuple[Engine, Tokenizer], tmp_path: Path) -> None:
    engine, tok = loaded
    prompt = _prompt(2, 50)
    plain = _run(engine, tok, prompt)
    _run(engine, tok, prompt, _store(engine, tmp_path))
    restarted = _store(engine, tmp_path)                  # a new process: disk only
    again = _run(engine, tok, prompt, restarted)
    assert again.cached_tokens == 48 and again.token_ids == plain.token_ids
    assert restarted.store.stats()["hits_disk"] >= 1


def test_partial_prefix_then_suffix_prefill(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    shared = _prompt(3, 40)
    prefix = _store(engine)
    _run(engine, tok, shared + _prompt(4, 20), prefix)
    other = shared + _prompt(5, 25)
    got = _run(engine, tok, other, prefix)
    assert got.cached_tokens == 32                          # two full shared blocks
    assert got.token_ids == _run(engine, tok, other).token_ids


def test_different_conversations_do_not_see_each_other(
        loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    prefix = _store(engine)
    a, b = _prompt(6, 40), _prompt(7, 40)
    _run(engine, tok, a, prefix)
    got_b = _run(engine, tok, b, prefix)
    assert got_b.cached_tokens == 0
    assert got_b.token_ids == _run(engine, tok, b).token_ids


def test_hot_slot_continues_in_place(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    slots = HotSlots(engine, 2)
    prompt = _prompt(8, 30)
    cache, n = slots.acquire(prompt)
    assert n == 0
    (g,) = generate(engine, tok, [prompt], SamplingParams(max_tokens=6), cache=cache)
    slots.release(cache, prompt + g.token_ids)
    follow = prompt + g.token_ids + _prompt(9, 7)
    cache2, n2 = slots.acquire(follow)
    assert cache2 is cache and n2 == len(prompt) + len(g.token_ids) - 1
    (g2,) = generate(engine, tok, [follow], SamplingParams(max_tokens=6), cache=cache2)
    assert g2.cached_tokens == n2
    assert g2.token_ids == _run(engine, tok, follow).token_ids[:6]
    other, n3 = slots.acquire(_prompt(10, 12))
    assert other is not cache and n3 == 0


def test_warm_pins_and_serves_a_fixed_prompt_head(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    prefix = _store(engine)
    head = _prompt(11, 40)
    assert prefix.warm(engine, head) == 32
    assert prefix.store.stats()["entries_pinned"] == 2
    request = head + _prompt(12, 9)
    got = _run(engine, tok, request, prefix)
    assert got.cached_tokens == 32
    assert got.token_ids == _run(engine, tok, request).token_ids


def test_hot_slots_from_a_byte_budget(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, _ = loaded
    m = engine.manifest
    per_slot = m.kv.bytes_per_token(m.dims) * 64
    slots = HotSlots.from_budget(engine, 3 * per_slot + 1, max_seq=64)
    assert len(slots.slots) == 3 and slots.nbytes == 3 * per_slot


def test_a_busy_hot_slot_is_never_handed_out_twice(loaded: tuple[Engine, Tokenizer]) -> None:
    from rung.engines.errors import EngineError

    engine, _ = loaded
    slots = HotSlots(engine, 2)
    a, _ = slots.acquire([1, 2, 3, 4])
    b, n = slots.acquire([1, 2, 3, 9])          # same prefix, but slot a is busy
    assert b is not a and n == 0
    with pytest.raises(EngineError, match="all 2 hot slots are busy"):
        slots.acquire([5, 6])
    slots.release(a, None)                       # a failed request: contents unknown
    c, n = slots.acquire([1, 2, 3, 4])
    assert c is a and n == 0
