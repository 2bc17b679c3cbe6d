"""The delivery journal: every request durably recorded before the broker hears it was
received, every answer recorded before it is published, every duplicate recognised.

One SQLite file in ``state_dir`` (WAL, ``synchronous=FULL``, and a checkpoint after every
write but the delivery marks: a row is in the database file itself, not only in the WAL,
once ``record`` returns, so a WAL cut short after a crash cannot take an acknowledged
request with it; a WAL that ends in a damaged tail is reported at open, see ``wal.py``).
A row's life::

    record() -> pending --answer()--> answered --delivered()--> delivered
                  |  ^ started(): attempts+1   ^ a restart republishes rows left here
                  |                           `--dead()--> dead (the broker refused it)
    a restart re-runs rows left pending (or answers ``expired``); one started
    ``max_attempts`` times without an answer is answered ``internal`` (quarantined)

Duplicates: a request that names itself (MQTT v5 Correlation Data or the payload's ``id``)
has a key over its reply address, id, topic and payload; a redelivery of it is recognised
while the row is kept (``retention_s`` after delivery), so it is answered once. A request
without an id is recognised only as a broker redelivery of a row not yet delivered (same
packet id and content): two equal anonymous requests are two requests.

Requests that came as OPC UA method calls (rung's OPC UA server) are rows too, their topic
``opcua:...``: answered to the caller and kept (``settle``, never published), left out of
``pending()`` unless asked for (MQTT recovery and the fleet hand-over never see them).

A file that fails SQLite's integrity check is moved aside (``journal.db.corrupt-<time>``)
and a new one started; nothing from it is used.

The files must stay the ones opened: SQLite writes on through its open descriptors when
``journal.db`` (or its ``-wal``/``-shm``) is deleted or replaced, so the journal keeps the
device and inode of each and ``check_files`` compares them with what the path names now
(a ``stat`` per file). Once they differ the journal has *vanished*: every write fails
from then on (``JournalError``: requests are answered ``unavailable``, never recorded
where no restart finds them) and ``rung serve``'s storage check stops the daemon (exit 70).

Off the event loop (``attach``, what ``rung serve`` does): every write goes to one writer
thread with its own connection, which takes whatever is queued (in order), runs it as one
transaction, commits (one fsync) and checkpoints once, then hands the results back to the
loop; the loop never waits on SQLite's I/O. The guarantees stay those above: a recorded
request's future resolves (and the link acknowledges it) only after its commit and
checkpoint; answers are published only after ``settled`` (every answer written before the
publish is durable); the queue is one FIFO, so writes land in the order they were made.
Reads stay on the caller's thread (WAL readers never wait for the writer) and see what
the writer committed, plus the writes still in flight: an answer being written counts as
answered, a delivery being marked no longer counts as undelivered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import queue
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rung.daemon.journal import wal
from rung.engines.errors import RungError

log = logging.getLogger("rung.journal")

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT UNIQUE,            -- dedupe key (NULL once an anonymous row is delivered)
    received REAL NOT NULL,     -- wall clock, seconds
    expires REAL,               -- wall clock deadline from MQTT v5 Message Expiry, or NULL
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    response_topic TEXT,        -- v5 Response Topic
    correlation BLOB,           -- v5 Correlation Data
    state TEXT NOT NULL,        -- pending | answered | delivered
    reply_topic TEXT,
    response BLOB,
    updated REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,  -- times the model started on it
    note TEXT                   -- why a row was quarantined or dead-lettered
);
CREATE INDEX IF NOT EXISTS entries_state ON entries(state);
"""


MAX_BATCH = 256   # writes in one transaction of the writer thread
# the topic prefix of a request that came as an OPC UA method call (rung's OPC UA server):
# answered to its caller and kept for a repeated call (``settle``), never published; left
# out of ``pending()`` (MQTT recovery, fleet hand-over) unless asked for
OPCUA_PREFIX = "opcua:"

# SQLite errors that mean the file itself is damaged or not our journal (SQLITE_ERROR: the
# ``entries`` table or its columns are missing); any other error is not moved aside.
_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_ERROR")


class JournalError(RungError):
    """The journal cannot be opened or written (disk full, permissions)."""


_SIDES = ("", "-wal", "-shm")   # the database file and SQLite's two beside it


