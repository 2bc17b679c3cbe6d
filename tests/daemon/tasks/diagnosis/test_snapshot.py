"""What code knows of a diagnosis (``daemon/tasks/diagnosis/snapshot.py``): the trend fit, the
request's narrowed schema and the validator, each against the wrong answer the shipped demo
model once gave for a PLC snapshot (an ``assessed`` prognosis of 22 h "by linear
extrapolation of tank_vib_rms" from one snapshot, a point the snapshot does not have;
evidence ``["motor_current", "motor_current"]``; a fault evidenced by a vibration the
answer itself called normal; oil temperature in alarm at priority ``medium``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from rung.daemon.tasks.diagnosis import snapshot
from rung.daemon.tasks.diagnosis.snapshot import facts, narrow, prognosis, theil_sen, trend
from rung.daemon.tasks.runner import RetryPolicy, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.engines import load_engine
from rung.engines.grammar import unenforceable_keywords
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

TASK = load_tasks()["diagnosis"]
H = 3600.0
# the snapshot of the finding: oil temperature in alarm, motor current in alert, the
# vibration normal, the pump running; one snapshot, no history
SNAPSHOT: dict[str, Any] = {"asset": "Hydraulic press 1", "points": [
    {"name": "oil_temp", "value": 91.0, "unit": "degC", "limits": {"alert": 70, "alarm": 85}},
    {"name": "motor_current", "value": 44.0, "unit": "A", "limits": {"alert": 42, "alarm": 48}},
    {"name": "vibration", "value": 2.1, "unit": "mm/s", "limits": {"alert": 4.5, "alarm": 7.1}},
    {"name": "pump_on", "value": True}]}
STATES = [{"point": "oil_temp", "state": "alarm"}, {"point": "motor_current", "state": "alert"},
          {"point": "vibration", "state": "normal"}]
NORMAL: dict[str, Any] = {"asset": "Pump 3", "points": [
    {"name": "oil_temp", "value": 50.0, "limits": {"alert": 70, "alarm": 85}},
    {"name": "vibration", "value": 2.1, "limits": {"alert": 4.5, "alarm": 7.1}}]}


def _line(per_h: float, start: float, hours: float = 24, step_s: float = 1800,
          noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(0.0, hours * H, step_s)
    y = start + per_h * t / H + np.random.default_rng(seed).normal(0, noise, len(t))
    return t, y


def _point(name: str, t: np.ndarray, y: np.ndarray, **limits: float) -> dict[str, Any]:
    return {"name": name, "value": round(float(y[-1]), 3), "limits": limits,
            "history": [[float(a), round(float(b), 3)] for a, b in zip(t, y, strict=True)]}


# -- the fit ----------------------------------------------------------------------------


def test_a_known_linear_trend_gives_its_slope_and_remaining_life() -> None:
    t, y = _line(per_h=0.5, start=60.0)       # 48 samples over 23.5 h, 71.75 at the end
    fit = theil_sen(t, y)
    assert fit.slope * H == pytest.approx(0.5) and fit.lo * H == pytest.approx(0.5)
    assert fit.hi * H == pytest.approx(0.5) and fit.level == pytest.approx(71.75)
    assert fit.n == 48 and fit.span_s == pytest.approx(23.5 * H)
    got = trend(_point("oil_temp", t, y, alert=75, alarm=85))
    assert not isinstance(got, str) and got.limit == 85
    assert got.rul_h == pytest.approx((85 - 71.75) / 0.5)           # 26.5 h
    p = prognosis({"points": [_point("oil_temp", t, y, alert=75, alarm=85)]})
    assert p == {"status": "assessed", "remaining_useful_life_h": 26.5, "confidence": 0.95,
                 "point": "oil_temp", "limit": 85, "remaining_useful_life_ci_h": [26.5, 26.5],
                 "trend_per_h": 0.5, "trend_ci_per_h": [0.5, 0.5], "samples": 48,
                 "span_h": 23.5}
    # unix times fit as relative ones do
    unix = theil_sen(t + 1.7e9, y)
    assert unix.slope == pytest.approx(fit.slope) and unix.level == pytest.approx(fit.level)


def test_noise_with_an_outlier_still_fits() -> None:
    t, y = _line(per_h=0.5, start=60.0, noise=0.3, seed=3)
    y[-3] += 40.0                               # a spike near the end (a stuck transmitter)
    fit = theil_sen(t, y)
    assert fit.slope * H == pytest.approx(0.5, rel=0.05)
    assert fit.lo * H < 0.5 < fit.hi * H and fit.hi - fit.lo < 0.1 / H
    least_squares = np.polyfit(t, y, 1)[0] * H
    assert abs(least_squares - 0.5) > 0.15      # what a straight fit would have said
    got = trend(_point("oil_temp", t, y, alarm=85))
    assert not isinstance(got, str) and got.rul_h is not None and got.rul_ci_h is not None
    assert got.rul_ci_h[0] <= got.rul_h <= got.rul_ci_h[1]
    assert got.rul_h == pytest.approx(26.5, rel=0.1)


def test_the_slope_interval_covers_the_true_slope_at_its_level() -> None:
    covered = 0
    for seed in range(300):
        t, y = _line(per_h=0.2, start=10.0, hours=10, step_s=1200, noise=0.5, seed=seed)
        fit = theil_sen(t, y)
        covered += fit.lo * H <= 0.2 <= fit.hi * H
    assert 0.9 <= covered / 300 <= 0.99, covered


def test_a_flat_or_falling_trend_has_no_life_to_an_upper_limit() -> None:
    t, flat = _line(per_h=0.0, start=2.0, noise=0.1, seed=1)
    got = trend(_point("vibration", t, flat, alert=4.5, alarm=7.1))
    assert not isinstance(got, str) and got.rul_h is None
    assert got.why.startswith("vibration: no significant trend (")
    t, falling = _line(per_h=-0.5, start=80.0)
    got = trend(_point("oil_temp", t, falling, alert=75, alarm=85))
    assert not isinstance(got, str) and got.rul_h is None
    assert got.why == ("oil_temp: falling (-0.5/h, 95% CI -0.5 to -0.5, 48 samples over "
                       "23.5 h), away from its alarm 85, no low_alarm limit to reach")
    p = prognosis({"points": [_point("oil_temp", t, falling, alarm=85),
                              _point("vibration", t, flat, alarm=7.1)]})
    assert p["status"] == "not_assessed" and len(p["reason"]) <= 200
    assert p["reason"].startswith("no trend toward an alarm limit: oil_temp: falling")
    # falling toward a low alarm limit: the life to it
    got = trend(_point("pressure", t, 140 - 2.0 * t / H, low_alert=100, low_alarm=80))
    assert not isinstance(got, str) and got.limit == 80
    assert got.rul_h == pytest.approx((93.0 - 80) / 2.0)


def test_what_gives_no_trend_says_why() -> None:
    t, y = _line(per_h=0.5, start=60.0)
    p = _point("oil_temp", t, y, alarm=85)
    assert trend({**p, "history": p["history"][:4]}) == "oil_temp: 4 samples, a trend needs 5"
    back = {**p, "history": p["history"][::-1]}
    assert trend(back) == "oil_temp: history times do not increase"
    hot = trend({**p, "value": 86.0})            # already at its alarm limit
    assert not isinstance(hot, str) and hot.rul_h == 0.0
    assert prognosis(SNAPSHOT) == {"status": "not_assessed", "reason": snapshot.NO_HISTORY}


# -- the narrowed schema ----------------------------------------------------------------


def _narrowed(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    s = TASK.kind.shape(TASK.output_schema, data)
    assert unenforceable_keywords(s.schema) == []          # the grammar can enforce it all
    return s.schema, s.prefix


def _answer(**changes: Any) -> dict[str, Any]:
    good: dict[str, Any] = {
        "state_detection": STATES,
        "health_assessment": [{"fault": "Cooler fouled", "component": "oil cooler",
                               "confidence": 0.6, "evidence": ["oil_temp"]}],
        "prognosis": {"status": "not_assessed", "reason": snapshot.NO_HISTORY},
        "advisory": {"priority": "high", "actions": ["Check the oil cooler"],
                     "requires_human_confirmation": True}}
    good.update(changes)
    return good


def _fits(answer: dict[str, Any], schema: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(answer)


def test_evidence_only_from_points_that_are_not_normal_each_once() -> None:
    schema, prefix = _narrowed(SNAPSHOT)
    assert prefix == '{"state_detection":' + json.dumps(STATES, separators=(",", ":")) + ","
    evidence = schema["properties"]["health_assessment"]["items"]["properties"]["evidence"]
    sets = [[c["const"] for c in alt["prefixItems"]] for alt in evidence["anyOf"]]
    assert sets == [["oil_temp"], ["motor_current"], ["oil_temp", "motor_current"]]
    assert _fits(_answer(), schema) and _fits(_answer(), TASK.output_schema)
    for bad in (["vibration"], ["pump_on"], ["motor_current", "motor_current"], [],
                ["tank_vib_rms"]):
        fault = dict(_answer()["health_assessment"][0], evidence=bad)
        assert not _fits(_answer(health_assessment=[fault]), schema), bad
    # more citable points than the grammar spells out: an enum, repeats left to the judge
    many = {"asset": "a", "points": [{"name": f"t{i}", "value": 9, "limits": {"alert": 1}}
                                     for i in range(8)]}
    evidence = _narrowed(many)[0]["properties"]["health_assessment"]["items"]["properties"][
        "evidence"]
    assert evidence["items"] == {"enum": [f"t{i}" for i in range(8)]}
    assert evidence["minItems"] == 1 and evidence["maxItems"] == 8


def test_fault_flags_and_missing_readings_may_be_cited() -> None:
    data = {"asset": "a", "points": [
        {"name": "overload_trip", "value": True, "limits": {"alarm": True}},
        {"name": "door_closed", "value": True, "limits": {"alert": False}},
        {"name": "flow", "value": None, "unit": "m3/h"},
        {"name": "pump_on", "value": True}]}
    f = facts(data)
    assert f.states == [{"point": "overload_trip", "state": "alarm"},
                        {"point": "door_closed", "state": "normal"}]
    assert f.citable == ["overload_trip", "flow"] and f.worst == "alarm"


def test_every_point_normal_asserts_no_fault_at_low_priority() -> None:
    schema, prefix = _narrowed(NORMAL)
    props = schema["properties"]
    assert props["health_assessment"] == {"type": "array", "maxItems": 0}
    assert props["advisory"]["properties"]["priority"] == {"enum": ["low"]}
    assert prefix.endswith('"health_assessment":[],"prognosis":{"status":"not_assessed",'
                           f'"reason":"{snapshot.NO_HISTORY}"}},')
    good = _answer(state_detection=[{"point": "oil_temp", "state": "normal"},
                                    {"point": "vibration", "state": "normal"}],
                   health_assessment=[],
                   advisory={"priority": "low", "actions": ["Continue operation"],
                             "requires_human_confirmation": True})
    assert _fits(good, schema) and _fits(good, TASK.output_schema)
    assert not _fits(dict(good, health_assessment=_answer()["health_assessment"]), schema)
    assert not _fits(dict(good, advisory=dict(good["advisory"], priority="medium")), schema)


def test_priority_follows_the_worst_state() -> None:
    def allowed(data: dict[str, Any]) -> list[str]:
        return list(_narrowed(data)[0]["properties"]["advisory"]["properties"]["priority"][
            "enum"])

    assert allowed(SNAPSHOT) == ["high", "critical"]                       # oil_temp: alarm
    alert = copy.deepcopy(SNAPSHOT)
    alert["points"][0]["value"] = 72.0
    assert allowed(alert) == ["medium", "high", "critical"]              # worst: alert
    missing = {"asset": "a", "points": [{"name": "flow", "value": None}]}
    assert allowed(missing) == ["low", "medium", "high", "critical"]     # a reading missing
    # the setting is the task's: a stricter one narrows further
    strict = copy.deepcopy(TASK.output_schema)
    strict["properties"]["advisory"]["properties"]["priority"][snapshot.FLOOR_KEY] = {
        "normal": "low", "alert": "high", "alarm": "critical"}
    schema, _ = narrow(strict, alert)
    assert schema["properties"]["advisory"]["properties"]["priority"]["enum"] == [
        "high", "critical"]
    assert snapshot.floor(TASK.output_schema) == snapshot.DEFAULT_FLOOR
    for bad in ({"normal": "low", "alert": "medium"}, {"normal": "high", "alert": "low",
                                                       "alarm": "low"}):
        strict["properties"]["advisory"]["properties"]["priority"][snapshot.FLOOR_KEY] = bad
        with pytest.raises(ValueError, match="x-minimum-priority"):
            snapshot.floor(strict)


def test_prognosis_is_a_constant_without_history_and_computed_with_it() -> None:
    schema, _ = _narrowed(SNAPSHOT)
    assert schema["properties"]["prognosis"] == {"const": {
        "status": "not_assessed", "reason": snapshot.NO_HISTORY}}
    assessed = {"status": "assessed", "remaining_useful_life_h": 22, "confidence": 0.5,
                "note": "linear extrapolation of tank_vib_rms"}
    assert not _fits(_answer(prognosis=assessed), schema)
    assert _fits(_answer(prognosis=assessed), TASK.output_schema)   # the published shape
    t, y = _line(per_h=0.5, start=60.0)
    data = {"asset": "a", "points": [_point("oil_temp", t, y, alert=75, alarm=85)]}
    schema, prefix = _narrowed(data)
    computed = prognosis(data)
    props = schema["properties"]["prognosis"]["properties"]
    assert {k: v["const"] for k, v in props.items() if k != "note"} == computed
    assert props["note"]["type"] == "string" and "pattern" in props["note"]
    answer = _answer(state_detection=[{"point": "oil_temp", "state": "normal"}],
                     health_assessment=[], prognosis={**computed, "note": "oil_temp rises"},
                     advisory={"priority": "low", "actions": ["Plan a cooler check"],
                               "requires_human_confirmation": True})
    assert _fits(answer, schema) and _fits(answer, TASK.output_schema)
    wrong = dict(answer, prognosis={**computed, "remaining_useful_life_h": 22,
                                    "note": "oil_temp rises"})
    assert not _fits(wrong, schema)
    assert '"prognosis"' not in prefix          # the note is the model's: not in the start


def test_free_text_may_name_only_the_request_points() -> None:
    schema, _ = _narrowed(SNAPSHOT)
    actions = schema["properties"]["advisory"]["properties"]["actions"]
    ok = _answer(advisory={"priority": "high", "requires_human_confirmation": True,
                           "actions": ["Check oil_temp and motor_current; low_alarm unset"]})
    assert _fits(ok, schema)
    for text in ("Check tank_vib_rms", "Check oil_temp2_x", "Check xoil_temp", "HOT_AMBIENT"):
        bad = dict(ok, advisory=dict(ok["advisory"], actions=[text]))
        assert not _fits(bad, schema), text
        assert _fits(bad, TASK.output_schema)
    assert actions["items"]["maxLength"] == 200
    assert snapshot.unknown_names("Check OIL_TEMP, tank_vib_rms, tank_vib_rms and a_b",
                                   ["oil_temp"]) == ["tank_vib_rms", "a_b"]
    assert snapshot.unknown_names("P1.oil_temp and oil_temp_avg", ["P1.oil_temp"]) == [
        "oil_temp_avg"]


# -- the judge --------------------------------------------------------------------------


def _check(answer: dict[str, Any], data: dict[str, Any] = SNAPSHOT) -> dict[str, Any]:
    ok, v = validate_output(TASK.output_schema, TASK.kind, answer, data)
    assert v["schema"]["ok"], v["schema"]
    assert ok == v["diagnosis"]["ok"]
    return dict(v["diagnosis"])


def _failed(section: dict[str, Any]) -> list[str]:
    return [c for c, passed in section["checks"].items() if not passed]


def test_a_right_answer_passes_every_check() -> None:
    section = _check(_answer())
    assert section["ok"] and section["checks"] == dict.fromkeys(snapshot.CHECKS, True)


def test_a_fault_asserted_twice_is_not_right() -> None:
    """One entry per fault with its evidence together: the same fault again (any case or
    spacing) fails the faults check; two different faults pass."""
    first = _answer()["health_assessment"][0]
    again = {**first, "fault": "  " + first["fault"].upper() + " ",
             "evidence": list(reversed(first["evidence"]))}
    section = _check(_answer(health_assessment=[first, again]))
    assert _failed(section) == ["faults"], section
    assert "asserted twice (health_assessment/0)" in section["errors"][0]["message"]
    other = {**first, "fault": "Cooler fouling"}
    assert _check(_answer(health_assessment=[first, other]))["ok"]


def test_the_finding_fails_on_each_of_its_errors() -> None:
    fault = {"fault": "Clogged suction strainer", "component": "suction strainer",
             "confidence": 0.6}
    finding = _answer(
        health_assessment=[{**fault, "evidence": ["vibration"]},
                           {"fault": "Overload", "component": "pump", "confidence": 0.5,
                            "evidence": ["motor_current", "motor_current"]}],
        prognosis={"status": "assessed", "remaining_useful_life_h": 22, "confidence": 0.5,
                   "note": "linear extrapolation of tank_vib_rms"},
        advisory={"priority": "medium", "actions": ["Clean the suction strainer"],
                  "requires_human_confirmation": True})
    section = _check(finding)
    assert not section["ok"]
    assert _failed(section) == ["evidence", "priority", "prognosis", "names"]
    assert [(e["path"], e["message"]) for e in section["errors"]] == [
        ("health_assessment/0/evidence/0",
         "vibration is normal by its limits: it cannot support a fault"),
        ("health_assessment/1/evidence/1", "motor_current is cited twice"),
        ("advisory/priority",
         "priority medium with alarm (oil_temp): expected high or critical"),
        ("prognosis/status", f"assessed, but {snapshot.NO_HISTORY}"),
        ("prognosis/note", "'tank_vib_rms' is no point of the request")]
    # each error alone fails the answer
    for wrong, check in (
            (_answer(health_assessment=[{**fault, "evidence": ["vibration"]}]), "evidence"),
            (_answer(health_assessment=[{**fault, "evidence": ["oil_temp", "oil_temp"]}]),
             "evidence"),
            (_answer(health_assessment=[{**fault, "evidence": []}]), "evidence"),
            (_answer(health_assessment=[{**fault, "evidence": ["pump_on"]}]), "evidence"),
            (_answer(prognosis={"status": "assessed", "remaining_useful_life_h": 22}),
             "prognosis"),
            (_answer(advisory=finding["advisory"]), "priority"),
            (_answer(advisory={"priority": "high", "actions": ["Check tank_vib_rms"],
                               "requires_human_confirmation": True}), "names"),
            (_answer(state_detection=STATES[1:]), "states")):
        assert _failed(_check(wrong)) == [check], wrong


def test_every_point_normal_is_judged_too() -> None:
    states = [{"point": "oil_temp", "state": "normal"}, {"point": "vibration", "state": "normal"}]
    calm = _answer(state_detection=states, health_assessment=[],
                   advisory={"priority": "low", "actions": ["Continue operation"],
                             "requires_human_confirmation": True})
    assert _check(calm, NORMAL)["ok"]
    claimed = dict(calm, health_assessment=[{"fault": "Bearing wear", "component": "bearing",
                                             "confidence": 0.4, "evidence": ["vibration"]}])
    assert _failed(_check(claimed, NORMAL)) == ["evidence", "faults"]
    loud = dict(calm, advisory=dict(calm["advisory"], priority="high"))
    section = _check(loud, NORMAL)
    assert _failed(section) == ["priority"]
    assert section["errors"][0]["message"] == (
        "priority high with every point normal: expected low")


def test_the_prognosis_must_be_what_the_history_gives() -> None:
    t, y = _line(per_h=0.5, start=60.0)
    data = {"asset": "a", "points": [_point("oil_temp", t, y, alert=75, alarm=85)]}
    computed = prognosis(data)
    base = _answer(state_detection=[{"point": "oil_temp", "state": "normal"}],
                   health_assessment=[],
                   advisory={"priority": "low", "actions": ["Plan a cooler check"],
                             "requires_human_confirmation": True})
    assert _check(dict(base, prognosis={**computed, "note": "oil_temp rises"}), data)["ok"]
    section = _check(dict(base, prognosis={**computed, "remaining_useful_life_h": 22}), data)
    assert _failed(section) == ["prognosis"]
    assert section["errors"][0]["path"] == "prognosis/remaining_useful_life_h"
    section = _check(dict(base, prognosis={"status": "not_assessed", "reason": "no data"}),
                     data)
    assert section["errors"][0]["message"] == (
        "the history of oil_temp gives 26.5 h to its alarm limit 85; the answer says "
        "not_assessed")


# -- the demo model under the narrowed grammar ------------------------------------------


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


@pytest.mark.slow
def test_the_demo_model_cannot_repeat_the_finding(runner: TaskRunner) -> None:
    """Greedy and sampled answers to the finding's snapshot: whatever else they say, the
    evidence, the priority, the prognosis and the names in free text hold."""
    params = [SamplingParams()] + [SamplingParams(temperature=1.0, seed=s) for s in range(4)]
    for p in params:
        (r,) = runner.run([("diagnosis", SNAPSHOT)], p)
        assert r.output is not None, r.error
        checks = r.validation["diagnosis"]["checks"]  # type: ignore[index]
        assert all(checks.values()), r.validation
    (r,) = runner.run([("diagnosis", SNAPSHOT)], SamplingParams(), retry=RetryPolicy())
    assert r.ok, r.error


def test_the_demo_model_writes_the_computed_prognosis(runner: TaskRunner) -> None:
    t, y = _line(per_h=0.5, start=60.0, noise=0.3, seed=5)
    data = {"asset": "Hydraulic press 1", "points": [
        _point("oil_temp", t, y, alert=75, alarm=85),
        {"name": "vibration", "value": 2.0, "limits": {"alert": 4.5, "alarm": 7.1}}]}
    (r,) = runner.run([("diagnosis", data)], SamplingParams(), retry=RetryPolicy())
    assert r.ok, r.error
    assert r.output is not None and r.output["health_assessment"] == []
    got = dict(r.output["prognosis"])
    assert isinstance(got.pop("note"), str) and got == prognosis(data)


def test_a_fault_already_asserted_cannot_be_named_again() -> None:
    """The guard's view of an answer: at a fault's name, the faults asserted before it."""
    from rung.daemon.tasks.diagnosis.snapshot import fault_names_at

    head = '{"state_detection":[],"health_assessment":[{"fault":"Bearing damage","evidence":["v"]},'
    assert fault_names_at(head + '{"fault":') == (None, ["Bearing damage"])
    assert fault_names_at(head + '{"fault":"Bear') == ("Bear", ["Bearing damage"])
    assert fault_names_at(head + '{"fault":"Loose \\"foot\\"') is None   # closed
    assert fault_names_at(head + '{"fault":"Misalignment",') is None
    assert fault_names_at('{"state_detection":[],"health_assessment":[{"fault":') == (None, [])
    assert fault_names_at('{"state_detection":[') is None
    # the diagnosis shape hands it to the runner's name guard
    from rung.daemon.tasks.task import load_tasks

    task = load_tasks()["diagnosis"]
    assert task.kind.shape(task.output_schema, SNAPSHOT).names is fault_names_at
