"""The MQTT intake on its own: a real journal on disk and the real outbox; the scheduler
and the broker are stand-ins that record what they are given. Each request is recorded,
then routed (to the scheduler, or answered at once), and answered exactly once; after a
restart what is pending is run again, or quarantined after ``journal.max_attempts``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rung.daemon.config import parse_config
from rung.daemon.journal.store import Entry, Incoming, Journal
from rung.daemon.metrics import Metrics
from rung.daemon.mqtt.intake import MqttIntake
from rung.daemon.mqtt.outbox import Outbox
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer

BASE = "t/rung/node1"
CLIENT = "node1"
DEFAULT_REPLY = f"{BASE}/res/{CLIENT}"
TASKS = {"st_code": SimpleNamespace(validators=("st",)), "fault_tree": SimpleNamespace()}
POU = {"pou_type": "FUNCTION_BLOCK", "name": "FB_Fill",
       "variables": [{"section": "VAR_OUTPUT", "name": "pump", "type": "BOOL"}],
       "body": "pump := TRUE;"}


class FakeScheduler:
    """Takes up to ``room`` requests; their futures are resolved by the test."""

    def __init__(self, room: int = 8) -> None:
        self.room = room
        self.taken: list[tuple[Request, bool, asyncio.Future[Answer]]] = []
        self.broken = False   # submit raises (a bug behind the intake)
        self.on_start: dict[int, Callable[[Request], object] | None] = {}   # by request uid

    def submit(self, req: Request, recovered: bool = False,
               on_start: Callable[[Request], object] | None = None
               ) -> asyncio.Future[Answer] | None:
        if self.broken:
            raise RuntimeError("submit broken")
        if len(self.taken) >= self.room:
            return None
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.taken.append((req, recovered, future))
        self.on_start[req.uid] = on_start
        return future

    @property
    def depth(self) -> int:
        return len(self.taken)

    @property
    def inflight(self) -> int:
        return 0


class Broker:
    """The link as the outbox sees it: disconnected for journaled answers (they stay in
    the journal), but answers sent straight from memory are taken and recorded."""

    connected = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.arrived = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, correlation: bytes | None = None,
                      **_: Any) -> bool:
        self.sent.append((topic, payload, correlation))
        self.arrived.set()
        return True


class Rig:
    def __init__(self, tmp_path: Path, room: int = 8, max_attempts: int = 2) -> None:
        self.cfg = parse_config({"engine": {"path": str(tmp_path)},
                                 "mqtt": {"base_topic": BASE, "client_id": CLIENT},
                                 "queue": {"max_pending": room},
                                 "journal": {"max_attempts": max_attempts},
                                 "state_dir": str(tmp_path / "state")}, tmp_path)
        self.journal = Journal(tmp_path / "state" / "journal.db")
        self.metrics = Metrics()
        self.broker = Broker()
        self.scheduler = FakeScheduler(room)
        self.intake = MqttIntake(self.cfg, TASKS, self.journal, self.scheduler,
                                 Outbox(self.journal, self.broker, self.metrics), self.metrics)

    def send(self, body: dict[str, Any] | bytes, task: str = "st_code", **kw: Any) -> bool:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.intake.on_message(Incoming(f"{BASE}/req/{task}", payload, **kw))

    def answers(self) -> list[tuple[str | None, dict[str, Any]]]:
        """Recorded answers (reply topic, payload), oldest first."""
        return [(e.reply_topic, json.loads(e.response or b"null"))
                for e in self.journal.undelivered()]

    def outcome(self, outcome: str, task: str = "st_code") -> float:
        value = self.metrics.registry.get_sample_value(
            "rung_requests_total", {"task": task, "outcome": outcome})
        return value or 0.0


async def settled(future: asyncio.Future[Answer]) -> None:
    """Wait until the callbacks added to ``future`` before this one (the intake's) ran."""
    done = asyncio.Event()
    future.add_done_callback(lambda _: done.set())
    await done.wait()


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await body()
    asyncio.run(bounded())


def test_a_request_is_recorded_routed_and_its_answer_recorded(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        assert r.send({"input": {"spec": "fill"}, "id": "a1", "session": "s", "seed": 4},
                      response_topic="t/replies", correlation=b"c1")
        (row,) = r.journal.pending()   # recorded before the link acknowledges
        ((req, recovered, future),) = r.scheduler.taken
        assert (req.ref, req.task, req.input, req.seed, req.session) == (
            f"mqtt request {row.seq}", "st_code", {"spec": "fill"}, 4, "s")
        assert not recovered and r.answers() == []
        # the intake hands its start callback with the request (its journal counts it)
        assert r.scheduler.on_start[req.uid] == r.intake.started
        future.set_result(Answer(req, True, output={"x": 1}, validation={"ok": True},
                                 usage={"prompt_tokens": 5, "completion_tokens": 2,
                                        "ttft_ms": 3.0, "steps": 2}))
        await settled(future)
        ((topic, doc),) = r.answers()
        assert topic == "t/replies"
        assert doc["ok"] and doc["id"] == "a1" and doc["task"] == "st_code"
        assert doc["output"] == {"x": 1} and doc["attempts"] == 1
        assert doc["usage"]["prompt_tokens"] == 5 and doc["usage"]["cached_tokens"] is None
        assert doc["usage"]["steps"] == 2 and "total_ms" in doc["usage"]
        assert r.journal.pending() == []
    run(body)


def test_a_duplicate_is_acknowledged_and_not_run_again(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        assert r.send({"input": {}, "id": "same"})
        assert r.send({"input": {}, "id": "same"})
        assert len(r.scheduler.taken) == 1 and len(r.journal.pending()) == 1
        assert r.outcome("duplicate", task="-") == 1
    run(body)


@pytest.mark.parametrize("payload,task,code", [
    (b"{not json", "st_code", "bad_json"),
    (b'{"input": {}, "colour": 1}', "st_code", "bad_request"),
    (b'{"input": {}}', "no_such_task", "unknown_task"),
    (b'{"input": {}, "output_formats": ["plcopen_xml"]}', "fault_tree", "bad_request"),
])
def test_input_refused_at_the_edge_is_answered_at_once(tmp_path: Path, payload: bytes,
                                                       task: str, code: str) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        assert r.send(payload, task=task)
        assert r.scheduler.taken == [] and r.journal.pending() == []
        ((topic, doc),) = r.answers()
        assert topic == DEFAULT_REPLY and not doc["ok"] and doc["error"]["code"] == code
        assert r.outcome(code, task=task if task in TASKS else "-") == 1
    run(body)


def test_a_full_queue_answers_busy(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path, room=1)
        r.send({"input": {}, "id": "first"})
        r.send({"input": {}, "id": "second", "reply_to": "t/mine"})
        assert len(r.scheduler.taken) == 1
        ((topic, doc),) = r.answers()
        assert (topic, doc["id"], doc["error"]["code"]) == ("t/mine", "second", "busy")
        assert doc["error"]["message"] == "queue full (1 pending); retry later"
        assert r.outcome("busy") == 1 and [e.seq for e in r.journal.pending()] == [1]
    run(body)


def test_a_failed_answer_carries_what_the_model_said(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.send({"input": {}, "id": "bad"})
        ((req, _, future),) = r.scheduler.taken
        future.set_result(Answer(req, False, "invalid_output", "the body does not parse",
                                 output={"body": "x :="}, validation={"ok": False},
                                 usage={"prompt_tokens": 9}, attempts=3))
        await settled(future)
        ((_, doc),) = r.answers()
        assert not doc["ok"] and doc["error"] == {"code": "invalid_output",
                                                  "message": "the body does not parse"}
        assert doc["output"] == {"body": "x :="} and doc["validation"] == {"ok": False}
        assert doc["attempts"] == 3 and doc["usage"]["prompt_tokens"] == 9
    run(body)


def test_an_answer_in_plcopen_xml_when_asked(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.send({"input": {}, "id": "xml", "output_formats": ["plcopen_xml"]})
        r.send({"input": {}, "id": "no-xml", "output_formats": ["plcopen_xml"]})
        (req, _, good), (req2, _, bad) = r.scheduler.taken
        good.set_result(Answer(req, True, output=POU))
        bad.set_result(Answer(req2, True, output={**POU, "pou_type": "CLASS"}))
        await settled(good)
        await settled(bad)
        (_, xml), (_, none) = r.answers()
        assert "FB_Fill" in xml["output_formats"]["plcopen_xml"]
        assert none["ok"] and none["output_formats"]["plcopen_xml"] is None
        assert "pou_type" in none["output_formats"]["error"]
    run(body)


def test_a_bug_while_routing_answers_that_request_internal(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.scheduler.broken = True
        assert r.send({"input": {}}, response_topic="t/mine", correlation=b"k")
        ((topic, doc),) = r.answers()   # acknowledged and answered all the same
        assert topic == "t/mine" and doc["id"] == "k"
        assert doc["error"] == {"code": "internal", "message": (
            "routing the request failed inside rung (RuntimeError); the daemon's log has "
            "the details")}   # the traceback is logged, the client told in brief
    run(body)


def test_holding_keeps_requests_pending(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.intake.holding = True
        r.send({"input": {}, "id": "later"})
        assert r.scheduler.taken == [] and r.answers() == []
        assert len(r.journal.pending()) == 1
    run(body)


def test_recovery_reruns_pending_requests_and_quarantines_a_poison_one(
        tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path, max_attempts=2)
        for rid in ("poison", "fine"):
            r.journal.record(Incoming(f"{BASE}/req/st_code",
                                      json.dumps({"input": {}, "id": rid}).encode()))
        poison, fine = r.journal.pending()
        for _ in range(2):   # the daemon died twice with it in flight
            r.journal.started(poison.seq)
        r.journal.started(fine.seq)
        assert r.intake.recover() == 2
        ((req, recovered, _),) = r.scheduler.taken
        assert (req.ref, recovered) == (f"mqtt request {fine.seq}", True)
        ((_, doc),) = r.answers()
        assert doc["id"] == "poison" and doc["error"]["code"] == "internal"
        assert doc["error"]["message"].startswith("quarantined: the daemon stopped 2 times")
        assert r.metrics.registry.get_sample_value("rung_requests_quarantined_total") == 1
    run(body)


def test_starts_are_counted_for_journaled_requests_only(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.send({"input": {}})
        ((req, _, future),) = r.scheduler.taken
        r.intake.started(req)
        r.intake.started(Request("diagnosis", {}, 0.0, 1.0))   # a PLC's job
        assert [e.attempts for e in r.journal.pending()] == [1]
        future.set_result(Answer(req, True, output={}))
        await settled(future)
        assert r.intake._open == {}   # forgotten once answered
    run(body)


def test_expire_answers_without_running(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.intake.holding = True
        r.send({"input": {}, "id": "old", "reply_to": "t/mine"})
        (entry,) = r.journal.pending()
        r.intake.expire(entry)
        ((topic, doc),) = r.answers()
        assert (topic, doc["id"], doc["task"], doc["error"]["code"]) == (
            "t/mine", "old", "st_code", "expired")
    run(body)


def test_a_retained_replay_is_acknowledged_and_ignored(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        assert r.send({"input": {}}, retained=True)
        assert r.journal.pending() == [] and r.scheduler.taken == []
        assert r.outcome("retained_replay", task="-") == 1
    run(body)


def test_a_request_the_journal_cannot_hold_is_answered_unavailable(tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        r.journal.db.close()   # every write fails from here on, as on a failing disk
        assert r.send({"input": {}, "id": "u", "reply_to": "t/mine"}, correlation=b"k")
        await r.broker.arrived.wait()
        ((topic, payload, correlation),) = r.broker.sent
        doc = json.loads(payload)
        assert (topic, correlation, doc["id"], doc["task"]) == ("t/mine", b"k", "u", "st_code")
        assert doc["error"]["code"] == "unavailable" and r.scheduler.taken == []
        assert r.metrics.registry.get_sample_value("rung_storage_ok") == 0
        assert r.outcome("unavailable", task="-") == 1
    run(body)


def test_an_expired_request_that_is_not_json_is_answered_on_the_default_topic(
        tmp_path: Path) -> None:
    async def body() -> None:
        r = Rig(tmp_path)
        entry = r.journal.record(Incoming(f"{BASE}/req/st_code", b"\xff not text"))
        assert isinstance(entry, Entry)
        r.intake.expire(entry)
        ((topic, doc),) = r.answers()
        assert topic == DEFAULT_REPLY and doc["id"] is None and doc["task"] == "st_code"
    run(body)
