"""The SQLite delivery journal: row states, duplicates (also across a restart), anonymous
redeliveries, pruning, expiry, a corrupt file moved aside, an unusable location."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.journal.store import Incoming, Journal, JournalError, dedupe_key

TOPIC = "v1/site/rung/node1/req/st_code"
PAYLOAD = b'{"input": {"spec": "a timer"}}'


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db")
    yield j
    j.close()


def _msg(payload: bytes = PAYLOAD, **kw: Any) -> Incoming:
    return Incoming(TOPIC, payload, **kw)


def test_row_life_pending_answered_delivered(journal: Journal) -> None:
    e = journal.record(_msg(response_topic="app/replies", correlation=b"c1"), now=1000.0)
    assert e is not None and e.seq >= 1
    assert (e.topic, e.payload, e.response_topic, e.correlation) == (
        TOPIC, PAYLOAD, "app/replies", b"c1")
    assert (e.received, e.expires, e.state) == (1000.0, None, "pending")
    assert [p.seq for p in journal.pending()] == [e.seq]
    assert journal.undelivered() == []
    assert journal.counts() == {"pending": 1}

    journal.answer(e.seq, "app/replies", b'{"ok": true}')
    assert journal.pending() == []
    [u] = journal.undelivered()
    assert (u.seq, u.state, u.reply_topic, u.response) == (
        e.seq, "answered", "app/replies", b'{"ok": true}')
    assert u.payload == PAYLOAD and u.received == 1000.0
    assert journal.counts() == {"answered": 1}

    journal.delivered(e.seq)
    assert journal.pending() == [] and journal.undelivered() == []
    assert journal.counts() == {"delivered": 1}


def test_answer_only_moves_a_pending_row(journal: Journal) -> None:
    e = journal.record(_msg())
    assert e is not None
    journal.answer(e.seq, "r/1", b"first")
    journal.answer(e.seq, "r/2", b"second")     # already answered: the first answer stays
    [u] = journal.undelivered()
    assert (u.reply_topic, u.response) == ("r/1", b"first")


def test_pending_and_undelivered_are_oldest_first(journal: Journal) -> None:
    seqs = []
    for i in range(4):
        e = journal.record(_msg(f'{{"input": {{}}, "n": {i}}}'.encode(), mid=i + 1))
        assert e is not None
        seqs.append(e.seq)
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    journal.answer(seqs[2], "t", b"x")
    journal.answer(seqs[0], "t", b"y")
    assert [p.seq for p in journal.pending()] == [seqs[1], seqs[3]]
    assert [u.seq for u in journal.undelivered()] == [seqs[0], seqs[2]]
    assert journal.counts() == {"pending": 2, "answered": 2}


@pytest.mark.parametrize("named", [{"correlation": b"corr-7"}, {"claimed_id": "req-7"}],
                         ids=["correlation", "claimed_id"])
def test_named_request_is_recorded_once(tmp_path: Path, named: dict[str, object]) -> None:
    path = tmp_path / "journal.db"
    j = Journal(path)
    first = j.record(_msg(mid=5, **named))
    assert first is not None
    assert j.record(_msg(mid=5, **named)) is None
    assert j.record(_msg(mid=99, **named)) is None       # a new packet id is still the same
    j.answer(first.seq, "r", b"a")
    j.delivered(first.seq)
    assert j.record(_msg(mid=6, **named)) is None        # kept after delivery too
    j.close()

    j2 = Journal(path)                                    # a restart keeps the row
    try:
        assert j2.moved_aside is None
        assert j2.record(_msg(mid=7, **named)) is None
        assert j2.counts() == {"delivered": 1}
        other = j2.record(_msg(b'{"input": {"spec": "other"}}', **named))
        assert other is not None and other.seq != first.seq   # other payload, other request
    finally:
        j2.close()


def test_pending_rows_survive_a_restart(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.db")
    a = j.record(_msg(claimed_id="a"), now=50.0)
    b = j.record(_msg(claimed_id="b"))
    assert a is not None and b is not None
    j.answer(b.seq, "r/b", b"answer-b")
    j.close()
    j2 = Journal(tmp_path / "journal.db")
    try:
        [p] = j2.pending()
        assert (p.seq, p.payload, p.received) == (a.seq, PAYLOAD, 50.0)
        [u] = j2.undelivered()
        assert (u.seq, u.reply_topic, u.response) == (b.seq, "r/b", b"answer-b")
    finally:
        j2.close()


def test_anonymous_redelivery_while_not_delivered_is_a_duplicate(journal: Journal) -> None:
    e = journal.record(_msg(mid=12))
    assert e is not None
    assert journal.record(_msg(mid=12)) is None
    journal.answer(e.seq, "r", b"x")
    assert journal.record(_msg(mid=12)) is None          # answered, not yet acknowledged
    assert journal.counts() == {"answered": 1}


def test_anonymous_after_delivery_is_a_new_request(journal: Journal) -> None:
    e = journal.record(_msg(mid=12))
    assert e is not None
    journal.answer(e.seq, "r", b"x")
    journal.delivered(e.seq)
    again = journal.record(_msg(mid=12))                 # the broker reused its packet id
    assert again is not None and again.seq != e.seq
    assert journal.counts() == {"delivered": 1, "pending": 1}


def test_equal_anonymous_messages_with_other_mids_are_two_rows(journal: Journal) -> None:
    a = journal.record(_msg(mid=1))
    b = journal.record(_msg(mid=2))
    assert a is not None and b is not None and a.seq != b.seq
    assert len(journal.pending()) == 2


def test_dedupe_key_kinds() -> None:
    assert dedupe_key(_msg(claimed_id="x")).startswith("id:")
    assert dedupe_key(_msg(correlation=b"")).startswith("id:")
    assert dedupe_key(_msg(mid=3)).startswith("anon:3:")
    assert dedupe_key(_msg(claimed_id="x", mid=1)) == dedupe_key(_msg(claimed_id="x", mid=2))
    assert dedupe_key(_msg(claimed_id="x")) != dedupe_key(_msg(claimed_id="y"))
    # a lone surrogate (a JSON "\ud800" escape) still makes a key
    assert dedupe_key(_msg(claimed_id="\ud800")) != dedupe_key(_msg(claimed_id="\ud801"))


def test_prune_removes_old_delivered_rows_only(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.db", retention_s=100.0)
    try:
        rows = [j.record(_msg(claimed_id=str(i))) for i in range(3)]
        assert all(r is not None for r in rows)
        done, answered, _pending = (r.seq for r in rows if r is not None)
        j.answer(done, "r", b"x")
        j.delivered(done)
        j.answer(answered, "r", b"y")
        assert j.prune(now=time.time()) == 0              # within the retention
        assert j.prune(now=time.time() + 101.0) == 1
        assert j.counts() == {"answered": 1, "pending": 1}
        assert j.record(_msg(claimed_id="0")) is not None  # forgotten: new again
    finally:
        j.close()


def test_expires_from_expiry_interval(journal: Journal) -> None:
    e = journal.record(_msg(claimed_id="e", expiry_s=30.0), now=1000.0)
    assert e is not None and e.expires == 1030.0
    [p] = journal.pending()
    assert p.expires == 1030.0
    f = journal.record(_msg(claimed_id="f"), now=1000.0)
    assert f is not None and f.expires is None


def _assert_fresh_after_corruption(path: Path) -> None:
    j = Journal(path)
    try:
        assert j.moved_aside is not None
        assert j.moved_aside.parent == path.parent
        assert j.moved_aside.name.startswith("journal.db.corrupt-")
        assert j.moved_aside.exists()
        assert j.counts() == {} and j.pending() == []
        e = j.record(_msg(claimed_id="after"))
        assert e is not None and e.seq == 1
    finally:
        j.close()
    j2 = Journal(path)                                   # the new file is healthy
    try:
        assert j2.moved_aside is None and j2.counts() == {"pending": 1}
    finally:
        j2.close()


def test_garbage_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    garbage = bytes(range(256)) * 64
    path.write_bytes(garbage)
    Path(f"{path}-wal").write_bytes(b"stale")
    _assert_fresh_after_corruption(path)
    [aside] = tmp_path.glob("journal.db.corrupt-*")
    assert aside.read_bytes() == garbage
    wal = Path(f"{path}-wal")                            # the stale one was not replayed
    assert not wal.exists() or wal.read_bytes() != b"stale"


def test_foreign_sqlite_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE something_else (a INTEGER, b TEXT)")
    db.execute("INSERT INTO something_else VALUES (1, 'x')")
    db.commit()
    db.close()
    _assert_fresh_after_corruption(path)
    [aside] = tmp_path.glob("journal.db.corrupt-*")
    with sqlite3.connect(aside) as old:
        assert old.execute("SELECT a, b FROM something_else").fetchall() == [(1, "x")]
    old.close()


def test_unwritable_location_raises_journal_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(JournalError) as err:
        Journal(blocker / "state" / "journal.db")
    assert "cannot open the delivery journal" in err.value.message
    assert err.value.hint is not None and "state_dir" in err.value.hint


def test_directory_in_place_of_the_file_raises_journal_error(tmp_path: Path) -> None:
    (tmp_path / "journal.db").mkdir()                    # cannot be opened: not damage
    with pytest.raises(JournalError):
        Journal(tmp_path / "journal.db")
    assert (tmp_path / "journal.db").is_dir()
    assert list(tmp_path.glob("journal.db.corrupt-*")) == []



def test_started_counts_attempts_and_survives_a_restart(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.db")
    e = j.record(_msg())
    assert e is not None
    assert j.started(e.seq) == 1 and j.started(e.seq) == 2
    j.close()
    j = Journal(tmp_path / "journal.db")
    [p] = j.pending()
    assert p.attempts == 2
    j.answer(e.seq, "r/1", b"quarantined", note="why")
    assert j.started(e.seq) == 0          # only pending rows count
    j.close()


def test_dead_letter_leaves_the_outbox_and_is_kept(journal: Journal) -> None:
    a, b = journal.record(_msg(b'{"n": 1}')), journal.record(_msg(b'{"n": 2}'))
    assert a is not None and b is not None
    journal.answer(a.seq, "bad\x01topic", b"x")
    journal.answer(b.seq, "good/topic", b"y")
    journal.dead(a.seq, "the broker refused it 3 times")
    assert [u.seq for u in journal.undelivered()] == [b.seq]
    assert journal.dead_letters() == [(a.seq, "bad\x01topic", "the broker refused it 3 times")]
    assert journal.counts() == {"dead": 1, "answered": 1}
    assert journal.prune(now=time.time() + journal.retention_s + 1) == 1


def test_an_older_journal_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE entries (seq INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT UNIQUE, received REAL NOT NULL, expires REAL, topic TEXT NOT NULL,
        payload BLOB NOT NULL, response_topic TEXT, correlation BLOB, state TEXT NOT NULL,
        reply_topic TEXT, response BLOB, updated REAL NOT NULL);
        INSERT INTO entries (key, received, topic, payload, state, updated)
        VALUES ('k', 1.0, 't/req/x', X'7B7D', 'pending', 1.0);""")
    db.close()
    j = Journal(path)
    [p] = j.pending()
    assert p.attempts == 0 and j.started(p.seq) == 1
    j.close()


