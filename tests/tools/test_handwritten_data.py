"""The hand-written requests themselves (tests/data/handwritten.json), without a model: each
one is a request its task accepts, there are enough of them, and the st_code test vectors
(``st_vectors``, one set per st_code request, same order) are runnable and right: a POU
written by hand for the request passes its vectors, and the same POU with a typical mistake
(a missing restart lockout, a level where an edge belongs, one threshold where there are
two, ...) fails them."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rung.daemon.tasks.st_exec import run_vectors
from rung.daemon.tasks.task import builtin_tasks_dir, load_tasks
from rung.daemon.tasks.validate import VALIDATORS

DATA = Path(__file__).resolve().parents[1] / "data" / "handwritten.json"
TASKS = ("st_code", "fault_tree", "diagnosis")
HAND = json.loads(DATA.read_text(encoding="utf-8"))
MAX_STEPS = 200   # what a request's own ``vectors`` may hold (configs/tasks/st_code.yaml)


def _schema(task: str) -> dict[str, Any]:
    doc = yaml.safe_load((builtin_tasks_dir() / f"{task}.yaml").read_text(encoding="utf-8"))
    schema: dict[str, Any] = doc["input_schema"]
    return schema


def _by_name(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for request, vectors in zip(HAND["st_code"], HAND["st_vectors"], strict=True):
        if request.get("name") == name:
            return request, vectors
    raise KeyError(name)


# -- the requests --------------------------------------------------------------------------

def test_enough_requests_per_task() -> None:
    assert isinstance(HAND.get("about"), str) and HAND["about"]
    for task in TASKS:
        assert len(HAND[task]) >= 20, task


@pytest.mark.parametrize("task", TASKS)
def test_every_request_is_valid_input(task: str) -> None:
    schema = _schema(task)
    checker = jsonschema.Draft202012Validator(schema)
    rung_task = load_tasks()[task]
    for i, request in enumerate(HAND[task]):
        errors = [e.message for e in checker.iter_errors(request)]
        assert not errors, (task, i, errors)
        rung_task.check_input(request)   # rung's own keywords (uniqueBy, notReserved, ...)


def test_diagnosis_requests_cover_the_cases() -> None:
    def states(request: dict[str, Any]) -> list[str]:
        from rung.daemon.tasks.diagnosis import states as computed
        return [s["state"] for s in computed(request)]

    diagnoses = HAND["diagnosis"]
    all_normal = [d for d in diagnoses if set(states(d)) == {"normal"}]
    one_alarm = [d for d in diagnoses if states(d).count("alarm") == 1]
    flag_set = [d for d in diagnoses if any(
        isinstance(p["value"], bool) and p.get("limits")
        and p["value"] in (p["limits"].get("alert"), p["limits"].get("alarm"))
        for p in d["points"])]
    with_history = [d for d in diagnoses if any(p.get("history") for p in d["points"])]
    assert len(all_normal) >= 2 and len(one_alarm) >= 2 and len(flag_set) >= 2
    assert len(with_history) >= 4
    from rung.daemon.tasks.diagnosis import prognosis
    for d in with_history:
        for p in d["points"]:
            if p.get("history"):
                assert 10 <= len(p["history"]) <= 30, d["asset"]
                assert p["history"][-1][1] == p["value"], d["asset"]
        assert prognosis(d)["status"] == "assessed", d["asset"]


# -- the st_code vectors -------------------------------------------------------------------

def test_st_vectors_are_parallel_and_well_formed() -> None:
    requests, vectors = HAND["st_code"], HAND["st_vectors"]
    assert len(vectors) == len(requests)
    schema = _schema("st_code")
    with_vectors = ("vectors" in schema.get("properties", {})
                    and jsonschema.Draft202012Validator(schema))
    for request, v in zip(requests, vectors, strict=True):
        name = request["name"]   # vectors need the POU's name and interface fixed
        assert request.get("pou_type") in ("PROGRAM", "FUNCTION_BLOCK", "FUNCTION"), name
        assert set(v) == {"scan_s", "steps"} and v["scan_s"] > 0, name
        steps = v["steps"]
        assert 0 < len(steps) <= MAX_STEPS, name
        times = [s["t"] for s in steps]
        assert times == sorted(times) and len(set(times)) == len(times), name
        assert all(set(s) <= {"t", "set", "expect"} and math.isfinite(s["t"]) for s in steps)
        assert any("expect" in s for s in steps), name
        text = " ".join([request["description"], *request.get("constraints", [])])
        used = {k for s in steps for part in ("set", "expect") for k in s.get(part, {})}
        for var in used - {name}:   # a FUNCTION's result is expected under its name
            assert re.search(rf"\b{re.escape(var)}\b", text), (name, var)
        if with_vectors:   # the vectors could ride in the request itself
            errors = [e.message for e in with_vectors.iter_errors({**request, "vectors": v})]
            assert not errors, (name, errors)


def _var(section: str, name: str, type_: str, initial: str | None = None) -> dict[str, str]:
    v = {"section": section, "name": name, "type": type_}
    if initial is not None:
        v["initial"] = initial
    return v


def _pou(pou_type: str, name: str, variables: list[dict[str, str]],
         body: str) -> dict[str, Any]:
    return {"pou_type": pou_type, "name": name, "variables": variables, "body": body}


# A POU per request as an experienced controls engineer writes it, and one typical mistake
# (the body text replaced) that the vectors must catch.
REFERENCES: dict[str, tuple[dict[str, Any], tuple[str, str]]] = {
    "P_Compressor": (_pou(
        "PROGRAM", "P_Compressor",
        [_var("VAR_INPUT", "rPressure", "REAL"), _var("VAR_OUTPUT", "bCompressorRun", "BOOL"),
         _var("VAR", "tRestartLock", "TOF")],
        "tRestartLock(IN := bCompressorRun, PT := T#60s);\n"
        "IF rPressure > 7.5 THEN\n  bCompressorRun := FALSE;\n"
        "ELSIF rPressure < 6.5 AND NOT tRestartLock.Q THEN\n  bCompressorRun := TRUE;\n"
        "END_IF;\n"),
        # restarts at once after a stop
        ("rPressure < 6.5 AND NOT tRestartLock.Q", "rPressure < 6.5")),
    "FB_StarDelta": (_pou(
        "FUNCTION_BLOCK", "FB_StarDelta",
        [_var("VAR_INPUT", "bRun", "BOOL"), _var("VAR_OUTPUT", "bMainK1", "BOOL"),
         _var("VAR_OUTPUT", "bStarK3", "BOOL"), _var("VAR_OUTPUT", "bDeltaK2", "BOOL"),
         _var("VAR", "tStar", "TON"), _var("VAR", "tPause", "TON")],
        "tStar(IN := bRun, PT := T#8s);\ntPause(IN := tStar.Q, PT := T#100ms);\n"
        "bMainK1 := bRun;\nbStarK3 := bRun AND NOT tStar.Q;\n"
        "bDeltaK2 := bRun AND tPause.Q AND NOT bStarK3;\n"),
        # delta closes the moment star opens: no changeover pause
        ("tPause.Q AND NOT bStarK3", "tStar.Q")),
    "FB_LubeOilAlarm": (_pou(
        "FUNCTION_BLOCK", "FB_LubeOilAlarm",
        [_var("VAR_INPUT", "rLubeOilBar", "REAL"), _var("VAR_INPUT", "bTurbineRunning", "BOOL"),
         _var("VAR_INPUT", "bAckPB", "BOOL"), _var("VAR_OUTPUT", "bHorn", "BOOL"),
         _var("VAR_OUTPUT", "bAlarmLamp", "BOOL"), _var("VAR", "tLowPress", "TON"),
         _var("VAR", "rtAck", "R_TRIG"), _var("VAR", "bAcked", "BOOL")],
        "tLowPress(IN := bTurbineRunning AND rLubeOilBar < 1.2, PT := T#3s);\n"
        "rtAck(CLK := bAckPB);\n"
        "IF tLowPress.Q AND NOT bAlarmLamp THEN\n  bAlarmLamp := TRUE;\n  bHorn := TRUE;\n"
        "  bAcked := FALSE;\nEND_IF;\n"
        "IF rtAck.Q AND bAlarmLamp THEN\n  bHorn := FALSE;\n  bAcked := TRUE;\nEND_IF;\n"
        "IF bAcked AND NOT tLowPress.Q THEN\n  bAlarmLamp := FALSE;\n  bAcked := FALSE;\n"
        "END_IF;\n"),
        # acknowledge by level: a jammed ack button hides the next alarm
        ("IF rtAck.Q AND bAlarmLamp THEN", "IF bAckPB AND bAlarmLamp THEN")),
    "FB_BufferTable": (_pou(
        "FUNCTION_BLOCK", "FB_BufferTable",
        [_var("VAR_INPUT", "bPE1_In", "BOOL"), _var("VAR_INPUT", "bPE2_Out", "BOOL"),
         _var("VAR_INPUT", "bZeroCount", "BOOL"), _var("VAR_OUTPUT", "iOnTable", "INT"),
         _var("VAR_OUTPUT", "bHoldFiller", "BOOL"), _var("VAR", "ctBuffer", "CTUD")],
        "ctBuffer(CU := bPE1_In, CD := bPE2_Out, R := bZeroCount, PV := 40);\n"
        "iOnTable := ctBuffer.CV;\n"
        "IF iOnTable >= 40 THEN\n  bHoldFiller := TRUE;\nELSIF iOnTable < 30 THEN\n"
        "  bHoldFiller := FALSE;\nEND_IF;\n"),
        # one threshold for hold and release
        ("ELSIF iOnTable < 30 THEN", "ELSIF iOnTable < 40 THEN")),
    "FB_HallenLicht": (_pou(
        "FUNCTION_BLOCK", "FB_HallenLicht",
        [_var("VAR_INPUT", "bTasterNord", "BOOL"), _var("VAR_INPUT", "bTasterSued", "BOOL"),
         _var("VAR_INPUT", "bZentralAus", "BOOL"), _var("VAR_OUTPUT", "bHallenlicht", "BOOL"),
         _var("VAR", "rtNord", "R_TRIG"), _var("VAR", "rtSued", "R_TRIG")],
        "rtNord(CLK := bTasterNord);\nrtSued(CLK := bTasterSued);\n"
        "IF rtNord.Q OR rtSued.Q THEN\n  bHallenlicht := NOT bHallenlicht;\nEND_IF;\n"
        "IF bZentralAus THEN\n  bHallenlicht := FALSE;\nEND_IF;\n"),
        # toggles on the level: every scan while the button is held
        ("IF rtNord.Q OR rtSued.Q THEN", "IF bTasterNord OR bTasterSued THEN")),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_reference_pou_passes_its_vectors_and_a_wrong_one_fails(name: str) -> None:
    request, vectors = _by_name(name)
    ref, (old, new) = REFERENCES[name]
    assert request.get("pou_type") == ref["pou_type"]
    got = run_vectors(ref, vectors)
    assert got["ok"], got
    # the reference is also an answer rung's checks accept for this request
    checks = VALIDATORS["st"](ref, request)
    for section in ("st_syntax", "identifiers", "relevance", "building_blocks", "inputs"):
        assert checks[section]["ok"], (section, checks[section])
    wrong = copy.deepcopy(ref)
    assert old in wrong["body"]
    wrong["body"] = wrong["body"].replace(old, new)
    bad = run_vectors(wrong, vectors)
    assert not bad["ok"] and bad["error"] is None and bad["failures"], bad
