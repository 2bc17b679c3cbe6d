"""The cold KV store: chained keys, the block codec, RAM LRU and pinning, persistence across a
restart, dropping corrupt files, and sharing the store between threads."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from rung.engines.errors import EngineError
from rung.engines.kv import KVCache
from rung.engines.kv_disk import MAGIC, Record, pack_record
from rung.engines.kv_store import ColdStore, chain_keys, decode_block, encode_block
from rung.engines.manifest import HEAD_MAJOR, KV_LAYOUT

ENGINE = "engine-test-0001"
BLOCK = 8
DTYPES = ("float32", "float16", "float8_e4m3fn")


def key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def kv_block(dtype: str = "float32", seed: int = 0) -> dict[str, np.ndarray]:
    """One row's block out of a real KVCache (strided slices), filled with KV-like values."""
    rng = np.random.default_rng(seed)
    cache = KVCache(num_layers=2, batch=2, max_seq=4 * BLOCK, kv_heads=2, head_dim=16,
                    dtype=dtype)
    for buf in cache.buffers.values():
        if buf.dtype == np.uint8:
            buf[:] = rng.integers(0, 256, buf.shape, dtype=np.uint8)
        else:
            scale = rng.lognormal(0.0, 0.7, buf.shape[2:])
            buf[:] = (scale * rng.standard_normal(buf.shape)).astype(buf.dtype)
    return {name: buf[BLOCK:2 * BLOCK, 1] for name, buf in cache.buffers.items()}


def assert_same(got: dict[str, np.ndarray] | None, want: dict[str, np.ndarray]) -> None:
    assert got is not None
    assert sorted(got) == sorted(want)
    for name, a in want.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        assert got[name].tobytes() == np.ascontiguousarray(a).tobytes(), name


def entry_size(dtype: str = "float32") -> int:
    """Compressed bytes of one kv_block (all seeds give the same size within a few bytes)."""
    store = ColdStore(ENGINE, 1 << 30)
    store.put(key(0), kv_block(dtype))
    return int(store.stats()["bytes_ram"])


# -- keys ---------------------------------------------------------------------------------

def test_chain_keys_follow_the_formula_and_are_deterministic() -> None:
    tokens = list(range(3 * BLOCK))
    keys = chain_keys(ENGINE, tokens, BLOCK)
    assert keys == chain_keys(ENGINE, tokens, BLOCK)
    assert len(keys) == 3
    first = hashlib.sha256(ENGINE.encode() + np.arange(BLOCK, dtype="<i8").tobytes())
    assert keys[0] == first.hexdigest()
    second = hashlib.sha256(first.digest() + ENGINE.encode()
                            + np.arange(BLOCK, 2 * BLOCK, dtype="<i8").tobytes())
    assert keys[1] == second.hexdigest()


def test_chain_keys_prefix_engine_and_partial_block() -> None:
    tokens = [5, 9, 2, 7] * 10                                     # 40 tokens
    keys = chain_keys(ENGINE, tokens, BLOCK)
    assert len(keys) == 5
    assert chain_keys(ENGINE, tokens[:3 * BLOCK], BLOCK) == keys[:3]
    assert chain_keys(ENGINE, tokens[:3 * BLOCK + 5], BLOCK) == keys[:3]  # partial: no key
    assert chain_keys(ENGINE, tokens[:BLOCK - 1], BLOCK) == []
    other = chain_keys("another-engine", tokens, BLOCK)
    assert not set(other) & set(keys)
    changed = list(tokens)
    changed[1] += 1                                                 # an early token changes
    assert not set(chain_keys(ENGINE, changed, BLOCK)) & set(keys)  # every later key too
    with pytest.raises(EngineError):
        chain_keys(ENGINE, tokens, 0)


