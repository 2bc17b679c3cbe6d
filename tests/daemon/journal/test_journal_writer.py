"""The journal off the event loop (``Journal.attach``): every write runs in the writer
thread, never on the loop; what is queued together lands in one transaction, in order; a
recorded request's future resolves only once the row is committed and checkpointed into the
database file; answers count as answered at once but ``settled`` (what the link awaits
before publishing) waits until they are durable; failures keep the synchronous journal's
outcomes. The loop keeps running while a write is stuck on the disk."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.journal.store import Incoming, Journal, JournalError

TOPIC = "v1/site/rung/node1/req/st_code"
WRITES = ("INSERT", "UPDATE", "DELETE", "BEGIN", "COMMIT", "ROLLBACK", "PRAGMA WAL_CHECKPOINT")


def _msg(i: int) -> Incoming:
    return Incoming(TOPIC, b'{"input": {}, "n": %d}' % i, claimed_id=f"id-{i}")


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(30):
            await body()
    asyncio.run(bounded())


class Traced:
    """Every statement either connection runs, with the thread it ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lines: list[tuple[str, str]] = []
        connect = Journal._connect

        def traced(journal: Journal) -> sqlite3.Connection:
            db = connect(journal)
            db.set_trace_callback(lambda sql: self.lines.append(
                (threading.current_thread().name, sql.strip().upper())))
            return db

        monkeypatch.setattr(Journal, "_connect", traced)

    def writes(self) -> list[tuple[str, str]]:
        return [(t, sql) for t, sql in self.lines if sql.startswith(WRITES)]


class Gate:
    """Holds the writer thread inside its next checkpoint until opened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open, self.entered = threading.Event(), threading.Event()
        checkpoint = Journal._checkpoint

        def held(db: sqlite3.Connection) -> None:
            self.entered.set()
            self.open.wait(20)
            checkpoint(db)

        monkeypatch.setattr(Journal, "_checkpoint", staticmethod(held))


def test_writes_run_in_the_writer_thread_never_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traced = Traced(monkeypatch)

    async def body() -> None:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        traced.lines.clear()
        loop_thread = threading.current_thread().name
        a = await j.record_soon(_msg(1))
        b = await j.record_soon(_msg(2), answer=("r/refused", b'{"ok": false}'))
        assert a is not None and b is not None and b.state == "answered"
        assert await j.started_soon(a.seq) == 1
        j.answer(a.seq, "r/1", b'{"ok": true}')
        await j.settled()
        j.delivered(a.seq)
        j.dead(b.seq, "refused")
        j.prune()
        await j.written()
        assert j.pending() == [] and j.undelivered() == []
        j.close()
        writes = traced.writes()
        assert writes and {t for t, _ in writes} == {"rung-journal"}
        on_loop = [sql for t, sql in traced.lines if t == loop_thread]
        assert on_loop and all(sql.startswith("SELECT") for sql in on_loop), on_loop
        with sqlite3.connect(tmp_path / "journal.db") as db:
            assert db.execute("SELECT seq, state FROM entries ORDER BY seq").fetchall() == [
                (a.seq, "delivered"), (b.seq, "dead")]
        db.close()
    run(body)


def test_what_is_queued_together_lands_in_one_transaction_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traced = Traced(monkeypatch)
    gate = Gate(monkeypatch)

    async def body() -> None:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        first = j.record_soon(_msg(0))
        await asyncio.to_thread(gate.entered.wait, 10)   # the writer is busy with it
        traced.lines.clear()
        landed: list[int] = []
        futures = [j.record_soon(_msg(i)) for i in range(1, 21)]
        for i, f in enumerate(futures, 1):
            f.add_done_callback(lambda _, i=i: landed.append(i))
        gate.open.set()
        entries = await asyncio.gather(first, *futures)
        assert landed == list(range(1, 21))                      # in the order queued
        seqs = [e.seq for e in entries if e is not None]
        assert seqs == sorted(seqs) and len(seqs) == 21
        commits = [sql for _, sql in traced.writes() if sql == "COMMIT"]
        checkpoints = [sql for _, sql in traced.writes() if "WAL_CHECKPOINT" in sql]
        assert len(commits) <= 2 and len(checkpoints) <= 2, traced.writes()
        j.close()
    run(body)


def test_a_record_resolves_once_it_is_in_the_database_file(tmp_path: Path) -> None:
    """Not only in the WAL: the row is in the main file when the future resolves (what
    the link acknowledges on), read here with the WAL ignored."""
    path = tmp_path / "journal.db"

    async def body() -> None:
        j = Journal(path)
        j.attach()
        seen: list[list[Any]] = []

        def in_main_file(f: asyncio.Future[Any]) -> None:
            ro = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
            seen.append(ro.execute("SELECT seq, state FROM entries").fetchall())
            ro.close()

        fut = j.record_soon(_msg(1))
        fut.add_done_callback(in_main_file)
        e = await fut
        assert e is not None and seen == [[(e.seq, "pending")]]
        j.close()
    run(body)


def test_the_loop_runs_on_while_a_write_is_stuck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop-lag probe: while the writer thread sits in a checkpoint (a slow disk), the
    loop keeps turning; the request is not acknowledged meanwhile."""
    gate = Gate(monkeypatch)

    async def body() -> None:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        fut = j.record_soon(_msg(1))
        ticks = 0
        while not gate.entered.is_set() or ticks < 50:
            await asyncio.sleep(0.001)
            ticks += 1
        assert not fut.done()   # not durable yet: the link would not acknowledge it
        gate.open.set()
        assert (await fut) is not None
        j.close()
    run(body)


