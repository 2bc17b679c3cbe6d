"""The hand-written requests themselves (tests/data/handwritten.json), without a model: each
one is a request its task accepts, there are enough of them, at least half the st_code
requests are a description only (no name, POU type or interface), and the st_code test
vectors are runnable and right: a POU written by hand for the request passes its vectors,
and the same POU with a typical mistake (a missing restart lockout, a level where an edge
belongs, one threshold where there are two, ...) fails them.

Vectors name the POU's own inputs and outputs, so only a request that fixes its interface
has vectors in the data (``st_vectors``, parallel to those requests, which come first). A
description-only request leaves the names to the answer; its reference POU here (``DESCRIBED``)
comes with vectors named after that reference's variables: they show the description decides
the behaviour and that a right answer passes rung's checks for the request as asked."""

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

from rung.daemon.tasks.kinds import KINDS
from rung.daemon.tasks.st.interpreter import run_vectors
from rung.daemon.tasks.task import builtin_tasks_dir, load_tasks

DATA = Path(__file__).resolve().parents[1] / "data" / "handwritten.json"
TASKS = ("st_code", "fault_tree", "diagnosis")
HAND = json.loads(DATA.read_text(encoding="utf-8"))
MAX_STEPS = 200   # what a request's own ``vectors`` may hold (configs/tasks/st_code.yaml)


def _schema(task: str) -> dict[str, Any]:
    doc = yaml.safe_load((builtin_tasks_dir() / f"{task}.yaml").read_text(encoding="utf-8"))
    schema: dict[str, Any] = doc["input_schema"]
    return schema


def _description_only(request: dict[str, Any]) -> bool:
    """Asked as most requests arrive: no POU name, no POU type, no interface."""
    return not any(k in request for k in ("name", "pou_type", "constraints"))


def _with_interface() -> list[dict[str, Any]]:
    """The st_code requests that fix name, type and interface: those with ``st_vectors``."""
    return [r for r in HAND["st_code"] if not _description_only(r)]