_WRITER = """
import os, sys, sqlite3
from pathlib import Path
from rung.daemon.journal.store import Incoming, Journal
path, n, raw = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "raw"
if raw:   # plain SQLite without rung's checkpoints: committed rows live only in the WAL
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for i in range(n):
        db.execute("INSERT INTO t VALUES (?)", (os.urandom(3000),))
else:
    j = Journal(path)
    for i in range(n):
        j.record(Incoming("b/req/st_code", b'{"input": {}, "id": "%d"}' % i))
print("recorded", flush=True)
os._exit(0)   # like SIGKILL: no close, no final checkpoint
"""


def _write_and_die(path: Path, n: int, raw: bool = False) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WRITER, str(path), str(n),
                          "raw" if raw else "journal"], capture_output=True, text=True,
                         timeout=120, check=True)
    assert "recorded" in out.stdout


@pytest.mark.parametrize("keep", [0, 32, 1000])
def test_acknowledged_rows_survive_a_wal_cut_short_after_a_crash(tmp_path: Path,
                                                                 keep: int) -> None:
    path = tmp_path / "journal.db"
    _write_and_die(path, 20)
    wal_file = Path(f"{path}-wal")
    if wal_file.exists():
        wal_file.write_bytes(wal_file.read_bytes()[:keep])
    j = Journal(path)
    assert len(j.pending()) == 20       # every row that record() returned for is kept
    j.close()
    # the hazard the checkpoints remove: plain WAL mode loses committed rows this way
    raw = tmp_path / "raw.db"
    _write_and_die(raw, 20, raw=True)
    raw_wal = Path(f"{raw}-wal")
    raw_wal.write_bytes(raw_wal.read_bytes()[:keep])
    db = sqlite3.connect(raw)
    assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] < 20
    db.close()


