"""Prefix reuse of KV across requests through the compressed cold tier.

Token sequences are split into blocks of ``block`` positions; each full block is keyed by a
hash chained over the previous blocks and the engine id (``kv_store.chain_keys``), so a key
names a whole prefix. Before a request, ``PrefixCache.restore`` fills a cache row with the
longest cached prefix of its prompt, and only the rest is prefilled; after it,
``PrefixCache.save`` offers the row's full blocks (prompt and generated tokens) to the cold
tier. The hot tier is the decode loop's own rows (``batch.BatchDecoder``): a row keeps the
KV of the sequence that left it, and a prompt sharing a prefix with it continues in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rung.engines import AnyEngine
from rung.engines.kv import KVCache
from rung.engines.kv_store import ColdStore, chain_keys


class PrefixCache:
    """Restores and saves KV blocks of cache rows through a ``ColdStore``."""

    def __init__(self, store: ColdStore, engine_id: str, block: int = 64) -> None:
        self.store, self.engine_id, self.block = store, engine_id, block

    def available(self, tokens: Sequence[int]) -> int:
        """How many positions of ``tokens`` ``restore`` would fill (hashing only, nothing
        read or counted)."""
        keys = chain_keys(self.engine_id, tokens, self.block)
        return min(self.store.longest_prefix(keys) * self.block, max(len(tokens) - 1, 0))

    def restore(self, cache: KVCache, row: int, tokens: Sequence[int]) -> int:
        """Fill ``row`` with the longest stored prefix of ``tokens`` (whatever it held
        before is dropped); returns how many positions are valid (at most
        ``len(tokens) - 1``: the last prompt token is always run, its logits start the
        answer)."""
        cache.reset(row)
        keys = chain_keys(self.engine_id, tokens, self.block)
        restored = 0
        for i in range(self.store.longest_prefix(keys)):
            arrays = self.store.get(keys[i])
            if arrays is None or (i + 1) * self.block > cache.max_seq:
                break
            cache.write_block(row, i * self.block, arrays)
            restored += self.block
        usable = min(restored, max(len(tokens) - 1, 0))
        cache.restore(row, usable)
        return usable

    def warm(self, engine: AnyEngine, tokens: Sequence[int]) -> int:
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
        """Offer the row's full blocks whose KV is in the cache; returns blocks stored.

        With a disk tier this is the decode step's offload when a sequence leaves: each
        block is copied out of the cache and queued (``ColdStore.put``), and the disk tier's
        writer compresses and writes them after this returns (``ColdStore.hold_writes``)."""
        valid = min(int(cache.lengths[row]), len(tokens))
        keys = chain_keys(self.engine_id, tokens[:valid], self.block)
        stored = 0
        with self.store.hold_writes():
            for i, key in enumerate(keys):
                if key in self.store:
                    if pinned:
                        self.store.pin(key)
                    continue
                stored += int(self.store.put(
                    key, cache.read_block(row, i * self.block, self.block), pinned=pinned))
        return stored
