"""The supervisor of rung's long-lived parts (daemon/supervise.py): a transient fault is
retried with backoff and logged once; a part that cannot go on is dead, liveness says so and
the daemon exits 70. The unit tests drive the supervisor alone; the integration tests kill a
real daemon part's dependency (real mosquitto, the demo engine, in process)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.demo.localbroker import free_port
from rung.daemon.metrics import Metrics
from rung.daemon.supervise import Fatal, Policy, Supervisor, spawn
from tests.daemon.harness import Broker, Requester, write_config

pytestmark = pytest.mark.slow

FAST = Policy(first_s=0.01, max_s=0.05, restarts=3, healthy_s=0.3)


class Dead:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.event = asyncio.Event()

    def __call__(self, name: str, why: str) -> None:
        self.calls.append((name, why))
        self.event.set()


def _part_up(m: Metrics, name: str) -> float:
    return float(m.part_up.labels(part=name)._value.get())


def test_a_transient_fault_is_restarted_and_logged_once_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        dead, metrics = Dead(), Metrics()
        sup = Supervisor(dead, FAST, metrics)
        runs, healthy = 0, asyncio.Event()

        async def part() -> None:
            nonlocal runs
            runs += 1
            if runs <= 2:
                raise sqlite3.OperationalError("disk I/O error")
            healthy.set()
            await asyncio.Event().wait()

        sup.start("outbox", part)
        await asyncio.wait_for(healthy.wait(), 5)
        assert runs == 3 and dead.calls == [] and sup.liveness() is None
        assert metrics.part_restarts.labels(part="outbox")._value.get() == 2
        assert _part_up(metrics, "outbox") == 1
        await sup.stop()

    caplog.set_level(logging.INFO, "rung.supervise")
    asyncio.run(body())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None   # once, with the traceback
    assert "OperationalError: disk I/O error" in errors[0].getMessage()
    again = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(again) == 1 and again[0].exc_info is None        # the repeat: one line


def test_a_part_that_keeps_failing_is_dead_and_liveness_says_so() -> None:
    async def body() -> None:
        dead, metrics = Dead(), Metrics()
        sup = Supervisor(dead, FAST, metrics)
        runs = 0

        async def part() -> None:
            nonlocal runs
            runs += 1
            raise RuntimeError("broken for good")

        sup.start("sparkplug", part)
        await asyncio.wait_for(dead.event.wait(), 5)
        assert runs == FAST.restarts + 1
        assert dead.calls == [("sparkplug", "gave up after 3 restarts (RuntimeError: broken "
                                            "for good)")]
        assert sup.liveness() == ("sparkplug has stopped: gave up after 3 restarts "
                                  "(RuntimeError: broken for good)")
        assert _part_up(metrics, "sparkplug") == 0
        await sup.stop()
    asyncio.run(body())


def test_a_part_that_says_it_cannot_go_on_is_dead_at_once() -> None:
    async def body() -> None:
        dead = Dead()
        sup = Supervisor(dead, FAST)

        async def part() -> None:
            raise Fatal("the state dir is gone")

        sup.start("fleet", part)
        await asyncio.wait_for(dead.event.wait(), 5)
        assert dead.calls == [("fleet", "cannot go on (Fatal: the state dir is gone)")]
        await sup.stop()
    asyncio.run(body())


def test_a_failure_after_a_healthy_run_starts_a_new_episode() -> None:
    async def body() -> None:
        dead = Dead()
        sup = Supervisor(dead, FAST)
        runs = 0
        done = asyncio.Event()

        async def part() -> None:
            nonlocal runs
            runs += 1
            if runs == 8:
                done.set()
                await asyncio.Event().wait()
            if runs % 3 == 0:   # every third run is healthy for longer than healthy_s
                await asyncio.sleep(FAST.healthy_s + 0.05)
            raise ConnectionError("flaky")

        sup.start("plc-press1", part)
        await asyncio.wait_for(done.wait(), 10)
        assert dead.calls == [] and sup.liveness() is None   # never 4 failures in a row
        await sup.stop()
    asyncio.run(body())


def test_a_watched_part_that_ends_is_dead_unless_the_daemon_stops() -> None:
    async def body() -> None:
        dead = Dead()
        sup = Supervisor(dead, FAST)
        ended = asyncio.get_running_loop().create_task(asyncio.sleep(0))
        sup.watch("scheduler", ended)
        await asyncio.wait_for(dead.event.wait(), 5)
        assert dead.calls == [("scheduler", "ended (it returned while the daemon runs)")]

        quiet = Dead()
        sup2 = Supervisor(quiet, FAST)
        gate = asyncio.Event()

        async def loop() -> None:
            await gate.wait()

        task = asyncio.get_running_loop().create_task(loop())
        sup2.watch("scheduler", task)
        sup2.stopping = True     # the daemon stops: the engine loop ends on purpose
        gate.set()
        await task
        await asyncio.sleep(0)
        assert quiet.calls == [] and sup2.liveness() is None
    asyncio.run(body())


def test_a_part_that_returns_was_stopped_and_is_not_restarted() -> None:
    async def body() -> None:
        dead = Dead()
        sup = Supervisor(dead, FAST)
        runs = 0

        async def part() -> None:
            nonlocal runs
            runs += 1

        task = sup.start("mqtt", part)
        await task
        assert runs == 1 and dead.calls == [] and sup.liveness() is None
    asyncio.run(body())


def test_a_one_shot_task_that_fails_is_logged_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        held: set[asyncio.Task[Any]] = set()

        async def publish() -> None:
            raise ValueError("payload rejected")

        task = spawn(publish(), "outbox-direct", held)
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        assert held == set()
    asyncio.run(body())
    (rec,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "outbox-direct failed: ValueError: payload rejected" in rec.getMessage()
    assert rec.exc_info is not None


# -- a real daemon's parts, in process --------------------------------------------------

SHORT = {"input": {"description": "Pump P1 runs while the level is below 2 m.",
                   "name": "P_Pump", "pou_type": "PROGRAM"}, "max_tokens": 3}


class FlakyDb:
    """The journal's connection; reads of answers to publish fail ``fail`` times (a disk
    error), everything else goes through."""

    def __init__(self, db: sqlite3.Connection, fail: int) -> None:
        self.db, self.fail, self.failed = db, fail, 0

    def execute(self, sql: str, args: Any = ()) -> Any:
        if self.failed < self.fail and args == ("answered",):
            self.failed += 1
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def _service(tmp_path: Path, port: int, edge_engine: Path, **sections: Any) -> Any:
    from rung.daemon.config import load_config
    from rung.daemon.serve import Service, build_runner

    cfg = load_config(write_config(tmp_path, edge_engine, port, **sections), [])
    service = Service(cfg, build_runner(cfg))
    service.supervisor.policy = FAST
    return service


async def _connected(service: Any) -> asyncio.Future[int]:
    run = asyncio.ensure_future(service.run())
    while not service.link.connected:
        await asyncio.sleep(0.01)
    return run


@pytest.mark.integration
def test_answers_recorded_while_the_journal_cannot_be_read_are_published(
        tmp_path: Path, broker: Broker, edge_engine: Path) -> None:
    """The finding: one ``sqlite3.OperationalError`` in ``undelivered()`` ended the outbox
    and the answers recorded afterwards were never published, liveness green. Now the
    outbox tries again with backoff and every answer goes out."""
    service = _service(tmp_path, broker.port, edge_engine)
    flaky = FlakyDb(service.journal.db, fail=3)

    async def main() -> tuple[list[Any], str | None, int]:
        run = await _connected(service)
        service.journal.db = flaky
        req = Requester(broker.port)
        try:
            for i in range(3):
                await asyncio.to_thread(req.send, "st_code", {**SHORT, "id": f"r{i}"})
            replies = await asyncio.to_thread(req.wait, 3, 120)
        finally:
            req.client.disconnect()
        alive = service.liveness()
        service._stopping.set()
        return replies, alive, await run

    replies, alive, code = asyncio.run(main())
    assert flaky.failed == 3
    assert sorted(r.body["id"] for r in replies) == ["r0", "r1", "r2"]
    assert alive is None and code == 0


@pytest.mark.integration
def test_an_outbox_that_cannot_go_on_fails_liveness_and_exits_70(
        tmp_path: Path, broker: Broker, edge_engine: Path) -> None:
    service = _service(tmp_path, broker.port, edge_engine)

    async def broken(*_: Any, **__: Any) -> bool:
        raise RuntimeError("publish is broken")

    async def main() -> tuple[int, str | None]:
        run = await _connected(service)
        service.link.publish = broken
        req = Requester(broker.port)   # an answer to publish
        try:
            await asyncio.to_thread(req.send, "st_code", {**SHORT, "id": "r0"})
            code = await asyncio.wait_for(run, 60)
        finally:
            req.client.disconnect()
        return code, service.liveness()

    code, why = asyncio.run(main())
    assert code == 70
    assert why == ("outbox has stopped: gave up after 3 restarts (RuntimeError: publish is "
                   "broken)")
    assert service.metrics.up._value.get() == 0


@pytest.mark.integration
def test_a_metrics_endpoint_whose_thread_died_is_served_again(
        tmp_path: Path, broker: Broker, edge_engine: Path) -> None:
    mport = free_port()
    service = _service(tmp_path, broker.port, edge_engine, metrics={"port": mport})

    def scrape() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2).read()
        except (urllib.error.URLError, ConnectionError):
            return False
        return True

    async def main() -> tuple[bool, bool, str | None]:
        run = await _connected(service)
        assert await asyncio.to_thread(scrape)
        server, thread = service.metrics._server
        server.shutdown()   # the endpoint's thread ends
        thread.join(5)
        restarts = service.metrics.part_restarts.labels(part="metrics")
        for _ in range(200):
            if restarts._value.get() >= 1 and await asyncio.to_thread(scrape):
                break
            await asyncio.sleep(0.05)
        served = await asyncio.to_thread(scrape)
        alive = service.liveness()
        service._stopping.set()
        return served, await run == 0, alive

    served, clean, alive = asyncio.run(main())
    assert served and clean and alive is None


@pytest.mark.integration
def test_every_long_lived_part_is_supervised(tmp_path: Path, broker: Broker,
                                            edge_engine: Path) -> None:
    """Each part a daemon runs, with Sparkplug, metrics and a PLC configured (a fleet
    node: the fleet part), is under the supervisor."""
    plc = tmp_path / "press1.yaml"
    plc.write_text(json.dumps({
        "id": "press1", "description": "press",
        "transport": {"kind": "tcp", "host": "127.0.0.1", "port": free_port(),
                      "timeout_s": 0.2},
        "handshake": {"req": 100, "req_seq": 101, "ack_seq": 110, "busy": 111, "done": 112,
                      "err": 113, "result": 114, "heartbeat": 115},
        "points": [{"name": "oil_temp", "table": "holding", "address": 200,
                    "type": "int16"}]}))
    for fleet in (False, True):
        root = tmp_path / ("fleet" if fleet else "single")
        root.mkdir()
        mqtt: dict[str, Any] = {"shared_group": "g1"} if fleet else {}
        service = _service(root, broker.port, edge_engine, plcs=[str(plc)], mqtt=mqtt,
                           metrics={"port": free_port()},
                           sparkplug={"enabled": True, "group_id": "plant1"})

        async def main(service: Any = service) -> set[str]:
            run = await _connected(service)
            while "status" not in service.supervisor.parts:   # started once READY
                await asyncio.sleep(0.01)
            parts = set(service.supervisor.parts)
            service._stopping.set()
            assert await run == 0
            return parts

        parts = asyncio.run(main())
        expected = {"mqtt", "scheduler", "outbox", "sparkplug", "metrics", "status"}
        expected |= {"fleet"} if fleet else {"plc-press1"}
        assert expected <= parts, expected - parts


def test_the_unit_allows_the_shutdown_grace() -> None:
    """systemd's TimeoutStopSec covers the default grace plus what follows it (answers
    published, offline said): a stop is never cut short by SIGKILL."""
    from rung.daemon.config import QueueConfig
    from rung.daemon.serve import STOP_TAIL_S

    unit = (Path(__file__).resolve().parents[2] / "systemd" / "rung.service").read_text()
    (line,) = [ln for ln in unit.splitlines() if ln.startswith("TimeoutStopSec=")]
    assert float(line.partition("=")[2]) >= QueueConfig().stop_grace_s + STOP_TAIL_S


@pytest.mark.integration
def test_a_stop_past_its_grace_halts_the_engine_thread(
        tmp_path: Path, broker: Broker, edge_engine: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The finding: a stop with 0.5 s grace returned after 0.5 s but the process lived on
    until a 4 s generation ended. With no grace left the engine thread ends at its next
    step and the request stays pending in the journal for the restart."""
    from rung.daemon.journal.store import Journal

    service = _service(tmp_path, broker.port, edge_engine, queue={"stop_grace_s": 0})
    long = {"input": SHORT["input"], "id": "long"}   # the task's whole token budget

    async def main() -> tuple[int, bool]:
        run = await _connected(service)
        req = Requester(broker.port)
        try:
            await asyncio.to_thread(req.send, "st_code", long)
            while service.scheduler.inflight == 0:
                await asyncio.sleep(0.005)
            service._stopping.set()
            code = await asyncio.wait_for(run, 60)
        finally:
            req.client.disconnect()
        engine_loop = service.supervisor.parts["scheduler"].task
        return code, engine_loop is not None and engine_loop.done()

    caplog.set_level(logging.INFO)
    code, ended = asyncio.run(main())
    assert code == 0 and ended
    assert any("halting it; its 1 requests stay pending" in r.getMessage()
               for r in caplog.records)
    stopped = [r for r in caplog.records if r.getMessage() == "stopped"]
    assert stopped and stopped[0].rung_fields["queued_for_restart"] == 1  # type: ignore[attr-defined]
    j = Journal(tmp_path / "state" / "journal.db")
    assert [json.loads(e.payload)["id"] for e in j.pending()] == ["long"]
    j.close()


@pytest.mark.integration
@pytest.mark.parametrize("part", ["sparkplug", "fleet"])
def test_a_plant_part_that_keeps_failing_stops_rung_for_a_restart(
        tmp_path: Path, broker: Broker, edge_engine: Path, part: str) -> None:
    """The Sparkplug link (its session with the broker) and the fleet (its status
    republishing) each fail for good in turn: liveness names the part and rung exits 70."""
    mqtt: dict[str, Any] = {"shared_group": "g1", "fleet_update_s": 0.05} \
        if part == "fleet" else {}
    service = _service(tmp_path, broker.port, edge_engine, mqtt=mqtt,
                       sparkplug={"enabled": part == "sparkplug", "group_id": "plant1"})

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError(f"{part} dependency gone")

    if part == "sparkplug":
        service.sparkplug._serve = broken       # every session fails at once
    else:
        service.fleet._retry_refused = broken   # its periodic round

    async def main() -> tuple[int, str | None]:
        code = await asyncio.wait_for(service.run(), 60)
        return code, service.liveness()

    code, why = asyncio.run(main())
    assert code == 70 and why is not None and why.startswith(f"{part} has stopped: gave up")
    assert service.metrics.part_restarts.labels(part=part)._value.get() == FAST.restarts
