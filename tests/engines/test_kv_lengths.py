"""The KV cache is the one owner of its rows' lengths (kv.RowLengths): outsiders read a
read-only view, and the named operations check their invariants."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rung.engines.errors import EngineError
from rung.engines.kv import KVCache
from rung.engines.manifest import HEAD_MAJOR, KV_LAYOUT

ROWS, SEQ = 3, 16


def _cache(layout: str = KV_LAYOUT) -> KVCache:
    return KVCache(2, ROWS, SEQ, 2, 4, "float32", layout)


@pytest.mark.parametrize("layout", [KV_LAYOUT, HEAD_MAJOR])
def test_a_stray_write_to_lengths_fails_loudly(layout: str) -> None:
    cache = _cache(layout)
    with pytest.raises(ValueError, match="read-only"):
        cache.lengths[0] = 5
    with pytest.raises(ValueError, match="read-only"):
        cache.lengths[:] = 5
    with pytest.raises(ValueError, match="read-only"):
        cache.lengths += 1
    with pytest.raises(AttributeError):
        cache.lengths = np.ones(ROWS, np.int64)  # type: ignore[misc]
    assert cache.lengths.tolist() == [0, 0, 0]


def test_the_view_follows_the_operations() -> None:
    cache = _cache()
    seen = cache.lengths
    cache.advance(np.array([4, 0, 2]))
    assert seen.tolist() == cache.lengths.tolist() == [4, 0, 2]
    cache.rollback(0, 3)
    cache.rollback(np.array([False, False, True]))
    assert cache.lengths.tolist() == [1, 0, 1]
    cache.truncate(2, 0)
    cache.restore(1, 7)
    cache.reset(0)
    assert cache.lengths.tolist() == [0, 7, 0]
    assert cache.lengths.dtype == np.int64


def test_append_advances_through_the_owner() -> None:
    cache = _cache()
    new = {name: np.ones((3, ROWS, *buf.shape[2:]), buf.dtype)
           for name, buf in cache.buffers.items()}
    cache.append(new, np.array([3, 1, 0], np.int64))
    assert cache.lengths.tolist() == [3, 1, 0] and cache.past_len() == 3
    with pytest.raises(EngineError, match="KV cache full"):
        cache.append(new, np.array([SEQ, 0, 0], np.int64))
    assert cache.lengths.tolist() == [3, 1, 0]


@pytest.mark.parametrize("violation,match", [
    (lambda c: c.advance(np.array([SEQ + 1, 0, 0])), "KV cache full"),
    (lambda c: c.advance(np.array([-1, 0, 0])), "negative"),
    (lambda c: c.advance(np.array([1, 1])), "3 rows"),
    (lambda c: c.advance(np.array([1.0, 0.0, 0.0])), "integer"),
    (lambda c: c.rollback(0, 5), "rollback"),
    (lambda c: c.rollback(np.array([True, True, False]), 3), "rollback"),
    (lambda c: c.rollback(0, -1), "rollback"),
    (lambda c: c.truncate(0, 5), "never grows"),
    (lambda c: c.truncate(0, -1), "never grows"),
    (lambda c: c.restore(0, 2), "reset the row first"),
    (lambda c: c.restore(1, SEQ + 1), "max_seq"),
    (lambda c: c.restore(1, -1), "max_seq"),
    (lambda c: c.reset(ROWS), "out of range"),
    (lambda c: c.rollback(-1, 0), "out of range"),
], ids=["advance-past-max_seq", "advance-negative", "advance-shape", "advance-float",
        "rollback-past-zero", "rollback-mask-past-zero", "rollback-negative",
        "truncate-grows", "truncate-negative", "restore-into-a-full-row",
        "restore-past-max_seq", "restore-negative", "reset-out-of-range",
        "rollback-negative-row"])
def test_violations_raise_and_change_nothing(violation: Callable[[KVCache], None],
                                             match: str) -> None:
    cache = _cache()
    cache.advance(np.array([4, 0, 2]))
    with pytest.raises(EngineError, match=match):
        violation(cache)
    assert cache.lengths.tolist() == [4, 0, 2]


def test_restore_fills_exactly_max_seq() -> None:
    cache = _cache()
    cache.restore(0, SEQ)
    assert cache.lengths.tolist() == [SEQ, 0, 0]