# -- codec and round trip -----------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [False, True, None])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_exact(dtype: str, shuffle: bool | None) -> None:
    block = kv_block(dtype)
    assert_same(decode_block(encode_block(block, shuffle)), block)
    store = ColdStore(ENGINE, 1 << 20, shuffle=shuffle)
    assert store.put(key(1), block)
    got = store.get(key(1))
    assert_same(got, block)
    assert got is not None and all(a.flags.writeable for a in got.values())
    stats = store.stats()
    assert stats["hits_ram"] == 1 and stats["misses"] == 0
    assert stats["compression_ratio"] > 1.0 and stats["compress_mb_s"] > 0


LAYOUTS = [(KV_LAYOUT, d) for d in DTYPES] + [(HEAD_MAJOR, d) for d in DTYPES[:2]]


@pytest.mark.parametrize("n", [1, 5, 63])
@pytest.mark.parametrize(("layout", "dtype"), LAYOUTS)
def test_round_trip_every_layout_and_odd_lengths(layout: str, dtype: str, n: int) -> None:
    """Blocks as ``read_block`` cuts them from either layout, any length, back bit-exact
    through the codec and ``write_block`` into another cache."""
    rng = np.random.default_rng(n)
    cache = KVCache(num_layers=2, batch=2, max_seq=70, kv_heads=3, head_dim=8, dtype=dtype,
                    layout=layout)
    for buf in cache.buffers.values():
        if buf.dtype == np.uint8:
            buf[:] = rng.integers(0, 256, buf.shape, dtype=np.uint8)
        else:
            buf[:] = rng.standard_normal(buf.shape).astype(buf.dtype)
    block = cache.read_block(1, 3, n)
    for shuffle in (False, True):
        got = decode_block(encode_block(block, shuffle))
        assert_same(got, block)
        other = KVCache(num_layers=2, batch=1, max_seq=70, kv_heads=3, head_dim=8,
                        dtype=dtype, layout=layout)
        other.write_block(0, 3, got)
        assert_same(other.read_block(0, 3, n), block)


def test_payload_format_is_the_documented_one() -> None:
    """A payload built by hand from ``encode_block``'s documented format decodes (the
    format of blocks already in RAM or on disk), shuffled or not, and encoding gives it."""
    a = np.arange(6, dtype="<f4").reshape(3, 2) - 2.5
    s = np.array([[7, 8], [9, 10], [11, 12]], dtype="<u1")
    for shuffle in (False, True):
        header = json.dumps({"shuffle": shuffle, "arrays": [
            ["a", "<f4", [3, 2]], ["s", "|u1", [3, 2]]]}, separators=(",", ":")).encode()
        if shuffle:   # byte k of every element of a, then of s where it has one
            planes = a.reshape(-1).view(np.uint8).reshape(6, 4)
            body = b"".join([planes[:, 0].tobytes(), s.tobytes(),
                             *(planes[:, k].tobytes() for k in (1, 2, 3))])
        else:
            body = a.tobytes() + s.tobytes()
        payload = struct.pack("<I", len(header)) + header + body
        assert_same(decode_block(payload), {"a": a, "s": s})
        assert encode_block({"s": s, "a": a}, shuffle) == payload


def test_shuffle_default_and_flag_in_payload() -> None:
    assert encode_block(kv_block("float32"), None) == encode_block(kv_block("float32"), True)
    fp8 = kv_block("float8_e4m3fn")
    assert encode_block(fp8, None) == encode_block(fp8, False)


def test_bad_input_is_refused() -> None:
    with pytest.raises(EngineError):
        decode_block(b"\x05\x00\x00\x00{bad}")
    payload = encode_block(kv_block())
    with pytest.raises(EngineError):
        decode_block(payload[:-1])
    with pytest.raises(EngineError):
        encode_block({"x": np.array(["a"])})
    with pytest.raises(EngineError):
        ColdStore(ENGINE, 1 << 20).put("../../etc/passwd", kv_block())


# -- RAM budget: LRU and pinning ----------------------------------------------------------

