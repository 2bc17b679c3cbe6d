"""The cold tier's disk writes happen in the background: the decode step's offload does not
wait for the disk, the writer thread survives a failing write, a full queue drops its oldest
write, close() flushes, and nothing is fsynced.

The writer is held on an Event the test owns (``kv_disk.atomic_write`` wrapped); waits on
it have long timeouts only so that a broken build fails instead of hanging. No assertion is
about elapsed time."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rung.engines import kv_disk, load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.kv_store import ColdStore, chain_keys
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from tests.engines.test_kv_store import ENGINE, assert_same, key, kv_block

GUARD_S = 60.0   # only so that a broken build fails instead of hanging


class HeldWriter:
    """``kv_disk.atomic_write`` held until ``release`` is set; records what it wrote."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.started: list[Path] = []
        self.finished: list[Path] = []
        self._write = kv_disk.atomic_write

    def __call__(self, path: Path, data: bytes) -> None:
        self.started.append(path)
        self.entered.set()
        self.release.wait(GUARD_S)
        self._write(path, data)
        self.finished.append(path)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldWriter]:
    writer = HeldWriter()
    monkeypatch.setattr(kv_disk, "atomic_write", writer)
    yield writer
    writer.release.set()   # never leave a writer thread waiting


def _rkv(state: Path) -> list[str]:
    return sorted(p.stem for p in (state / "kv").glob("*.rkv"))


def _writer_alive(store: ColdStore) -> bool:
    assert store._disk is not None
    thread = store._disk._thread
    return thread is not None and thread.is_alive()


# -- the decode step ----------------------------------------------------------------------

@pytest.mark.integration
def test_leaving_sequence_offload_does_not_wait_for_the_disk(
        engines: dict[str, Path], tmp_path: Path, held: HeldWriter) -> None:
    engine = load_engine(engines["llama"])
    tok = Tokenizer.load(engines["llama"], engine.manifest.tokenizer)
    eid = engine.manifest.engine_id
    store = ColdStore(eid, 1 << 24, state_dir=tmp_path)
    dec = BatchDecoder(engine, tok, 1, PrefixCache(store, eid, block=16))
    prompt = np.random.default_rng(0).integers(5, 300, 40).tolist()
    dec.add("a", prompt, SamplingParams(max_tokens=4))
    done = []
    while not done:
        done = dec.step()      # the last one offloads the row's blocks as the sequence leaves
    [(_, g)] = done
    assert g.error is None
    tokens = prompt + g.token_ids
    keys = chain_keys(eid, tokens[:int(dec.cache.lengths[0])], 16)
    assert len(keys) == 2
    # the step is over while the writer is held inside its first file: nothing on disk yet
    assert held.entered.wait(GUARD_S)
    assert held.finished == [] and _rkv(tmp_path) == []
    assert all(k in store for k in keys)
    for i, k in enumerate(keys):   # served from RAM meanwhile
        assert_same(store.get(k), dec.cache.read_block(0, 16 * i, 16))
    stats = store.stats()
    assert stats["hits_ram"] == 2 and stats["hits_disk"] == 0 and stats["writes_pending"] >= 1

    held.release.set()
    assert store.close()
    assert _rkv(tmp_path) == sorted(keys) and len(held.finished) == 2
    again = ColdStore(eid, 1 << 24, state_dir=tmp_path)   # a restart: disk only
    for i, k in enumerate(keys):
        assert_same(again.get(k), dec.cache.read_block(0, 16 * i, 16))
    assert again.stats()["hits_disk"] == 2


def test_put_returns_while_the_writer_is_held(tmp_path: Path, held: HeldWriter) -> None:
    store = ColdStore(ENGINE, 0, state_dir=tmp_path)   # no RAM tier: staged, then disk only
    for i in range(3):
        assert store.put(key(i), kv_block(seed=i))
    assert held.entered.wait(GUARD_S)
    assert held.finished == [] and _rkv(tmp_path) == []
    for i in range(3):     # queued blocks are served from memory, never from a half file
        assert key(i) in store
        assert_same(store.get(key(i)), kv_block(seed=i))
    assert store.stats()["misses"] == 0
    held.release.set()
    assert store.flush()
    assert _rkv(tmp_path) == sorted(key(i) for i in range(3))
    stats = store.stats()
    assert stats["entries_staged"] == 0 and stats["writes_pending"] == 0
    assert stats["entries_ram"] == 0 and stats["entries_disk"] == 3
    assert_same(store.get(key(0)), kv_block(seed=0))
    assert store.stats()["hits_disk"] == 1