def test_an_answer_is_listed_at_once_and_settled_once_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        e = await j.record_soon(_msg(1))
        assert e is not None
        gate = Gate(monkeypatch)
        j.answer(e.seq, "r/1", b"first")
        j.answer(e.seq, "r/2", b"second")    # already answered: the first answer stays
        [u] = j.undelivered()                # what the outbox takes to publish
        assert (u.seq, u.reply_topic, u.response, u.state) == (e.seq, "r/1", b"first",
                                                               "answered")
        assert j.pending() == []
        settled = asyncio.ensure_future(j.settled())   # what the link awaits
        await asyncio.to_thread(gate.entered.wait, 10)
        await asyncio.sleep(0.05)
        assert not settled.done()
        gate.open.set()
        await settled
        with sqlite3.connect(tmp_path / "journal.db") as db:
            assert db.execute("SELECT state, response FROM entries").fetchall() == [
                ("answered", b"first")]
        db.close()
        j.delivered(e.seq)                   # leaves the outbox at once
        assert j.undelivered() == []
        j.close()
    run(body)


class FailingDb:
    """A connection whose statements starting with one of ``fail`` raise (a disk error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.fail: tuple[str, ...] = ()

    def execute(self, sql: str, args: Any = ()) -> Any:
        if sql.startswith(self.fail):
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_failed_writes_keep_the_synchronous_outcomes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record that fails raises (answered ``unavailable`` by the intake); an answer that
    cannot be written still goes out (from memory) and its row stays pending; a delivery
    mark that fails keeps the answer from going out twice and lands with a later write."""
    writer: list[FailingDb] = []
    connect = Journal._connect

    def failing(journal: Journal) -> Any:
        db = FailingDb(connect(journal))
        if threading.current_thread().name == "rung-journal":
            writer.append(db)
        return db

    monkeypatch.setattr(Journal, "_connect", failing)
    failures: list[JournalError] = []

    async def body() -> None:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        j.on_failure = failures.append
        a = await j.record_soon(_msg(1))
        b = await j.record_soon(_msg(2))
        assert a is not None and b is not None
        writer[0].fail = ("INSERT",)
        with pytest.raises(JournalError):
            await j.record_soon(_msg(3))
        assert not j.healthy
        writer[0].fail = ("UPDATE",)
        j.answer(a.seq, "r/a", b"from memory")
        await j.written()
        assert failures and [u.seq for u in j.undelivered()] == [a.seq]   # still goes out
        j.delivered(a.seq)                   # published: done with (the row stays pending)
        writer[0].fail = ()
        j.answer(b.seq, "r/b", b"b")
        await j.written()
        writer[0].fail = ("UPDATE",)
        j.delivered(b.seq)
        await j.written()
        assert j.undelivered() == []         # not published twice
        writer[0].fail = ()
        j.prune()                            # any later write carries the mark again
        await j.written()
        assert j.healthy
        assert {e.seq: e.state for e in j.pending()} == {a.seq: "pending"}
        assert j.counts() == {"pending": 1, "delivered": 1}
        j.close()
    run(body)


def test_a_refusal_recorded_answered_is_settled_with_its_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request refused at the edge is recorded already answered, in one transaction:
    the link publishes nothing before that transaction is checkpointed either."""
    gate = Gate(monkeypatch)

    async def body() -> None:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        fut = j.record_soon(_msg(1), answer=("r/refused", b'{"ok": false}'))
        settled = asyncio.ensure_future(j.settled())
        await asyncio.to_thread(gate.entered.wait, 10)   # committed, not checkpointed
        await asyncio.sleep(0.05)
        assert not fut.done() and not settled.done()
        gate.open.set()
        e = await fut
        await settled
        assert e is not None and (e.state, e.reply_topic) == ("answered", "r/refused")
        [u] = j.undelivered()
        assert (u.seq, u.response) == (e.seq, b'{"ok": false}') and j.pending() == []
        j.close()
    run(body)