def _by_name(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for request, vectors in zip(_with_interface(), HAND["st_vectors"], strict=True):
        if request.get("name") == name:
            return request, vectors
    raise KeyError(name)


def _described(start: str) -> dict[str, Any]:
    """The one description-only request whose description starts with ``start``."""
    found = [r for r in HAND["st_code"]
             if _description_only(r) and r["description"].startswith(start)]
    assert len(found) == 1, (start, len(found))
    return found[0]


# -- the requests --------------------------------------------------------------------------

def test_enough_requests_per_task() -> None:
    assert isinstance(HAND.get("about"), str) and HAND["about"]
    for task in TASKS:
        assert len(HAND[task]) >= 30, task


def test_half_the_st_requests_are_description_only() -> None:
    """As most requests arrive (issue 44): a description, nothing else; no interface slipped
    into the prose either."""
    requests = HAND["st_code"]
    only = [r for r in requests if _description_only(r)]
    assert 2 * len(only) >= len(requests), (len(only), len(requests))
    for r in only:
        assert set(r) == {"description"}, r
        assert not re.search(r"\b(VAR_\w+|FUNCTION_BLOCK|PROGRAM)\b|\b[bri][A-Z]\w*\s*:",
                             r["description"]), r["description"]


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
        from rung.daemon.tasks.diagnosis.snapshot import states as computed
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
    from rung.daemon.tasks.diagnosis.snapshot import prognosis
    for d in with_history:
        for p in d["points"]:
            if p.get("history"):
                assert 10 <= len(p["history"]) <= 30, d["asset"]
                assert p["history"][-1][1] == p["value"], d["asset"]
        assert prognosis(d)["status"] == "assessed", d["asset"]


# -- the st_code vectors -------------------------------------------------------------------

def _check_steps(v: dict[str, Any], label: str) -> set[str]:
    """Vectors as ``run_vectors`` and the input schema take them; returns the names used."""
    assert set(v) == {"scan_s", "steps"} and v["scan_s"] > 0, label
    steps = v["steps"]
    assert 0 < len(steps) <= MAX_STEPS, label
    times = [s["t"] for s in steps]
    assert times == sorted(times) and len(set(times)) == len(times), label
    assert all(set(s) <= {"t", "set", "expect"} and math.isfinite(s["t"]) for s in steps)
    assert any("expect" in s for s in steps), label
    return {k for s in steps for part in ("set", "expect") for k in s.get(part, {})}


def test_st_vectors_are_parallel_and_well_formed() -> None:
    requests, vectors = HAND["st_code"], HAND["st_vectors"]
    stated = _with_interface()
    # the requests with an interface come first, one set of vectors each, same order
    # (tools/eval_model.py gives st_vectors[i] to st_code[i] while i < len(st_vectors));
    # the description-only requests after them have none: no names to set or expect
    assert requests[:len(stated)] == stated
    assert len(vectors) == len(stated)
    assert all("vectors" not in r for r in requests)   # they ride in st_vectors
    schema = _schema("st_code")
    with_vectors = ("vectors" in schema.get("properties", {})
                    and jsonschema.Draft202012Validator(schema))
    for request, v in zip(stated, vectors, strict=True):
        name = request["name"]   # vectors need the POU's name and interface fixed
        assert request.get("pou_type") in ("PROGRAM", "FUNCTION_BLOCK", "FUNCTION"), name
        used = _check_steps(v, name)
        text = " ".join([request["description"], *request.get("constraints", [])])
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
    "FB_SumpP410": (_pou(
        "FUNCTION_BLOCK", "FB_SumpP410",
        [_var("VAR_INPUT", "bLSH", "BOOL"), _var("VAR_INPUT", "bLSL", "BOOL"),
         _var("VAR_INPUT", "bAlarmReset", "BOOL"), _var("VAR_OUTPUT", "bPump", "BOOL"),
         _var("VAR_OUTPUT", "bLongRun", "BOOL"), _var("VAR", "tRun", "TON")],
        "tRun(IN := bPump, PT := T#10m);\nIF tRun.Q THEN\n  bLongRun := TRUE;\nEND_IF;\n"
        "IF bAlarmReset THEN\n  bLongRun := FALSE;\nEND_IF;\n"
        "IF bLongRun OR NOT bLSL THEN\n  bPump := FALSE;\nELSIF bLSH THEN\n"
        "  bPump := TRUE;\nEND_IF;\n"),
        # the alarm is raised but does not stop the pump: it runs on dry
        ("IF bLongRun OR NOT bLSL THEN", "IF NOT bLSL THEN")),
    "FB_K3FirstOut": (_pou(
        "FUNCTION_BLOCK", "FB_K3FirstOut",
        [_var("VAR_INPUT", "bOk1", "BOOL"), _var("VAR_INPUT", "bOk2", "BOOL"),
         _var("VAR_INPUT", "bOk3", "BOOL"), _var("VAR_INPUT", "bOk4", "BOOL"),
         _var("VAR_INPUT", "bReset", "BOOL"), _var("VAR_OUTPUT", "iFirstOut", "INT"),
         _var("VAR", "bAnyTrip", "BOOL")],
        "bAnyTrip := NOT (bOk1 AND bOk2 AND bOk3 AND bOk4);\n"
        "IF bReset AND NOT bAnyTrip THEN\n  iFirstOut := 0;\nEND_IF;\n"
        "IF iFirstOut = 0 THEN\n  IF NOT bOk1 THEN\n    iFirstOut := 1;\n"
        "  ELSIF NOT bOk2 THEN\n    iFirstOut := 2;\n  ELSIF NOT bOk3 THEN\n    iFirstOut := 3;\n"
        "  ELSIF NOT bOk4 THEN\n    iFirstOut := 4;\n  END_IF;\nEND_IF;\n"),
        # a priority display, not a first-out: the lowest-numbered active trip wins
        ("IF iFirstOut = 0 THEN", "IF bAnyTrip THEN")),
    "FB_DosingScrew": (_pou(
        "FUNCTION_BLOCK", "FB_DosingScrew",
        [_var("VAR_INPUT", "rWeightKg", "REAL"), _var("VAR_INPUT", "rTargetKg", "REAL"),
         _var("VAR_INPUT", "rInflightKg", "REAL"), _var("VAR_INPUT", "bStart", "BOOL"),
         _var("VAR_INPUT", "bAbort", "BOOL"), _var("VAR_OUTPUT", "bFast", "BOOL"),
         _var("VAR_OUTPUT", "bSlow", "BOOL"), _var("VAR_OUTPUT", "bDone", "BOOL"),
         _var("VAR", "rtStart", "R_TRIG"), _var("VAR", "bActive", "BOOL")],
        "rtStart(CLK := bStart);\nIF rtStart.Q THEN\n  bActive := TRUE;\n  bDone := FALSE;\n"
        "END_IF;\nIF bAbort THEN\n  bActive := FALSE;\n  bDone := FALSE;\nEND_IF;\n"
        "IF bActive AND rWeightKg >= rTargetKg - rInflightKg THEN\n  bActive := FALSE;\n"
        "  bDone := TRUE;\nEND_IF;\n"
        "bFast := bActive AND rWeightKg < 0.9 * rTargetKg;\nbSlow := bActive AND NOT bFast;\n"),
        # no in-flight allowance: every batch overshoots
        ("rWeightKg >= rTargetKg - rInflightKg", "rWeightKg >= rTargetKg")),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_reference_pou_passes_its_vectors_and_a_wrong_one_fails(name: str) -> None:
    request, vectors = _by_name(name)
    ref, (old, new) = REFERENCES[name]
    assert request.get("pou_type") == ref["pou_type"]
    got = run_vectors(ref, vectors)
    assert got["ok"], got
    # the reference is also an answer rung's checks accept for this request
    checks = KINDS["st"].validate(ref, request)
    for section in ("st_syntax", "identifiers", "relevance", "building_blocks", "inputs",
                    "outputs"):
        assert checks[section]["ok"], (section, checks[section])
    wrong = copy.deepcopy(ref)
    assert old in wrong["body"]
    wrong["body"] = wrong["body"].replace(old, new)
    bad = run_vectors(wrong, vectors)
    assert not bad["ok"] and bad["error"] is None and bad["failures"], bad


# -- description-only requests ---------------------------------------------------------

def _vars(*lines: str) -> list[dict[str, str]]:
    """Declarations as ST writes them: ``"VAR_INPUT bA, bB : BOOL"``."""
    out = []
    for line in lines:
        section, rest = line.split(" ", 1)
        names, type_ = rest.rsplit(":", 1)
        out += [_var(section, n.strip(), type_.strip()) for n in names.split(",")]
    return out


Row = tuple[float, dict[str, Any] | None] | tuple[float, dict[str, Any] | None, dict[str, Any]]


def _vectors(scan_s: float, *rows: Row) -> dict[str, Any]:
    """Vectors from ``(t, set)`` and ``(t, set or None, expect)`` rows, in time order."""
    steps = []
    for row in sorted(rows, key=lambda r: r[0]):
        step: dict[str, Any] = {"t": row[0]}
        if row[1]:
            step["set"] = row[1]
        if len(row) > 2 and row[2]:
            step["expect"] = row[2]
        steps.append(step)
    return {"scan_s": scan_s, "steps": steps}


def _near(x: float) -> dict[str, float]:
    return {"value": x, "tol": 0.001}


F, T = False, True

# For each description-only request (by the start of its description): a POU an engineer
# writes from the description alone, vectors named after that POU's variables (an answer
# names its own, so these are not in the data), and a typical mistake the vectors catch.
DESCRIBED: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, str]]] = {
    "TK-05 nitrogen blanketing": (_pou(
        "FUNCTION_BLOCK", "FB_TK05Blanket",
        _vars("VAR_INPUT rTankPressMbar : REAL", "VAR_OUTPUT bN2Valve, bVentValve : BOOL"),
        "IF rTankPressMbar < 5.0 THEN\n  bN2Valve := TRUE;\nELSIF rTankPressMbar >= 12.0 THEN\n"
        "  bN2Valve := FALSE;\nEND_IF;\n"
        "IF rTankPressMbar > 25.0 THEN\n  bVentValve := TRUE;\nELSIF rTankPressMbar <= 18.0 THEN\n"
        "  bVentValve := FALSE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rTankPressMbar": 10.0}),
                 (0.5, None, {"bN2Valve": F, "bVentValve": F}),
                 (1, {"rTankPressMbar": 4.0}), (1.5, None, {"bN2Valve": T}),
                 (2, {"rTankPressMbar": 8.0}), (2.5, None, {"bN2Valve": T}),
                 (3, {"rTankPressMbar": 13.0}), (3.5, None, {"bN2Valve": F}),
                 (4, {"rTankPressMbar": 8.0}), (4.5, None, {"bN2Valve": F, "bVentValve": F}),
                 (5, {"rTankPressMbar": 26.0}), (5.5, None, {"bVentValve": T, "bN2Valve": F}),
                 (6, {"rTankPressMbar": 21.0}), (6.5, None, {"bVentValve": T}),
                 (7, {"rTankPressMbar": 17.0}), (7.5, None, {"bVentValve": F})),
        # the vent without its hysteresis: it chatters around 25 mbar
        ("ELSIF rTankPressMbar <= 18.0", "ELSIF rTankPressMbar <= 25.0")),
    "Begleitheizung (trace heating)": (_pou(
        "FUNCTION_BLOCK", "FB_TraceHeatTT118",
        _vars("VAR_INPUT rPipeTemp : REAL", "VAR_OUTPUT bHeating, bSensorFault : BOOL"),
        "bSensorFault := rPipeTemp < -40.0 OR rPipeTemp > 150.0;\n"
        "IF bSensorFault THEN\n  bHeating := FALSE;\nELSIF rPipeTemp < 25.0 THEN\n"
        "  bHeating := TRUE;\nELSIF rPipeTemp > 30.0 THEN\n  bHeating := FALSE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rPipeTemp": 40.0}),
                 (0.5, None, {"bHeating": F, "bSensorFault": F}),
                 (1, {"rPipeTemp": 20.0}), (1.5, None, {"bHeating": T}),
                 (2, {"rPipeTemp": 27.0}), (2.5, None, {"bHeating": T}),
                 (3, {"rPipeTemp": 31.0}), (3.5, None, {"bHeating": F}),
                 (4, {"rPipeTemp": 27.0}), (4.5, None, {"bHeating": F}),
                 (5, {"rPipeTemp": 20.0}), (5.5, None, {"bHeating": T}),
                 (6, {"rPipeTemp": -60.0}), (6.5, None, {"bHeating": F, "bSensorFault": T}),
                 (7, {"rPipeTemp": 10.0}), (7.5, None, {"bHeating": T, "bSensorFault": F}),
                 (8, {"rPipeTemp": 200.0}), (8.5, None, {"bHeating": F, "bSensorFault": T}),
                 (9, {"rPipeTemp": 28.0}), (9.5, None, {"bHeating": F, "bSensorFault": F})),
        # only the upper end checked: a sensor gone low (broken wire) heats for ever
        ("rPipeTemp < -40.0 OR ", "")),
    "CV-7 Förderband, Tippbetrieb": (_pou(
        "FUNCTION_BLOCK", "FB_CV7Jog",
        _vars("VAR_INPUT bJogPB, bManual : BOOL", "VAR_OUTPUT bBeltRun : BOOL",
              "VAR tJogMax : TON"),
        "tJogMax(IN := bJogPB AND bManual, PT := T#5s);\n"
        "bBeltRun := bJogPB AND bManual AND NOT tJogMax.Q;\n"),
        _vectors(0.1, (0, {"bJogPB": F, "bManual": T}), (0.5, None, {"bBeltRun": F}),
                 (1, {"bJogPB": T}), (1.5, None, {"bBeltRun": T}),
                 (3, {"bJogPB": F}), (3.5, None, {"bBeltRun": F}),
                 (4, {"bJogPB": T}), (8.5, None, {"bBeltRun": T}), (9.5, None, {"bBeltRun": F}),
                 (10, {"bJogPB": F}), (10.5, None, {"bBeltRun": F}),
                 (11, {"bJogPB": T}), (11.5, None, {"bBeltRun": T}),
                 (12, {"bJogPB": F}), (12.5, None, {"bBeltRun": F}),
                 (13, {"bManual": F}), (14, {"bJogPB": T}), (14.5, None, {"bBeltRun": F}),
                 (20, None, {"bBeltRun": F})),
        # no time limit on a held button
        (" AND NOT tJogMax.Q", "")),
    "Chiller CH-2 compressor": (_pou(
        "FUNCTION_BLOCK", "FB_CH2AntiCycle",
        _vars("VAR_INPUT bDemand : BOOL", "VAR_OUTPUT bCompressor : BOOL",
              "VAR tMinOn, tMinOff : TON"),
        "tMinOn(IN := bCompressor, PT := T#3m);\ntMinOff(IN := NOT bCompressor, PT := T#5m);\n"
        "IF bCompressor THEN\n  IF NOT bDemand AND tMinOn.Q THEN\n    bCompressor := FALSE;\n"
        "  END_IF;\nELSIF bDemand AND tMinOff.Q THEN\n  bCompressor := TRUE;\nEND_IF;\n"),
        _vectors(0.5, (0, {"bDemand": F}), (1, None, {"bCompressor": F}),
                 (310, {"bDemand": T}), (311, None, {"bCompressor": T}),
                 (320, {"bDemand": F}), (321, None, {"bCompressor": T}),
                 (485, None, {"bCompressor": T}), (495, None, {"bCompressor": F}),
                 (500, {"bDemand": T}), (510, None, {"bCompressor": F}),
                 (780, None, {"bCompressor": F}), (800, None, {"bCompressor": T}),
                 (900, None, {"bCompressor": T}),
                 (1000, {"bDemand": F}), (1001, None, {"bCompressor": F})),
        # minimum run time kept, minimum off time forgotten
        ("ELSIF bDemand AND tMinOff.Q THEN", "ELSIF bDemand THEN")),
    "Line 4 stack light": (_pou(
        "FUNCTION_BLOCK", "FB_Line4StackLight",
        _vars("VAR_INPUT bLineRunning, bFillerStarved, bFault, bAck : BOOL",
              "VAR_OUTPUT bGreen, bYellow, bRed : BOOL", "VAR rtFault : R_TRIG",
              "VAR bUnacked : BOOL", "VAR tLit, tDark : TON"),
        "rtFault(CLK := bFault);\nIF rtFault.Q THEN\n  bUnacked := TRUE;\nEND_IF;\n"
        "IF bAck THEN\n  bUnacked := FALSE;\nEND_IF;\n"
        "tLit(IN := bUnacked AND NOT tDark.Q, PT := T#500ms);\n"
        "tDark(IN := tLit.Q, PT := T#500ms);\n"
        "bRed := (bUnacked AND NOT tLit.Q) OR (NOT bUnacked AND bFault);\n"
        "bGreen := bLineRunning;\nbYellow := bFillerStarved;\n"),
        _vectors(0.01, (0, {"bLineRunning": F, "bFillerStarved": F, "bFault": F, "bAck": F}),
                 (0.5, None, {"bGreen": F, "bYellow": F, "bRed": F}),
                 (0.6, {"bLineRunning": T}), (0.8, None, {"bGreen": T}),
                 (0.9, {"bLineRunning": F}),
                 (1, {"bFault": T}), (1.25, None, {"bRed": T}), (1.75, None, {"bRed": F}),
                 (2.27, None, {"bRed": T}), (2.77, None, {"bRed": F}),
                 (3.2, {"bAck": T}), (3.4, {"bAck": F}), (3.5, None, {"bRed": T}),
                 (4.3, None, {"bRed": T}), (4.5, {"bFault": F}), (4.7, None, {"bRed": F}),
                 (5, {"bFault": T}), (5.25, None, {"bRed": T}), (5.3, {"bFault": F}),
                 (5.75, None, {"bRed": F}), (6.27, None, {"bRed": T}),
                 (6.6, {"bAck": T}), (6.8, {"bAck": F}), (7, None, {"bRed": F}),
                 (7.2, {"bFillerStarved": T}), (7.4, None, {"bYellow": T, "bRed": F})),
        # acknowledged while the fault is still there: red goes dark
        ("(bUnacked AND NOT tLit.Q) OR (NOT bUnacked AND bFault)", "bUnacked AND NOT tLit.Q")),
    "Reject station behind the label inspection camera": (_pou(
        "FUNCTION_BLOCK", "FB_RejectJet",
        _vars("VAR_INPUT bPitch, bBadBottle : BOOL", "VAR_OUTPUT bJet : BOOL",
              "VAR rtPitch : R_TRIG", "VAR aTrack : ARRAY[0..6] OF BOOL", "VAR i : INT",
              "VAR tpJet : TP"),
        "rtPitch(CLK := bPitch);\nIF rtPitch.Q THEN\n  FOR i := 6 TO 1 BY -1 DO\n"
        "    aTrack[i] := aTrack[i - 1];\n  END_FOR;\n  aTrack[0] := bBadBottle;\nEND_IF;\n"
        "tpJet(IN := rtPitch.Q AND aTrack[6], PT := T#80ms);\nbJet := tpJet.Q;\n"),
        _vectors(0.01, (0, {"bPitch": F, "bBadBottle": F}),
                 *[row for k in range(1, 18) for row in (
                     (0.5 * k, {"bPitch": T, **({"bBadBottle": T} if k in (2, 9) else {})}),
                     (0.5 * k + 0.04, None, {"bJet": k in (8, 15, 16)}),
                     (0.5 * k + 0.12, {"bPitch": F, **({"bBadBottle": F} if k in (2, 10)
                                                      else {})}, {"bJet": F}))]),
        # shifted every scan the pitch sensor is on, not once per pitch
        ("IF rtPitch.Q THEN", "IF bPitch THEN")),
    "Dichtheitsprüfung (valve proving)": (_pou(
        "FUNCTION_BLOCK", "FB_GasTrainLeakTest",
        _vars("VAR_INPUT bStartTest : BOOL", "VAR_INPUT rPressMbar : REAL",
              "VAR_OUTPUT bTestRunning, bLeak, bPassed : BOOL",
              "VAR rtStart, rtSettled : R_TRIG", "VAR tSettle, tTest : TON",
              "VAR rNoted : REAL"),
        "rtStart(CLK := bStartTest);\nIF rtStart.Q THEN\n  bTestRunning := TRUE;\n"
        "  bLeak := FALSE;\n  bPassed := FALSE;\nEND_IF;\n"
        "tSettle(IN := bTestRunning, PT := T#10s);\nrtSettled(CLK := tSettle.Q);\n"
        "IF rtSettled.Q THEN\n  rNoted := rPressMbar;\nEND_IF;\n"
        "tTest(IN := tSettle.Q, PT := T#30s);\n"
        "IF tTest.Q THEN\n  bTestRunning := FALSE;\n  IF rNoted - rPressMbar > 2.0 THEN\n"
        "    bLeak := TRUE;\n  ELSE\n    bPassed := TRUE;\n  END_IF;\nEND_IF;\n"),
        _vectors(0.1, (0, {"bStartTest": F, "rPressMbar": 55.0}),
                 (0.5, None, {"bTestRunning": F, "bLeak": F, "bPassed": F}),
                 (1, {"bStartTest": T}), (1.5, None, {"bTestRunning": T}),
                 (2, {"bStartTest": F}), (5, {"rPressMbar": 51.0}), (8, {"rPressMbar": 50.0}),
                 (20, None, {"bTestRunning": T, "bLeak": F, "bPassed": F}),
                 (30, {"rPressMbar": 49.0}), (40.5, None, {"bTestRunning": T}),
                 (41.5, None, {"bTestRunning": F, "bLeak": F, "bPassed": T}),
                 (50, {"bStartTest": T, "rPressMbar": 50.0}),
                 (50.5, None, {"bTestRunning": T, "bLeak": F, "bPassed": F}),
                 (51, {"bStartTest": F}), (70, {"rPressMbar": 47.5}),
                 (89.5, None, {"bTestRunning": T}),
                 (91.5, None, {"bTestRunning": F, "bLeak": T, "bPassed": F})),
        # the pressure noted at the start, before it has settled
        ("IF rtSettled.Q THEN", "IF rtStart.Q THEN")),
    "HPU-2 hydraulic power pack": (_pou(
        "FUNCTION_BLOCK", "FB_HPU2OilTemp",
        _vars("VAR_INPUT rOilTemp : REAL", "VAR_INPUT bPumpRequest : BOOL",
              "VAR_OUTPUT bCoolerFan, bTankHeater, bPump : BOOL"),
        "IF rOilTemp >= 50.0 THEN\n  bCoolerFan := TRUE;\nELSIF rOilTemp <= 45.0 THEN\n"
        "  bCoolerFan := FALSE;\nEND_IF;\n"
        "IF rOilTemp < 15.0 THEN\n  bTankHeater := TRUE;\nELSIF rOilTemp > 20.0 THEN\n"
        "  bTankHeater := FALSE;\nEND_IF;\n"
        "IF NOT bPumpRequest OR rOilTemp > 70.0 THEN\n  bPump := FALSE;\n"
        "ELSIF rOilTemp >= 10.0 THEN\n  bPump := TRUE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rOilTemp": 30.0, "bPumpRequest": F}),
                 (0.5, None, {"bCoolerFan": F, "bTankHeater": F, "bPump": F}),
                 (1, {"bPumpRequest": T}), (1.5, None, {"bPump": T}),
                 (3, {"rOilTemp": 8.0}), (3.5, None, {"bPump": T, "bTankHeater": T}),
                 (5, {"rOilTemp": 18.0}), (5.5, None, {"bTankHeater": T}),
                 (6, {"rOilTemp": 21.0}), (6.5, None, {"bTankHeater": F}),
                 (7, {"rOilTemp": 48.0}), (7.5, None, {"bCoolerFan": F}),
                 (8, {"rOilTemp": 52.0}), (8.5, None, {"bCoolerFan": T}),
                 (9, {"rOilTemp": 47.0}), (9.5, None, {"bCoolerFan": T}),
                 (10, {"rOilTemp": 44.0}), (10.5, None, {"bCoolerFan": F}),
                 (11, {"rOilTemp": 72.0}), (11.5, None, {"bPump": F, "bCoolerFan": T}),
                 (12, {"bPumpRequest": F, "rOilTemp": 60.0}), (12.5, None, {"bPump": F}),
                 (13, {"rOilTemp": 5.0, "bPumpRequest": T}),
                 (13.5, None, {"bPump": F, "bTankHeater": T}),
                 (15, {"rOilTemp": 12.0}), (15.5, None, {"bPump": T})),
        # the start permissive written as a run interlock: cold oil stops a running pump
        ("IF NOT bPumpRequest OR rOilTemp > 70.0 THEN\n  bPump := FALSE;\n"
         "ELSIF rOilTemp >= 10.0 THEN\n  bPump := TRUE;\nEND_IF;\n",
         "bPump := bPumpRequest AND rOilTemp >= 10.0 AND rOilTemp <= 70.0;\n")),
    "R-1 pressure is measured twice": (_pou(
        "FUNCTION_BLOCK", "FB_R1Pressure",
        _vars("VAR_INPUT rPT11, rPT12 : REAL", "VAR_OUTPUT rPressure : REAL",
              "VAR_OUTPUT bDeviation : BOOL", "VAR tDeviation : TON"),
        "tDeviation(IN := ABS(rPT11 - rPT12) > 0.5, PT := T#5s);\n"
        "bDeviation := tDeviation.Q;\nIF bDeviation THEN\n  rPressure := MAX(rPT11, rPT12);\n"
        "ELSE\n  rPressure := (rPT11 + rPT12) / 2.0;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rPT11": 4.0, "rPT12": 4.2}),
                 (0.5, None, {"rPressure": _near(4.1), "bDeviation": F}),
                 (1, {"rPT12": 4.8}), (3, None, {"rPressure": _near(4.4), "bDeviation": F}),
                 (5.5, None, {"bDeviation": F}),
                 (6.5, None, {"bDeviation": T, "rPressure": _near(4.8)}),
                 (10, {"rPT11": 4.5, "rPT12": 4.6}),
                 (10.5, None, {"bDeviation": F, "rPressure": _near(4.55)})),
        # the lower reading passed on: the unsafe side
        ("MAX(rPT11, rPT12)", "MIN(rPT11, rPT12)")),
    "Silo SL-2, pneumatic filling": (_pou(
        "FUNCTION_BLOCK", "FB_SiloSL2Fill",
        _vars("VAR_INPUT bKeySwitch, bHighLevel : BOOL", "VAR_INPUT rFilterDpMbar : REAL",
              "VAR_INPUT bAckPB : BOOL", "VAR_OUTPUT bFillValve, bHorn : BOOL",
              "VAR rtKey : R_TRIG", "VAR tHigh : TON"),
        "rtKey(CLK := bKeySwitch);\ntHigh(IN := bHighLevel, PT := T#2s);\n"
        "IF rtKey.Q THEN\n  bFillValve := TRUE;\nEND_IF;\n"
        "IF NOT bKeySwitch THEN\n  bFillValve := FALSE;\nEND_IF;\n"
        "IF bFillValve AND (tHigh.Q OR rFilterDpMbar > 25.0) THEN\n  bFillValve := FALSE;\n"
        "  bHorn := TRUE;\nEND_IF;\nIF bAckPB THEN\n  bHorn := FALSE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"bKeySwitch": F, "bHighLevel": F, "rFilterDpMbar": 5.0,
                           "bAckPB": F}),
                 (0.5, None, {"bFillValve": F, "bHorn": F}),
                 (1, {"bKeySwitch": T}), (1.5, None, {"bFillValve": T, "bHorn": F}),
                 (5, {"rFilterDpMbar": 30.0}), (5.5, None, {"bFillValve": F, "bHorn": T}),
                 (6, {"rFilterDpMbar": 10.0}), (6.5, None, {"bFillValve": F, "bHorn": T}),
                 (7, {"bAckPB": T}), (7.5, {"bAckPB": F}),
                 (8, None, {"bHorn": F, "bFillValve": F}),
                 (9, {"bKeySwitch": F}), (10, {"bKeySwitch": T}),
                 (10.5, None, {"bFillValve": T}), (12, {"bHighLevel": T}),
                 (13.5, None, {"bFillValve": T, "bHorn": F}),
                 (14.5, None, {"bFillValve": F, "bHorn": T}),
                 (15, {"bHighLevel": F}), (15.5, None, {"bFillValve": F}),
                 (16, {"bAckPB": T}), (16.5, {"bAckPB": F}),
                 (17, None, {"bHorn": F, "bFillValve": F}),
                 (18, {"bKeySwitch": F}), (18.5, None, {"bFillValve": F})),
        # the key switch read as a level: the valve reopens once the trip has cleared
        ("IF rtKey.Q THEN", "IF bKeySwitch THEN")),
    "Druckerhöhungsanlage, three pumps": (_pou(
        "FUNCTION_BLOCK", "FB_BoosterSet",
        _vars("VAR_INPUT rHeaderBar : REAL", "VAR_OUTPUT bP1, bP2, bP3 : BOOL",
              "VAR tStage : TON", "VAR iRunning : INT", "VAR bLow, bHigh : BOOL"),
        "bLow := rHeaderBar < 4.0 AND iRunning < 3;\nbHigh := rHeaderBar > 5.0 AND iRunning > 0;\n"
        "tStage(IN := bLow OR bHigh, PT := T#10s);\n"
        "IF tStage.Q THEN\n  IF bLow THEN\n    iRunning := iRunning + 1;\n  ELSE\n"
        "    iRunning := iRunning - 1;\n  END_IF;\n  tStage(IN := FALSE);\nEND_IF;\n"
        "bP1 := iRunning >= 1;\nbP2 := iRunning >= 2;\nbP3 := iRunning >= 3;\n"),
        _vectors(0.1, (0, {"rHeaderBar": 4.5}), (1, None, {"bP1": F, "bP2": F, "bP3": F}),
                 (5, {"rHeaderBar": 3.5}), (14, None, {"bP1": F}),
                 (16, None, {"bP1": T, "bP2": F, "bP3": F}), (24, None, {"bP2": F}),
                 (27, None, {"bP2": T, "bP3": F}), (34, None, {"bP3": F}),
                 (38, None, {"bP3": T}), (40, {"rHeaderBar": 4.5}),
                 (45, None, {"bP1": T, "bP2": T, "bP3": T}),
                 (50, {"rHeaderBar": 5.5}), (59, None, {"bP3": T}),
                 (61, None, {"bP3": F, "bP2": T}), (69, None, {"bP2": T}),
                 (72, None, {"bP2": F, "bP1": T}), (79, None, {"bP1": T}),
                 (82, None, {"bP1": F, "bP2": F, "bP3": F})),
        # the staging timer not restarted: all three pumps start at once
        ("  tStage(IN := FALSE);\n", "")),
    "Magmeter FT-220 over Modbus": (dict(_pou(
        "FUNCTION", "FC_FT220Flow", _vars("VAR_INPUT iHoldingReg : INT"),
        "FC_FT220Flow := MAX(0, iHoldingReg) * 250.0 / 10000.0;\n"), return_type="REAL"),
        _vectors(0.1, (0, {"iHoldingReg": 5000}, {"FC_FT220Flow": _near(125.0)}),
                 (1, {"iHoldingReg": 10000}, {"FC_FT220Flow": _near(250.0)}),
                 (2, {"iHoldingReg": 400}, {"FC_FT220Flow": _near(10.0)}),
                 (3, {"iHoldingReg": -300}, {"FC_FT220Flow": _near(0.0)}),
                 (4, {"iHoldingReg": 0}, {"FC_FT220Flow": _near(0.0)}),
                 (5, {"iHoldingReg": 2500}, {"FC_FT220Flow": _near(62.5)})),
        # reverse flow shown as a negative flow
        ("MAX(0, iHoldingReg)", "iHoldingReg")),
    "Rührwerk of mixer MX-4": (_pou(
        "FUNCTION_BLOCK", "FB_MX4Agitator",
        _vars("VAR_INPUT bHmiStart, bHmiStop, bLidClosed : BOOL", "VAR_INPUT rLevelPct : REAL",
              "VAR_OUTPUT bAgitator : BOOL"),
        "IF bHmiStop OR NOT bLidClosed OR rLevelPct < 10.0 THEN\n  bAgitator := FALSE;\n"
        "ELSIF bHmiStart AND rLevelPct > 15.0 THEN\n  bAgitator := TRUE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"bHmiStart": F, "bHmiStop": F, "bLidClosed": T, "rLevelPct": 50.0}),
                 (0.5, None, {"bAgitator": F}),
                 (1, {"bHmiStart": T}), (1.3, {"bHmiStart": F}), (1.5, None, {"bAgitator": T}),
                 (2, {"rLevelPct": 12.0}), (2.5, None, {"bAgitator": T}),
                 (3, {"rLevelPct": 8.0}), (3.5, None, {"bAgitator": F}),
                 (4, {"rLevelPct": 12.0}), (5, {"bHmiStart": T}), (5.3, {"bHmiStart": F}),
                 (5.5, None, {"bAgitator": F}),
                 (6, {"rLevelPct": 20.0}), (6.5, None, {"bAgitator": F}),
                 (7, {"bHmiStart": T}), (7.3, {"bHmiStart": F}), (7.5, None, {"bAgitator": T}),
                 (8, {"bLidClosed": F}), (8.5, None, {"bAgitator": F}),
                 (9, {"bLidClosed": T}), (9.5, None, {"bAgitator": F}),
                 (10, {"bHmiStart": T}), (10.3, {"bHmiStart": F}),
                 (10.5, None, {"bAgitator": T}),
                 (11, {"bHmiStop": T}), (11.3, {"bHmiStop": F}), (11.5, None, {"bAgitator": F}),
                 (12, {"bLidClosed": F}), (13, {"bHmiStart": T}), (13.3, {"bHmiStart": F}),
                 (13.5, None, {"bAgitator": F})),
        # one level for start and stop: it starts at 12 %
        ("bHmiStart AND rLevelPct > 15.0", "bHmiStart AND rLevelPct >= 10.0")),
    "Layer forming on palletiser PAL-1": (_pou(
        "FUNCTION_BLOCK", "FB_PAL1Layers",
        _vars("VAR_INPUT bCartonSensor, bPalletPresent : BOOL",
              "VAR_OUTPUT bLayerPusher, bPalletFull : BOOL", "VAR rtCarton : R_TRIG",
              "VAR ftPallet : F_TRIG", "VAR tpPush : TP", "VAR iCartons, iLayers : INT",
              "VAR bPushReq : BOOL"),
        "rtCarton(CLK := bCartonSensor);\nftPallet(CLK := bPalletPresent);\n"
        "IF ftPallet.Q THEN\n  iCartons := 0;\n  iLayers := 0;\n  bPalletFull := FALSE;\n"
        "END_IF;\nIF rtCarton.Q AND NOT bPalletFull THEN\n  iCartons := iCartons + 1;\n"
        "  IF iCartons >= 6 THEN\n    iCartons := 0;\n    iLayers := iLayers + 1;\n"
        "    bPushReq := TRUE;\n  END_IF;\nEND_IF;\n"
        "tpPush(IN := bPushReq, PT := T#2s);\nbPushReq := FALSE;\nbLayerPusher := tpPush.Q;\n"
        "IF iLayers >= 3 THEN\n  bPalletFull := TRUE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"bCartonSensor": F, "bPalletPresent": T}),
                 (0.5, None, {"bLayerPusher": F, "bPalletFull": F}),
                 *[row for k in [*range(1, 19), *range(26, 32)] for row in (
                     (k, {"bCartonSensor": T}), (k + 0.3, {"bCartonSensor": F}))],
                 (2.5, None, {"bLayerPusher": F}), (5.5, None, {"bLayerPusher": F}),
                 (6.5, None, {"bLayerPusher": T}), (7.5, None, {"bLayerPusher": T}),
                 (8.5, None, {"bLayerPusher": F}),
                 (12.5, None, {"bLayerPusher": T, "bPalletFull": F}),
                 (14.5, None, {"bLayerPusher": F}),
                 (18.5, None, {"bLayerPusher": T, "bPalletFull": T}),
                 (21, None, {"bLayerPusher": F, "bPalletFull": T}),
                 (22, {"bPalletPresent": F}), (22.5, None, {"bPalletFull": F}),
                 (25, {"bPalletPresent": T}), (30.5, None, {"bLayerPusher": F}),
                 (31.5, None, {"bLayerPusher": T, "bPalletFull": F})),
        # counted on the sensor's level: a carton counts every scan it is seen
        ("IF rtCarton.Q AND NOT bPalletFull THEN", "IF bCartonSensor AND NOT bPalletFull THEN")),
    "HX-3 steam valve": (_pou(
        "FUNCTION_BLOCK", "FB_HX3SteamValve",
        _vars("VAR_INPUT rOutletTemp : REAL", "VAR_INPUT bCondPumpRun : BOOL",
              "VAR_OUTPUT rValvePct : REAL", "VAR rOut : REAL"),
        "rOut := 4.0 * (85.0 - rOutletTemp);\n"
        "IF bCondPumpRun THEN\n  rValvePct := LIMIT(0.0, rOut, 100.0);\nELSE\n"
        "  rValvePct := 0.0;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rOutletTemp": 80.0, "bCondPumpRun": T},
                       {"rValvePct": _near(20.0)}),
                 (1, {"rOutletTemp": 84.0}, {"rValvePct": _near(4.0)}),
                 (2, {"rOutletTemp": 90.0}, {"rValvePct": _near(0.0)}),
                 (3, {"rOutletTemp": 50.0}, {"rValvePct": _near(100.0)}),
                 (4, {"rOutletTemp": 85.0}, {"rValvePct": _near(0.0)}),
                 (5, {"rOutletTemp": 70.0}, {"rValvePct": _near(60.0)}),
                 (6, {"bCondPumpRun": F}, {"rValvePct": _near(0.0)}),
                 (7, {"bCondPumpRun": T}, {"rValvePct": _near(60.0)})),
        # no clamp: -20 % and 140 % go out to the valve
        ("LIMIT(0.0, rOut, 100.0)", "rOut")),
    "CIP return line, conductivity QT-12": (_pou(
        "FUNCTION_BLOCK", "FB_CIPReturnDivert",
        _vars("VAR_INPUT rConductivity : REAL", "VAR_OUTPUT bToRecoveryTank : BOOL",
              "VAR tHigh : TON"),
        "tHigh(IN := rConductivity > 40.0, PT := T#15s);\n"
        "IF tHigh.Q THEN\n  bToRecoveryTank := TRUE;\nELSIF rConductivity < 35.0 THEN\n"
        "  bToRecoveryTank := FALSE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rConductivity": 10.0}), (1, None, {"bToRecoveryTank": F}),
                 (5, {"rConductivity": 45.0}), (12, None, {"bToRecoveryTank": F}),
                 (19.5, None, {"bToRecoveryTank": F}), (20.5, None, {"bToRecoveryTank": T}),
                 (30, {"rConductivity": 38.0}), (31, None, {"bToRecoveryTank": T}),
                 (40, {"rConductivity": 30.0}), (40.5, None, {"bToRecoveryTank": F}),
                 (50, {"rConductivity": 45.0}), (55, {"rConductivity": 20.0}),
                 (55.5, None, {"bToRecoveryTank": F}), (60, {"rConductivity": 45.0}),
                 (70, None, {"bToRecoveryTank": F}), (75.5, None, {"bToRecoveryTank": T})),
        # no 15 s: the first slug of caustic goes to the tank with the rinse water
        ("IF tHigh.Q THEN", "IF rConductivity > 40.0 THEN")),
    "AHU-2 Frostschutz": (_pou(
        "FUNCTION_BLOCK", "FB_AHU2Frost",
        _vars("VAR_INPUT rCoilAirTemp, rCtrlOutPct : REAL", "VAR_INPUT bReset : BOOL",
              "VAR_OUTPUT bFrostAlarm, bSupplyFanEnable : BOOL",
              "VAR_OUTPUT rHeatValvePct : REAL"),
        "IF rCoilAirTemp < 5.0 THEN\n  bFrostAlarm := TRUE;\nEND_IF;\n"
        "IF bReset AND rCoilAirTemp > 8.0 THEN\n  bFrostAlarm := FALSE;\nEND_IF;\n"
        "bSupplyFanEnable := NOT bFrostAlarm;\n"
        "IF bFrostAlarm THEN\n  rHeatValvePct := 100.0;\nELSE\n  rHeatValvePct := rCtrlOutPct;\n"
        "END_IF;\n"),
        _vectors(0.1, (0, {"rCoilAirTemp": 15.0, "rCtrlOutPct": 30.0, "bReset": F}),
                 (0.5, None, {"bFrostAlarm": F, "bSupplyFanEnable": T,
                              "rHeatValvePct": _near(30.0)}),
                 (2, {"rCoilAirTemp": 4.0}),
                 (2.5, None, {"bFrostAlarm": T, "bSupplyFanEnable": F,
                              "rHeatValvePct": _near(100.0)}),
                 (4, {"rCoilAirTemp": 6.0}), (4.5, None, {"bFrostAlarm": T}),
                 (5, {"bReset": T}), (5.3, {"bReset": F}),
                 (5.5, None, {"bFrostAlarm": T, "bSupplyFanEnable": F,
                              "rHeatValvePct": _near(100.0)}),
                 (8, {"rCoilAirTemp": 9.0}), (8.5, None, {"bFrostAlarm": T}),
                 (9, {"bReset": T}), (9.3, {"bReset": F}),
                 (9.5, None, {"bFrostAlarm": F, "bSupplyFanEnable": T,
                              "rHeatValvePct": _near(30.0)}),
                 (11, {"rCtrlOutPct": 45.0}), (11.5, None, {"rHeatValvePct": _near(45.0)})),
        # a reset taken while the coil is still cold
        ("bReset AND rCoilAirTemp > 8.0", "bReset")),
    "Desiccant dryer with towers A and B": (_pou(
        "FUNCTION_BLOCK", "FB_DryerTowers",
        _vars("VAR_INPUT bEnable : BOOL", "VAR_OUTPUT bValveA, bValveB : BOOL",
              "VAR iStep : INT", "VAR tPhase : TON"),
        "IF NOT bEnable THEN\n  iStep := 0;\n  tPhase(IN := FALSE);\nEND_IF;\n"
        "CASE iStep OF\n"
        "  0:\n    tPhase(IN := bEnable, PT := T#4m);\n"
        "    IF tPhase.Q THEN\n      iStep := 1;\n      tPhase(IN := FALSE);\n    END_IF;\n"
        "  1:\n    tPhase(IN := TRUE, PT := T#5s);\n"
        "    IF tPhase.Q THEN\n      iStep := 2;\n      tPhase(IN := FALSE);\n    END_IF;\n"
        "  2:\n    tPhase(IN := TRUE, PT := T#4m);\n"
        "    IF tPhase.Q THEN\n      iStep := 3;\n      tPhase(IN := FALSE);\n    END_IF;\n"
        "  3:\n    tPhase(IN := TRUE, PT := T#5s);\n"
        "    IF tPhase.Q THEN\n      iStep := 0;\n      tPhase(IN := FALSE);\n    END_IF;\n"
        "END_CASE;\n"
        "bValveA := bEnable AND iStep <> 2;\nbValveB := bEnable AND iStep <> 0;\n"),
        _vectors(0.1, (0, {"bEnable": F}), (0.5, None, {"bValveA": F, "bValveB": F}),
                 (1, {"bEnable": T}), (1.5, None, {"bValveA": T, "bValveB": F}),
                 (120, None, {"bValveA": T, "bValveB": F}),
                 (243.5, None, {"bValveA": T, "bValveB": T}),
                 (300, None, {"bValveA": F, "bValveB": T}),
                 (489, None, {"bValveA": T, "bValveB": T}),
                 (600, None, {"bValveA": T, "bValveB": F}),
                 (650, {"bEnable": F}), (651, None, {"bValveA": F, "bValveB": F}),
                 (700, {"bEnable": T}), (701, None, {"bValveA": T, "bValveB": F}),
                 (942.5, None, {"bValveA": T, "bValveB": T}),
                 (950, None, {"bValveA": F, "bValveB": T})),
        # no overlap at A to B: the air stops for a moment at every changeover
        ("bValveB := bEnable AND iStep <> 0;", "bValveB := bEnable AND iStep = 2;")),
    "Chemical dosing proportional to make-up water": (_pou(
        "FUNCTION_BLOCK", "FB_DP5Dosing",
        _vars("VAR_INPUT bMeterPulse : BOOL", "VAR_OUTPUT bDosingStroke : BOOL",
              "VAR rtPulse : R_TRIG", "VAR rLitres : REAL", "VAR bFire : BOOL",
              "VAR tpStroke : TP"),
        "rtPulse(CLK := bMeterPulse);\nIF rtPulse.Q THEN\n  rLitres := rLitres + 10.0;\n"
        "END_IF;\nbFire := FALSE;\nIF rLitres >= 50.0 THEN\n  rLitres := rLitres - 50.0;\n"
        "  bFire := TRUE;\nEND_IF;\ntpStroke(IN := bFire, PT := T#200ms);\n"
        "bDosingStroke := tpStroke.Q;\n"),
        _vectors(0.01, (0, {"bMeterPulse": F}), (0.5, None, {"bDosingStroke": F}),
                 *[row for k in range(1, 13) for row in (
                     (k, {"bMeterPulse": T}),
                     (k + 0.1, {"bMeterPulse": F}, {"bDosingStroke": k in (5, 10)}),
                     (k + 0.3, None, {"bDosingStroke": F}))]),
        # the litres never taken off: one stroke, then none
        ("  rLitres := rLitres - 50.0;\n", "")),
    "UPS changeover for the control room": (_pou(
        "FUNCTION_BLOCK", "FB_UPSChangeover",
        _vars("VAR_INPUT rL1, rL2, rL3 : REAL", "VAR_OUTPUT bOnUps : BOOL",
              "VAR bBad, bGood : BOOL", "VAR tBad, tGood : TON"),
        "bBad := rL1 < 207.0 OR rL1 > 253.0 OR rL2 < 207.0 OR rL2 > 253.0\n"
        "  OR rL3 < 207.0 OR rL3 > 253.0;\n"
        "bGood := rL1 >= 215.0 AND rL1 <= 245.0 AND rL2 >= 215.0 AND rL2 <= 245.0\n"
        "  AND rL3 >= 215.0 AND rL3 <= 245.0;\n"
        "tBad(IN := bBad, PT := T#500ms);\ntGood(IN := bGood, PT := T#30s);\n"
        "IF tBad.Q THEN\n  bOnUps := TRUE;\nELSIF tGood.Q THEN\n  bOnUps := FALSE;\nEND_IF;\n"),
        _vectors(0.05, (0, {"rL1": 230.0, "rL2": 230.0, "rL3": 230.0}),
                 (1, None, {"bOnUps": F}), (2, {"rL2": 200.0}), (2.3, None, {"bOnUps": F}),
                 (2.6, None, {"bOnUps": T}), (3, {"rL2": 230.0}), (10, None, {"bOnUps": T}),
                 (32.5, None, {"bOnUps": T}), (33.5, None, {"bOnUps": F}),
                 (40, {"rL3": 260.0}), (40.3, {"rL3": 230.0}), (41, None, {"bOnUps": F}),
                 (45, {"rL1": 212.0}), (45.8, None, {"bOnUps": F}),
                 (46, {"rL1": 200.0}), (46.7, None, {"bOnUps": T}),
                 (47, {"rL1": 212.0}), (80, None, {"bOnUps": T}),
                 (81, {"rL1": 230.0}), (110.5, None, {"bOnUps": T}),
                 (111.5, None, {"bOnUps": F})),
        # back to mains the moment the voltages are good
        ("ELSIF tGood.Q THEN", "ELSIF bGood THEN")),
    "P-7 Hand-0-Auto selector": (_pou(
        "FUNCTION_BLOCK", "FB_P7HandAuto",
        _vars("VAR_INPUT bSelHand, bSelAuto, bLevelDemand, bLSLLWet : BOOL",
              "VAR_OUTPUT bPumpRun : BOOL"),
        "bPumpRun := (bSelHand OR (bSelAuto AND bLevelDemand)) AND bLSLLWet;\n"),
        _vectors(0.1, (0, {"bSelHand": F, "bSelAuto": F, "bLevelDemand": F, "bLSLLWet": T}),
                 (0.5, None, {"bPumpRun": F}), (1, {"bSelHand": T}),
                 (1.5, None, {"bPumpRun": T}), (2, {"bLSLLWet": F}),
                 (2.5, None, {"bPumpRun": F}), (3, {"bLSLLWet": T}),
                 (3.5, None, {"bPumpRun": T}), (4, {"bSelHand": F}),
                 (4.5, None, {"bPumpRun": F}), (5, {"bSelAuto": T}),
                 (5.5, None, {"bPumpRun": F}), (6, {"bLevelDemand": T}),
                 (6.5, None, {"bPumpRun": T}), (7, {"bLSLLWet": F}),
                 (7.5, None, {"bPumpRun": F}), (8, {"bLSLLWet": T}),
                 (8.5, None, {"bPumpRun": T}), (9, {"bSelAuto": F}),
                 (9.5, None, {"bPumpRun": F})),
        # dry-run protection in AUTO only: HAND runs the pump dry
        ("(bSelHand OR (bSelAuto AND bLevelDemand)) AND bLSLLWet",
         "bSelHand OR (bSelAuto AND bLevelDemand AND bLSLLWet)")),
    "Pump room gas detection": (_pou(
        "FUNCTION_BLOCK", "FB_PumpRoomGas",
        _vars("VAR_INPUT rGD1, rGD2 : REAL", "VAR_INPUT bReset : BOOL",
              "VAR_OUTPUT bGasWarning, bPumpTrip : BOOL", "VAR rWorst : REAL"),
        "rWorst := MAX(rGD1, rGD2);\nbGasWarning := rWorst >= 20.0;\n"
        "IF rWorst >= 40.0 THEN\n  bPumpTrip := TRUE;\nEND_IF;\n"
        "IF bReset AND rWorst < 10.0 THEN\n  bPumpTrip := FALSE;\nEND_IF;\n"),
        _vectors(0.1, (0, {"rGD1": 0.0, "rGD2": 0.0, "bReset": F}),
                 (0.5, None, {"bGasWarning": F, "bPumpTrip": F}),
                 (1, {"rGD2": 25.0}), (1.5, None, {"bGasWarning": T, "bPumpTrip": F}),
                 (2, {"rGD2": 45.0}), (2.5, None, {"bGasWarning": T, "bPumpTrip": T}),
                 (3, {"rGD2": 15.0}), (3.5, None, {"bGasWarning": F, "bPumpTrip": T}),
                 (4, {"bReset": T}), (4.3, {"bReset": F}), (4.5, None, {"bPumpTrip": T}),
                 (5, {"rGD2": 5.0}), (5.5, None, {"bPumpTrip": T}),
                 (6, {"bReset": T}), (6.3, {"bReset": F}), (6.5, None, {"bPumpTrip": F}),
                 (7, {"rGD1": 22.0}), (7.5, None, {"bGasWarning": T, "bPumpTrip": F}),
                 (8, {"rGD1": 41.0}), (8.5, None, {"bPumpTrip": T}), (9, {"rGD1": 3.0}),
                 (10, {"bReset": T}), (10.3, {"bReset": F}),
                 (10.5, None, {"bPumpTrip": F, "bGasWarning": F})),
        # only the first head read
        ("rWorst := MAX(rGD1, rGD2);", "rWorst := rGD1;")),
    "Neutralisation pit, pH probe QIC-3": (_pou(
        "FUNCTION_BLOCK", "FB_NeutralisationPit",
        _vars("VAR_INPUT rPH : REAL", "VAR_OUTPUT bAcidPump, bCausticPump : BOOL",
              "VAR bAcidReq, bCausticReq, bDosing, bOnPhase : BOOL",
              "VAR tPulseOn, tPulseOff : TON"),
        "IF rPH > 8.5 THEN\n  bAcidReq := TRUE;\nELSIF rPH < 8.0 THEN\n  bAcidReq := FALSE;\n"
        "END_IF;\nIF rPH < 6.5 THEN\n  bCausticReq := TRUE;\nELSIF rPH > 7.0 THEN\n"
        "  bCausticReq := FALSE;\nEND_IF;\nbDosing := bAcidReq OR bCausticReq;\n"
        "tPulseOn(IN := bDosing AND NOT tPulseOff.Q, PT := T#5s);\n"
        "tPulseOff(IN := tPulseOn.Q, PT := T#25s);\nbOnPhase := bDosing AND NOT tPulseOn.Q;\n"
        "bAcidPump := bOnPhase AND bAcidReq;\nbCausticPump := bOnPhase AND bCausticReq;\n"),
        _vectors(0.1, (0, {"rPH": 7.5}), (0.5, None, {"bAcidPump": F, "bCausticPump": F}),
                 (1, {"rPH": 9.0}), (3.5, None, {"bAcidPump": T, "bCausticPump": F}),
                 (10, None, {"bAcidPump": F}), (20, None, {"bAcidPump": F}),
                 (33.5, None, {"bAcidPump": T}), (40, {"rPH": 8.2}),
                 (45, None, {"bAcidPump": F}), (63.5, None, {"bAcidPump": T}),
                 (70, {"rPH": 7.5}), (93.5, None, {"bAcidPump": F}),
                 (100, {"rPH": 6.0}), (102.5, None, {"bCausticPump": T, "bAcidPump": F}),
                 (110, {"rPH": 6.8}), (120, None, {"bCausticPump": F}),
                 (132.5, None, {"bCausticPump": T}), (140, {"rPH": 7.2}),
                 (161.5, None, {"bCausticPump": F, "bAcidPump": F})),
        # acid stops at 8.5 again: no hysteresis
        ("ELSIF rPH < 8.0 THEN", "ELSIF rPH <= 8.5 THEN")),
    "Cooling tower CT-1 fan": (_pou(
        "FUNCTION_BLOCK", "FB_CT1Fan",
        _vars("VAR_INPUT rBasinTemp : REAL", "VAR_OUTPUT bFanLow, bFanHigh : BOOL",
              "VAR iSpeed : INT", "VAR tCoast : TON"),
        "IF rBasinTemp > 32.0 THEN\n  iSpeed := 2;\n"
        "ELSIF rBasinTemp > 28.0 AND iSpeed = 0 THEN\n  iSpeed := 1;\n"
        "ELSIF rBasinTemp < 26.0 THEN\n  iSpeed := 0;\n"
        "ELSIF rBasinTemp < 30.0 AND iSpeed = 2 THEN\n  iSpeed := 1;\nEND_IF;\n"
        "bFanHigh := iSpeed = 2;\ntCoast(IN := NOT bFanHigh, PT := T#5s);\n"
        "bFanLow := iSpeed = 1 AND tCoast.Q;\n"),
        _vectors(0.1, (0, {"rBasinTemp": 25.0}), (1, None, {"bFanLow": F, "bFanHigh": F}),
                 (10, {"rBasinTemp": 29.0}), (11, None, {"bFanLow": T, "bFanHigh": F}),
                 (20, {"rBasinTemp": 33.0}), (27, None, {"bFanHigh": T, "bFanLow": F}),
                 (30, {"rBasinTemp": 31.0}), (31, None, {"bFanHigh": T, "bFanLow": F}),
                 (40, {"rBasinTemp": 29.0}), (41, None, {"bFanHigh": F, "bFanLow": F}),
                 (44, None, {"bFanLow": F}), (46, None, {"bFanLow": T, "bFanHigh": F}),
                 (50, {"rBasinTemp": 27.0}), (51, None, {"bFanLow": T}),
                 (60, {"rBasinTemp": 25.0}), (61, None, {"bFanLow": F, "bFanHigh": F})),
        # high to low with no coast-down: low speed on a motor still turning fast
        ("bFanLow := iSpeed = 1 AND tCoast.Q;", "bFanLow := iSpeed = 1;")),
    "DHW tank, weekly Legionellenschaltung": (_pou(
        "FUNCTION_BLOCK", "FB_DHWLegionella",
        _vars("VAR_INPUT bTimeSwitch : BOOL", "VAR_INPUT rTankTemp : REAL",
              "VAR_OUTPUT bHeatRequest, bDone, bFault : BOOL", "VAR rtTrigger : R_TRIG",
              "VAR bActive, bReached : BOOL", "VAR tReach, tHold : TON"),
        "rtTrigger(CLK := bTimeSwitch);\nIF rtTrigger.Q THEN\n  bActive := TRUE;\n"
        "  bReached := FALSE;\n  bDone := FALSE;\n  bFault := FALSE;\nEND_IF;\n"
        "IF bActive AND rTankTemp >= 70.0 THEN\n  bReached := TRUE;\nEND_IF;\n"
        "tReach(IN := bActive AND NOT bReached, PT := T#2h);\n"
        "tHold(IN := bActive AND bReached AND rTankTemp > 68.0, PT := T#30m);\n"
        "IF tReach.Q THEN\n  bFault := TRUE;\n  bActive := FALSE;\nEND_IF;\n"
        "IF tHold.Q THEN\n  bDone := TRUE;\n  bActive := FALSE;\nEND_IF;\n"
        "bHeatRequest := bActive;\n"),
        _vectors(1.0, (0, {"bTimeSwitch": F, "rTankTemp": 50.0}),
                 (1, None, {"bHeatRequest": F, "bDone": F, "bFault": F}),
                 (10, {"bTimeSwitch": T}), (20, {"bTimeSwitch": F}),
                 (30, None, {"bHeatRequest": T}), (300, {"rTankTemp": 60.0}),
                 (600, {"rTankTemp": 70.5}), (700, None, {"bHeatRequest": T, "bDone": F}),
                 (1200, {"rTankTemp": 66.0}), (1260, {"rTankTemp": 69.5}),
                 (2500, None, {"bDone": F, "bHeatRequest": T}), (3050, None, {"bDone": F}),
                 (3070, None, {"bDone": T, "bHeatRequest": F, "bFault": F}),
                 (3100, {"bTimeSwitch": T, "rTankTemp": 55.0}), (3110, {"bTimeSwitch": F}),
                 (3120, None, {"bDone": F, "bHeatRequest": T}),
                 (10290, None, {"bFault": F, "bHeatRequest": T}),
                 (10310, None, {"bFault": T, "bHeatRequest": F, "bDone": F})),
        # the 30 min counted from the first time at 70 °C, dips or not
        ("bReached AND rTankTemp > 68.0", "bReached")),
}


