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

Writes happen in the background: :meth:`DiskTier.write` only queues a block (a bounded queue,
``max_pending`` blocks) and returns; one writer thread owned by the tier drains the queue
(making the record first when it was queued as a callable: the store compresses there, off
the decode step), packs it, and writes a ``*.tmp`` file in the same folder that
``os.replace`` renames into place. Until its file is in the index a queued block is served
from memory (:meth:`DiskTier.read` hands out the queued record) or is a miss; a reader never
sees a file being written. A full queue drops its oldest write (``dropped_writes``) rather
than make the decode step wait. The writer is supervised: an exception while writing a block
(an OS error, a bug) drops that block's file, counts in ``errors`` and is logged with its
traceback once (the first of a run of failures; the next success says how many blocks the
run lost); the thread goes on with the next block. :meth:`DiskTier.flush` waits (bounded)
until the queue is written, :meth:`DiskTier.close` flushes and stops the thread; an open
tier is closed when the interpreter exits (``atexit``, bounded wait).

Nothing is fsynced. A crash of the process leaves the old file or the new, never half of
one under the key's name (the rename is atomic), and loses the blocks still queued. A power
loss can also lose or tear recently written files: the folder is a cache, so what a crash
can lose is a cache block (its prefix is prefilled again), never an answer (answers live in
the fsynced delivery journal). A file that is not exactly right (unknown magic or version,
another engine id or key, a length that does not match, a failed checksum: a torn or
zero-filled write) is never used: it is deleted, a warning names the file and the reason,
and ``dropped_corrupt`` counts it. Start-up reads and checks every file (and deletes
``*.tmp`` leftovers of a crash, counted the same way); every read checks again, since files
can rot after start-up. Deleting rather than renaming aside keeps bad files from filling a
small disk outside the budget.

The index (key -> file size, least recently used first) and the queue are guarded by one
lock; file I/O happens outside it, so a slow disk does not block lookups. One process owns a
folder: a second one starting on it would delete the first one's in-flight ``*.tmp`` files.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import struct
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
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
    """Write ``data`` to ``path`` through a ``*.tmp`` file and ``os.replace``: a crash of the
    process leaves the old file or the new, never half. Not fsynced (see the module
    docstring: a power loss can tear it, and the checksum catches that).

    Raises:
        OSError: the write failed (the temp file is removed).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem[:16] + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# a block queued for the writer: its record, or a callable that makes it in the writer
# (None: nothing to write after all)
Make = Record | Callable[[], Record | None]
MAX_PENDING = 64        # blocks queued for the writer before the oldest is dropped
CLOSE_WAIT_S = 5.0      # how long close() (and interpreter exit) waits for queued writes


@dataclass
class _Job:
    key: str
    make: Make
    protected: frozenset[str]
    done: Callable[[str], None] | None   # called once the job is over: written, failed, dropped
    record: Record | None = None         # once made: served to reads until the file is indexed


_OPEN: weakref.WeakSet[DiskTier] = weakref.WeakSet()


@atexit.register
def _close_open_tiers() -> None:
    """Flush and stop every open tier's writer when the interpreter exits."""
    for tier in list(_OPEN):
        tier.close()


