"""The disk half of the cold KV tier: one ``.rkv`` file per block under ``state_dir/kv/``.

File format (version 1), little-endian::

    magic          8 bytes   b"RUNGKV\\x00\\x01"
    version        u16       FORMAT_VERSION
    flags          u8        bit 0: the payload's byte planes are shuffled
    level          i8        zstd level the payload was compressed with
    payload_len    u64       bytes of the zstd payload after the header
    raw_len        u64       bytes of the payload once decompressed
    sha256         32 bytes  of the zstd payload
    engine_len     u16       then the engine id, UTF-8
    key_len        u16       then the block's key, ASCII (must equal the file name)
    payload        payload_len bytes: one zstd frame of ``kv_store.encode_block``'s output

Writes are atomic: a ``*.tmp`` file in the same folder, fsync, ``os.replace``, fsync of the
folder. A file that is not exactly right (unknown magic or version, another engine id or key,
a length that does not match, a failed checksum) is never used: it is deleted, a warning
names the file and the reason, and ``dropped_corrupt`` counts it. Start-up reads and checks
every file (and deletes ``*.tmp`` leftovers of a crash, counted the same way); every read
checks again, since files can rot after start-up. Deleting rather than renaming aside keeps
bad files from filling a small disk outside the budget.

The index (key -> file size, least recently used first) is guarded by a lock; file I/O
happens outside it, so a slow fsync does not block lookups. One process owns a folder: a
second one starting on it would delete the first one's in-flight ``*.tmp`` files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import struct
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from rung.engines.errors import EngineError

log = logging.getLogger(__name__)

MAGIC = b"RUNGKV\x00\x01"
FORMAT_VERSION = 1
SUFFIX = ".rkv"
# magic, version, flags, level, payload_len, raw_len, sha256, engine_len, key_len
_HEADER = struct.Struct("<8sHBbQQ32sHH")
_SHUFFLED = 0x01
KEY_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Record:
    """One block as stored: its zstd payload and what is needed to decode it."""

    payload: bytes   # one zstd frame
    raw_len: int     # decompressed size
    shuffle: bool
    level: int


class CorruptFile(Exception):
    """A ``.rkv`` file failed a check; the message is the reason."""


def pack_record(record: Record, engine_id: str, key: str) -> bytes:
    """The bytes of a ``.rkv`` file holding ``record``."""
    engine, name = engine_id.encode(), key.encode("ascii")
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, _SHUFFLED if record.shuffle else 0,
                          record.level, len(record.payload), record.raw_len,
                          hashlib.sha256(record.payload).digest(), len(engine), len(name))
    return b"".join((header, engine, name, record.payload))


def unpack_record(data: bytes, engine_id: str, key: str) -> Record:
    """Check a ``.rkv`` file's bytes and return its record.

    Raises:
        CorruptFile: bad magic or version, another engine or key, wrong length, bad checksum.
    """
    if len(data) < _HEADER.size:
        raise CorruptFile(f"{len(data)} bytes is shorter than the header (truncated)")
    (magic, version, flags, level, payload_len, raw_len, digest, engine_len,
     key_len) = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptFile(f"unknown magic {magic!r}")
    if version != FORMAT_VERSION:
        raise CorruptFile(f"format version {version} is not supported (want {FORMAT_VERSION})")
    if flags & ~_SHUFFLED:
        raise CorruptFile(f"unknown flags {flags:#04x}")
    start = _HEADER.size + engine_len + key_len
    if len(data) != start + payload_len:
        raise CorruptFile(f"{len(data)} bytes, the header says {start + payload_len} "
                          "(truncated or padded)")
    engine = data[_HEADER.size:_HEADER.size + engine_len].decode(errors="replace")
    if engine != engine_id:
        raise CorruptFile(f"written by engine {engine!r}, this is {engine_id!r}")
    if data[_HEADER.size + engine_len:start] != key.encode("ascii"):
        raise CorruptFile("the key in the header does not match the file name")
    payload = data[start:]
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptFile("payload checksum mismatch")
    return Record(payload, raw_len, bool(flags & _SHUFFLED), level)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new, never half.

    Raises:
        OSError: the write failed (the temp file is removed).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem[:16] + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DiskTier:
    """``.rkv`` files of one engine in one folder, under an optional byte budget (LRU).

    Recency survives a restart through the files' mtimes: start-up orders by mtime and every
    read bumps it.
    """

    def __init__(self, root: Path, engine_id: str, budget_bytes: int | None = None) -> None:
        """Open (creating it if needed) ``root`` and index the valid files in it.

        Raises:
            EngineError: the folder cannot be created or listed.
        """
        self.root = root
        self.engine_id = engine_id
        self.budget = budget_bytes
        self.dropped_corrupt = 0
        self.refused = 0        # writes that did not fit the budget
        self.errors = 0         # OS errors on write or read
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()   # key -> file bytes, LRU first
        self._pending: dict[str, int] = {}                    # writes in flight
        self._bytes = 0                                       # indexed + pending
        try:
            root.mkdir(parents=True, exist_ok=True)
            entries = sorted(root.iterdir())
        except OSError as e:
            raise EngineError(f"cannot open the cold KV folder {root}: {e}",
                              "check state_dir and its permissions") from e
        self._load(entries)

    # -- start-up -----------------------------------------------------------------------

    def _load(self, entries: list[Path]) -> None:
        found: list[tuple[float, str, int]] = []
        for path in entries:
            if path.suffix == ".tmp":
                self._drop_file(path, "temp file of an interrupted write")
            elif path.suffix == SUFFIX and path.is_file():
                item = self._check_file(path)
                if item is not None:
                    found.append(item)
        for _, key, size in sorted(found):
            self._index[key] = size
            self._bytes += size
        self._make_room(0, ())

    def _check_file(self, path: Path) -> tuple[float, str, int] | None:
        """(mtime, key, size) of a valid file; a bad one is dropped and gives None."""
        key = path.stem
        if not KEY_RE.fullmatch(key):
            self._drop_file(path, "the file name is not a cold KV key")
            return None
        try:
            data = path.read_bytes()
            mtime = path.stat().st_mtime
        except OSError as e:
            self._drop_file(path, f"unreadable: {e}")
            return None
        try:
            unpack_record(data, self.engine_id, key)
        except CorruptFile as e:
            self._drop_file(path, str(e))
            return None
        return mtime, key, len(data)

    # -- queries --------------------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._index

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    @property
    def nbytes(self) -> int:
        """Bytes of the indexed files."""
        with self._lock:
            return sum(self._index.values())

    def path(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    # -- write, read, drop ----------------------------------------------------------------

    def write(self, key: str, record: Record, protected: Collection[str] = ()) -> bool:
        """Store ``record`` under ``key`` unless it is there already (then mark it used).

        Least recently used files not in ``protected`` are deleted to make room.

        Returns:
            Whether the block is on disk afterwards (False: no room, or an OS error).
        """
        data = pack_record(record, self.engine_id, key)
        with self._lock:
            if key in self._index or key in self._pending:
                self._touch(key)
                return True
            if not self._make_room(len(data), protected):
                self.refused += 1
                return False
            self._pending[key] = len(data)
            self._bytes += len(data)
        try:
            atomic_write(self.path(key), data)
        except OSError as e:
            log.warning("cannot write cold KV file %s: %s", self.path(key), e)
            with self._lock:
                self._bytes -= self._pending.pop(key)
                self.errors += 1
            return False
        with self._lock:
            self._index[key] = self._pending.pop(key)
        return True

    def read(self, key: str) -> Record | None:
        """The checked record of ``key``; None if absent, unreadable or corrupt (dropped)."""
        with self._lock:
            if key not in self._index:
                return None
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._forget(key)
            return None
        except OSError as e:
            log.warning("cannot read cold KV file %s: %s", path, e)
            with self._lock:
                self.errors += 1
            return None
        try:
            record = unpack_record(data, self.engine_id, key)
        except CorruptFile as e:
            self.drop(key, str(e))
            return None
        with self._lock:
            if key in self._index:
                self._touch(key)
        return record

    def drop(self, key: str, reason: str) -> None:
        """Delete ``key``'s file as corrupt: warn, count, forget."""
        self._forget(key)
        self._drop_file(self.path(key), reason)

    def _drop_file(self, path: Path, reason: str) -> None:
        log.warning("dropping cold KV file %s: %s", path, reason)
        with self._lock:
            self.dropped_corrupt += 1
        with contextlib.suppress(OSError):
            path.unlink()

    def _forget(self, key: str) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self._bytes -= size

    # -- budget (callers hold the lock) ---------------------------------------------------

    def _touch(self, key: str) -> None:
        if key in self._index:
            self._index.move_to_end(key)
            with contextlib.suppress(OSError):
                os.utime(self.path(key))

    def _make_room(self, size: int, protected: Collection[str]) -> bool:
        """Evict LRU files (not ``protected``) until ``size`` more bytes fit; False if not."""
        if self.budget is None:
            return True
        for key in list(self._index):
            if self._bytes + size <= self.budget:
                break
            if key not in protected:
                self._bytes -= self._index.pop(key)
                with contextlib.suppress(OSError):
                    self.path(key).unlink()
        return self._bytes + size <= self.budget
