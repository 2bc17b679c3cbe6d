"""A register map's ``history``: the agent keeps the last snapshots of its PLC and hands
them to the diagnosis as each numeric point's history, so a PLC-triggered diagnosis gets a
prognosis from a trend (docs/tasks.md, Diagnosis)."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.modbus.agent import PlcAgent, Trends
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import RegisterMapError, parse_map
from rung.daemon.plc.points import History
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer
from rung.daemon.tasks.diagnosis.snapshot import prognosis
from rung.daemon.tasks.runner import TaskRunner
from tests.daemon.modbus.test_plc_agent import DONE, REQ, REQ_SEQ, _running, plant, run
from tests.daemon.plc_rig import map_doc


def test_the_map_setting_is_checked() -> None:
    doc = map_doc(port=5020)
    assert parse_map(doc, Path("press1.yaml")).history is None
    doc["history"] = {"keep": 60}
    assert parse_map(doc, Path("press1.yaml")).history == History(60, 60.0)
    for bad, key in (({"keep": 300}, "history.keep"), ({"every_s": 5}, "history.keep"),
                     ({"keep": 5, "every_s": 0}, "history.every_s")):
        doc["history"] = bad
        with pytest.raises(RegisterMapError, match=key):
            parse_map(doc, Path("press1.yaml"))


def test_kept_snapshots_become_each_numeric_point_history() -> None:
    trends = Trends(History(keep=6))
    for i in range(10):   # oil temperature rising 0.5 degC an hour, a sample every 30 min
        trends.add(1.7e9 + i * 1800, {"oil_temp": 60 + 0.25 * i, "pump_on": True,
                                      "flow": None})
    trends.add(1.7e9, {"oil_temp": 1.0})       # older than the newest: not kept
    data = {"asset": "a", "points": [
        {"name": "oil_temp", "value": 62.5, "limits": {"alert": 70, "alarm": 85}},
        {"name": "pump_on", "value": True}, {"name": "flow", "value": None}]}
    now = 1.7e9 + 10 * 1800
    got = trends.attach(data, now)
    oil = got["points"][0]["history"]
    assert len(oil) == 7 and oil[-1] == [now, 62.5] and oil[0] == [1.7e9 + 4 * 1800, 61.0]
    assert all(b[0] > a[0] for a, b in pairwise(oil))
    assert "history" not in got["points"][1] and "history" not in got["points"][2]
    assert "history" not in data["points"][0]          # the caller's input is untouched
    assert prognosis(got)["remaining_useful_life_h"] == pytest.approx((85 - 62.5) / 0.5)
    assert len(trends.snapshots) == 6 and trends.snapshots[-1][0] == now


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    from rung.daemon.tasks.task import load_tasks
    from rung.engines import load_engine
    from rung.engines.tokenizer import Tokenizer

    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


@pytest.mark.integration
@pytest.mark.slow
def test_a_plc_triggered_diagnosis_gets_the_kept_history(runner: TaskRunner,
                                                         tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path) as p:
            doc = map_doc(port=p.proxy.port)
            doc["history"] = {"keep": 5, "every_s": 0.1}
            plc = parse_map(doc, Path("press1.yaml"))
            asked: list[Request] = []

            def submit(req: Request) -> asyncio.Future[Answer] | None:
                asked.append(req)
                return p.scheduler.submit(req)

            agent = PlcAgent(plc, Link(plc), submit, p.publish, "t/rung", 60.0, 0.1, 30.0,
                             state_dir=tmp_path)
            assert agent.trends is not None
            trends = agent.trends

            async def body() -> None:
                await p.until("5 snapshots kept", lambda: len(trends.snapshots) == 5)
                regs = p.sim.holding
                regs[REQ_SEQ], regs[REQ] = 1, 1
                await p.until("done", lambda: regs[DONE] == 1)

            await _running(agent, body)
            (req,) = asked
            points: dict[str, Any] = {q["name"]: q for q in req.input["points"]}
            oil = points["oil_temp"]
            assert len(oil["history"]) == 6 and oil["history"][-1][1] == oil["value"] == 85.3
            assert "history" not in points["pump_on"]
            (event,) = p.events()
            got = event["diagnosis"]["output"]["prognosis"]
            # oil_temp is at its alarm limit already (85.3 >= 85): no life left to it
            assert (got["status"], got["point"], got["remaining_useful_life_h"]) == (
                "assessed", "oil_temp", 0)
            assert got["samples"] == 6 and got["trend_per_h"] == 0
    run(scenario)