@dataclass
class Entry:
    """One received request message, as recorded."""

    seq: int
    topic: str
    payload: bytes
    response_topic: str | None
    correlation: bytes | None
    received: float
    expires: float | None
    state: str = "pending"
    reply_topic: str | None = None
    response: bytes | None = None
    attempts: int = 0


@dataclass(frozen=True)
class Incoming:
    """A request message as it came off the wire (before anything is parsed)."""

    topic: str
    payload: bytes
    response_topic: str | None = None
    correlation: bytes | None = None
    expiry_s: float | None = None     # v5 Message Expiry Interval left when it arrived
    mid: int = 0                      # broker packet id (kept across redeliveries)
    claimed_id: str | None = None     # the payload's "id" when it has one (cheap peek)
    retained: bool = False            # delivered with the retain flag (a replay)


def dedupe_key(msg: Incoming) -> str:
    """The row key: explicit ids name the request; anonymous ones only a redelivery."""
    h = hashlib.sha256()
    for part in (msg.topic.encode(), msg.payload, (msg.response_topic or "").encode(),
                 msg.correlation or b"",
                 (msg.claimed_id or "").encode("utf-8", "surrogatepass")):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    if msg.correlation is not None or msg.claimed_id is not None:
        return "id:" + h.hexdigest()
    return f"anon:{msg.mid}:{h.hexdigest()}"


Write = Callable[..., sqlite3.Cursor]   # (sql, args, checkpoint=True) -> cursor
_ANSWER = ("UPDATE entries SET state = 'answered', reply_topic = ?, response = ?, "
           "updated = ?, note = ? WHERE seq = ? AND state = 'pending'")


@dataclass
class _Op:
    """One write for the writer thread: ``fn`` runs its statements through the batch's
    ``write``; ``kind``/``seq`` say what the loop updates when it lands."""

    fn: Callable[[Write], Any]
    kind: str
    seq: int = 0
    future: asyncio.Future[Any] | None = None               # resolved on the loop
    waiter: concurrent.futures.Future[Any] | None = None    # a blocking caller's
    answers: bool = False    # writes an answer (``settled`` waits for it)
    number: int = 0          # its place in the queue