def test_lru_eviction_order() -> None:
    size = entry_size()
    store = ColdStore(ENGINE, int(size * 3.5))
    for i in range(3):
        store.put(key(i), kv_block(seed=i))
    assert store.get(key(0)) is not None                 # 0 is now the most recently used
    store.put(key(3), kv_block(seed=3))                  # evicts 1, the least recently used
    assert [key(i) in store for i in range(4)] == [True, False, True, True]
    store.put(key(4), kv_block(seed=4))                  # evicts 2
    assert [key(i) in store for i in range(5)] == [True, False, False, True, True]
    assert store.get(key(1)) is None and store.stats()["misses"] == 1
    assert store.stats()["bytes_ram"] <= size * 3.5


def test_pinned_entries_stay_until_unpinned() -> None:
    size = entry_size()
    store = ColdStore(ENGINE, int(size * 2.5))
    store.put(key(0), kv_block(seed=0), pinned=True)
    store.put(key(1), kv_block(seed=1))
    assert store.pin(key(1)) and not store.pin(key(99))
    for i in range(2, 6):
        assert not store.put(key(i), kv_block(seed=i))   # no room beside the pinned: refused
    assert key(0) in store and key(1) in store and store.stats()["refused_ram"] == 4
    store.unpin(key(0))
    store.put(key(6), kv_block(seed=6))
    assert key(0) not in store and key(1) in store and key(6) in store


def test_pinned_over_budget_warns_and_refuses_unpinned(caplog: pytest.LogCaptureFixture) -> None:
    size = entry_size()
    store = ColdStore(ENGINE, int(size * 1.5))
    store.put(key(0), kv_block(seed=0))
    with caplog.at_level(logging.WARNING):
        store.put(key(1), kv_block(seed=1), pinned=True)  # evicts 0
        store.put(key(2), kv_block(seed=2), pinned=True)  # over budget: kept, warned
    assert "over the RAM budget" in caplog.text
    assert key(0) not in store and key(1) in store and key(2) in store
    assert not store.put(key(3), kv_block(seed=3))
    assert key(3) not in store


def test_longest_prefix() -> None:
    store = ColdStore(ENGINE, 1 << 20)
    keys = chain_keys(ENGINE, list(range(4 * BLOCK)), BLOCK)
    for k in keys[:2]:
        store.put(k, kv_block())
    store.put(keys[3], kv_block())
    assert store.longest_prefix(keys) == 2
    assert store.longest_prefix([]) == 0
    assert store.longest_prefix(keys[:2]) == 2


# -- persistence ----------------------------------------------------------------------------

def test_restart_restores_from_disk(tmp_path: Path) -> None:
    blocks = {dtype: kv_block(dtype, seed=i) for i, dtype in enumerate(DTYPES)}
    store = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)
    for i, dtype in enumerate(DTYPES):
        store.put(key(i), blocks[dtype])
    assert store.close()                                        # written in the background
    assert sorted(p.name for p in (tmp_path / "kv").iterdir()) == sorted(
        f"{key(i)}.rkv" for i in range(3))

    again = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)     # a restart
    assert again.stats()["entries_disk"] == 3 and again.stats()["entries_ram"] == 0
    assert again.longest_prefix([key(0), key(1), key(2), key(3)]) == 3
    for i, dtype in enumerate(DTYPES):
        assert_same(again.get(key(i)), blocks[dtype])
    stats = again.stats()
    assert stats["hits_disk"] == 3 and stats["entries_ram"] == 3 and stats["dropped_corrupt"] == 0
    assert_same(again.get(key(0)), blocks["float32"])          # promoted: now a RAM hit
    assert again.stats()["hits_ram"] == 1 and again.stats()["restore_ms"] > 0


def test_ram_eviction_falls_back_to_disk(tmp_path: Path) -> None:
    store = ColdStore(ENGINE, int(entry_size() * 1.5), state_dir=tmp_path)
    store.put(key(0), kv_block(seed=0))
    store.put(key(1), kv_block(seed=1))                       # evicts 0 from RAM only
    assert store.flush()
    assert store.stats()["entries_ram"] == 1 and store.stats()["entries_disk"] == 2
    assert key(0) in store
    assert_same(store.get(key(0)), kv_block(seed=0))
    assert store.stats()["hits_disk"] == 1


