"""rung's OPC UA server calls through the delivery journal, against real asyncua clients and
the real scheduler on the demo model: a call with an id is recorded before it runs and its
answer kept; the same id again (at once, from a second session while it runs, or after a
restart) gets that answer and the model runs once; a call without an id gets one; a call
cut short by a stop stays pending in the journal (not an MQTT request), runs once at the
next start and its answer goes to the repeated call."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua
from asyncua.client.client import Client

from rung.daemon.config import OpcUaServerConfig
from rung.daemon.demo.localbroker import free_port
from rung.daemon.journal.store import OPCUA_PREFIX, Journal
from rung.daemon.opcua.server import RungServer, Submit
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.tasks.runner import TaskRunner
from tests.daemon.opcua.test_agent import runner  # noqa: F401  (the module's fixture)
from tests.daemon.opcua.test_server import DIAGNOSIS, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REQUEST = json.dumps({"input": DIAGNOSIS, "id": "scada-0001", "max_tokens": 200})


def _config() -> OpcUaServerConfig:
    return OpcUaServerConfig(enabled=True, endpoint=f"opc.tcp://127.0.0.1:{free_port()}/rung/")


@asynccontextmanager
async def serving(cfg: OpcUaServerConfig, journal: Journal, submit: Submit,
                  tasks: Any) -> AsyncIterator[RungServer]:
    server = RungServer(cfg, tasks, submit, lambda: {"ready": True}, "rung-test",
                        120.0, journal, max_attempts=3)
    task = asyncio.get_running_loop().create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 30)
        yield server
    finally:   # as a stopped process: the calls in progress end with it
        for call in list(server._inflight.values()):
            call.cancel()
        task.cancel()
        await asyncio.gather(task, *server._inflight.values(), return_exceptions=True)


class Counted:
    """The real scheduler (its starts counted in the journal), every submission counted."""

    def __init__(self, runner: TaskRunner) -> None:  # noqa: F811
        self.server: RungServer | None = None
        self.scheduler = Scheduler(runner, lambda a: None, 4)
        self.submitted: list[Request] = []

    def submit(self, req: Request, recovered: bool = False,
               on_start: Callable[[Request], object] | None = None
               ) -> asyncio.Future[Answer] | None:
        self.submitted.append(req)
        return self.scheduler.submit(req, recovered, on_start)


async def _call(endpoint: str, method: str, request: str, timeout: float = 120) -> str:
    client = Client(endpoint, timeout=timeout, watchdog_intervall=600)
    async with client:
        rung = await client.nodes.objects.get_child(["2:rung"])
        answer: str = await rung.call_method(f"2:{method}",
                                             ua.Variant(request, ua.VariantType.String))
        return answer


def _rows(path: Path) -> list[tuple[Any, ...]]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT seq, topic, state, attempts, response IS NOT NULL "
                          "FROM entries ORDER BY seq").fetchall()


def test_a_call_with_an_id_runs_once(runner: TaskRunner, tmp_path: Path) -> None:  # noqa: F811
    cfg = _config()
    path = tmp_path / "journal.db"

    async def scenario() -> None:
        journal = Journal(path)
        journal.attach()
        counted = Counted(runner)
        counted.scheduler.start()
        try:
            async with serving(cfg, journal, counted.submit, runner.tasks) as server:
                counted.server = server
                # the same id from two sessions at once: one run, both get its answer
                first, second = await asyncio.gather(
                    _call(cfg.endpoint, "Diagnose", REQUEST),
                    _call(cfg.endpoint, "Diagnose", json.dumps(json.loads(REQUEST), indent=2)))
                assert first == second
                doc = json.loads(first)
                assert doc["id"] == "scada-0001" and doc["task"] == "diagnosis", doc
                assert len(counted.submitted) == 1
                # again, after it was answered: from the journal
                assert await _call(cfg.endpoint, "Diagnose", REQUEST) == first
                assert len(counted.submitted) == 1
                # without an id: one is assigned and echoed; that id names it from now on
                short = {"input": DIAGNOSIS, "max_tokens": 16}
                fresh = json.loads(await _call(cfg.endpoint, "Diagnose", json.dumps(short)))
                assert fresh["id"].startswith("opcua-") and len(counted.submitted) == 2
                again = await _call(cfg.endpoint, "Diagnose",
                                    json.dumps({**short, "id": fresh["id"]}))
                assert json.loads(again) == fresh and len(counted.submitted) == 2
                # refused at the edge: answered, nothing recorded
                bad = json.loads(await _call(cfg.endpoint, "Diagnose", "{nope"))
                assert bad["error"]["code"] == "bad_json"
                await journal.written()
                assert journal.pending() == [] and journal.pending(opcua=True) == []
        finally:
            await counted.scheduler.stop(5)
            journal.close()
        rows = _rows(path)
        assert [(topic, state, attempts, kept) for _, topic, state, attempts, kept in rows] \
            == [(f"{OPCUA_PREFIX}diagnosis", "delivered", 1, 1)] * 2
    run(scenario, 600)


def test_a_call_cut_short_by_a_stop_runs_once_after_the_restart(
        runner: TaskRunner, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "journal.db"

    async def before() -> None:
        """The model starts on the call, then the daemon stops (its answer never comes)."""
        journal = Journal(path)
        journal.attach()
        cfg = _config()
        taken: asyncio.Event = asyncio.Event()
        servers: list[RungServer] = []

        def hang(req: Request, recovered: bool = False,
                 on_start: Callable[[Request], object] | None = None
                 ) -> asyncio.Future[Answer]:
            def start() -> None:   # as the scheduler does, later: the start counted
                assert on_start is not None
                started = on_start(req)
                assert isinstance(started, asyncio.Future)
                started.add_done_callback(lambda _: taken.set())

            asyncio.get_running_loop().call_soon(start)
            return asyncio.get_running_loop().create_future()

        async with serving(cfg, journal, hang, runner.tasks) as server:
            servers.append(server)
            call = asyncio.get_running_loop().create_task(
                _call(cfg.endpoint, "Diagnose", REQUEST, timeout=5))
            await asyncio.wait_for(taken.wait(), 30)
        with pytest.raises(Exception):   # noqa: B017  the session ends with the server
            await call
        await journal.written()
        journal.close()

    async def after() -> None:
        journal = Journal(path)
        assert journal.pending() == []   # not an MQTT request: MQTT recovery never sees it
        (row,) = journal.pending(opcua=True)
        assert row.attempts == 1 and row.topic == f"{OPCUA_PREFIX}diagnosis"
        journal.attach()
        cfg = _config()
        counted = Counted(runner)
        counted.scheduler.start()
        try:
            async with serving(cfg, journal, counted.submit, runner.tasks) as server:
                counted.server = server
                assert server.recover() == 1
                first = await _call(cfg.endpoint, "Diagnose", REQUEST)
                assert json.loads(first)["id"] == "scada-0001"
                assert await _call(cfg.endpoint, "Diagnose", REQUEST) == first
                assert len(counted.submitted) == 1   # the recovered run, once
                await journal.written()
        finally:
            await counted.scheduler.stop(5)
            journal.close()
        assert [r[2:] for r in _rows(path)] == [("delivered", 2, 1)]

    run(before, 120)
    run(after, 600)
