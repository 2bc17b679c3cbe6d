"""The cold KV tier: compressed blocks of finished or evicted sequences, keyed by content.

A block is ``block`` consecutive positions of one sequence across every KV buffer: buffer
name -> ``[block, ...]``, as ``KVCache.read_block`` returns it (any layout, any device). Its key
(:func:`chain_keys`) hashes the engine id and every token up to the block's end, so equal
keys mean equal KV, and a prompt's longest cached prefix is its longest run of present keys
(:meth:`ColdStore.longest_prefix`).

:class:`ColdStore` keeps blocks zstd-compressed in RAM under a byte budget (LRU, pinning)
and, given a ``state_dir``, also on disk (:mod:`rung.engines.kv_disk`) so a restart keeps
them. With a disk tier, :meth:`ColdStore.put` does no compression and no I/O: it keeps the
block's arrays (the caller's copy) and queues it for the disk tier's writer thread, which
compresses it into RAM and writes its file (see :class:`ColdStore`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from rung.engines.errors import EngineError
from rung.engines.kv_disk import CLOSE_WAIT_S, KEY_RE, MAX_PENDING, DiskTier, Record

log = logging.getLogger(__name__)

# Byte-plane shuffle per block dtype: the planes are grouped across the whole block (plane 0
# of every array, then plane 1, ...), so zstd codes the low-entropy sign/exponent planes
# together instead of beside noise-like mantissa planes in one Huffman block. Float blocks
# come out smaller with it and restore no slower; an fp8 block is single bytes, which a
# byte shuffle cannot reorder, and restores slower with it, so it stays off. Delta coding
# across tokens does not pay (neighbouring tokens are barely correlated) and level 1
# compresses as well as level 3, faster. The figures, with their commands:
# docs/benchmarks/real-checkpoints.md, "Cold-tier compression of real KV", and
# docs/benchmarks/kv-cache.md.
SHUFFLE_DEFAULT: dict[str, bool] = {"float32": True, "float16": True, "uint8": False}

_LEN = struct.Struct("<I")
_KINDS = "biuf"   # numeric dtypes only: no objects, strings or void records


# -- keys ---------------------------------------------------------------------------------

def chain_keys(engine_id: str, tokens: Sequence[int], block: int) -> list[str]:
    """One hex key per full block of ``tokens``; a partial last block has none.

    ``key_i = sha256(digest_{i-1} || engine_id (UTF-8) || block i's token ids as <i8)``,
    with ``digest_{-1} = b""`` and ``digest`` the raw 32 bytes behind the hex key, so key i
    names the whole prefix ``tokens[:(i + 1) * block]`` for that engine.

    Raises:
        EngineError: ``block`` is not positive.
    """
    if block < 1:
        raise EngineError(f"KV block size must be positive, got {block}")
    ids = np.asarray(tokens, dtype="<i8").reshape(-1)
    engine = engine_id.encode()
    keys: list[str] = []
    prev = b""
    for start in range(0, len(ids) - block + 1, block):
        h = hashlib.sha256(prev + engine + ids[start:start + block].tobytes())
        prev = h.digest()
        keys.append(h.hexdigest())
    return keys


# -- block codec --------------------------------------------------------------------------

def default_shuffle(arrays: Mapping[str, np.ndarray]) -> bool:
    """The measured default for a block: that of the dtype holding most of its bytes."""
    by_dtype: dict[np.dtype[Any], int] = {}   # keyed by dtype: its .name is slow to build
    for a in arrays.values():
        by_dtype[a.dtype] = by_dtype.get(a.dtype, 0) + a.nbytes
    if not by_dtype:
        return False
    return SHUFFLE_DEFAULT.get(max(by_dtype, key=lambda d: by_dtype[d]).name, False)


def encode_block(arrays: Mapping[str, np.ndarray], shuffle: bool | None = None) -> bytes:
    """Serialize a block: ``u32 header length``, a JSON header, then the arrays' bytes.

    The header holds ``shuffle`` and ``[name, dtype, shape]`` per array in name order. The
    body is each array's C-order bytes in name order, or with ``shuffle`` its byte planes
    across the whole block: byte 0 of every element of every array, then byte 1 of the
    arrays whose items have one, and so on. ``shuffle=None`` takes :func:`default_shuffle`.

    Raises:
        EngineError: an array's dtype is not numeric.
    """
    names = sorted(arrays)
    flat = [_flat_bytes(name, arrays[name]) for name in names]
    if shuffle is None:
        shuffle = default_shuffle(arrays)
    header = json.dumps({"shuffle": shuffle, "arrays": [
        [name, arrays[name].dtype.str, list(arrays[name].shape)] for name in names]},
        separators=(",", ":")).encode()
    body = [_shuffle(flat).data] if shuffle else [f.data for f in flat]
    return b"".join([_LEN.pack(len(header)), header, *body])


def decode_block(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an :func:`encode_block` payload (new, writable arrays).

    Raises:
        EngineError: the payload is malformed.
    """
    try:
        shuffle, specs, body = _parse(data)
        if len(body) != sum(n * dt.itemsize for _, dt, _, n in specs):
            raise ValueError(f"body is {len(body)} bytes, the header describes another size")
    except (ValueError, TypeError, KeyError, struct.error) as e:
        raise EngineError(f"malformed KV block: {e}") from e
    if not shuffle:
        return _split(body, specs)
    out = {name: np.empty(shape, dt) for name, dt, shape, _ in specs}
    _unshuffle(body, [out[name].reshape(-1).view(np.uint8).reshape(n, dt.itemsize)
                      for name, dt, _, n in specs])
    return out


_Spec = tuple[str, np.dtype[Any], tuple[int, ...], int]   # name, dtype, shape, elements


def _parse(data: bytes) -> tuple[bool, list[_Spec], memoryview]:
    (n,) = _LEN.unpack_from(data)
    header = json.loads(data[_LEN.size:_LEN.size + n])
    specs: list[_Spec] = []
    for name, dtype, shape in header["arrays"]:
        dt = np.dtype(dtype)
        dims = tuple(int(d) for d in shape)
        if dt.kind not in _KINDS or any(d < 0 for d in dims):
            raise ValueError(f"array {name!r}: dtype {dtype} shape {shape} not allowed")
        specs.append((str(name), dt, dims, int(np.prod(dims, dtype=np.int64))))
    return bool(header["shuffle"]), specs, memoryview(data)[_LEN.size + n:]


def _split(body: memoryview, specs: list[_Spec]) -> dict[str, np.ndarray]:
    """Copies of the arrays laid end to end in ``body``."""
    out: dict[str, np.ndarray] = {}
    off = 0
    for name, dt, shape, n in specs:
        out[name] = np.frombuffer(body, dt, n, off).reshape(shape).copy()
        off += n * dt.itemsize
    return out


def _flat_bytes(name: str, a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as ``[elements, itemsize]`` uint8 (C order; copies if strided)."""
    if a.dtype.kind not in _KINDS:
        raise EngineError(f"KV block array {name!r} has dtype {a.dtype}, not a number type")
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, a.dtype.itemsize)


def _shuffle(flat: list[np.ndarray]) -> np.ndarray:
    """Byte planes across all arrays: plane 0 of each, plane 1 of each with one, ..."""
    out = np.empty(sum(f.size for f in flat), np.uint8)
    off = 0
    for plane in range(max((f.shape[1] for f in flat), default=0)):
        for f in flat:
            if f.shape[1] > plane:
                out[off:off + f.shape[0]] = f[:, plane]
                off += f.shape[0]
    return out


def _unshuffle(body: memoryview, flat: list[np.ndarray]) -> None:
    """Inverse of :func:`_shuffle`, writing into the ``[elements, itemsize]`` views."""
    src = np.frombuffer(body, np.uint8)
    off = 0
    for plane in range(max((f.shape[1] for f in flat), default=0)):
        for f in flat:
            if f.shape[1] > plane:
                f[:, plane] = src[off:off + f.shape[0]]
                off += f.shape[0]


# -- the store ----------------------------------------------------------------------------

@dataclass
class _Entry:
    data: bytes      # one zstd frame of an encode_block payload
    raw_len: int     # bytes of that payload
    shuffle: bool


@dataclass
class _Counters:
    hits_ram: int = 0
    hits_disk: int = 0
    misses: int = 0
    refused_ram: int = 0
    compress_s: float = 0.0
    compress_bytes: int = 0
    decompress_s: float = 0.0
    decompress_bytes: int = 0
    restore_s: float = 0.0


class ColdStore:
    """Compressed KV blocks of one engine, in RAM under a byte budget and optionally on disk.

    RAM holds zstd frames under ``ram_budget_bytes`` (compressed bytes), least recently used
    evicted first. Pinned blocks are never evicted (from RAM or disk). A pinned put evicts
    unpinned blocks to make room and is admitted even when the pinned blocks alone then
    exceed the budget (a warning says so); while they do, unpinned puts are refused from RAM
    (never at the cost of a pinned block) and only reach the disk. With ``state_dir`` every
    put is also written to ``state_dir/kv/<key>.rkv`` (see :mod:`rung.engines.kv_disk`)
    under ``disk_budget_bytes`` (None: unbounded); a block evicted from RAM stays on disk
    and a get promotes it back.

    The decode step's offload (an unpinned put with a disk tier) does no compression and no
    I/O: the block's arrays (the caller's own copy, as ``KVCache.read_block`` makes it) are
    staged and queued for the disk tier's writer thread, which compresses them, admits the
    frame to RAM (under the budget, as above) and writes the file; a get meanwhile serves
    the staged arrays (a RAM hit). Staged blocks are outside the RAM budget, at most the
    write queue's ``max_pending`` (+1 being written); a full queue drops its oldest block,
    staged arrays and file both (``writes_dropped``). Pinned puts (task heads at start-up)
    and a store without a disk tier (or closed) compress in the caller. :meth:`flush` waits
    for the queue, :meth:`close` flushes and stops the writer (bounded waits); what a crash
    can lose is in :mod:`rung.engines.kv_disk`: cache blocks, never answers.

    A lock guards the store (one zstd context each way in the caller, another for the
    writer), so worker threads may share it; compression in the writer and disk I/O run
    outside it.
    """

    def __init__(self, engine_id: str, ram_budget_bytes: int, level: int = 1,
                 state_dir: str | os.PathLike[str] | None = None,
                 disk_budget_bytes: int | None = None, shuffle: bool | None = None,
                 max_pending: int = MAX_PENDING) -> None:
        """Raises: EngineError: a bad budget, level or queue size, or ``state_dir`` cannot
        be opened."""
        if ram_budget_bytes < 0 or (disk_budget_bytes is not None and disk_budget_bytes < 0):
            raise EngineError("cold KV budgets must not be negative")
        if not 1 <= level <= zstandard.MAX_COMPRESSION_LEVEL:
            raise EngineError(f"zstd level {level} is out of range",
                              f"use 1..{zstandard.MAX_COMPRESSION_LEVEL}")
        self.engine_id = engine_id
        self.ram_budget = ram_budget_bytes
        self.level = level
        self.shuffle = shuffle
        self._lock = threading.Lock()
        self._cctx = zstandard.ZstdCompressor(level=level)
        self._wctx = zstandard.ZstdCompressor(level=level)   # the writer thread's
        self._dctx = zstandard.ZstdDecompressor()
        self._ram: OrderedDict[str, _Entry] = OrderedDict()   # least recently used first
        self._staged: dict[str, Mapping[str, np.ndarray]] = {}   # queued, not compressed yet
        self._pinned: set[str] = set()
        self._bytes_ram = self._bytes_raw = self._bytes_pinned = 0
        self._n = _Counters()
        self._disk = (DiskTier(Path(state_dir) / "kv", engine_id, disk_budget_bytes,
                               max_pending) if state_dir is not None else None)

    # -- public interface -----------------------------------------------------------------

    def put(self, key: str, arrays: Mapping[str, np.ndarray], pinned: bool = False) -> bool:
        """Store a block (``[block, ...]`` per buffer) under ``key`` from :func:`chain_keys`.

        A key already held is only marked used (equal keys mean equal KV). With an open disk
        tier an unpinned block is staged and queued (see the class): the arrays must not be
        changed afterwards.

        Returns:
            Whether the block is held afterwards (RAM, staged, or disk); False when RAM
            refused it (no room beside pinned blocks) and there is no disk or no room on it.
            A staged block counts as held: the writer may still drop it (a full queue) or
            RAM and disk refuse it.

        Raises:
            EngineError: ``key`` is not a sha256 hex digest, or an array is not numeric.
        """
        _check_key(key)
        disk = self._disk if self._disk is not None and not self._disk.closed else None
        in_ram = False
        with self._lock:
            if pinned:
                self._pin(key)
            entry = self._ram.get(key)
            if entry is not None:
                self._ram.move_to_end(key)
                in_ram = True
            elif key in self._staged:
                return True
            elif disk is not None and not pinned:
                _check_arrays(arrays)
                self._staged[key] = arrays
            else:
                entry = self._compress(arrays)
                in_ram = self._admit(key, entry)
            protected = frozenset(self._pinned)
        if disk is None:
            return in_ram
        if entry is None:   # staged: the writer compresses it, then drops the arrays
            if disk.write(key, lambda: self._produce(key), protected, self._unstage):
                return True
            with self._lock:   # closed meanwhile: compress here instead
                arrays = self._staged.pop(key, arrays)
                entry = self._compress(arrays)
                return self._admit(key, entry)
        record = Record(entry.data, entry.raw_len, entry.shuffle, self.level)
        return disk.write(key, record, protected) or in_ram

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """The block under ``key`` (RAM or staged, then disk, promoted to RAM), or None."""
        t0 = time.perf_counter()
        with self._lock:
            entry = self._ram.get(key)
            staged = self._staged.get(key) if entry is None else None
            if entry is not None or staged is not None:
                if entry is not None:
                    self._ram.move_to_end(key)
                    hot = self._decompress(entry)
                else:
                    assert staged is not None
                    hot = {name: np.array(a, copy=True) for name, a in staged.items()}
                self._n.hits_ram += 1
                self._n.restore_s += time.perf_counter() - t0
                return hot
        record = self._disk.read(key) if self._disk is not None else None
        with self._lock:
            arrays = self._restore(key, record)
            if arrays is None:
                self._n.misses += 1
            else:
                self._n.hits_disk += 1
                self._n.restore_s += time.perf_counter() - t0
            return arrays

    def contains(self, key: str) -> bool:
        """Whether ``key`` is held in RAM, staged or on disk (not counted as a hit or
        miss)."""
        with self._lock:
            if key in self._ram or key in self._staged:
                return True
        return self._disk is not None and key in self._disk

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def longest_prefix(self, keys: Sequence[str]) -> int:
        """How many leading ``keys`` are held (RAM, staged or disk)."""
        for n, key in enumerate(keys):
            if not self.contains(key):
                return n
        return len(keys)

    def pin(self, key: str) -> bool:
        """Keep ``key`` from eviction (RAM and disk); False if it is not held."""
        with self._lock:
            if (key not in self._ram and key not in self._staged
                    and (self._disk is None or key not in self._disk)):
                return False
            self._pin(key)
            return True

    def unpin(self, key: str) -> None:
        """Make ``key`` evictable again (evicting now if RAM is over its budget)."""
        with self._lock:
            if key not in self._pinned:
                return
            self._pinned.discard(key)
            if key in self._ram:
                self._bytes_pinned -= len(self._ram[key].data)
            self._evict_until(self.ram_budget)

    def hold_writes(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the disk tier's writer starts no new block: ``PrefixCache.save``
        queues a leaving sequence's blocks in one, so that the decode step's offload does not
        share the interpreter with their compression (see ``DiskTier.hold``)."""
        disk = self._disk
        return contextlib.nullcontext() if disk is None else disk.hold()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) until every queued block is compressed and
        written; whether it is (True at once without a disk tier)."""
        return self._disk is None or self._disk.flush(timeout)

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Flush (at most ``timeout`` seconds) and stop the disk tier's writer; later puts
        compress in the caller and stay in RAM. Whether every queued block was written."""
        return self._disk is None or self._disk.close(timeout)

    def stats(self) -> dict[str, int | float]:
        """Counters and sizes; rates are cumulative raw MB (1e6 bytes) per second."""
        with self._lock:
            n = self._n
            out: dict[str, int | float] = {
                "hits_ram": n.hits_ram, "hits_disk": n.hits_disk, "misses": n.misses,
                "entries_ram": len(self._ram), "entries_pinned": len(self._pinned),
                "entries_staged": len(self._staged),
                "bytes_ram": self._bytes_ram, "bytes_raw": self._bytes_raw,
                "bytes_pinned": self._bytes_pinned, "refused_ram": n.refused_ram,
                "compression_ratio": self._bytes_raw / self._bytes_ram if self._bytes_ram else 0.0,
                "compress_mb_s": _rate(n.compress_bytes, n.compress_s),
                "decompress_mb_s": _rate(n.decompress_bytes, n.decompress_s),
                "restore_ms": n.restore_s * 1e3,
            }
        disk = self._disk
        if disk is None:
            out.update(entries_disk=0, bytes_disk=0, dropped_corrupt=0, refused_disk=0,
                       disk_errors=0, writes_pending=0, writes_dropped=0)
        else:
            out.update(entries_disk=len(disk), bytes_disk=disk.nbytes,
                       dropped_corrupt=disk.dropped_corrupt, refused_disk=disk.refused,
                       disk_errors=disk.errors, writes_pending=disk.pending,
                       writes_dropped=disk.dropped_writes)
        return out

    # -- the writer thread's part -----------------------------------------------------------

    def _produce(self, key: str) -> Record | None:
        """Compress a staged block (in the writer thread, outside the lock) and admit it to
        RAM; its record for the file, None if it is not staged any more."""
        with self._lock:
            arrays = self._staged.get(key)
            entry = self._ram.get(key)
        if arrays is None:
            return None
        if entry is None:
            entry = self._compress(arrays, self._wctx, locked=False)
            with self._lock:
                if key in self._ram:
                    self._ram.move_to_end(key)
                else:
                    self._admit(key, entry)
        return Record(entry.data, entry.raw_len, entry.shuffle, self.level)

    def _unstage(self, key: str) -> None:
        """The writer is done with ``key`` (written, failed or dropped): forget its arrays."""
        with self._lock:
            self._staged.pop(key, None)

    # -- internals (callers hold the lock) ------------------------------------------------

    def _compress(self, arrays: Mapping[str, np.ndarray],
                  cctx: zstandard.ZstdCompressor | None = None, locked: bool = True) -> _Entry:
        """Encode and compress ``arrays`` with ``cctx`` (the caller's: the lock is held;
        the writer's: ``locked=False``, the counters are taken under the lock)."""
        t0 = time.perf_counter()
        shuffle = default_shuffle(arrays) if self.shuffle is None else self.shuffle
        payload = encode_block(arrays, shuffle)
        data = (cctx or self._cctx).compress(payload)
        dt = time.perf_counter() - t0
        with contextlib.nullcontext() if locked else self._lock:
            self._n.compress_s += dt
            self._n.compress_bytes += len(payload)
        return _Entry(data, len(payload), shuffle)

    def _decompress(self, entry: _Entry) -> dict[str, np.ndarray]:
        """Raises: EngineError: the frame or the payload inside is malformed."""
        t0 = time.perf_counter()
        try:
            payload = self._dctx.decompress(entry.data, max_output_size=entry.raw_len)
        except zstandard.ZstdError as e:
            raise EngineError(f"cold KV block does not decompress: {e}") from e
        if len(payload) != entry.raw_len:
            raise EngineError(f"cold KV block is {len(payload)} bytes, expected {entry.raw_len}")
        arrays = decode_block(payload)
        self._n.decompress_s += time.perf_counter() - t0
        self._n.decompress_bytes += entry.raw_len
        return arrays

    def _restore(self, key: str, record: Record | None) -> dict[str, np.ndarray] | None:
        """Decode a block read from disk and promote it to RAM; None if absent or bad."""
        if record is None or self._disk is None:
            return None
        entry = _Entry(record.payload, record.raw_len, record.shuffle)
        try:
            arrays = self._decompress(entry)
        except EngineError as e:
            self._disk.drop(key, str(e))
            return None
        if key in self._ram:
            self._ram.move_to_end(key)
        else:
            self._admit(key, entry)
        return arrays

    def _pin(self, key: str) -> None:
        if key not in self._pinned:
            self._pinned.add(key)
            if key in self._ram:
                self._bytes_pinned += len(self._ram[key].data)

    def _admit(self, key: str, entry: _Entry) -> bool:
        """Insert into RAM, evicting unpinned LRU entries; False if refused (see class)."""
        size, pinned = len(entry.data), key in self._pinned
        if not pinned and self._bytes_pinned + size > self.ram_budget:
            self._n.refused_ram += 1
            return False
        self._evict_until(self.ram_budget - size)
        self._ram[key] = entry
        self._bytes_ram += size
        self._bytes_raw += entry.raw_len
        if pinned:
            self._bytes_pinned += size
            if self._bytes_pinned > self.ram_budget:
                log.warning("pinned cold KV blocks hold %d bytes, over the RAM budget of %d; "
                            "unpinned blocks are refused from RAM until some are unpinned",
                            self._bytes_pinned, self.ram_budget)
        return True

    def _evict_until(self, limit: int) -> None:
        """Evict unpinned entries, least recently used first, until RAM holds <= ``limit``."""
        for key in list(self._ram):
            if self._bytes_ram <= limit:
                return
            if key not in self._pinned:
                entry = self._ram.pop(key)
                self._bytes_ram -= len(entry.data)
                self._bytes_raw -= entry.raw_len


def _check_arrays(arrays: Mapping[str, np.ndarray]) -> None:
    """Raises: EngineError: an array is not numeric (what ``encode_block`` refuses)."""
    for name, a in arrays.items():
        if a.dtype.kind not in _KINDS:
            raise EngineError(f"KV block array {name!r} has dtype {a.dtype}, not a number type")


def _check_key(key: str) -> None:
    if not KEY_RE.fullmatch(key):
        raise EngineError(f"cold KV key {key[:80]!r} is not a sha256 hex digest",
                          "make keys with chain_keys")


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds if seconds > 0 else 0.0