def test_every_description_only_request_has_a_reference() -> None:
    only = [r for r in HAND["st_code"] if _description_only(r)]
    covered = [_described(start) for start in DESCRIBED]
    assert len(covered) == len(only) and all(r in covered for r in only)


@pytest.mark.parametrize("start", sorted(DESCRIBED))
def test_description_only_reference_passes_and_a_wrong_one_fails(start: str) -> None:
    request = _described(start)
    ref, vectors, (old, new) = DESCRIBED[start]
    used = _check_steps(vectors, start)
    got = run_vectors(ref, vectors)
    assert got["ok"], got
    declared = {v["name"] for v in ref["variables"]
                if v["section"] in ("VAR_INPUT", "VAR_OUTPUT")} | {ref["name"]}
    assert used <= declared, used - declared
    # what the eval judges such an answer by: rung's checks for the request as asked
    checks = KINDS["st"].validate(ref, request)
    for section in ("st_syntax", "identifiers", "relevance", "building_blocks", "inputs",
                    "outputs"):
        assert checks[section]["ok"], (section, checks[section])
    wrong = copy.deepcopy(ref)
    assert old in wrong["body"]
    wrong["body"] = wrong["body"].replace(old, new)
    bad = run_vectors(wrong, vectors)
    assert not bad["ok"] and bad["error"] is None and bad["failures"], bad
