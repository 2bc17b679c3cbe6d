"""rung's OPC UA server beside the MQTT intake: the same requests, sent once over MQTT (the
real intake, journal and outbox) and once as method calls from a real asyncua client,
answered with the same envelope (``output_formats`` too), the same ``answered`` log lines
and the same ``rung_requests_total`` outcomes; a method called with an argument of the
wrong type, or with too few or too many, is told what was expected."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua
from asyncua.client.client import Client

from rung.daemon.config import OpcUaServerConfig
from rung.daemon.demo.localbroker import free_port
from rung.daemon.metrics import Metrics
from rung.daemon.opcua.server import RungServer
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer
from tests.daemon.mqtt.test_intake import CLIENT, POU, TASKS, FakeScheduler, Rig, settled
from tests.daemon.opcua.test_server import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LIMIT = 4096
TOO_LARGE = {"input": {"spec": "x" * (LIMIT + 100)}}
# what each adapter gets, in order; the first two are taken by the scheduler (room 2)
REQUESTS: list[dict[str, Any] | bytes] = [
    {"input": {"spec": "fill the tank"}, "id": "a1", "output_formats": ["plcopen_xml"]},
    {"input": {"spec": "empty it"}, "id": "c1"},
    {"input": {"spec": "once more"}, "id": "b1"},     # busy
    b"{not json",
    {"input": {}, "id": "d1", "colour": "red"},
    TOO_LARGE]


def _answer(req: Request) -> Answer:
    """The scheduler's answer to either adapter's request, by its input."""
    usage = {"prompt_tokens": 40, "completion_tokens": 12, "cached_tokens": 8, "ttft_ms": 3.5,
             "steps": 9}
    if req.input["spec"] == "fill the tank":
        return Answer(req, True, output=POU, validation={"ok": True, "checks": ["st"]},
                      usage=usage)
    return Answer(req, False, "invalid_output", "the body does not parse",
                  output={**POU, "body": "pump :="}, validation={"ok": False}, usage=usage,
                  attempts=3)


@asynccontextmanager
async def serving(scheduler: FakeScheduler, metrics: Metrics,
                  **kw: Any) -> AsyncIterator[tuple[RungServer, Client]]:
    cfg = OpcUaServerConfig(enabled=True, endpoint=f"opc.tcp://127.0.0.1:{free_port()}/rung/",
                            max_request_bytes=LIMIT, **kw)
    server = RungServer(cfg, TASKS, scheduler.submit, lambda: {"ready": True}, CLIENT,
                        timeout_s=60.0, metrics=metrics)
    task = asyncio.get_running_loop().create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 30)
        client = Client(cfg.endpoint, timeout=30, watchdog_intervall=600)
        async with client:
            yield server, client
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _answered(caplog: pytest.LogCaptureFixture, opcua: bool) -> list[dict[str, Any]]:
    fields = [getattr(r, "rung_fields", {}) for r in caplog.records
              if r.name == "rung.serve" and r.getMessage() == "answered"]
    return [f for f in fields if (f.get("via") == "opcua") == opcua]


def _outcomes(metrics: Metrics) -> dict[tuple[str, str], float]:
    return {(s.labels["task"], s.labels["outcome"]): s.value
            for family in metrics.registry.collect() if family.name == "rung_requests"
            for s in family.samples if s.name == "rung_requests_total"}


def _timeless(doc: dict[str, Any]) -> dict[str, Any]:
    """An answer without what measures time (its total, the XML file's times)."""
    doc = json.loads(re.sub(r'DateTime=\\"[^"\\]*\\"', "DateTime=T", json.dumps(doc)))
    usage = {k: v for k, v in (doc.get("usage") or {}).items() if k != "total_ms"}
    return {**doc, "usage": usage} if "usage" in doc else doc


def test_an_opcua_call_is_answered_logged_and_counted_as_an_mqtt_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.serve")
    mqtt_answers: dict[str, dict[str, Any]] = {}
    opcua_answers: list[dict[str, Any]] = []
    rig_metrics: list[Metrics] = []

    async def over_mqtt() -> None:
        r = Rig(tmp_path, room=2)
        r.intake.cfg = r.cfg = replace(r.cfg, mqtt=replace(r.cfg.mqtt, max_payload_bytes=LIMIT))
        for body in REQUESTS:
            r.send(body)
        for req, _, future in r.scheduler.taken:
            future.set_result(_answer(req))
            await settled(future)
        mqtt_answers.update({doc.get("id") or f"#{n}": doc
                             for n, (_, doc) in enumerate(r.answers())})
        rig_metrics.append(r.metrics)

    async def over_opcua() -> None:
        scheduler, metrics = FakeScheduler(room=2), Metrics()
        rig_metrics.append(metrics)
        async with serving(scheduler, metrics) as (_, client):
            rung = await client.nodes.objects.get_child(["2:rung"])

            async def call(body: dict[str, Any] | bytes) -> dict[str, Any]:
                text = body.decode() if isinstance(body, bytes) else json.dumps(body)
                answer = await rung.call_method("2:GenerateST", ua.Variant(
                    text, ua.VariantType.String))
                doc: dict[str, Any] = json.loads(answer)
                return doc

            # one session answers its calls in order: the two the scheduler holds go on
            # sessions of their own
            async def on_its_own(body: dict[str, Any] | bytes) -> dict[str, Any]:
                c = Client(client.server_url.geturl(), timeout=30, watchdog_intervall=600)
                async with c:
                    node = await c.nodes.objects.get_child(["2:rung"])
                    answer = await node.call_method("2:GenerateST", ua.Variant(
                        json.dumps(body), ua.VariantType.String))
                    doc: dict[str, Any] = json.loads(answer)
                    return doc

            held = [asyncio.get_running_loop().create_task(on_its_own(b))
                    for b in REQUESTS[:2]]
            while len(scheduler.taken) < 2 and not any(t.done() for t in held):
                await asyncio.sleep(0.01)
            rest = [await call(body) for body in REQUESTS[2:]]
            for req, _, future in scheduler.taken:
                future.set_result(_answer(req))
            opcua_answers.extend([*await asyncio.gather(*held), *rest])

    run(over_mqtt)
    mqtt_lines = _answered(caplog, opcua=False)
    run(over_opcua)
    a1, c1, busy, bad_json, unknown, big = opcua_answers
    # one envelope: field for field (output_formats' PLCopen XML too), time aside
    assert "FB_Fill" in a1["output_formats"]["plcopen_xml"]
    assert _timeless(a1) == _timeless(mqtt_answers["a1"])
    assert _timeless(c1) == _timeless(mqtt_answers["c1"])
    assert c1["error"]["code"] == "invalid_output" and c1["attempts"] == 3
    assert bad_json == next(d for d in mqtt_answers.values()
                            if not d["ok"] and d["error"]["code"] == "bad_json")
    assert unknown == mqtt_answers["d1"]
    assert (busy["error"]["code"], big["error"]["code"]) == ("busy", "too_large")
    assert "opcua_server.max_request_bytes" in big["error"]["message"]
    # the same lines, field for field (values that measure time or count rows aside)
    opcua_lines = _answered(caplog, opcua=True)
    assert len(opcua_lines) == len(mqtt_lines) == len(REQUESTS)

    def shape(lines: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((f["ok"], f.get("code"), f.get("id"),
                       tuple(sorted(set(f) - {"via"}))) for f in lines)

    assert shape(opcua_lines) == shape(mqtt_lines)
    # the same outcomes counted (the scheduler's answers are counted by its callback)
    mqtt_metrics, opcua_metrics = rig_metrics
    assert _outcomes(opcua_metrics) == _outcomes(mqtt_metrics) == {
        ("st_code", "busy"): 1.0, ("st_code", "bad_json"): 1.0,
        ("st_code", "bad_request"): 1.0, ("st_code", "too_large"): 1.0}


def test_method_arguments_are_checked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.serve")
    metrics = Metrics()

    async def scenario() -> None:
        async with serving(FakeScheduler(), metrics) as (_, client):
            rung = await client.nodes.objects.get_child(["2:rung"])
            number = json.loads(await rung.call_method(
                "2:GenerateST", ua.Variant(7, ua.VariantType.Int32)))
            assert number["error"] == {"code": "bad_request", "message": "request: expected a "
                                       "String (the request as JSON), got Int32"}
            with pytest.raises(ua.uaerrors.BadArgumentsMissing):
                await rung.call_method("2:GenerateST")
            with pytest.raises(ua.uaerrors.BadTooManyArguments):
                await rung.call_method("2:GenerateST", ua.Variant("{}", ua.VariantType.String),
                                       ua.Variant("{}", ua.VariantType.String))
    run(scenario)
    lines = _answered(caplog, opcua=True)
    assert [f["code"] for f in lines] == ["bad_request"] * 3
    assert "got 0 (BadArgumentsMissing)" in lines[1]["error"]
    assert "got 2 (BadTooManyArguments)" in lines[2]["error"]
    assert _outcomes(metrics) == {("st_code", "bad_request"): 3.0}
