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

A file that fails SQLite's integrity check is moved aside (``journal.db.corrupt-<time>``)
and a new one started; nothing from it is used.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rung.daemon.mqtt import wal
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


# SQLite errors that mean the file itself is damaged or not our journal (SQLITE_ERROR: the
# ``entries`` table or its columns are missing); any other error is not moved aside.
_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_ERROR")


class JournalError(RungError):
    """The journal cannot be opened or written (disk full, permissions)."""


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


class Journal:
    """The SQLite delivery journal of one daemon (use from one thread: the event loop)."""

    def __init__(self, path: Path, retention_s: float = 7 * 86400.0) -> None:
        self.path, self.retention_s = Path(path), retention_s
        self.moved_aside: Path | None = None
        self.wal_damage: str | None = None   # what a damaged WAL tail held, at open
        self.healthy = True                  # False after a failed write, until one works
        self.last_error: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._check_wal()
            self.db = self._open()
        except (OSError, sqlite3.Error) as e:
            raise JournalError(f"{self.path}: cannot open the delivery journal ({e})",
                               "check state_dir and its permissions") from e

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
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        columns = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
        for name, decl in (("attempts", "INTEGER NOT NULL DEFAULT 0"), ("note", "TEXT")):
            if name not in columns:   # a journal from an earlier version
                db.execute(f"ALTER TABLE entries ADD COLUMN {name} {decl}")
        return db

    def close(self) -> None:
        self.db.close()

    def _write(self, sql: str, args: tuple[object, ...],
               checkpoint: bool = True) -> sqlite3.Cursor:
        """Run one statement (its own transaction); a change is checkpointed into the
        database file before this returns (``checkpoint``: a change whose loss costs only
        a documented repeat, like a delivery mark, is left to the next write's)."""
        try:
            cur = self.db.execute(sql, args)
            if cur.rowcount > 0 and checkpoint:
                self._checkpoint()
        except sqlite3.Error as e:
            if self.healthy:
                log.error("journal writes failing: %s", e)
            self.healthy, self.last_error = False, str(e)
            raise JournalError(f"{self.path}: journal write failed ({e})",
                               "check free space in state_dir") from e
        if cur.rowcount > 0 and not self.healthy:   # a change landed: writes work again
            log.warning("journal writes work again")
            self.healthy, self.last_error = True, None
        return cur

    def _checkpoint(self) -> None:
        """The commit is durable in the WAL already (``synchronous=FULL``); copying it into
        the database file keeps it safe from a WAL cut short. A checkpoint that cannot run
        now (a reader such as ``rung check``, a full disk) is retried with the next write."""
        try:
            busy = self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as e:
            log.warning("journal checkpoint failed: %s", e)
            return
        if busy:
            log.debug("journal checkpoint deferred: another connection reads the journal")

    def record(self, msg: Incoming, now: float | None = None) -> Entry | None:
        """Record a received message durably; None when it is a duplicate of a kept row."""
        now = time.time() if now is None else now
        key = dedupe_key(msg)
        row = self._write("SELECT seq, state FROM entries WHERE key = ?", (key,)).fetchone()
        if row is not None:
            if key.startswith("id:") or row[1] != "delivered":
                return None
            # an anonymous row already answered: the broker reused its packet id
            self._write("UPDATE entries SET key = NULL WHERE seq = ?", (row[0],))
        expires = None if msg.expiry_s is None else now + msg.expiry_s
        cur = self._write(
            "INSERT INTO entries (key, received, expires, topic, payload, response_topic, "
            "correlation, state, updated) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
            (key, now, expires, msg.topic, msg.payload, msg.response_topic, msg.correlation,
             now))
        return Entry(int(cur.lastrowid or 0), msg.topic, msg.payload, msg.response_topic,
                     msg.correlation, now, expires)

    def answer(self, seq: int, reply_topic: str, response: bytes,
               note: str | None = None) -> None:
        """Record the answer to publish (before publishing it)."""
        self._write("UPDATE entries SET state = 'answered', reply_topic = ?, response = ?, "
                    "updated = ?, note = ? WHERE seq = ? AND state = 'pending'",
                    (reply_topic, response, time.time(), note, seq))

    def started(self, seq: int) -> int:
        """The model starts on a pending row: count it (a row that keeps taking the daemon
        down with it is recognised after a restart); returns the attempts so far."""
        cur = self._write("UPDATE entries SET attempts = attempts + 1, updated = ? "
                          "WHERE seq = ? AND state = 'pending' RETURNING attempts",
                          (time.time(), seq))
        row = cur.fetchone()
        return int(row[0]) if row else 0

    def dead(self, seq: int, note: str) -> None:
        """Give up publishing an answer the broker keeps refusing (the row and its
        response stay for inspection until pruned)."""
        self._write("UPDATE entries SET state = 'dead', updated = ?, note = ?, "
                    "key = CASE WHEN key LIKE 'anon:%' THEN NULL ELSE key END "
                    "WHERE seq = ? AND state = 'answered'", (time.time(), note, seq))

    def handed_over(self, seq: int, note: str) -> None:
        """A pending request given to another node (a fleet node leaving its group): no
        longer pending, and no longer a duplicate here (it may come back to this node, and
        must then be run). Pruned like a delivered row."""
        self._write("UPDATE entries SET state = 'delivered', updated = ?, note = ?, key = NULL "
                    "WHERE seq = ? AND state = 'pending'", (time.time(), note, seq))

    def delivered(self, seq: int) -> None:
        """The broker acknowledged the answer; anonymous rows give up their key. Marked as
        soon as possible after the PUBACK (a kill in between publishes the answer once
        more after the restart): durable in the WAL, checkpointed with the next write."""
        self._write("UPDATE entries SET state = 'delivered', updated = ?, "
                    "key = CASE WHEN key LIKE 'anon:%' THEN NULL ELSE key END "
                    "WHERE seq = ?", (time.time(), seq), checkpoint=False)

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        """Run one query; a failing read (a damaged or vanished file, an I/O error) is a
        ``JournalError`` like a failing write, never a bare ``sqlite3`` error."""
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise JournalError(f"{self.path}: journal read failed ({e})",
                               "check state_dir (its disk and the journal file)") from e

    def _entries(self, state: str) -> list[Entry]:
        rows = self._read(
            "SELECT seq, topic, payload, response_topic, correlation, received, expires, "
            "state, reply_topic, response, attempts FROM entries WHERE state = ? "
            "ORDER BY seq",
            (state,))
        return [Entry(*r) for r in rows]

    def pending(self) -> list[Entry]:
        """Recorded, not yet answered (oldest first)."""
        return self._entries("pending")

    def undelivered(self) -> list[Entry]:
        """Answered, the broker has not acknowledged the answer (oldest first)."""
        return self._entries("answered")

    def dead_letters(self) -> list[tuple[int, str, str | None]]:
        """(seq, reply topic, why) of answers given up on, oldest first."""
        rows = self._read("SELECT seq, reply_topic, note FROM entries WHERE "
                          "state = 'dead' ORDER BY seq")
        return [(int(r[0]), str(r[1]), r[2]) for r in rows]

    def counts(self) -> dict[str, int]:
        rows = self._read("SELECT state, COUNT(*) FROM entries GROUP BY state")
        return {state: n for state, n in rows}

    def prune(self, now: float | None = None) -> int:
        """Forget delivered rows older than the retention; returns rows removed."""
        cutoff = (time.time() if now is None else now) - self.retention_s
        cur = self._write("DELETE FROM entries WHERE state IN ('delivered', 'dead') "
                          "AND updated < ?",
                          (cutoff,))
        return cur.rowcount
