"""A journal deleted or replaced under a running daemon: SQLite writes on through its open
descriptors into files no restart will find, so rung must notice (device and inode) and
stop, never stay alive and silent. The unit tests drive the journal alone; the last one a
real daemon in process (real mosquitto, the demo engine)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.journal.store import Incoming, Journal, JournalError
from tests.daemon.harness import Broker, Requester, write_config

TOPIC = "v1/site/rung/node1/req/st_code"
SIDES = ("", "-wal", "-shm")


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db")
    yield j
    j.close()


def _msg(n: int) -> Incoming:
    return Incoming(TOPIC, json.dumps({"id": f"r{n}", "input": {}}).encode(),
                    claimed_id=f"r{n}")


def _delete(path: Path) -> None:
    for side in SIDES:
        Path(f"{path}{side}").unlink(missing_ok=True)


def test_a_journal_in_use_is_its_files(journal: Journal) -> None:
    """Writes, a checkpoint after each, another connection opening and closing the file
    (``rung check``): the path names the same files all along."""
    for n in range(3):
        entry = journal.record(_msg(n))
        assert entry is not None
        journal.answer(entry.seq, "r/1", b"{}")
        journal.delivered(entry.seq)
    other = Journal(journal.path)
    assert other.counts() == {"delivered": 3}
    other.close()
    assert journal.record(_msg(9)) is not None
    assert journal.check_files() is None and journal.vanished is None


def test_a_deleted_journal_refuses_every_write(journal: Journal,
                                               caplog: pytest.LogCaptureFixture) -> None:
    assert journal.record(_msg(0)) is not None
    _delete(journal.path)
    why = journal.check_files()
    assert why is not None and why == journal.vanished
    assert f"{journal.path} was deleted or replaced under the running daemon" in why
    assert "the path names nothing" in why
    with pytest.raises(JournalError, match="deleted or replaced") as err:
        journal.record(_msg(1))
    assert err.value.hint is not None and "restart" in err.value.hint
    assert not journal.healthy
    # a new journal at the path (``rung check``, a restore) does not make it right again
    Journal(journal.path).close()
    assert journal.check_files() == why
    with pytest.raises(JournalError):
        journal.record(_msg(2))
    failing = [r for r in caplog.records if "journal writes failing" in r.getMessage()]
    assert len(failing) == 1   # said once, not per write


def test_a_replaced_journal_is_seen(journal: Journal, tmp_path: Path) -> None:
    """Another file moved onto the path (a restore from a backup): another inode."""
    assert journal.record(_msg(0)) is not None
    copy = Journal(tmp_path / "other.db")
    copy.close()
    os.replace(tmp_path / "other.db", journal.path)
    why = journal.check_files()
    assert why is not None and "the path names another file (device" in why


def test_an_attached_journal_fails_the_writes_queued_after(tmp_path: Path) -> None:
    """Attached (``rung serve``): the writer thread checks the files before each batch, so
    a request is refused (``JournalError``: answered ``unavailable``) instead of recorded
    into the unlinked file."""
    async def main() -> tuple[Any, BaseException | None]:
        j = Journal(tmp_path / "journal.db")
        j.attach()
        try:
            first = await j.record_soon(_msg(0))
            _delete(j.path)
            second = j.record_soon(_msg(1))
            await asyncio.wait([second])
            return first, second.exception()
        finally:
            j.close()

    first, err = asyncio.run(main())
    assert first is not None
    assert isinstance(err, JournalError) and "deleted or replaced" in err.message


# -- a real daemon, in process -----------------------------------------------------------

SHORT = {"input": {"description": "Pump P1 runs while the level is below 2 m.",
                   "name": "P_Pump", "pou_type": "PROGRAM"}, "max_tokens": 3}


@pytest.mark.slow
@pytest.mark.integration
def test_a_journal_deleted_under_a_running_daemon_stops_it(
        tmp_path: Path, broker: Broker, edge_engine: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The finding: with journal.db and its WAL/SHM deleted, rung kept answering into the
    unlinked files, ``rung_storage_ok`` 1, no warning; after a restart an id answered
    before was run and answered again. Now: ``rung_storage_ok`` 0, one critical line that
    names the file, exit 70 for systemd to restart it."""
    from rung.daemon.config import load_config
    from rung.daemon.serve import Service, build_runner

    caplog.set_level(logging.INFO)
    cfg = load_config(write_config(tmp_path, edge_engine, broker.port), [])
    service = Service(cfg, build_runner(cfg))
    path = cfg.state_dir / "journal.db"

    async def main() -> tuple[list[Any], int, str | None]:
        run = asyncio.ensure_future(service.run())
        while not service.link.connected:
            await asyncio.sleep(0.01)
        req = Requester(broker.port)
        try:
            await asyncio.to_thread(req.send, "st_code", {**SHORT, "id": "before"})
            replies = await asyncio.to_thread(req.wait, 1, 120)
            assert service.metrics.storage_ok._value.get() == 1
            _delete(path)
            code = await asyncio.wait_for(run, 60)
        finally:
            req.close()
        return replies, code, service.liveness()

    replies, code, why = asyncio.run(main())
    assert [r.body["id"] for r in replies] == ["before"]
    assert code == 70
    assert service.metrics.storage_ok._value.get() == 0
    assert service.metrics.up._value.get() == 0
    assert why is not None and why.startswith("storage has stopped: cannot go on")
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1, [r.getMessage() for r in critical]
    text = critical[0].getMessage()
    assert text.startswith("storage has stopped for good") and str(path) in text
    assert "deleted or replaced under the running daemon" in text
