"""Output validation: the schema first, then the task's semantic validators."""

from __future__ import annotations

from typing import Any

import pytest

from rung.daemon.tasks.diagnosis.snapshot import expected_state
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import validate_output

SNAPSHOT = {"asset": "Pump 3", "points": [
    {"name": "oil_temp", "value": 91.0, "unit": "degC", "limits": {"alert": 70, "alarm": 85}},
    {"name": "pressure", "value": 95.0, "unit": "bar",
     "limits": {"low_alarm": 80, "low_alert": 100}},
    {"name": "pump_on", "value": True}]}


def _diagnosis(**changes: Any) -> dict[str, Any]:
    good: dict[str, Any] = {
        "state_detection": [{"point": "oil_temp", "state": "alarm"},
                            {"point": "pressure", "state": "alert"},
                            {"point": "pump_on", "state": "normal"}],
        "health_assessment": [{"fault": "internal leak", "component": "pump",
                               "confidence": 0.6, "evidence": ["oil_temp", "pressure"]}],
        "prognosis": {"status": "not_assessed", "reason": "no trend data"},
        "advisory": {"priority": "high", "actions": ["reduce load", "inspect pump seals"],
                     "requires_human_confirmation": True}}
    good.update(changes)
    return good


def _check(output: Any) -> tuple[bool, dict[str, Any]]:
    task = load_tasks()["diagnosis"]
    return validate_output(task.output_schema, task.kind, output, SNAPSHOT)


def test_good_diagnosis_passes() -> None:
    ok, v = _check(_diagnosis())
    assert ok and v["schema"]["ok"] and v["diagnosis"]["ok"]


def test_state_contradicting_limits_is_flagged() -> None:
    ok, v = _check(_diagnosis(state_detection=[{"point": "oil_temp", "state": "normal"}]))
    assert not ok
    assert v["diagnosis"]["errors"] == [
        {"path": "state_detection/0/state",
         "message": "oil_temp = 91.0 is alarm by its limits, not normal"},
        {"path": "state_detection", "message": "pressure is alert by its limits and not listed"}]
    assert not v["diagnosis"]["checks"]["states"] and v["diagnosis"]["checks"]["evidence"]


def test_unknown_points_are_flagged() -> None:
    ok, v = _check(_diagnosis(
        state_detection=[{"point": "flux", "state": "normal"}],
        health_assessment=[{"fault": "x", "component": "y", "confidence": 0.1,
                            "evidence": ["vibration"]}]))
    assert not ok
    assert [e["path"] for e in v["diagnosis"]["errors"]] == [
        "state_detection/0/point", "state_detection", "state_detection",   # oil_temp, pressure
        "health_assessment/0/evidence/0"]


def test_schema_violation_stops_semantic_checks() -> None:
    bad = _diagnosis(advisory={"priority": "high", "actions": ["x"],
                               "requires_human_confirmation": False})
    ok, v = _check(bad)
    assert not ok and not v["schema"]["ok"] and "diagnosis" not in v
    assert v["schema"]["errors"][0]["path"] == "advisory/requires_human_confirmation"


@pytest.mark.parametrize("value,limits,state", [
    (50, {"alert": 70, "alarm": 85}, "normal"), (70, {"alert": 70, "alarm": 85}, "alert"),
    (85, {"alert": 70, "alarm": 85}, "alarm"), (79, {"low_alarm": 80}, "alarm"),
    (99, {"low_alert": 100, "low_alarm": 80}, "alert"), (True, {"alarm": 1}, None),
    (None, {"alarm": 1}, None), (3, {}, None),
    # a fault flag: a boolean against the value its limits name
    (True, {"alarm": True}, "alarm"), (False, {"alarm": True}, "normal"),
    (False, {"alert": False}, "alert"), (5, {"alarm": True}, None)])
def test_expected_state(value: Any, limits: dict[str, float], state: str | None) -> None:
    assert expected_state(value, limits) == state


def test_relevance_finds_stated_values_in_the_pou() -> None:
    from rung.daemon.tasks.st import request as st_request

    text = ("Compressor: run when pressure drops below 6.5 bar, stop above 7.5 bar, never "
            "restart within 60 s, pause 500 ms; fill to 20 %; pumps P1 and P2 on line 3.")
    pou = "IF p < 6.5 THEN run := TRUE; END_IF; t(PT := T#1m); t2(PT := T#0.5S); lvl < 0.2"
    r = st_request.values_used(st_request.read({"description": text}), {"body": pou})
    assert r["stated"] == ["6.5 bar", "7.5 bar", "60 s", "500 ms", "20 %"]  # not P1, line 3
    assert [e["message"] for e in r["errors"]] == [
        "the request states 7.5 bar; the POU does not use it"]
    assert "advisory" not in r and r["ok"] is False    # gating: the answer is retried
    assert st_request.values_used(st_request.read({"description": "no numbers here"}),
                                  {"body": "x := 1;"})["ok"] is True