class Journal:
    """The SQLite delivery journal of one daemon. Without ``attach``: synchronous, from one
    thread. Attached: writes in the writer thread, reads and bookkeeping on the loop."""

    def __init__(self, path: Path, retention_s: float = 7 * 86400.0) -> None:
        self.path, self.retention_s = Path(path), retention_s
        self.moved_aside: Path | None = None
        self.wal_damage: str | None = None   # what a damaged WAL tail held, at open
        self.healthy = True                  # False after a failed write, until one works
        self.last_error: str | None = None
        # attached (``attach``): the writer thread and what is in flight, on the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._closed = False
        self._queued = self._landed = 0            # writes handed to / back from the thread
        self._answer_ops: set[int] = set()         # answers in flight: queue numbers
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._answering: dict[int, Entry] = {}     # answers being written (or that failed)
        self._marking: dict[int, _Op] = {}         # delivery marks in flight or to retry
        self._retry: list[_Op] = []                # marks that failed, for the next write
        self._handing: set[int] = set()            # hand-overs in flight
        self.on_failure: Callable[[JournalError], None] | None = None   # on the loop
        # (device, inode) of each file opened, by suffix (``check_files``); set once the
        # journal has vanished: why
        self._files: dict[str, tuple[int, int]] = {}
        self.vanished: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._check_wal()
            self.db = self._open()
        except (OSError, sqlite3.Error) as e:
            raise JournalError(f"{self.path}: cannot open the delivery journal ({e})",
                               "check state_dir and its permissions") from e
        self.check_files()

    def check_files(self) -> str | None:
        """Whether the journal's path still names the files it has open (same device and
        inode; a ``-wal`` or ``-shm`` that SQLite creates later is taken when first seen).
        None while it does; else why, the same from then on (``vanished``). Any thread."""
        if self.vanished is not None:
            return self.vanished
        for side in _SIDES:
            name = f"{self.path}{side}"
            try:
                st = os.stat(name)
                now: tuple[int, int] | None = (st.st_dev, st.st_ino)
            except FileNotFoundError:
                now = None
            except OSError as e:   # unreadable path: a disk fault, not a vanished file
                log.debug("journal file check: %s: %s", name, e)
                continue
            was = self._files.get(side)
            if was is None:
                if now is not None:
                    self._files[side] = now
                continue
            if now != was:
                found = ("nothing" if now is None
                         else f"another file (device {now[0]}, inode {now[1]})")
                self.vanished = (
                    f"{name} was deleted or replaced under the running daemon (rung has "
                    f"device {was[0]}, inode {was[1]} open; the path names {found}): "
                    "what rung records would be lost at the next restart")
                log.debug("journal vanished: %s", self.vanished)
                return self.vanished
        return None

    def _gone(self) -> JournalError | None:
        """The error of a write while the journal has vanished (``check_files``)."""
        why = self.check_files()
        if why is None:
            return None
        if self.healthy:
            log.error("journal writes failing: %s", why)
        self.healthy, self.last_error = False, why
        return JournalError(why, "rung stops for systemd to restart it with a new journal; "
                                 "never delete files in state_dir under a running rung")

    def _check_wal(self) -> None:
        """Report (and keep a copy of) a WAL whose tail SQLite is about to drop."""
        side = Path(f"{self.path}-wal")
        state = wal.inspect(side)
        if state.problem is None:
            return
        copy = side.with_name(f"{side.name}.damaged-{int(time.time())}")
        shutil.copyfile(side, copy)
        self.wal_damage = (f"{side}: ends in {state.problem}; {state.dropped_bytes} bytes "
                           f"after the last complete commit are dropped ({state.committed_frames}"
                           f" committed frames kept; a copy is in {copy.name}). Requests "
                           "acknowledged to the broker are never in that tail (each is "
                           "checkpointed first); a lost unacknowledged one is redelivered")
        log.error("journal write-ahead log damaged: %s", self.wal_damage)

    def _open(self) -> sqlite3.Connection:
        if self.path.exists():
            db: sqlite3.Connection | None = None
            try:
                db = sqlite3.connect(self.path, isolation_level=None)
                ok = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
                db.execute("SELECT seq, key, state FROM entries LIMIT 1").fetchall()
            except sqlite3.DatabaseError as e:
                if not (e.sqlite_errorname or "").startswith(_DAMAGED):
                    if db is not None:    # cannot open or read it (permissions, I/O): not
                        db.close()        # damage, so not moved aside: JournalError
                    raise
                ok = False
                log.error("journal unreadable: %s", e)
            if not ok:
                if db is not None:
                    db.close()
                self.moved_aside = self.path.with_name(
                    f"{self.path.name}.corrupt-{int(time.time())}")
                self.path.replace(self.moved_aside)
                for side in ("-wal", "-shm"):
                    Path(f"{self.path}{side}").unlink(missing_ok=True)
                log.error("journal %s failed its integrity check: moved to %s, starting "
                          "a new one", self.path, self.moved_aside)
            elif db is not None:
                db.close()
        db = self._connect()
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(SCHEMA)
        columns = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
        for name, decl in (("attempts", "INTEGER NOT NULL DEFAULT 0"), ("note", "TEXT")):
            if name not in columns:   # a journal from an earlier version
                db.execute(f"ALTER TABLE entries ADD COLUMN {name} {decl}")
        return db

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")
        return db

    # -- attached: the writer thread ----------------------------------------------------

    @property
    def attached(self) -> bool:
        return self._writer is not None

    def attach(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Move every write to a writer thread of its own (once; ``rung serve`` does it at
        start-up, on the event loop): writes queued from the loop land in order, each
        batch one transaction, one fsync and one checkpoint."""
        if self._writer is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._writer = threading.Thread(target=self._write_loop, name="rung-journal",
                                        daemon=True)
        self._writer.start()

    def _write_loop(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            db = self._connect()
        except sqlite3.Error as e:   # every write fails: each says so
            log.error("journal writer cannot open %s: %s", self.path, e)
        while True:
            first = self._queue.get()
            ops = [first]
            while first is not None and len(ops) < MAX_BATCH:
                try:
                    op = self._queue.get_nowait()
                except queue.Empty:
                    break
                ops.append(op)
                if op is None:
                    break
            stop = ops[-1] is None
            batch = [op for op in ops if op is not None]
            if batch:
                gone = self._gone()
                results: list[tuple[Any, JournalError | None]] = (
                    [(None, gone) for _ in batch] if gone is not None
                    else self._run_batch(db, batch) if db is not None
                    else [(None, self._failed(sqlite3.OperationalError("not open")))
                          for _ in batch])
                for op, (value, err) in zip(batch, results, strict=True):
                    if op.waiter is not None:
                        if err is None:
                            op.waiter.set_result(value)
                        else:
                            op.waiter.set_exception(err)
                self._hand_back(batch, results)
            if stop:
                break
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    def _run_batch(self, db: sqlite3.Connection,
                   ops: list[_Op]) -> list[tuple[Any, JournalError | None]]:
        """One transaction for ``ops``, then one checkpoint; when it fails, each op once
        more in its own transaction, so that each gets its own outcome."""
        cursors: list[tuple[sqlite3.Cursor, bool]] = []

        def write(sql: str, args: tuple[object, ...], checkpoint: bool = True
                  ) -> sqlite3.Cursor:
            cur = db.execute(sql, args)
            cursors.append((cur, checkpoint))
            return cur

        try:
            db.execute("BEGIN IMMEDIATE")
            values = [op.fn(write) for op in ops]
            db.execute("COMMIT")
        except Exception as e:   # a disk error (or a bug): each op on its own, its outcome
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if len(ops) > 1:
                return [self._run_batch(db, [op])[0] for op in ops]
            if not isinstance(e, sqlite3.Error):
                log.error("journal write failed", exc_info=e)
            return [(None, self._failed(e))]
        changed = any(cur.rowcount > 0 for cur, _ in cursors)
        if any(cur.rowcount > 0 and ckpt for cur, ckpt in cursors):
            self._checkpoint(db)
        if changed and not self.healthy:
            log.warning("journal writes work again")
            self.healthy, self.last_error = True, None
        return [(v, None) for v in values]

    def _failed(self, e: Exception) -> JournalError:
        if self.healthy:
            log.error("journal writes failing: %s", e)
        self.healthy, self.last_error = False, str(e)
        err = JournalError(f"{self.path}: journal write failed ({e})",
                           "check free space in state_dir")
        err.__cause__ = e
        return err

    def _hand_back(self, ops: list[_Op], results: list[tuple[Any, JournalError | None]]
                   ) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):   # the loop is gone (shut down)
            loop.call_soon_threadsafe(self._landed_on_loop, ops, results)

    def _landed_on_loop(self, ops: list[_Op],
                        results: list[tuple[Any, JournalError | None]]) -> None:
        """On the loop: a batch is durable (or failed): bookkeeping, futures, waiters."""
        failure: JournalError | None = None
        for op, (value, err) in zip(ops, results, strict=True):
            self._answer_ops.discard(op.number)
            if op.kind == "answer" and err is None:
                self._answering.pop(op.seq, None)
            elif op.kind == "answer":   # goes out from memory all the same (the row stays
                failure = err           # pending: answered again after a restart)
            elif op.kind == "mark" and err is None:
                if self._marking.get(op.seq) is op:
                    del self._marking[op.seq]
            elif op.kind == "mark":     # kept: not published again; tried again with
                failure = err           # the next write
                if self._marking.get(op.seq) is op:
                    self._retry.append(op)
            elif op.kind == "hand":
                self._handing.discard(op.seq)
                if err is not None:
                    log.error("request %d handed over but not marked (%s): it is answered "
                              "again after the restart", op.seq, err)
            elif err is not None and op.kind != "record":
                failure = err
            if op.future is not None and not op.future.done():
                if err is None:
                    op.future.set_result(value)
                else:
                    op.future.set_exception(err)
        self._landed += len(ops)
        ready = [f for n, f in self._waiters if n <= self._landed]
        self._waiters = [(n, f) for n, f in self._waiters if n > self._landed]
        for f in ready:
            if not f.done():
                f.set_result(None)
        if failure is not None and self.on_failure is not None:
            self.on_failure(failure)

    def _submit(self, op: _Op) -> _Op:
        self._check_open()
        retry, self._retry = self._retry, []
        for old in retry:
            if self._marking.get(old.seq) is old:
                self._marking[old.seq] = self._put(replace(old))
        return self._put(op)

    def _put(self, op: _Op) -> _Op:
        self._queued += 1
        op.number = self._queued
        if op.answers:
            self._answer_ops.add(op.number)
        self._queue.put(op)
        return op

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError(f"{self.path}: the journal is closed",
                               "the daemon is stopping")

    def _soon(self, fn: Callable[[Write], Any], kind: str, seq: int = 0,
              answers: bool = False) -> asyncio.Future[Any]:
        assert self._loop is not None
        future: asyncio.Future[Any] = self._loop.create_future()
        self._submit(_Op(fn, kind, seq, future=future, answers=answers))
        return future

    def _blocking(self, fn: Callable[[Write], Any], kind: str = "call") -> Any:
        """A write whose caller waits for it (attached, off the hot paths)."""
        waiter: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._submit(_Op(fn, kind, waiter=waiter))
        return waiter.result()

    async def settled(self) -> None:
        """Return once every answer written before this call has landed (committed and
        checkpointed, or failed: then it goes out from memory): the link waits for it
        before it publishes, so no answer goes out before the journal holds it. Other
        writes are not waited for (requests are routed only once recorded; a delivery mark
        may be lost, as documented)."""
        if self._answer_ops:
            await self._landing(max(self._answer_ops))   # they land in order

    async def written(self) -> None:
        """Return once every write queued before this call has landed."""
        await self._landing(self._queued)

    async def _landing(self, target: int) -> None:
        if self._landed >= target or self._loop is None:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append((target, future))
        await future

    def close(self) -> None:
        """Finish the writes queued (attached: the writer thread ends), then close."""
        if self._writer is not None and not self._closed:
            self._closed = True
            self._queue.put(None)
            self._writer.join()
        self._closed = True
        self.db.close()

    # -- writes --------------------------------------------------------------------------

    def _write(self, sql: str, args: tuple[object, ...],
               checkpoint: bool = True) -> sqlite3.Cursor:
        """Run one statement (its own transaction); a change is checkpointed into the
        database file before this returns (``checkpoint``: a change whose loss costs only
        a documented repeat, like a delivery mark, is left to the next write's)."""
        gone = self._gone()
        if gone is not None:
            raise gone
        try:
            cur = self.db.execute(sql, args)
            if cur.rowcount > 0 and checkpoint:
                self._checkpoint(self.db)
        except sqlite3.Error as e:
            raise self._failed(e) from e
        if cur.rowcount > 0 and not self.healthy:   # a change landed: writes work again
            log.warning("journal writes work again")
            self.healthy, self.last_error = True, None
        return cur

    @staticmethod
    def _checkpoint(db: sqlite3.Connection) -> None:
        """The commit is durable in the WAL already (``synchronous=FULL``); copying it into
        the database file keeps it safe from a WAL cut short. A checkpoint that cannot run
        now (a reader such as ``rung check``, a full disk) is retried with the next write."""
        try:
            busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as e:
            log.warning("journal checkpoint failed: %s", e)
            return
        if busy:
            log.debug("journal checkpoint deferred: another connection reads the journal")

    def _record(self, write: Write, msg: Incoming, now: float) -> Entry | None:
        key = dedupe_key(msg)
        row = write("SELECT seq, state FROM entries WHERE key = ?", (key,)).fetchone()
        if row is not None:
            if key.startswith("id:") or row[1] != "delivered":
                return None
            # an anonymous row already answered: the broker reused its packet id
            write("UPDATE entries SET key = NULL WHERE seq = ?", (row[0],))
        expires = None if msg.expiry_s is None else now + msg.expiry_s
        cur = write(
            "INSERT INTO entries (key, received, expires, topic, payload, response_topic, "
            "correlation, state, updated) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
            (key, now, expires, msg.topic, msg.payload, msg.response_topic, msg.correlation,
             now))
        return Entry(int(cur.lastrowid or 0), msg.topic, msg.payload, msg.response_topic,
                     msg.correlation, now, expires)

    def record(self, msg: Incoming, now: float | None = None) -> Entry | None:
        """Record a received message durably; None when it is a duplicate of a kept row."""
        now = time.time() if now is None else now
        if self.attached:
            return self._blocking(lambda w: self._record(w, msg, now))   # type: ignore[no-any-return]
        return self._record(self._write, msg, now)

    def record_soon(self, msg: Incoming, now: float | None = None,
                    answer: tuple[str, bytes] | None = None) -> asyncio.Future[Entry | None]:
        """Attached: ``record`` in the writer thread; the future resolves on the loop once
        the row is committed and checkpointed (or raises ``JournalError``). ``answer``
        (reply topic, response): a request refused at the edge, recorded already answered
        in the same transaction (one commit and checkpoint instead of two)."""
        now = time.time() if now is None else now

        def record(w: Write) -> Entry | None:
            entry = self._record(w, msg, now)
            if entry is not None and answer is not None:
                w(_ANSWER, (answer[0], answer[1], now, None, entry.seq))
                entry = replace(entry, state="answered", reply_topic=answer[0],
                                response=answer[1])
            return entry

        return self._soon(record, "record", answers=answer is not None)

    def answer(self, seq: int, reply_topic: str, response: bytes,
               note: str | None = None) -> None:
        """Record the answer to publish (before publishing it). Attached: queued, and
        ``undelivered`` lists it at once; the link publishes it only once it landed."""
        args = (reply_topic, response, time.time(), note, seq)
        sql = _ANSWER
        if not self.attached:
            self._write(sql, args)
            return
        self._check_open()
        if seq in self._answering or seq in self._handing:
            return   # already answered: the first answer stays
        rows = self._rows("WHERE seq = ? AND state = 'pending'", (seq,))
        if not rows:
            return
        self._answering[seq] = replace(rows[0], state="answered", reply_topic=reply_topic,
                                       response=response)
        self._submit(_Op(lambda w: w(sql, args), "answer", seq, answers=True))

    def _started(self, write: Write, seq: int) -> int:
        rows = write("UPDATE entries SET attempts = attempts + 1, updated = ? "
                     "WHERE seq = ? AND state = 'pending' RETURNING attempts",
                     (time.time(), seq)).fetchall()
        return int(rows[0][0]) if rows else 0

    def started(self, seq: int) -> int:
        """The model starts on a pending row: count it (a row that keeps taking the daemon
        down with it is recognised after a restart); returns the attempts so far."""
        if self.attached:
            return int(self._blocking(lambda w: self._started(w, seq)))
        return self._started(self._write, seq)

    def started_soon(self, seq: int) -> asyncio.Future[int]:
        """Attached: ``started`` in the writer thread; resolves once it is durable."""
        return self._soon(lambda w: self._started(w, seq), "started", seq)

    def settle(self, seq: int, reply_topic: str, response: bytes, note: str | None = None,
               keep: bool = True) -> asyncio.Future[Any] | None:
        """A pending request answered to its caller directly (an OPC UA method call):
        the answer recorded and the row done (``delivered``) in one write, never published;
        the row is kept as a duplicate's answer (``find``) for ``retention_s``. ``keep``
        False gives up the row's key (a call refused as ``busy``: the same id may come
        again and is then run). Attached: the future resolves once it is durable."""
        sql = ("UPDATE entries SET state = 'delivered', reply_topic = ?, response = ?, "
               "updated = ?, note = ?, key = CASE WHEN ? THEN key ELSE NULL END "
               "WHERE seq = ? AND state = 'pending'")
        args = (reply_topic, response, time.time(), note, keep, seq)
        if self.attached:
            self._check_open()
            return self._soon(lambda w: w(sql, args), "settle", seq)
        self._write(sql, args)
        return None

    def _mark(self, seq: int, sql: str, args: tuple[object, ...],
              checkpoint: bool) -> None:
        """Attached: a delivery (or dead-letter) mark, queued; the row leaves
        ``undelivered`` at once, and a mark that fails is tried again with later writes."""
        self._check_open()
        op = _Op(lambda w: w(sql, args, checkpoint), "mark", seq)
        self._marking[seq] = op
        self._answering.pop(seq, None)   # an answer that went out from memory: done with
        self._submit(op)

    def dead(self, seq: int, note: str) -> None:
        """Give up publishing an answer the broker keeps refusing (the row and its
        response stay for inspection until pruned)."""
        sql = ("UPDATE entries SET state = 'dead', updated = ?, note = ?, "
               "key = CASE WHEN key LIKE 'anon:%' THEN NULL ELSE key END "
               "WHERE seq = ? AND state = 'answered'")
        if self.attached:
            self._mark(seq, sql, (time.time(), note, seq), True)
            return
        self._write(sql, (time.time(), note, seq))

    def handed_over(self, seq: int, note: str) -> None:
        """A pending request given to another node (a fleet node leaving its group): no
        longer pending, and no longer a duplicate here (it may come back to this node, and
        must then be run). Pruned like a delivered row."""
        sql = ("UPDATE entries SET state = 'delivered', updated = ?, note = ?, key = NULL "
               "WHERE seq = ? AND state = 'pending'")
        args = (time.time(), note, seq)
        if self.attached:
            self._check_open()
            self._handing.add(seq)
            self._submit(_Op(lambda w: w(sql, args), "hand", seq))
            return
        self._write(sql, args)

    def delivered(self, seq: int) -> None:
        """The broker acknowledged the answer; anonymous rows give up their key. Marked as
        soon as possible after the PUBACK (a kill in between publishes the answer once
        more after the restart): durable in the WAL, checkpointed with the next write."""
        sql = ("UPDATE entries SET state = 'delivered', updated = ?, "
               "key = CASE WHEN key LIKE 'anon:%' THEN NULL ELSE key END "
               "WHERE seq = ? AND state = 'answered'")
        if self.attached:
            self._mark(seq, sql, (time.time(), seq), False)
            return
        self._write(sql, (time.time(), seq), checkpoint=False)

    # -- reads (on the caller's thread; attached: plus what is in flight) ---------------

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        """Run one query; a failing read (a damaged or vanished file, an I/O error) is a
        ``JournalError`` like a failing write, never a bare ``sqlite3`` error."""
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise JournalError(f"{self.path}: journal read failed ({e})",
                               "check state_dir (its disk and the journal file)") from e

    def _rows(self, where: str, args: tuple[object, ...]) -> list[Entry]:
        rows = self._read(
            "SELECT seq, topic, payload, response_topic, correlation, received, expires, "
            f"state, reply_topic, response, attempts FROM entries {where} ORDER BY seq", args)
        return [Entry(*r) for r in rows]

    def pending(self, opcua: bool = False) -> list[Entry]:
        """Recorded, not yet answered (oldest first): the MQTT requests, or with ``opcua``
        the OPC UA server's calls (topic ``opcua:...``; ``OPCUA_PREFIX``)."""
        rows = self._rows(f"WHERE state = ? AND topic {'' if opcua else 'NOT '}LIKE ?",
                          ("pending", OPCUA_PREFIX + "%"))
        if not self.attached:
            return rows
        return [e for e in rows if e.seq not in self._answering and e.seq not in self._handing]

    def find(self, msg: Incoming) -> Entry | None:
        """The row kept for a request with an id (its dedupe key), answered or not."""
        rows = self._rows("WHERE key = ?", (dedupe_key(msg),))
        return rows[0] if rows else None

    def undelivered(self) -> list[Entry]:
        """Answered, the broker has not acknowledged the answer (oldest first)."""
        rows = self._rows("WHERE state = ?", ("answered",))
        if not self.attached:
            return rows
        by_seq = {e.seq: e for e in rows if e.seq not in self._marking}
        by_seq.update(self._answering)
        return [by_seq[s] for s in sorted(by_seq)]

    def dead_letters(self) -> list[tuple[int, str, str | None]]:
        """(seq, reply topic, why) of answers given up on, oldest first."""
        rows = self._read("SELECT seq, reply_topic, note FROM entries WHERE "
                          "state = 'dead' ORDER BY seq")
        return [(int(r[0]), str(r[1]), r[2]) for r in rows]

    def counts(self) -> dict[str, int]:
        rows = self._read("SELECT state, COUNT(*) FROM entries GROUP BY state")
        return {state: n for state, n in rows}

    def prune(self, now: float | None = None) -> int:
        """Forget delivered rows older than the retention; returns rows removed (attached:
        queued, returns 0)."""
        cutoff = (time.time() if now is None else now) - self.retention_s
        sql = ("DELETE FROM entries WHERE state IN ('delivered', 'dead') AND updated < ?")
        if self.attached:
            self._submit(_Op(lambda w: w(sql, (cutoff,)), "prune"))
            return 0
        return self._write(sql, (cutoff,)).rowcount
