"""The event loop does I/O only: the heaviest CPU work rung has (a batch decoding, a long
prompt prefix restored from the disk tier, a maximum-size fault tree validated with its
BDD) runs in the engine thread, never on the loop's, and the systemd watchdog keeps being
fed meanwhile. Real engine, real task runner, real scheduler, a real datagram socket in
place of systemd. What is checked is where the work runs, not how long the loop waited:
a stall measured in milliseconds says more about a busy machine than about rung
(bench/loop_latency.py measures it)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.demo.localbroker import LocalBroker
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.sdnotify import Notifier, watchdog_loop
from rung.daemon.tasks.runner import Prepared, TaskResult, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.kv_store import ColdStore
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.slow


def max_size_fault_tree() -> dict[str, Any]:
    """A fault tree at the output schema's limits: 40 basic events, 30 gates of up to 10
    inputs each, events shared between gates (a BDD that does real work)."""
    events = [{"id": f"E{i}", "description": f"component {i} fails",
               "probability": 1e-3 * (1 + i % 7)}
              for i in range(40)]
    gates = []
    for g in range(30):
        kind = ["OR", "AND", "ATLEAST"][g % 3]
        inputs = [f"E{(g * 7 + j * 3) % 40}" for j in range(6)]
        if g >= 3:
            inputs += [f"G{(g - 1 - j) % g}" for j in range(min(4, g))]
        gate: dict[str, Any] = {"id": f"G{g}", "type": kind, "inputs": inputs[:10],
                                "description": f"subsystem {g}"}
        if kind == "ATLEAST":
            gate["k"] = 2
        gates.append(gate)
    return {"top": "G29", "description": "Press stops", "gates": gates,
            "basic_events": events}


class HeavyRunner(TaskRunner):
    """The real runner; a request whose input has ``"system": "MAX"`` is validated as if
    the model had written the maximum-size fault tree (the validator's worst case). It
    notes the thread each preparation and validation runs on."""

    threads: set[int]

    def prepare(self, *args: Any, **kw: Any) -> Any:
        self.threads.add(threading.get_ident())
        return super().prepare(*args, **kw)

    def finish(self, prepared: Prepared, gen: Generation) -> TaskResult:
        self.threads.add(threading.get_ident())
        if isinstance(prepared.data, dict) and prepared.data.get("system") == "MAX":
            gen.text = json.dumps(max_size_fault_tree())
            gen.finish_reason = "stop"
        return super().finish(prepared, gen)


def _request(seq: int, task: str, data: dict[str, Any], max_tokens: int = 48) -> Request:
    now = time.time()
    return Request(task=task, input=data, received=now, deadline=now + 300, ref=str(seq),
                   max_tokens=max_tokens)


@pytest.fixture
def runner(edge_engine: Path, tmp_path: Path) -> HeavyRunner:
    engine = load_engine(edge_engine)
    m = engine.manifest
    tok = Tokenizer.load(edge_engine, m.tokenizer)
    # no RAM tier: every prefix block comes back from the disk tier
    store = ColdStore(m.engine_id, 0, state_dir=tmp_path / "state", disk_budget_bytes=2**30)
    runner = HeavyRunner(engine, tok, load_tasks(), edge_engine,
                         prefix=PrefixCache(store, m.engine_id))
    runner.threads = set()
    return runner


def test_the_loop_stays_responsive_while_the_engine_thread_works(
        runner: HeavyRunner, tmp_path: Path) -> None:
    points = [{"name": f"sensor_{i:02d}_temperature", "value": 20.0 + i, "unit": "degC",
               "limits": {"alert": 70.0, "alarm": 85.0}} for i in range(22)]
    long_input = {"asset": "Hydraulic press 1", "description": "Shift report.", "points": points}
    prepared = runner.prepare("diagnosis", long_input, SamplingParams(), 4)
    assert isinstance(prepared, Prepared)
    prompt = prepared.ids    # the prompt and the answer's computed start
    max_seq = runner.engine.manifest.dims.max_seq
    assert 800 <= len(prompt) < max_seq - 48, len(prompt)

    sock_path = str(tmp_path / "notify.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(sock_path)
    receiver.setblocking(False)
    pings: list[float] = []

    engine_threads: set[int] = set()
    forward = runner.engine.forward

    def noted_forward(*args: Any, **kw: Any) -> Any:
        engine_threads.add(threading.get_ident())
        return forward(*args, **kw)

    runner.engine.forward = noted_forward  # type: ignore[method-assign]
    restore = PrefixCache.restore

    def noted_restore(self: PrefixCache, *args: Any, **kw: Any) -> Any:
        engine_threads.add(threading.get_ident())
        return restore(self, *args, **kw)

    async def body() -> tuple[int, list[Answer], dict[str, Any]]:
        answers: list[Answer] = []
        sched = Scheduler(runner, answers.append, max_pending=16, max_batch=4)
        loop = asyncio.get_running_loop()
        loop.add_reader(receiver.fileno(), lambda: pings.append(time.monotonic())
                        if b"WATCHDOG=1" in receiver.recv(4096) else None)
        dog = loop.create_task(watchdog_loop(Notifier(sock_path), 0.02, sched.liveness))
        task = sched.start()
        # the long prompt once, so its prefix blocks land on the disk tier
        sched.submit(_request(1, "diagnosis", long_input, max_tokens=4))
        while len(answers) < 1:
            await asyncio.sleep(0.01)
        stats0 = dict(runner.prefix.store.stats()) if runner.prefix else {}
        pings.clear()
        for i in range(4):
            sched.submit(_request(10 + i, "st_code", {"description": f"Pump {i} runs while "
                                                      "the level is low."}))
        sched.submit(_request(20, "diagnosis", long_input, max_tokens=4))   # from disk
        sched.submit(_request(21, "fault_tree", {"system": "MAX", "top_event": "stop"},
                              max_tokens=2))
        while len(answers) < 7:
            await asyncio.sleep(0.005)
        stats1 = dict(runner.prefix.store.stats()) if runner.prefix else {}
        await sched.stop(5.0)
        dog.cancel()
        task.cancel()
        loop.remove_reader(receiver.fileno())
        return threading.get_ident(), answers, {k: stats1.get(k, 0) - stats0.get(k, 0)
                                                for k in stats1}

    runner.threads.clear()   # the preparation above ran here, on the test's own thread
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PrefixCache, "restore", noted_restore)
        try:
            loop_thread, answers, delta = asyncio.run(body())
        finally:
            receiver.close()
    by_seq = {int(a.request.ref): a for a in answers}
    assert by_seq[20].usage["cached_tokens"] >= 768, by_seq[20].usage   # restored from disk
    assert delta.get("hits_disk", 0) >= 12, delta
    tree = by_seq[21]
    assert tree.validation is not None and tree.validation["fault_tree"]["ok"], tree
    # every preparation, validation, engine step and disk-tier restore ran, and none on
    # the loop's thread
    assert runner.threads and engine_threads
    assert loop_thread not in runner.threads | engine_threads
    # the watchdog was fed while the engine thread worked
    assert len(pings) >= 5, pings


@pytest.mark.integration
def test_journal_writes_never_run_on_the_event_loop(
        tmp_path: Path, broker: LocalBroker, edge_engine: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``rung serve``'s parts in process, a real broker: while model requests and requests
    refused at the edge are recorded, answered and delivered, every journal write (the
    inserts, updates, commits and checkpoints, each with its fsyncs) runs in the journal's
    writer thread; the event loop's thread only reads. Each request is answered once."""
    from rung.daemon.config import load_config
    from rung.daemon.journal.store import Journal
    from rung.daemon.serve import Service, build_runner
    from tests.daemon.harness import Requester, write_config

    statements: list[tuple[str, str]] = []
    connect = Journal._connect

    def traced(journal: Journal) -> sqlite3.Connection:
        db = connect(journal)
        db.set_trace_callback(lambda sql: statements.append(
            (threading.current_thread().name, sql.strip().upper())))
        return db

    monkeypatch.setattr(Journal, "_connect", traced)
    cfg = load_config(write_config(tmp_path, edge_engine, broker.port), [])
    service = Service(cfg, build_runner(cfg))
    short = {"input": {"description": "Pump P1 runs while the level is below 2 m.",
                       "name": "P_Pump", "pou_type": "PROGRAM"}, "max_tokens": 3}

    async def main() -> tuple[str, list[Any], int]:
        run = asyncio.ensure_future(service.run())
        while not service.link.connected:
            await asyncio.sleep(0.01)
        statements.clear()
        req = Requester(broker.port)
        try:
            for i in range(3):
                await asyncio.to_thread(req.send, "st_code", {**short, "id": f"m{i}"})
                await asyncio.to_thread(req.send, "st_code", b"{not json",
                                        correlation=f"bad{i}")
            replies = await asyncio.to_thread(req.wait_settled, 6, 120)
        finally:
            req.close()
        service._stopping.set()
        return threading.current_thread().name, replies, await run

    loop_thread, replies, code = asyncio.run(main())
    assert code == 0
    codes = sorted((r.body["id"], r.body["error"]["code"]) for r in replies)
    assert codes == [("bad0", "bad_json"), ("bad1", "bad_json"), ("bad2", "bad_json"),
                     ("m0", "truncated"), ("m1", "truncated"), ("m2", "truncated")]
    writes = [(t, sql) for t, sql in statements
              if sql.startswith(("INSERT", "UPDATE", "DELETE", "COMMIT", "PRAGMA WAL"))]
    assert writes and {t for t, _ in writes} == {"rung-journal"}, writes
    on_loop = [sql for t, sql in statements if t == loop_thread]
    assert all(sql.startswith("SELECT") for sql in on_loop), on_loop
