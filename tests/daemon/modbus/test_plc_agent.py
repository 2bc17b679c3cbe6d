"""The PLC agent in one process, where the daemon's process boundary would hide it: the
answer kept under ``state_dir`` across an agent restart (never a second model run), and the
``rung_plc_*`` metrics. A real pymodbus PLC behind the fault proxy, the real scheduler on
the demo model; the publisher is the agent's interface, recorded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rung.daemon.backoff import Backoff
from rung.daemon.demo.plcsim import SimPlc
from rung.daemon.metrics import Metrics
from rung.daemon.modbus.agent import PlcAgent
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import encode_words, parse_map
from rung.daemon.plc.job import Answered, AnswerStore
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.tasks.runner import TaskRunner
from tests.daemon.modbus_proxy import ModbusProxy
from tests.daemon.plc_rig import map_doc

pytestmark = pytest.mark.integration
T = TypeVar("T")
REQ, REQ_SEQ, ACK_SEQ, BUSY, DONE, ERR, RESULT, HEARTBEAT = 100, 101, 110, 111, 112, 113, 114, 115


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    from rung.daemon.tasks.task import load_tasks
    from rung.engines import load_engine
    from rung.engines.tokenizer import Tokenizer

    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


@dataclass
class Plant:
    sim: SimPlc
    proxy: ModbusProxy
    scheduler: Scheduler
    state_dir: Path
    metrics: Metrics = field(default_factory=Metrics)
    submitted: list[str] = field(default_factory=list)
    published: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    broken: bool = False   # the scheduler's intake raises (a bug inside rung)

    def submit(self, req: Request) -> asyncio.Future[Answer] | None:
        self.submitted.append(req.task)
        if self.broken:
            raise RuntimeError("intake broken")
        return self.scheduler.submit(req)

    async def publish(self, topic: str, doc: dict[str, Any], retain: bool) -> bool:
        self.published.append((topic, doc))
        return True

    def events(self) -> list[dict[str, Any]]:
        return [doc for topic, doc in self.published if topic.endswith("/event")]

    def agent(self) -> PlcAgent:
        plc = parse_map(map_doc(port=self.proxy.port), Path("press1.yaml"))
        return PlcAgent(plc, Link(plc), self.submit, self.publish, "t/rung", 60.0, 0.1, 30.0,
                        metrics=self.metrics, state_dir=self.state_dir)

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"plc": "press1", **labels})
        return 0.0 if value is None else value

    async def until(self, what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
        await self.proxy.until(what, cond, timeout)


@asynccontextmanager
async def plant(runner: TaskRunner, state_dir: Path) -> AsyncIterator[Plant]:
    async with SimPlc() as sim:
        sim.holding[200:202] = [853, 3950]
        sim.input[10:12] = encode_words(92.5, "float32", "CDAB")
        proxy = ModbusProxy((sim.host, sim.port))
        await proxy.start()
        scheduler = Scheduler(runner, lambda a: None, 8)   # answers come back as futures
        scheduler.start()
        try:
            yield Plant(sim, proxy, scheduler, state_dir)
        finally:
            await scheduler.stop(5)
            await proxy.pause()


async def _running(agent: PlcAgent, body: Callable[[], Awaitable[T]]) -> T:
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        return await body()
    finally:
        await agent.stop()
        await task


def run(scenario: Callable[[], Awaitable[T]], seconds: float = 120) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(seconds):
            return await scenario()
    return asyncio.run(bounded())


@pytest.mark.slow
def test_kept_answer_is_delivered_after_a_restart_without_a_second_run(
        runner: TaskRunner, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path) as p:
            regs = p.sim.holding
            p.proxy.inject("exception", 16, at=ERR, arg=2)

            async def refused() -> None:
                regs[REQ_SEQ], regs[REQ] = 4, 1
                await p.until("3 answer writes", lambda: len(p.proxy.requests(16, ERR)) >= 3)
                assert p.sample("rung_plc_failing", op="answer write") >= 2
                assert p.sample("rung_plc_retries_total", op="answer write") >= 2
                assert p.sample("rung_plc_serving") == 1
                assert p.sample("rung_plc_jobs_total", err=str(p.events()[0]["err"])) == 1

            await _running(p.agent(), refused)
            kept = json.loads((tmp_path / "press1.json").read_text())
            assert kept["req_seq"] == 4 and kept["published"] is True
            assert (regs[ACK_SEQ], regs[BUSY], regs[DONE]) == (4, 1, 0)
            p.proxy.clear()

            async def delivered() -> None:
                await p.until("done", lambda: regs[DONE] == 1)
                assert (regs[ERR], regs[RESULT]) == (kept["err"], kept["result"])
                assert p.sample("rung_plc_failing", op="answer write") == 0
                regs[REQ] = 0
                await p.until("done cleared", lambda: regs[DONE] == 0)
                await p.until("the kept answer gone",
                              lambda: not (tmp_path / "press1.json").exists())

            await _running(p.agent(), delivered)
            assert p.submitted == ["diagnosis"] and len(p.events()) == 1
    run(scenario)


def test_an_answer_kept_unpublished_is_published_once(runner: TaskRunner,
                                                      tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path) as p:
            regs = p.sim.holding
            regs[REQ_SEQ] = regs[ACK_SEQ] = 9
            regs[REQ] = regs[BUSY] = 1          # rung died after the run, before publishing
            event = {"plc": "press1", "req_seq": 9, "err": 0, "result": 3}
            AnswerStore(tmp_path / "press1.json", "press1").save(
                Answered("press1", 9, 0, 3, event, {"plc": "press1", "req_seq": 9}))

            async def body() -> None:
                await p.until("done", lambda: regs[DONE] == 1 and regs[BUSY] == 0)

            await _running(p.agent(), body)
            assert (regs[ERR], regs[RESULT]) == (0, 3)
            assert p.events() == [event] and p.submitted == []
    run(scenario)


@pytest.mark.slow
def test_a_kept_answer_the_plc_moved_past_is_dropped(runner: TaskRunner,
                                                    tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path) as p:
            regs = p.sim.holding
            regs[REQ_SEQ], regs[ACK_SEQ], regs[REQ] = 10, 9, 1   # a new request since
            AnswerStore(tmp_path / "press1.json", "press1").save(
                Answered("press1", 9, 5, 0, {"req_seq": 9}, {}, published=True))

            async def body() -> None:
                await p.until("done", lambda: regs[DONE] == 1 and regs[ACK_SEQ] == 10)

            await _running(p.agent(), body)
            assert p.submitted == ["diagnosis"] and [e["req_seq"] for e in p.events()] == [10]
            assert regs[ERR] != 5
    run(scenario)


@pytest.mark.slow
def test_a_job_failing_inside_rung_is_answered_err_5_once(runner: TaskRunner,
                                                          tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path) as p:
            regs = p.sim.holding
            p.broken = True
            regs[REQ_SEQ], regs[REQ] = 3, 1

            async def body() -> None:
                await p.until("done", lambda: regs[DONE] == 1)
                polls = len(p.proxy.requests(3, 100))
                await p.until("20 more polls", lambda: len(p.proxy.requests(3, 100)) > polls + 20)

            await _running(p.agent(), body)
            assert (regs[ERR], regs[RESULT], regs[ACK_SEQ]) == (5, 0, 3)
            assert p.submitted == ["diagnosis"] and len(p.events()) == 1
            assert p.events()[0]["err_text"] == "internal error in rung"
    run(scenario)


def test_metrics_say_when_the_link_reconnects_per_request(runner: TaskRunner,
                                                          tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path) as p:
            p.proxy.inject("close")

            async def body() -> None:
                await p.until("per-request connections",
                              lambda: p.sample("rung_plc_per_transaction") == 1, 10)
                beat = p.sim.holding[HEARTBEAT]
                await p.until("the heartbeat", lambda: p.sim.holding[HEARTBEAT] > beat, 10)
                assert p.sample("rung_plc_serving") == 1

            await _running(p.agent(), body)
    run(scenario)


def test_answer_store_drops_what_it_cannot_trust(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "press1.json"
    store = AnswerStore(path, "press1")
    assert store.load() is None
    good = Answered("press1", 7, 0, 2, {"req_seq": 7}, {"req_seq": 7}, published=True)
    store.save(good)
    assert store.load() == good and not path.with_name("press1.json.tmp").exists()
    bad = {"not json": "{", "another PLC": json.dumps({"format": 1, **good.__dict__,
                                                       "plc": "press2"}),
           "a string req_seq": json.dumps({"format": 1, **good.__dict__, "req_seq": "7"}),
           "another format": json.dumps({"format": 2, **good.__dict__}),
           "a missing key": json.dumps({"format": 1, "plc": "press1"})}
    for why, text in bad.items():
        path.write_text(text)
        assert store.load() is None, why
        assert not path.exists(), why
    assert len([r for r in caplog.records if "dropping the kept answer" in r.message]) == 5


def test_every_plc_series_exists_from_the_start() -> None:
    from rung.daemon.metrics import PLC_ERRS, PLC_OPS

    async def publish(topic: str, doc: dict[str, Any], retain: bool) -> bool:
        return True

    metrics = Metrics()
    plc = parse_map(map_doc(port=1502), Path("press1.yaml"))
    PlcAgent(plc, Link(plc), lambda r: False, publish, "t", 1.0, metrics=metrics)
    got = metrics.registry.get_sample_value
    for op in PLC_OPS:
        assert got("rung_plc_retries_total", {"plc": "press1", "op": op}) == 0
        assert got("rung_plc_failing", {"plc": "press1", "op": op}) == 0
    for err in PLC_ERRS:
        assert got("rung_plc_jobs_total", {"plc": "press1", "err": str(err)}) == 0
    assert got("rung_plc_serving", {"plc": "press1"}) == 0
    assert got("rung_plc_per_transaction", {"plc": "press1"}) == 0


def test_backoff_doubles_to_its_cap() -> None:
    b = Backoff(0.05, 0.65)
    assert [b.delay(n) for n in range(1, 7)] == [0.05, 0.1, 0.2, 0.4, 0.65, 0.65]
    assert b.delay(10_000) == 0.65 and b.delay(0) == 0.05
