"""What an st_code request states, read by code (daemon/tasks/st/request.py), and the
gating checks that hold a POU to it: stated values used, building blocks declared and
called, inputs never assigned, a POU name that is not IEC 61131-3's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.tasks.kinds import KINDS
from rung.daemon.tasks.shaping import compact
from rung.daemon.tasks.st import request as st_request
from rung.daemon.tasks.st.pou import assigned_names, render_pou, written_names
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
    ok, v = validate_output({}, KINDS["st"], _pou(RIGHT), DRAIN)
    assert ok and v["relevance"]["ok"], v
    wrong = ("IF rLevel >= 70.0 THEN bPump := TRUE; ELSIF rLevel <= 70.0 THEN bPump := "
             "FALSE; END_IF; bAlarm := rLevel >= 1.0;")
    ok, v = validate_output({}, KINDS["st"], _pou(wrong), DRAIN)
    assert not ok and not v["relevance"].get("advisory")          # gating
    assert [e["message"] for e in v["relevance"]["errors"]] == [
        "the request states 35.0 %; the POU does not use it",
        "the request states 95.0 %; the POU does not use it"]
    as_fraction = RIGHT.replace("70.0", "0.7 * 100.0")
    assert st_request.values_used(st_request.read(DRAIN), _pou(as_fraction))["ok"]


def test_durations_in_a_row_are_one_only_largest_unit_first() -> None:
    """ "1 min 30 s" is one duration; "2 s and 10 s" and "3 s and 2 min" are two each."""
    for text, stated in (("pulses of 5 s, 2 s and 10 s", ["5 s", "2 s", "10 s"]),
                         ("run 3 s and 2 min later again", ["3 s", "2 min"]),
                         ("for 1 h and 30 min", ["1 h and 30 min"])):
        assert [str(v) for v in st_request.read({"description": text}).values] == stated


def test_the_durations_a_pou_may_write() -> None:
    """A stated duration in the forms an engineer writes it; besides, only the small ones
    (none, a debounce's 10-100 ms, one second)."""
    forms = st_request.durations(st_request.read({"description": "stop after 1 min 30 s"}))
    assert {"1m30s", "90s", "1.5m", "90000ms", "1M30S", "0s", "100ms", "1s"} <= set(forms)
    assert not {"3s", "9s", "1m", "30s", "500ms"} & set(forms)
    # the form code declares a setpoint in is always one of them (25 h 1 min: T#25h1m)
    for text, seconds in (("after 25 h 1 min", 90060.0), ("every 24 h", 86400.0),
                          ("for 0.5 s", 0.5), ("1 h 30 min", 5400.0)):
        forms = st_request.durations(st_request.read({"description": text}))
        assert st_request.time_literal(seconds).removeprefix("T#") in forms, text


def test_a_stated_duration_is_used_as_a_time_of_the_same_length() -> None:
    data = {"description": "Stop the belt if it runs longer than 1 min 30 s without a part."}
    s = st_request.read(data)
    assert s.needs == ("timer",) and [str(v) for v in s.values] == ["1 min 30 s"]
    for pt, ok in (("T#1m30s", True), ("T#90s", True), ("T#90000ms", True), ("T#1m", False),
                   ("T#30s", False)):
        pou = _pou(f"tmr(IN := bPump, PT := {pt});", [
            {"section": "VAR", "name": "tmr", "type": "TON"},
            {"section": "VAR", "name": "bPump", "type": "BOOL"}])
        assert st_request.values_used(s, pou)["ok"] is ok, pt


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
    # "run only while ...": no run-on, no timer needed
    assert st_request.read({"description": "The pump may run only while the valve is "
                                           "open."}).needs == ()
    assert st_request.read({"description": "Fan with a run-on of 2 min."}).needs == ("timer",)


def test_a_var_input_assigned_fails_the_check() -> None:
    body = RIGHT + "\nrLevel := 0.0;"
    assert assigned_names(render_pou(_pou(body))) == ["bPump", "bPump", "bAlarm", "rLevel"]
    ok, v = validate_output({}, KINDS["st"], _pou(body), DRAIN)
    assert not ok and v["inputs"]["errors"][0]["message"].startswith("rLevel is a VAR_INPUT")


def test_an_output_never_written_fails_the_check() -> None:
    """An output the body never drives (the adapter's tank-fill POU switched two timers and
    never wrote ``bFillValve``) is not right; an FB output bound to it (``Q => bOut``)
    writes it."""
    ok, v = validate_output({}, KINDS["st"], _pou(RIGHT), DRAIN)
    assert v["outputs"]["ok"], v["outputs"]
    idle = "IF rLevel >= 70.0 THEN\n    bPump := TRUE;\nEND_IF;\nIF rLevel >= 95.0 THEN\n" \
           "    bPump := FALSE;\nEND_IF;"
    ok, v = validate_output({}, KINDS["st"], _pou(idle), DRAIN)
    assert not ok and v["outputs"]["errors"][0]["message"].startswith("bAlarm is never written")
    assert v["st_syntax"]["ok"] and v["identifiers"]["ok"]   # valid, not right
    timed = [*_pou("").get("variables"), {"section": "VAR", "name": "tonHigh", "type": "TON"}]
    bound = ("bPump := rLevel >= 70.0 AND rLevel > 35.0;\n"
             "tonHigh(IN := rLevel >= 95.0, PT := T#1s, Q => bAlarm);")
    assert written_names(render_pou(_pou(bound, timed))) == ["bPump", "bAlarm"]
    assert st_request.outputs_written(_pou(bound, timed), ["bPump", "bAlarm"])["ok"]
    fn = {"pou_type": "FUNCTION", "name": "FC_Scale", "return_type": "REAL", "variables": [
        {"section": "VAR_INPUT", "name": "iRaw", "type": "INT"}], "body": "iRaw := 0;"}
    assert st_request.outputs_written(fn, ["iRaw"])["errors"][0]["message"].startswith(
        "FC_Scale is never written")


def test_a_pou_name_of_iec_61131_3_fails_the_check() -> None:
    for name in ("END_VAR", "TON", "BOOL", "ton"):
        ok, v = validate_output({}, KINDS["st"], {**_pou(RIGHT), "name": name}, DRAIN)
        assert not ok and "IEC 61131-3" in v["identifiers"]["errors"][-1]["message"], name


def test_the_interface_a_request_states_is_written_by_code() -> None:
    from rung.daemon.tasks.task import load_tasks
    from rung.engines.grammar import Lark

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
    prefix = st.kind.shape(st.output_schema, data).prefix
    assert prefix.startswith('{"pou_type":"FUNCTION_BLOCK","name":"FB_Fill","variables":[{')
    assert prefix.endswith('{"section":"VAR_OUTPUT","name":"bValve","type":"BOOL"},'
                           '{"section":"VAR","name":"rOpenBelow","type":"REAL","initial":'
                           '"20.0","comment":"stated: 20 %"},{"section":"VAR","name":'
                           '"rCloseAbove","type":"REAL","initial":"80.0","comment":'
                           '"stated: 80 %"}')
    # the body reads the setpoints and never assigns them; it reads and writes the rest
    shaped = st.kind.shape(st.output_schema, data)
    assert shaped.restage is not None
    grammar = shaped.restage(prefix + '],"body":"')
    assert grammar is not None
    assert isinstance(grammar, Lark)
    rules = grammar.text
    integers = next(r for r in rules.splitlines() if r.startswith("ivar:"))
    setpoints = next(r for r in rules.splitlines() if r.startswith("rfix:"))
    assert '"rOpenBelow"' in setpoints and '"iBatch"' in integers
    # no number may be assigned: the setpoints are fixed, the others inputs
    assert not any(r.startswith(("nw:", "iw:")) for r in rules.splitlines())
    bools = next(r for r in rules.splitlines() if r.startswith("bw:"))
    assert '"bValve"' in bools and '"bDrainOpen"' not in bools
    # a FUNCTION's return type comes before its variables: the model writes it all
    assert st.kind.shape(st.output_schema, {**data, "pou_type": "FUNCTION"}).prefix == ""
    assert st.kind.shape(st.output_schema, {"description": "x"}).prefix == ""


def test_a_list_of_names_of_one_type_declares_each_of_them() -> None:
    """``bOk1, bOk2 : BOOL`` (as IEC 61131-3 writes a list) and ``a, b (all BOOL, ...)``
    declare every name in the list, not only the one next to the type."""
    data = {"description": "First-out of four trips.", "name": "FB_FirstOut",
            "pou_type": "FUNCTION_BLOCK",
            "constraints": ["VAR_INPUT bOk1, bOk2, bOk3 : BOOL (TRUE = healthy)",
                            "inputs bReset, bLampTest (all BOOL, TRUE = pressed)",
                            "VAR_OUTPUT iFirstOut : INT, bHorn, bLamp : BOOL (alarm)"]}
    assert [(v["section"], v["name"], v["type"]) for v in st_request.interface(data)] == [
        ("VAR_INPUT", "bOk1", "BOOL"), ("VAR_INPUT", "bOk2", "BOOL"),
        ("VAR_INPUT", "bOk3", "BOOL"), ("VAR_INPUT", "bReset", "BOOL"),
        ("VAR_INPUT", "bLampTest", "BOOL"), ("VAR_OUTPUT", "iFirstOut", "INT"),
        ("VAR_OUTPUT", "bHorn", "BOOL"), ("VAR_OUTPUT", "bLamp", "BOOL")]


def test_the_models_own_variables_hold_no_setpoints_value() -> None:
    """Past the interface and the setpoints code declares, a variable the model declares
    cannot hold a value a setpoint holds, nor carry a comment that says it was stated
    (the adapter wrote ``tStopOk : TIME := T#30s; // stated: 30 s`` beside the setpoint
    ``tBeltRuns`` and read the copy)."""
    import llguidance

    from rung.daemon.tasks.task import load_tasks
    from rung.engines.grammar import GrammarCompiler

    model = Path(__file__).resolve().parents[4] / "models" / "edge-tiny"
    compiler = GrammarCompiler(model / "tokenizer.json", [2], 2048)
    data = {"description": "Stop the belt and set a jam alarm if it runs 30 s without a "
                           "part; open the vent above 6.5 bar.",
            "name": "FB_Belt", "pou_type": "FUNCTION_BLOCK",
            "constraints": ["VAR_INPUT bPart : BOOL, rPressure : REAL",
                            "VAR_OUTPUT bJam : BOOL"]}
    st = load_tasks()["st_code"]
    shaped = st.kind.shape(st.output_schema, data)
    assert '"initial":"T#30s","comment":"stated: 30 s"' in shaped.prefix
    grammar = compiler.compile(shaped.schema)

    def accepts(own: dict[str, str]) -> bool:
        m = llguidance.LLMatcher(compiler.tokenizer, grammar)
        text = shaped.prefix + "," + compact(own)
        ids = compiler.tokenizer.tokenize_str(text)
        return m.try_consume_tokens(ids) == len(ids) and not m.is_error()

    var = {"section": "VAR", "name": "tonJam", "type": "TON"}
    assert accepts(var)
    assert accepts({**var, "comment": "jam timer"})
    assert accepts({**var, "comment": "start delay"})
    assert not accepts({**var, "comment": "stated: 30 s"})
    tmr = {"section": "VAR", "name": "tDelay", "type": "TIME"}
    assert accepts({**tmr, "initial": "T#1s"})
    assert not accepts({**tmr, "initial": "T#30s"})
    assert not accepts({**tmr, "initial": "T#30000ms"})
    limit = {"section": "VAR", "name": "rLimit", "type": "REAL"}
    assert accepts({**limit, "initial": "0.0"})
    assert not accepts({**limit, "initial": "6.5"})
    # where code declares nothing (a FUNCTION), a variable may hold a stated value as before
    free = st.kind.shape(st.output_schema, {"description": "x above 6.5 bar.",
                                            "pou_type": "FUNCTION"})
    assert "prefixItems" not in free.schema["properties"]["variables"]


def test_a_value_counts_as_used_only_where_the_body_reads_it() -> None:
    """A setpoint declared with the stated value and never read does nothing: the finding
    was a POU that declared thresholds and compared the level with something else."""
    variables = [{"section": "VAR_INPUT", "name": "rLevel", "type": "REAL"},
                 {"section": "VAR_OUTPUT", "name": "bPump", "type": "BOOL"},
                 {"section": "VAR_OUTPUT", "name": "bAlarm", "type": "BOOL"},
                 {"section": "VAR", "name": "rOn", "type": "REAL", "initial": "70.0"},
                 {"section": "VAR", "name": "rOff", "type": "REAL", "initial": "35.0"},
                 {"section": "VAR", "name": "rAlarm", "type": "REAL", "initial": "95.0"}]
    reads_all = ("IF rLevel >= rOn THEN bPump := TRUE; ELSIF rLevel <= rOff THEN "
                 "bPump := FALSE; END_IF; bAlarm := rLevel >= rAlarm;")
    assert st_request.values_used(st_request.read(DRAIN), _pou(reads_all, variables))["ok"]
    skips_off = reads_all.replace("rLevel <= rOff", "rLevel <= rOn")
    r = st_request.values_used(st_request.read(DRAIN), _pou(skips_off, variables))
    assert [e["message"] for e in r["errors"]] == [   # the finding names the idle setpoint
        "the request states 35.0 %; the POU does not use it (the body never reads rOff, "
        "which holds it)"]
    # a comment that names the setpoint is no use of it
    commented = skips_off + " // rOff is the stop level"
    assert not st_request.values_used(st_request.read(DRAIN), _pou(commented, variables))["ok"]


def test_code_declares_each_stated_value_as_a_setpoint_named_from_the_request() -> None:
    data = {**DRAIN, "name": "P_Drain", "constraints": [
        "VAR_INPUT rLevel : REAL", "VAR_OUTPUT bPump : BOOL, bAlarm : BOOL",
        "the pump must not restart within 1 min 30 s; count 12 parts per box"]}
    interface, setpoints = st_request.declared(data)
    assert [v["name"] for v in interface] == ["rLevel", "bPump", "bAlarm"]
    assert [(v["section"], v["type"], v["initial"], v["comment"]) for v in setpoints] == [
        ("VAR", "REAL", "70.0", "stated: 70.0 %"), ("VAR", "REAL", "35.0", "stated: 35.0 %"),
        ("VAR", "REAL", "95.0", "stated: 95.0 %"), ("VAR", "TIME", "T#1m30s",
                                                     "stated: 1 min 30 s"),
        ("VAR", "INT", "12", "stated: 12 parts")]
    names = [v["name"] for v in setpoints]
    assert names[:3] == ["rDrainPumpOn", "rOff", "rHighLevelAlarm"]   # the words said with it
    assert names[3].startswith("t") and names[4].startswith("i")
    assert len({n.upper() for n in names} | {"RLEVEL", "BPUMP", "BALARM"}) == 8   # all new
    # a request that asks for a FUNCTION: the model writes the declarations (a FUNCTION's
    # return type comes first); one that names no POU: code names it (below)
    assert st_request.declared({**data, "pou_type": "FUNCTION"}) == ([], [])
    assert st_request.pou(DRAIN) == ("PROGRAM", "P_DrainPump")
    assert [v["name"] for v in st_request.declared(DRAIN)[1]] == names[:3]
    assert [st_request.time_literal(s) for s in (0.1, 30, 90, 7200, 61.5)] == [
        "T#100ms", "T#30s", "T#1m30s", "T#2h", "T#1m1s500ms"]


VENT = ("Open the vent valve when the tank pressure exceeds 6.5 bar and close it again below "
        "5.8 bar.")


def test_a_description_only_request_gets_its_stated_values_too() -> None:
    """The most common request shape (a description, no type, no name, no interface): code
    chooses a FUNCTION_BLOCK named from the description's main noun, writes it and a
    setpoint per stated value into the answer's start, and the body must read them (held
    read-only; ``relevance`` wants each used)."""
    from rung.daemon.tasks.task import load_tasks

    st = load_tasks()["st_code"]
    data = {"description": VENT}
    assert st_request.pou(data) == ("FUNCTION_BLOCK", "FB_VentValve")
    interface, setpoints = st_request.declared(data)
    assert interface == []
    assert [(v["type"], v["initial"], v["comment"]) for v in setpoints] == [
        ("REAL", "6.5", "stated: 6.5 bar"), ("REAL", "5.8", "stated: 5.8 bar")]
    shaped = st.kind.shape(st.output_schema, data)
    props = shaped.schema["properties"]
    assert props["pou_type"] == {"const": "FUNCTION_BLOCK"}
    assert props["name"] == {"const": "FB_VentValve"}
    assert shaped.prefix == '{"pou_type":"FUNCTION_BLOCK","name":"FB_VentValve","variables":' + (
        "[" + ",".join(json.dumps(v, separators=(",", ":")) for v in setpoints))
    # the body reads them (relevance), never assigns them (the body grammar holds them)
    high, low = (v["name"] for v in setpoints)
    variables = [{"section": "VAR_INPUT", "name": "rPressure", "type": "REAL"},
                 {"section": "VAR_OUTPUT", "name": "bVent", "type": "BOOL"}, *setpoints]
    reads = (f"IF rPressure > {high} THEN\n  bVent := TRUE;\nELSIF rPressure < {low} THEN\n"
             "  bVent := FALSE;\nEND_IF;")
    answer = {"pou_type": "FUNCTION_BLOCK", "name": "FB_VentValve", "variables": variables,
              "body": reads}
    assert st_request.values_used(st_request.read(data), answer)["ok"]
    unread = {**answer, "body": "bVent := rPressure > 7.0;"}
    assert not st_request.values_used(st_request.read(data), unread)["ok"]


@pytest.mark.parametrize("data,chosen", [
    ({"description": "Pump P1 runs while the level is below 2 m."},
     ("FUNCTION_BLOCK", "FB_PumpP1Runs")),
    ({"description": "Write a function block that switches the heater on below 18 degC."},
     ("FUNCTION_BLOCK", "FB_Heater")),
    ({"description": "A program that counts 12 parts per box."}, ("PROGRAM", "P_Control")),
    ({"description": "Start the fan 30 s after the pump.", "pou_type": "PROGRAM"},
     ("PROGRAM", "P_Fan")),
    ({"description": "Start the fan 30 s after the pump.", "name": "FB_Fan2"},
     ("FUNCTION_BLOCK", "FB_Fan2")),
    ({"description": "Start the fan 30 s after the pump.",
      "constraints": ["VAR_INPUT FB_Fan : BOOL"]}, ("FUNCTION_BLOCK", "FB_Fan2")),
    # the model chooses: a FUNCTION (its return type), or nothing for code to declare
    ({"description": "Write a FUNCTION that scales 4..20 mA to 0..10 bar."}, None),
    ({"description": "Start the fan 30 s after the pump.", "pou_type": "FUNCTION"}, None),
    ({"description": "Motor start/stop with interlock."}, None),
])
def test_code_chooses_the_pou_a_request_leaves_open(data: dict[str, Any],
                                                    chosen: tuple[str, str] | None) -> None:
    assert st_request.pou(data) == chosen
    assert bool(st_request.declared(data)[1]) == (chosen is not None)


def test_a_setpoint_name_never_takes_a_name_already_declared() -> None:
    data = {"description": "Open at 20 % and at 30 %.", "name": "P_X", "pou_type": "PROGRAM",
            "constraints": ["VAR_INPUT rOpen : REAL"]}
    _, setpoints = st_request.declared(data)
    assert [v["name"] for v in setpoints] == ["rOpen2", "rSetpoint"]   # "and at": no words


def test_more_stated_values_than_the_answer_holds_are_never_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request stating 800 values (each with a unit) names no setpoint for an answer
    of at most 40 variables: the shaper passes the schema's room, and the naming (the
    words around each value, a free name found for each) never starts; values are read
    once each (a set, not a list searched per value)."""
    from rung.daemon.tasks.task import load_tasks

    stated = [f"{i} A" for i in range(1, 801)]
    many = {"description": "Trip at " + ", ".join(stated[:200]) + ".",
            "constraints": [", ".join(stated[i:i + 30]) for i in range(200, 800, 30)],
            "name": "FB_X", "pou_type": "FUNCTION_BLOCK"}
    st = load_tasks()["st_code"]
    st.check_input(many)
    assert len(st_request.read(many).with_units) == 800
    named: list[int] = []
    words_near = st_request._words_near
    monkeypatch.setattr(st_request, "_words_near",
                        lambda *a: named.append(1) or words_near(*a))
    assert st_request.declared(many, room=40) == ([], [])
    assert st.kind.shape(st.output_schema, many).prefix == ""
    assert named == []
    # within the room they are named as ever, a stem counted up once for all
    few = {**many, "description": "Trip at " + ", ".join(stated[:40]) + ".",
           "constraints": []}
    _, setpoints = st_request.declared(few, room=40)
    assert len(named) == 40 and len(setpoints) == 40
    names = [v["name"] for v in setpoints]
    assert names == ["rSetpoint", *(f"rSetpoint{i}" for i in range(2, 41))]
    assert st_request.declared(few, room=39) == ([], [])


def test_code_writes_only_declarations_the_schema_accepts() -> None:
    """More values than ``variables`` may hold, or a value no literal may write: code leaves
    the setpoints out (then the interface), so the request is answered, not failed inside
    rung on a prefix its own grammar refuses."""
    from rung.daemon.tasks.task import load_tasks

    st = load_tasks()["st_code"]
    many = {"description": "; ".join(f"limit {i} at {i + 0.5} bar" for i in range(45)),
            "name": "FB_X", "pou_type": "FUNCTION_BLOCK",
            "constraints": ["VAR_INPUT rP : REAL"]}
    assert len(st_request.declared(many)[1]) == 45
    shaped = st.kind.shape(st.output_schema, many)
    assert shaped.prefix == ('{"pou_type":"FUNCTION_BLOCK","name":"FB_X","variables":'
                             '[{"section":"VAR_INPUT","name":"rP","type":"REAL"}')
    assert shaped.restage is not None
    grammar = shaped.restage(shaped.prefix + '],"body":"')
    assert grammar is not None   # nothing held read-only: no setpoint was declared
    huge = {"description": "Open above 20000000000000000 bar.", "name": "FB_X",
            "pou_type": "FUNCTION_BLOCK"}
    assert st.kind.shape(st.output_schema, huge).prefix == ""
    fits = {**many, "description": "Open above 70 %."}
    assert '"initial":"70.0"' in st.kind.shape(st.output_schema, fits).prefix


def test_a_negative_value_keeps_its_sign() -> None:
    """"under -40 °C" states minus forty: the setpoint holds -40.0 and a POU that writes 40
    does not use it; a dash in a range or after an operand is no sign."""
    data = {"description": "Sensor fault when the reading is under -40 °C or over 150 °C; "
                           "alarm between 10-20 s after start."}
    values = st_request.read(data).with_units
    assert [(v.text, v.unit) for v in values] == [("-40", "°C"), ("150", "°C"), ("20", "s")]
    setpoints = st_request.declared(data)[1]
    assert [v["initial"] for v in setpoints][:2] == ["-40.0", "150.0"]
    # the grammar writes the sign as a minus before the number: the numbers are unsigned
    assert "40.0" in st_request.literals(st_request.read(data))
    stated = st_request.read({"description": "Fault under -40 °C."})
    vs = [{"section": "VAR_INPUT", "name": "rT", "type": "REAL"},
          {"section": "VAR_OUTPUT", "name": "bF", "type": "BOOL"}]
    pou = {"pou_type": "FUNCTION_BLOCK", "name": "FB_T", "variables": vs}
    assert st_request.values_used(stated, {**pou, "body": "bF := rT < -40.0;"})["ok"]
    assert not st_request.values_used(stated, {**pou, "body": "bF := rT < 40.0;"})["ok"]
    assert not st_request.values_used(stated, {**pou, "body": "bF := rT-40.0 < 0.0;"})["ok"]


def test_names_code_gives_spell_out_what_iec_names_cannot_hold() -> None:
    """A German or French word in the description gives the POU and its setpoints names of
    ASCII letters, spelled as the language writes them without umlauts."""
    data = {"description": "Förderband CV-7, Tippbetrieb: the belt runs for at most 5 s per "
                           "press; Druckerhöhung above 4.5 bar."}
    name = st_request.pou(data)
    assert name == ("FUNCTION_BLOCK", "FB_FoerderbandCV")
    assert st_request.ascii_words("Spülung à l'eau, Maß") == "Spuelung a l'eau, Mass"
    assert [v["name"] for v in st_request.declared(data)[1]] == ["tBeltRuns",
                                                              "rDruckerhoehungAbove"]