def test_writer_waits_while_a_save_queues_its_blocks(tmp_path: Path) -> None:
    store = ColdStore(ENGINE, 1 << 24, state_dir=tmp_path)
    with store.hold_writes():             # as PrefixCache.save queues a leaving sequence
        for i in range(2):
            store.put(key(i), kv_block(seed=i))
        assert not store.flush(timeout=0.1)   # held: the writer starts no block
        stats = store.stats()
        assert stats["entries_staged"] == 2 and stats["entries_ram"] == 0
        assert stats["writes_pending"] == 2
    assert store.flush()
    assert _rkv(tmp_path) == sorted(key(i) for i in range(2))
    assert store.stats()["entries_ram"] == 2 and store.stats()["entries_staged"] == 0


# -- supervision ----------------------------------------------------------------------------

def test_a_failing_write_is_logged_once_and_the_writer_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real_replace = os.replace
    failures = [OSError(30, "Read-only file system"), RuntimeError("a bug in the writer")]

    def replace(src: str | Path, dst: str | Path) -> None:
        if str(dst).endswith(kv_disk.SUFFIX) and failures:
            raise failures.pop(0)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    store = ColdStore(ENGINE, 1 << 24, state_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="rung.engines.kv_disk"):
        store.put(key(0), kv_block(seed=0))
        store.put(key(1), kv_block(seed=1))
        assert store.flush()
        assert failures == [] and _writer_alive(store)
        store.put(key(2), kv_block(seed=2))     # the next block is written
        assert store.flush()
    assert _rkv(tmp_path) == [key(2)]
    assert not list((tmp_path / "kv").glob("*.tmp"))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None    # once, with its traceback
    assert errors[0].exc_info[0] is OSError and key(0) in errors[0].getMessage()
    assert "writing again after 2 failed blocks" in caplog.text
    stats = store.stats()
    assert stats["disk_errors"] == 2 and stats["entries_disk"] == 1
    for i in range(3):                          # the RAM tier still holds the dropped ones
        assert_same(store.get(key(i)), kv_block(seed=i))
    assert store.close()
    assert ColdStore(ENGINE, 1 << 24, state_dir=tmp_path).stats()["entries_disk"] == 1


def test_full_queue_drops_the_oldest_write(tmp_path: Path, held: HeldWriter) -> None:
    store = ColdStore(ENGINE, 0, state_dir=tmp_path, max_pending=2)
    store.put(key(0), kv_block(seed=0))
    assert held.entered.wait(GUARD_S)       # the writer is inside block 0
    for i in range(1, 5):                   # 1 and 2 queued, then each put drops the oldest
        assert store.put(key(i), kv_block(seed=i))
    stats = store.stats()
    assert stats["writes_dropped"] == 2 and stats["writes_pending"] == 3
    assert [key(i) in store for i in range(5)] == [True, False, False, True, True]
    assert store.get(key(1)) is None and store.get(key(2)) is None
    held.release.set()
    assert store.close()
    assert _rkv(tmp_path) == sorted([key(0), key(3), key(4)])


# -- close and flush ------------------------------------------------------------------------

def test_close_flushes_pending_writes_and_stops_the_writer(tmp_path: Path,
                                                           held: HeldWriter) -> None:
    store = ColdStore(ENGINE, 1 << 24, state_dir=tmp_path)
    for i in range(4):
        store.put(key(i), kv_block(seed=i))
    assert held.entered.wait(GUARD_S)
    assert _rkv(tmp_path) == [] and store.stats()["writes_pending"] == 4
    held.release.set()
    assert store.close()
    assert _rkv(tmp_path) == sorted(key(i) for i in range(4))
    assert not _writer_alive(store)
    stats = store.stats()
    assert stats["writes_pending"] == 0 and stats["writes_dropped"] == 0
    assert store.put(key(9), kv_block(seed=9))      # after close: RAM only, in the caller
    assert key(9) not in _rkv(tmp_path) and store.stats()["entries_ram"] == 5
    again = ColdStore(ENGINE, 1 << 24, state_dir=tmp_path)
    for i in range(4):
        assert_same(again.get(key(i)), kv_block(seed=i))


def test_close_waits_a_bounded_time_for_a_stuck_writer(
        tmp_path: Path, held: HeldWriter, caplog: pytest.LogCaptureFixture) -> None:
    store = ColdStore(ENGINE, 1 << 24, state_dir=tmp_path)
    for i in range(3):
        store.put(key(i), kv_block(seed=i))
    assert held.entered.wait(GUARD_S)
    with caplog.at_level(logging.WARNING):
        assert store.close(timeout=0.05) is False       # the writer is stuck in block 0
    assert "2 queued blocks not written at close" in caplog.text
    assert store.stats()["writes_dropped"] == 2
    assert_same(store.get(key(0)), kv_block(seed=0))    # compressed into RAM before the write
    assert key(1) not in store and key(2) not in store  # dropped before the writer got to them


def test_nothing_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    store = ColdStore(ENGINE, 1 << 24, state_dir=tmp_path)
    for i in range(3):
        store.put(key(i), kv_block(seed=i))
    assert store.close()
    assert _rkv(tmp_path) == sorted(key(i) for i in range(3)) and synced == []