class DiskTier:
    """``.rkv`` files of one engine in one folder, under an optional byte budget (LRU).

    Recency survives a restart through the files' mtimes: start-up orders by mtime and every
    read bumps it. Writes are queued for one writer thread (see the module docstring).
    """

    def __init__(self, root: Path, engine_id: str, budget_bytes: int | None = None,
                 max_pending: int = MAX_PENDING) -> None:
        """Open (creating it if needed) ``root`` and index the valid files in it.

        Raises:
            EngineError: the folder cannot be created or listed, or ``max_pending`` < 1.
        """
        if max_pending < 1:
            raise EngineError(f"the cold KV write queue needs room for a block, got "
                              f"{max_pending}")
        self.root = root
        self.engine_id = engine_id
        self.budget = budget_bytes
        self.max_pending = max_pending
        self.dropped_corrupt = 0
        self.refused = 0         # writes that did not fit the budget
        self.errors = 0          # errors on write (the writer's) or read
        self.dropped_writes = 0  # queued writes dropped because the queue was full
        self.written = 0         # files written
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)   # the queue moved or the writer idles
        self._index: OrderedDict[str, int] = OrderedDict()   # key -> file bytes, LRU first
        self._bytes = 0                                       # indexed + being written
        self._queue: OrderedDict[str, _Job] = OrderedDict()   # oldest first
        self._current: _Job | None = None                     # the job the writer is on
        self._thread: threading.Thread | None = None          # started by the first write
        self._closed = False
        self._held = 0           # hold() contexts open: the writer waits for them to end
        self._failing = 0        # blocks lost in the current run of writer failures
        try:
            root.mkdir(parents=True, exist_ok=True)
            entries = sorted(root.iterdir())
        except OSError as e:
            raise EngineError(f"cannot open the cold KV folder {root}: {e}",
                              "check state_dir and its permissions") from e
        self._load(entries)
        _OPEN.add(self)

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
        _unlink(self._make_room(0, ())[1])

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
        """Whether ``key`` is on disk or queued to be written."""
        with self._lock:
            return key in self._index or self._job(key) is not None

    def __len__(self) -> int:
        """Files on disk (not counting queued writes)."""
        with self._lock:
            return len(self._index)

    @property
    def nbytes(self) -> int:
        """Bytes of the indexed files."""
        with self._lock:
            return sum(self._index.values())

    @property
    def pending(self) -> int:
        """Writes queued or being written."""
        with self._lock:
            return len(self._queue) + (self._current is not None)

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def path(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    # -- write, read, drop ----------------------------------------------------------------

    def write(self, key: str, make: Make, protected: Collection[str] = (),
              done: Callable[[str], None] | None = None) -> bool:
        """Queue ``key``'s block for the writer and return at once, or mark it used if it is
        on disk or queued already.

        ``make`` is the record, or a callable the writer calls to make it (None: nothing to
        write). Least recently used files not in ``protected`` are deleted to make room when
        the block is written. A full queue drops its oldest job. ``done(key)`` is called
        once this write is over: written, failed, dropped, or at once when the key was
        there already (not when this returns False).

        Returns:
            Whether the block is on disk or queued afterwards (False: the tier is closed).
        """
        dropped: _Job | None = None
        with self._cond:
            if self._closed:
                return False
            there = key in self._index or self._job(key) is not None
            if there:
                self._touch(key)
            else:
                if len(self._queue) >= self.max_pending:
                    _, dropped = self._queue.popitem(last=False)
                    self.dropped_writes += 1
                self._queue[key] = _Job(key, make, frozenset(protected), done)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name=f"rung-kv-writer-{self.root.name}")
                    self._thread.start()
                self._cond.notify_all()
        if dropped is not None:
            log.debug("cold KV write queue full (%d): dropped the oldest write, %s",
                      self.max_pending, dropped.key)
            _call_done(dropped)
        if there and done is not None:
            done(key)
        return True

    def read(self, key: str) -> Record | None:
        """The checked record of ``key``; None if absent, unreadable or corrupt (dropped).

        A block still queued is served from memory once its record is made (a miss before).
        """
        with self._lock:
            if key not in self._index:
                job = self._job(key)
                if job is None or job.record is not None:
                    return None if job is None else job.record
                return None if callable(job.make) else job.make
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

    # -- the writer -------------------------------------------------------------------------

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the writer from starting another block while the caller queues several (a
        leaving sequence's): the step that queues them then does not share the interpreter
        with the writer's compression. The block being written goes on."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is over (at most ``timeout`` seconds); whether it
        is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._current is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Flush (waiting at most ``timeout`` seconds), then stop the writer; later writes
        are refused. Returns whether every queued write was over; the ones still queued
        then are dropped (a warning counts them)."""
        flushed = self.flush(timeout)
        with self._cond:
            if self._closed:
                return flushed
            self._closed = True
            left = list(self._queue.values())
            self._queue.clear()
            self.dropped_writes += len(left)
            thread = self._thread
            self._cond.notify_all()
        _OPEN.discard(self)
        if left or not flushed:
            log.warning("cold KV writer: %d queued blocks not written at close (a block "
                        "still being written after %.1f s)", len(left), timeout)
        for job in left:
            _call_done(job)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=0 if not flushed else max(timeout, 0.1))
        return flushed

    def _run(self) -> None:
        """The writer thread: one job at a time until the tier closes."""
        while True:
            with self._cond:
                while (not self._queue or self._held) and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    self._thread = None
                    return
                _, job = self._queue.popitem(last=False)
                self._current = job
            try:
                self._write_job(job)
            except Exception:   # supervised: log, drop this block, go on with the next
                self._failed(job)
            finally:
                with self._cond:
                    self._current = None
                    self._cond.notify_all()
                _call_done(job)

    def _write_job(self, job: _Job) -> None:
        record = job.make() if callable(job.make) else job.make
        if record is None:
            return
        data = pack_record(record, self.engine_id, job.key)
        with self._lock:
            job.record = record
            if job.key in self._index:
                self._touch(job.key)
                return
            fits, victims = self._make_room(len(data), job.protected)
            if fits:
                self._bytes += len(data)   # reserved while the file is written
            else:
                self.refused += 1
        _unlink(victims)
        if not fits:
            return
        try:
            atomic_write(self.path(job.key), data)
        except BaseException:
            with self._lock:
                self._bytes -= len(data)
            raise
        with self._lock:
            self._index[job.key] = len(data)
            self.written += 1
            lost, self._failing = self._failing, 0
        if lost:
            log.warning("cold KV writer: writing again after %d failed blocks", lost)

    def _failed(self, job: _Job) -> None:
        with self._lock:
            self.errors += 1
            self._failing += 1
            first = self._failing == 1
        if first:
            log.error("cold KV writer: block %s not written, dropped (the next failures are "
                      "counted, not logged, until a write succeeds)", self.path(job.key),
                      exc_info=True)

    def _job(self, key: object) -> _Job | None:
        """The queued or current job of ``key`` (caller holds the lock)."""
        job = self._queue.get(key) if isinstance(key, str) else None
        if job is None and self._current is not None and self._current.key == key:
            job = self._current
        return job

    # -- budget (callers hold the lock) ---------------------------------------------------

    def _touch(self, key: str) -> None:
        if key in self._index:
            self._index.move_to_end(key)
            with contextlib.suppress(OSError):
                os.utime(self.path(key))

    def _make_room(self, size: int, protected: Collection[str]) -> tuple[bool, list[Path]]:
        """Evict LRU files (not ``protected``) until ``size`` more bytes fit: whether they
        do, and the evicted files for the caller to delete outside the lock."""
        victims: list[Path] = []
        if self.budget is None:
            return True, victims
        for key in list(self._index):
            if self._bytes + size <= self.budget:
                break
            if key not in protected:
                self._bytes -= self._index.pop(key)
                victims.append(self.path(key))
        return self._bytes + size <= self.budget, victims


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def _call_done(job: _Job) -> None:
    if job.done is None:
        return
    try:
        job.done(job.key)
    except Exception:
        log.exception("cold KV writer: the completion of block %s failed", job.key)