def test_disk_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    store = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)
    store.put(key(0), kv_block(seed=0))
    assert store.close()
    file_size = (tmp_path / "kv" / f"{key(0)}.rkv").stat().st_size
    store = ColdStore(ENGINE, 0, state_dir=tmp_path, disk_budget_bytes=int(file_size * 2.5))
    store.put(key(1), kv_block(seed=1))
    assert store.flush()
    assert store.get(key(0)) is not None                      # 0 used more recently than 1
    store.put(key(2), kv_block(seed=2))
    assert store.flush()
    assert [key(i) in store for i in range(3)] == [True, False, True]
    assert not (tmp_path / "kv" / f"{key(1)}.rkv").exists()


# -- corruption -----------------------------------------------------------------------------

def _file(tmp_path: Path, i: int) -> Path:
    return tmp_path / "kv" / f"{key(i)}.rkv"


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_files_are_dropped_at_start(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    store = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)
    for i in range(5):
        store.put(key(i), kv_block(seed=i))
    assert store.close()
    _flip_last_byte(_file(tmp_path, 0))                                      # checksum
    data = _file(tmp_path, 1).read_bytes()
    _file(tmp_path, 1).write_bytes(data[:len(data) // 2])                    # truncated
    record = Record(b"\x28\xb5\x2f\xfd\x00\x00\x01\x00\x00", 0, False, 3)
    _file(tmp_path, 2).write_bytes(pack_record(record, "other-engine", key(2)))  # engine id
    data = _file(tmp_path, 3).read_bytes()
    _file(tmp_path, 3).write_bytes(b"NOTRUNG!" + data[len(MAGIC):])          # magic
    (tmp_path / "kv" / f"{key(5)}.abc123.tmp").write_bytes(b"half a write")  # crash leftover

    with caplog.at_level(logging.WARNING):
        again = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)
    for i, reason in enumerate(("checksum", "truncated", "other-engine", "magic")):
        assert any(key(i) in r.getMessage() and reason in r.getMessage()
                   for r in caplog.records), reason
    assert "interrupted write" in caplog.text
    stats = again.stats()
    assert stats["dropped_corrupt"] == 5 and stats["entries_disk"] == 1
    for i in range(4):
        assert key(i) not in again and again.get(key(i)) is None
        assert not _file(tmp_path, i).exists()
    assert sorted(p.name for p in (tmp_path / "kv").iterdir()) == [f"{key(4)}.rkv"]
    assert_same(again.get(key(4)), kv_block(seed=4))


def test_corruption_after_start_is_caught_on_read(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    first = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)
    first.put(key(0), kv_block())
    assert first.close()
    store = ColdStore(ENGINE, 1 << 20, state_dir=tmp_path)
    assert key(0) in store
    _flip_last_byte(_file(tmp_path, 0))
    with caplog.at_level(logging.WARNING):
        assert store.get(key(0)) is None
    assert "checksum" in caplog.text and key(0) in caplog.text
    stats = store.stats()
    assert stats["dropped_corrupt"] == 1 and stats["misses"] == 1 and stats["hits_disk"] == 0
    assert key(0) not in store and not _file(tmp_path, 0).exists()


# -- threads --------------------------------------------------------------------------------

def test_two_threads_share_the_store(tmp_path: Path) -> None:
    store = ColdStore(ENGINE, int(entry_size() * 6.5), state_dir=tmp_path)
    errors: list[str] = []

    def work(first: int) -> None:
        for i in range(first, first + 12):
            block = kv_block(seed=i)
            store.put(key(i), block)
            for j in (i, max(first, i - 3)):      # recent and RAM-evicted (disk) blocks
                got = store.get(key(j))
                want = kv_block(seed=j)
                if got is None or any(got[n].tobytes() != want[n].tobytes() for n in want):
                    errors.append(f"block {j}")

    threads = [threading.Thread(target=work, args=(first,)) for first in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.flush()
    stats = store.stats()
    assert stats["entries_disk"] == 24 and stats["misses"] == 0
    assert stats["entries_ram"] <= 6
