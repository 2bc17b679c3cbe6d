"""What an st_code request states, read by code (daemon/tasks/st_request.py), and the
gating checks that hold a POU to it: stated values used, building blocks declared and
called, inputs never assigned, a POU name that is not IEC 61131-3's own."""

from __future__ import annotations

from typing import Any

from rung.daemon.tasks import st_request
from rung.daemon.tasks.st import assigned_names, render_pou
from rung.daemon.tasks.validate import validate_output

DRAIN = {"description": "Switch the drain pump on at 70.0 % and off at 35.0 % "
                        "(hysteresis), high-level alarm at 95.0 %.", "pou_type": "PROGRAM"}


def _pou(body: str, variables: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"pou_type": "PROGRAM", "name": "P_Drain", "body": body, "variables": variables or [
        {"section": "VAR_INPUT", "name": "rLevel", "type": "REAL"},
        {"section": "VAR_OUTPUT", "name": "bPump", "type": "BOOL"},
        {"section": "VAR_OUTPUT", "name": "bAlarm", "type": "BOOL"}]}


RIGHT = ("IF rLevel >= 70.0 THEN\n    bPump := TRUE;\nELSIF rLevel <= 35.0 THEN\n"
         "    bPump := FALSE;\nEND_IF;\nbAlarm := rLevel >= 95.0;")


def test_a_request_is_read_for_its_values_and_blocks() -> None:
    s = st_request.read({"description": "Open the valve 1.5 s after start, count 12 parts "
                                        "per box; level below 2 m; pump P1; scale 0.0..16.0"})
    assert [(v.text, v.unit) for v in s.values] == [
        ("1.5", "s"), ("12", "parts"), ("2", "m"), ("0.0", None), ("16.0", None)]
    assert s.needs == ("timer", "counter")       # "after", a stated duration; "count"
    assert s.values[0].seconds == 1.5 and s.values[2].seconds is None   # m is a metre
    numbers = st_request.literals(s)
    assert {"1.5", "12", "11", "2", "16.0", "0", "100", "3600"} <= set(numbers)
    assert "1900.0" not in numbers


def test_the_pou_must_use_every_value_stated_with_a_unit() -> None:
    """The finding: the POU used none of 70, 35 or 95 and compared the level with one
    setpoint in both branches."""
    ok, v = validate_output({}, ("st",), _pou(RIGHT), DRAIN)
    assert ok and v["relevance"]["ok"], v
    wrong = ("IF rLevel >= 70.0 THEN bPump := TRUE; ELSIF rLevel <= 70.0 THEN bPump := "
             "FALSE; END_IF; bAlarm := rLevel >= 1.0;")
    ok, v = validate_output({}, ("st",), _pou(wrong), DRAIN)
    assert not ok and not v["relevance"].get("advisory")          # gating
    assert [e["message"] for e in v["relevance"]["errors"]] == [
        "the request states 35.0 %; the POU does not use it",
        "the request states 95.0 %; the POU does not use it"]
    as_fraction = RIGHT.replace("70.0", "0.7 * 100.0")
    assert st_request.values_used(st_request.read(DRAIN), render_pou(_pou(as_fraction)))["ok"]


def test_a_stated_duration_is_used_as_a_time_of_the_same_length() -> None:
    data = {"description": "Stop the belt if it runs longer than 1 min 30 s without a part."}
    s = st_request.read(data)
    assert s.needs == ("timer",) and [str(v) for v in s.values] == ["1 min 30 s"]
    for pt, ok in (("T#1m30s", True), ("T#90s", True), ("T#90000ms", True), ("T#1m", False),
                   ("T#30s", False)):
        text = render_pou(_pou(f"tmr(IN := bPump, PT := {pt});", [
            {"section": "VAR", "name": "tmr", "type": "TON"},
            {"section": "VAR", "name": "bPump", "type": "BOOL"}]))
        assert st_request.values_used(s, text)["ok"] is ok, pt