def test_a_torn_wal_is_reported_and_kept_aside(tmp_path: Path) -> None:
    from rung.daemon.journal import wal

    path = tmp_path / "journal.db"
    _write_and_die(path, 5, raw=True)
    wal_file = Path(f"{path}-wal")
    state = wal.inspect(wal_file)
    assert state.problem is None and state.committed_frames >= 5
    data = wal_file.read_bytes()
    wal_file.write_bytes(data[:-100])    # the last frame cut short
    torn = wal.inspect(wal_file)
    assert torn.problem is not None and "cut short" in torn.problem
    assert 0 < torn.committed_frames < state.committed_frames and torn.dropped_bytes > 0
    j = Journal(path)
    assert j.wal_damage is not None and "cut short" in j.wal_damage
    assert list(tmp_path.glob("journal.db-wal.damaged-*"))
    j.close()
    # a flipped byte inside the last frame: a torn write
    _write_and_die(tmp_path / "b.db", 3, raw=True)
    b_wal = tmp_path / "b.db-wal"
    raw = bytearray(b_wal.read_bytes())
    raw[-10] ^= 0xFF
    b_wal.write_bytes(bytes(raw))
    assert "wrong checksum" in (wal.inspect(b_wal).problem or "")
    # a clean WAL, an empty one and none at all are not damage
    assert wal.inspect(tmp_path / "none-wal").problem is None
    (tmp_path / "empty-wal").write_bytes(b"")
    assert wal.inspect(tmp_path / "empty-wal").problem is None
    (tmp_path / "short-wal").write_bytes(b"\x37\x7f\x06")
    assert "cut short" in (wal.inspect(tmp_path / "short-wal").problem or "")
