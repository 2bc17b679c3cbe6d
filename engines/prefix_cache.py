"""Prefix reuse of KV across requests: hot slots, then the compressed cold tier.

Token sequences are split into blocks of ``block`` positions; each full block is keyed by a
hash chained over the previous blocks and the engine id (``kv_store.chain_keys``), so a key
names a whole prefix. Before a request, ``PrefixCache.restore`` fills a cache row with the
longest cached prefix of its prompt, and only the rest is prefilled; after it,
``PrefixCache.save`` offers the row's full blocks (prompt and generated tokens) to the cold
tier. ``HotSlots`` keeps the last few single-sequence caches as they are: a request that
shares a prefix with one of them continues in it without copying anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rung.engines import Engine
from rung.engines.errors import EngineError
from rung.engines.kv import KVCache
from rung.engines.kv_store import ColdStore, chain_keys


@dataclass
class PrefixStats:
    requests: int = 0        # rows offered to restore()
    cached_tokens: int = 0   # positions restored instead of prefilled
    cold_hits: int = 0       # rows that restored at least one block
    restore_ms: float = 0.0  # time spent restoring


class PrefixCache:
    """Restores and saves KV blocks of cache rows through a ``ColdStore``."""

    def __init__(self, store: ColdStore, engine_id: str, block: int = 64) -> None:
        self.store, self.engine_id, self.block = store, engine_id, block
        self.stats = PrefixStats()

    def restore(self, cache: KVCache, row: int, tokens: Sequence[int]) -> int:
        """Fill ``row`` with the longest stored prefix of ``tokens``; returns how many
        positions are valid (at most ``len(tokens) - 1``: the last prompt token is always
        run, its logits start the answer)."""
        t0 = time.perf_counter()
        keys = chain_keys(self.engine_id, tokens, self.block)
        restored = 0
        for i in range(self.store.longest_prefix(keys)):
            arrays = self.store.get(keys[i])
            if arrays is None or (i + 1) * self.block > cache.max_seq:
                break
            cache.write_block(row, i * self.block, arrays)
            restored += self.block
        usable = min(restored, max(len(tokens) - 1, 0))
        cache.lengths[row] = usable
        self.stats.requests += 1
        self.stats.cached_tokens += usable
        if usable:
            self.stats.cold_hits += 1
            self.stats.restore_ms += (time.perf_counter() - t0) * 1000
        return usable

    def warm(self, engine: Engine, tokens: Sequence[int]) -> int:
        """Prefill ``tokens`` once and pin its full blocks (task system prompts at start-up);
        returns the pinned token count."""
        n = len(tokens) // self.block * self.block
        if n == 0:
            return 0
        keys = chain_keys(self.engine_id, tokens[:n], self.block)
        if self.store.longest_prefix(keys) == len(keys):
            for key in keys:
                self.store.pin(key)
            return n
        cache = engine.new_cache(1, n)
        engine.forward(cache, np.array([tokens[:n]]), np.array([n], np.int64))
        self.save(cache, 0, tokens[:n], pinned=True)
        return n

    def save(self, cache: KVCache, row: int, tokens: Sequence[int],
             pinned: bool = False) -> int:
        """Offer the row's full blocks whose KV is in the cache; returns blocks stored."""
        valid = min(int(cache.lengths[row]), len(tokens))
        keys = chain_keys(self.engine_id, tokens[:valid], self.block)
        stored = 0
        for i, key in enumerate(keys):
            if key in self.store:
                if pinned:
                    self.store.pin(key)
                continue
            stored += int(self.store.put(key, cache.read_block(row, i * self.block, self.block),
                                         pinned=pinned))
        return stored


@dataclass
class _Slot:
    cache: KVCache
    tokens: list[int] = field(default_factory=list)
    used: float = 0.0
    busy: bool = False


class HotSlots:
    """A fixed number of single-sequence caches kept as they were left (the hot tier)."""

    def __init__(self, engine: Engine, slots: int, max_seq: int | None = None) -> None:
        self.slots = [_Slot(engine.new_cache(1, max_seq)) for _ in range(slots)]
        self._lock = threading.Lock()

    @classmethod
    def from_budget(cls, engine: Engine, budget_bytes: int,
                    max_seq: int | None = None) -> HotSlots:
        """As many full-length slots as ``budget_bytes`` holds (at least one)."""
        m = engine.manifest
        seq = min(max_seq or m.dims.max_seq, m.dims.max_seq)
        per_slot = m.kv.bytes_per_token(m.dims) * seq
        return cls(engine, max(1, budget_bytes // per_slot), seq)

    @property
    def nbytes(self) -> int:
        return sum(s.cache.nbytes for s in self.slots)

    def acquire(self, tokens: Sequence[int]) -> tuple[KVCache, int]:
        """A free slot, the one sharing the longest prefix with ``tokens`` (else the least
        recently used), its length set to that shared prefix (at most ``len(tokens) - 1``);
        it stays busy until ``release``.

        Raises:
            EngineError: every slot is busy.
        """
        def shared(slot: _Slot) -> int:
            n = min(len(slot.tokens), int(slot.cache.lengths[0]), len(tokens) - 1)
            i = 0
            while i < n and slot.tokens[i] == tokens[i]:
                i += 1
            return i

        with self._lock:
            free = [s for s in self.slots if not s.busy]
            if not free:
                raise EngineError(f"all {len(self.slots)} hot slots are busy",
                                  "release a slot or configure more")
            best = max(free, key=lambda s: (shared(s), s.used))
            n = shared(best)
            if n == 0:
                best = min(free, key=lambda s: s.used)
            best.cache.lengths[0] = n
            best.tokens = list(tokens[:n])
            best.used = time.monotonic()
            best.busy = True
            return best.cache, n

    def release(self, cache: KVCache, tokens: Sequence[int] | None) -> None:
        """Free the slot of ``cache``, recording what it now holds (prompt + generated
        tokens), or nothing (``None``: the request failed, the contents are unknown)."""
        with self._lock:
            for s in self.slots:
                if s.cache is cache:
                    s.tokens = list(tokens) if tokens is not None else []
                    if tokens is None:
                        s.cache.lengths[0] = 0
                    s.used = time.monotonic()
                    s.busy = False