def test_the_building_blocks_the_behaviour_needs_are_declared_and_called() -> None:
    data = {"description": "Count each press of the start button; after 10 s without a "
                           "press, reset."}
    s = st_request.read(data)
    assert s.needs == ("timer", "edge", "counter")
    declared_only = _pou("bPump := TRUE;", [
        {"section": "VAR", "name": "tIdle", "type": "TON"},
        {"section": "VAR_OUTPUT", "name": "bPump", "type": "BOOL"}])
    errors = st_request.blocks_used(s, declared_only)["errors"]
    assert [e["message"] for e in errors] == [
        "the request needs a timer (TON/TOF/TP): tIdle is declared but never called",
        "the request needs a edge (R_TRIG/F_TRIG): declare one and call it in the body",
        "the request needs a counter (CTU/CTD/CTUD): declare one and call it in the body"]
    whole = _pou("rt(CLK := bStart); c(CU := rt.Q, RESET := tIdle.Q, PV := 10); "
                 "tIdle(IN := NOT rt.Q, PT := T#10s);", [
                     {"section": "VAR_INPUT", "name": "bStart", "type": "BOOL"},
                     {"section": "VAR", "name": "rt", "type": "R_TRIG"},
                     {"section": "VAR", "name": "c", "type": "CTU"},
                     {"section": "VAR", "name": "tIdle", "type": "TON"}])
    assert st_request.blocks_used(s, whole)["ok"]
    assert st_request.read({"description": "Lamp on while the door is open."}).needs == ()


def test_a_var_input_assigned_fails_the_check() -> None:
    body = RIGHT + "\nrLevel := 0.0;"
    assert assigned_names(render_pou(_pou(body))) == ["bPump", "bPump", "bAlarm", "rLevel"]
    ok, v = validate_output({}, ("st",), _pou(body), DRAIN)
    assert not ok and v["inputs"]["errors"][0]["message"].startswith("rLevel is a VAR_INPUT")


def test_a_pou_name_of_iec_61131_3_fails_the_check() -> None:
    for name in ("END_VAR", "TON", "BOOL", "ton"):
        ok, v = validate_output({}, ("st",), {**_pou(RIGHT), "name": name}, DRAIN)
        assert not ok and "IEC 61131-3" in v["identifiers"]["errors"][-1]["message"], name


def test_the_interface_a_request_states_is_written_by_code() -> None:
    from rung.daemon.tasks.shaping import shape
    from rung.daemon.tasks.task import load_tasks

    data = {"description": "Fill valve: open below 20 %, close above 80 %.",
            "name": "FB_Fill", "pou_type": "FUNCTION_BLOCK",
            "constraints": ["Inputs: rLevel : REAL (level in %), bDrainOpen : BOOL",
                            "VAR_INPUT iBatch : INT with initial value 500",
                            "VAR_OUTPUT bValve : BOOL", "Use PascalCase names."]}
    assert st_request.interface(data) == [
        {"section": "VAR_INPUT", "name": "rLevel", "type": "REAL"},
        {"section": "VAR_INPUT", "name": "bDrainOpen", "type": "BOOL"},
        {"section": "VAR_INPUT", "name": "iBatch", "type": "INT", "initial": "500"},
        {"section": "VAR_OUTPUT", "name": "bValve", "type": "BOOL"}]
    st = load_tasks()["st_code"]
    prefix = shape(st.output_schema, st.validators, data).prefix
    assert prefix.startswith('{"pou_type":"FUNCTION_BLOCK","name":"FB_Fill","variables":[{')
    assert prefix.endswith('{"section":"VAR_OUTPUT","name":"bValve","type":"BOOL"}')
    # a FUNCTION's return type comes before its variables: the model writes it all
    assert shape(st.output_schema, st.validators, {**data, "pou_type": "FUNCTION"}).prefix == ""
    assert shape(st.output_schema, st.validators, {"description": "x"}).prefix == ""
