"""Structured Text POUs: rendering, the tree-sitter syntax check and the identifier check."""

from __future__ import annotations

import copy
import sys
import threading
import time
from typing import Any

import pytest

from rung.daemon.tasks.st import pou as st_pou

# --- hand-written good POUs ---------------------------------------------------------------------


def var(section: str, name: str, type_: str, initial: str | None = None,
        comment: str | None = None) -> dict[str, str]:
    v = {"section": section, "name": name, "type": type_}
    if initial is not None:
        v["initial"] = initial
    if comment is not None:
        v["comment"] = comment
    return v


MOTOR: dict[str, Any] = {
    "pou_type": "FUNCTION_BLOCK",
    "name": "FB_MotorControl",
    "variables": [
        var("VAR_INPUT", "start", "BOOL", "FALSE", "start push button (NO)"),
        var("VAR_INPUT", "stop", "BOOL", "TRUE", "stop push button (NC)"),
        var("VAR_INPUT", "guardClosed", "BOOL", comment="safety interlock"),
        var("VAR_INPUT", "overload", "BOOL"),
        var("VAR_OUTPUT", "running", "BOOL"),
        var("VAR_OUTPUT", "fault", "BOOL"),
        var("VAR", "startDelay", "TON"),
        var("VAR", "feedbackTimeout", "TIME", "T#1m30s"),
    ],
    "body": (
        "(* start/stop with seal-in, interlock and a start delay *)\n"
        "startDelay(IN := start AND stop AND guardClosed, PT := T#5S);\n"
        "IF NOT stop OR NOT guardClosed OR overload THEN\n"
        "    running := FALSE;  // stop wins\n"
        "    fault := overload;\n"
        "ELSIF startDelay.Q THEN\n"
        "    running := TRUE;\n"
        "ELSE\n"
        "    running := running AND stop;\n"
        "END_IF;\n"
        "IF startDelay.ET > feedbackTimeout THEN\n"
        "    fault := TRUE;\n"
        "END_IF;"
    ),
    "assumptions": ["stop is wired normally closed"],
}

CONVEYOR: dict[str, Any] = {
    "pou_type": "PROGRAM",
    "name": "PRG_Conveyor",
    "variables": [
        var("VAR_INPUT", "partPresent", "BOOL"),
        var("VAR_INPUT", "atEnd", "BOOL"),
        var("VAR_INPUT", "eStop", "BOOL"),
        var("VAR_OUTPUT", "beltOn", "BOOL"),
        var("VAR_OUTPUT", "pusherOut", "BOOL"),
        var("VAR", "state", "INT", "0", "0 idle, 10 run, 20 push, 30 wait"),
        var("VAR", "pushTimer", "TP"),
        var("VAR", "waitTimer", "TOF"),
        var("VAR", "label", "STRING[20]", "'idle'"),
        var("VAR_TEMP", "pushTime", "TIME", "TIME#800ms"),
    ],
    "body": (
        "IF eStop THEN\n"
        "    state := 0;\n"
        "END_IF;\n"
        "CASE state OF\n"
        "    0: // idle\n"
        "        beltOn := FALSE;\n"
        "        label := 'idle';\n"
        "        IF partPresent THEN state := 10; END_IF;\n"
        "    10:\n"
        "        beltOn := TRUE;\n"
        "        IF atEnd THEN state := 20; END_IF;\n"
        "    20:\n"
        "        beltOn := FALSE;\n"
        "        pushTimer(IN := TRUE, PT := pushTime);\n"
        "        pusherOut := pushTimer.Q;\n"
        "        IF NOT pushTimer.Q AND pushTimer.ET >= pushTime THEN\n"
        "            pushTimer(IN := FALSE);\n"
        "            state := 30;\n"
        "        END_IF;\n"
        "    30, 31:\n"
        "        waitTimer(IN := FALSE, PT := T#2s);\n"
        "        IF NOT waitTimer.Q THEN state := 0; END_IF;\n"
        "ELSE\n"
        "    state := 0;\n"
        "END_CASE;"
    ),
}

SCALE: dict[str, Any] = {
    "pou_type": "FUNCTION",
    "name": "F_Scale",
    "return_type": "REAL",
    "variables": [
        var("VAR_INPUT", "raw", "INT", comment="analog input counts"),
        var("VAR_INPUT", "rawMin", "INT", "0"),
        var("VAR_INPUT", "rawMax", "INT", "27648"),
        var("VAR_INPUT", "engMin", "REAL", "0.0"),
        var("VAR_INPUT", "engMax", "REAL", "100.0"),
        var("VAR", "span", "REAL"),
    ],
    "body": (
        "span := INT_TO_REAL(rawMax - rawMin);\n"
        "IF span = 0.0 THEN\n"
        "    F_Scale := engMin;\n"
        "    RETURN;\n"
        "END_IF;\n"
        "F_Scale := LIMIT(engMin,\n"
        "                 engMin + INT_TO_REAL(raw - rawMin) * (engMax - engMin) / span,\n"
        "                 engMax);"
    ),
}

AVERAGE: dict[str, Any] = {
    "pou_type": "FUNCTION_BLOCK",
    "name": "FB_Average",
    "variables": [
        var("VAR_INPUT", "samples", "ARRAY[1..10] OF REAL"),
        var("VAR_OUTPUT", "mean", "REAL"),
        var("VAR_OUTPUT", "peak", "REAL"),
        var("VAR", "i", "INT"),
        var("VAR", "sum", "LREAL"),
        var("VAR", "flags", "WORD", "16#00FF"),
    ],
    "body": (
        "sum := 0.0;\n"
        "peak := samples[1];\n"
        "FOR i := 1 TO 10 BY 1 DO\n"
        "    sum := sum + REAL_TO_LREAL(samples[i]);\n"
        "    peak := MAX(peak, samples[i]);\n"
        "    IF samples[i] < 0.0 THEN\n"
        "        flags := flags OR SHL(WORD#1, i);\n"
        "        EXIT;\n"
        "    END_IF;\n"
        "END_FOR;\n"
        "mean := LREAL_TO_REAL(sum / 10.0);"
    ),
}

EDGE_COUNTER: dict[str, Any] = {
    "pou_type": "FUNCTION_BLOCK",
    "name": "FB_PartCounter",
    "variables": [
        var("VAR_INPUT", "sensor", "BOOL"),
        var("VAR_INPUT", "reset", "BOOL"),
        var("VAR_INPUT", "batchSize", "INT", "INT#50"),
        var("VAR_OUTPUT", "batchDone", "BOOL"),
        var("VAR_OUTPUT", "count", "INT"),
        var("VAR_IN_OUT", "total", "DINT"),
        var("VAR", "edge", "R_TRIG"),
        var("VAR", "counter", "CTU"),
    ],
    "body": (
        "edge(CLK := sensor);\n"
        "counter(CU := edge.Q, R := reset, PV := batchSize);\n"
        "IF edge.Q THEN\n"
        "    total := total + 1;\n"
        "END_IF;\n"
        "count := counter.CV;\n"
        "batchDone := counter.Q;"
    ),
}

GOOD = {"motor": MOTOR, "conveyor": CONVEYOR, "scale": SCALE, "average": AVERAGE,
        "edge_counter": EDGE_COUNTER}


def with_body(pou: dict[str, Any], body: str) -> dict[str, Any]:
    out = copy.deepcopy(pou)
    out["body"] = body
    return out


def body_line(pou: dict[str, Any], i: int) -> int:
    """1-based rendered line of 0-based body line ``i``."""
    return st_pou.render_pou_with_map(pou)[1] + i + 1


# --- rendering ----------------------------------------------------------------------------------

def test_render_golden() -> None:
    pou = {
        "pou_type": "FUNCTION_BLOCK",
        "name": "FB_Lamp",
        "variables": [
            var("VAR", "blink", "TON"),
            var("VAR_OUTPUT", "lamp", "BOOL"),
            var("VAR_INPUT", "enable", "BOOL", "FALSE", "lamp test"),
            var("VAR_INPUT", "period", "TIME", "T#500MS"),
        ],
        "body": "blink(IN := enable AND NOT blink.Q, PT := period);\n"
                "IF blink.Q THEN\n    lamp := NOT lamp;\nEND_IF;\n",
    }
    assert st_pou.render_pou(pou) == (
        "FUNCTION_BLOCK FB_Lamp\n"
        "VAR_INPUT\n"
        "    enable : BOOL := FALSE; // lamp test\n"
        "    period : TIME := T#500MS;\n"
        "END_VAR\n"
        "VAR_OUTPUT\n"
        "    lamp : BOOL;\n"
        "END_VAR\n"
        "VAR\n"
        "    blink : TON;\n"
        "END_VAR\n"
        "    blink(IN := enable AND NOT blink.Q, PT := period);\n"
        "    IF blink.Q THEN\n"
        "        lamp := NOT lamp;\n"
        "    END_IF;\n"
        "END_FUNCTION_BLOCK\n"
    )
    text, offset = st_pou.render_pou_with_map(pou)
    assert offset == 11
    assert text.split("\n")[offset] == "    blink(IN := enable AND NOT blink.Q, PT := period);"


def test_render_function_header_and_section_order() -> None:
    text, offset = st_pou.render_pou_with_map(SCALE)
    lines = text.split("\n")
    assert lines[0] == "FUNCTION F_Scale : REAL"
    assert lines[-2:] == ["END_FUNCTION", ""]
    assert lines[offset] == "    span := INT_TO_REAL(rawMax - rawMin);"
    sections = [ln for ln in st_pou.render_pou(CONVEYOR).split("\n") if ln.startswith("VAR")]
    assert sections == ["VAR_INPUT", "VAR_OUTPUT", "VAR", "VAR_TEMP"]
    assert st_pou.render_pou(CONVEYOR).startswith("PROGRAM PRG_Conveyor\n")
    assert st_pou.render_pou(CONVEYOR).endswith("END_CASE;\nEND_PROGRAM\n")


def test_render_keeps_blank_lines_unindented_and_comments_on_one_line() -> None:
    pou = {"pou_type": "PROGRAM", "name": "P", "body": "\r\nx := 1;\r\n\r\ny := 2;\n\n",
           "variables": [var("VAR", "x", "INT", comment="two\nlines"), var("VAR", "y", "INT")]}
    text, offset = st_pou.render_pou_with_map(pou)
    assert text == ("PROGRAM P\nVAR\n    x : INT; // two lines\n    y : INT;\nEND_VAR\n"
                    "    x := 1;\n\n    y := 2;\nEND_PROGRAM\n")
    assert offset == 5
    assert st_pou.to_body_position(offset + 3, 5, offset) == (3, 1)
    assert st_pou.to_body_position(2, 1, offset) is None


# --- good POUs pass both checks -----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_pous_pass(name: str) -> None:
    result = st_pou.validate_pou(GOOD[name])
    assert result["st_syntax"] == {"ok": True, "errors": []}, result["text"]
    assert result["identifiers"] == {"ok": True, "errors": []}, result["text"]
    assert result["text"] == st_pou.render_pou(GOOD[name])
    assert st_pou.check_syntax(result["text"]) == result["st_syntax"]
    assert st_pou.check_identifiers(GOOD[name]) == result["identifiers"]


def test_case_insensitive_and_literals_comments_strings_ignored() -> None:
    pou = with_body(MOTOR, (
        "// foo bar baz are not variables\n"
        "(* neither is qux := 1; *)\n"
        "if START and not Stop then RUNNING := true; end_if;\n"
        "STARTDELAY(in := Start, pt := TIME#1h2m3s4ms);\n"
        "running := startdelay.q AND (startDelay.et < t#1.5s) AND guardclosed;\n"
        "fault := DINT#16#FF > 2#1010_1010 AND 1.0E-3 < 2.5;"
    ))
    pou["variables"].append(var("VAR", "msg", "STRING(30)", "'foo $'bar$' $N'"))
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"], result["st_syntax"]
    assert result["identifiers"]["ok"], result["identifiers"]


# --- syntax errors ------------------------------------------------------------------------------

def only_error(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is False
    assert len(result["errors"]) == 1, result["errors"]
    err: dict[str, Any] = result["errors"][0]
    return err


def test_missing_then() -> None:
    pou = with_body(MOTOR, "running := FALSE;\nIF start AND stop\n    running := TRUE;\nEND_IF;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert (err["line"], err["column"]) == (body_line(pou, 1), 5)
    assert "IF without THEN" in err["message"]


def test_missing_then_on_elsif_and_do_on_while() -> None:
    pou = with_body(AVERAGE, "IF i > 1 THEN\n    i := 1;\nELSIF i < 0\n    i := 0;\nEND_IF;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert err["line"] == body_line(pou, 2) and "ELSIF without THEN" in err["message"]
    pou = with_body(AVERAGE, "WHILE i < 10\n    i := i + 1;\nEND_WHILE;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert err["line"] == body_line(pou, 0) and "WHILE without DO" in err["message"]


def test_missing_semicolon() -> None:
    pou = with_body(MOTOR, "running := FALSE\nfault := FALSE;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert err["message"] == "missing ';'"
    assert (err["line"], err["column"]) == (body_line(pou, 0), 5 + len("running := FALSE"))


def test_missing_semicolon_after_call() -> None:
    pou = with_body(MOTOR, "startDelay(IN := start, PT := T#5S)\nrunning := startDelay.Q;")
    result = st_pou.validate_pou(pou)
    err = only_error(result["st_syntax"])
    assert err["line"] in (body_line(pou, 0), body_line(pou, 1))
    assert "';'" in err["message"]
    assert result["identifiers"]["ok"], result["identifiers"]  # IN, PT are not variables


def test_missing_semicolon_after_end_if() -> None:
    # CODESYS tolerates `END_IF` without ';', IEC statement lists (and Siemens SCL) do not.
    pou = with_body(AVERAGE, "FOR i := 1 TO 2 DO\n    IF i > 1 THEN\n        EXIT;\n    END_IF\n"
                             "END_FOR;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert err == {"line": body_line(pou, 3), "column": 5 + len("    END_IF"),
                   "message": "missing ';' after END_IF"}


def test_equals_instead_of_assignment() -> None:
    pou = with_body(AVERAGE, "i := 0;\nsum = 5;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert (err["line"], err["column"]) == (body_line(pou, 1), 5)
    assert "use ':='" in err["message"]
    pou = with_body(AVERAGE, "IF i > 0 THEN\n    i = 5;\nEND_IF;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert (err["line"], err["column"]) == (body_line(pou, 1), 9)
    assert "use ':='" in err["message"]
    # `=` is comparison, valid inside an expression
    assert st_pou.validate_pou(
        with_body(AVERAGE, "IF i = 5 THEN i := 0; END_IF;"))["st_syntax"]["ok"]


def test_missing_end_if() -> None:
    pou = with_body(MOTOR, "IF start THEN\n    running := TRUE;\nfault := FALSE;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert err["message"].startswith("missing 'END_IF'")
    assert f"on line {body_line(pou, 0)}" in err["message"]


def test_stray_end_if_and_missing_end_case() -> None:
    pou = with_body(MOTOR, "running := TRUE;\nEND_IF;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert err["line"] == body_line(pou, 1)
    pou = with_body(CONVEYOR, "CASE state OF\n    0: state := 1;\n")
    assert only_error(st_pou.validate_pou(pou)["st_syntax"])["message"].startswith(
        "missing 'END_CASE'")


@pytest.mark.parametrize(("body", "hint"), [
    ("running := start == stop;", "'==' is not ST, compare with '='"),
    ("running := start && stop;", "'&&' is not ST, use AND"),
    ("running := !stop;", "'!' is not ST, use NOT"),
    ("IF start THEN running := TRUE; ELSEIF stop THEN running := FALSE; END_IF;", "use ELSIF"),
    ("IF start THEN running := TRUE; ELSE IF stop THEN running := FALSE; END_IF;",
     "'ELSE IF' opens a nested IF, use ELSIF"),
])
def test_hints_for_other_languages_habits(body: str, hint: str) -> None:
    err = only_error(st_pou.validate_pou(with_body(MOTOR, body))["st_syntax"])
    assert err["line"] == body_line(MOTOR, 0) and err["message"].endswith(hint)


def test_declarations_in_the_body() -> None:
    pou = with_body(MOTOR, "VAR\n    tmp : INT;\nEND_VAR\nrunning := TRUE;")
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"]  # valid ST text, but not the POU object's shape
    assert only_error(result["identifiers"]) == {
        "line": body_line(pou, 0), "column": 5,
        "message": "declarations belong in 'variables', not in the body"}


def test_assignment_to_a_literal() -> None:
    pou = with_body(AVERAGE, "5 := i;")
    err = only_error(st_pou.validate_pou(pou)["st_syntax"])
    assert "cannot assign to '5'" in err["message"]


def test_several_errors_sorted_with_char_columns() -> None:
    pou = with_body(MOTOR, "(* Überlast *) running := FALSE\nfault := TRUE\n")
    result = st_pou.check_syntax(st_pou.render_pou(pou))
    assert [(e["line"], e["column"], e["message"]) for e in result["errors"]] == [
        (body_line(pou, 0), 5 + len("(* Überlast *) running := FALSE"), "missing ';'"),
        (body_line(pou, 1), 5 + len("fault := TRUE"), "missing ';'"),
    ]


# --- identifier errors --------------------------------------------------------------------------

def test_undeclared_identifier_position() -> None:
    pou = with_body(MOTOR, "running := start;\nIF stop AND motorReady THEN\n    fault := FALSE;\n"
                           "END_IF;")
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"]
    err = only_error(result["identifiers"])
    assert err == {"line": body_line(pou, 1), "column": 5 + len("IF stop AND "),
                   "message": "undeclared identifier 'motorReady'"}
    assert result["text"].split("\n")[err["line"] - 1][err["column"] - 1:].startswith(
        "motorReady")


def test_identifiers_checked_even_when_syntax_fails() -> None:
    pou = with_body(MOTOR, "IF speed > 10\n    running := TRUE;\nEND_IF;")
    result = st_pou.validate_pou(pou)
    assert not result["st_syntax"]["ok"]
    err = only_error(result["identifiers"])
    assert err["message"] == "undeclared identifier 'speed'"
    assert (err["line"], err["column"]) == (body_line(pou, 0), 8)


def test_invalid_member_of_standard_fb() -> None:
    pou = with_body(MOTOR, "running := startDelay.QQ;")
    err = only_error(st_pou.check_identifiers(pou))
    assert err["message"] == "'QQ' is not a member of TON (IN, PT, Q, ET)"
    assert (err["line"], err["column"]) == (body_line(pou, 0), 5 + len("running := startDelay."))
    pou = with_body(EDGE_COUNTER, "count := counter.ET;\nbatchDone := edge.CLK;")
    result = st_pou.check_identifiers(pou)
    assert [e["message"] for e in result["errors"]] == [
        "'ET' is not a member of CTU (CU, R, PV, Q, CV)"]


def test_member_of_undeclared_and_of_elementary_variable() -> None:
    pou = with_body(MOTOR, "running := tmr.Q;\nfault := start.Q;")
    messages = [e["message"] for e in st_pou.check_identifiers(pou)["errors"]]
    assert messages == ["undeclared identifier 'tmr'",
                        "'Q': the BOOL before the '.' has no members"]


def test_member_of_array_element() -> None:
    pou = {"pou_type": "PROGRAM", "name": "P", "variables": [
        var("VAR", "timers", "ARRAY[0..3] OF TON"), var("VAR", "i", "INT"),
        var("VAR", "done", "BOOL")],
        "body": "FOR i := 0 TO 3 DO\n    timers[i](IN := TRUE, PT := T#1S);\n"
                "    done := timers[i].Q AND timers[i].XX;\nEND_FOR;"}
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"], result["st_syntax"]
    assert [e["message"] for e in result["identifiers"]["errors"]] == [
        "'XX' is not a member of TON (IN, PT, Q, ET)"]


def test_bit_access_and_direct_addresses() -> None:
    pou = {"pou_type": "PROGRAM", "name": "P", "variables": [
        var("VAR", "status", "WORD"), var("VAR", "flags", "ARRAY[1..4] OF BYTE"),
        var("VAR", "ok", "BOOL"), var("VAR", "level", "REAL")],
        "body": "ok := status.0 AND NOT status.15 AND flags[2].7;\n"
                "status.3 := %IX0.1 AND ok;\n"
                "%QX1.2 := ok;\n"
                "level := %IW64 / 27648.0 * 1.5;"}
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"], result["st_syntax"]
    assert result["identifiers"]["ok"], result["identifiers"]
    pou = with_body(pou, "ok := status.16 OR ok.1 OR level.0;")
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"], result["st_syntax"]
    assert [(e["column"], e["message"]) for e in result["identifiers"]["errors"]] == [
        (5 + len("ok := status."), "bit '.16' is out of range for a WORD (bits 0..15)"),
        (5 + len("ok := status.16 OR ok."),
         "bit access '.1' on a BOOL: it needs an integer or bit-string variable"),
        (5 + len("ok := status.16 OR ok.1 OR level."),
         "bit access '.0' on a REAL: it needs an integer or bit-string variable"),
    ]


def test_standard_fb_call_parameters() -> None:
    pou = with_body(MOTOR, "startDelay(IN := start, PTT := T#5S, IN => running);\n"
                           "startDelay(IN := start, Q => running);")
    result = st_pou.check_identifiers(pou)
    assert [e["message"] for e in result["errors"]] == [
        "'PTT' is not an input of TON (inputs: IN, PT)",
        "'IN' is not an output of TON (outputs: Q, ET)",
    ]


def test_equals_instead_of_assignment_in_call_arguments() -> None:
    # `tmr(IN = x)` parses (a positional comparison); the identifier check names the mistake
    pou = with_body(MOTOR, "startDelay(IN = start AND stop, PT := T#5S);\n"
                           "startDelay(start, T#5S);")
    result = st_pou.validate_pou(pou)
    assert result["st_syntax"]["ok"]
    assert result["identifiers"]["errors"] == [
        {"line": body_line(pou, 0), "column": 5 + len("startDelay("),
         "message": "'IN = ...' compares: pass the parameter with 'IN := ...'"},
        {"line": body_line(pou, 1), "column": 5 + len("startDelay("),
         "message": "'startDelay' is a TON: pass its inputs by name (IN, PT := ...)"},
    ]


def test_calls_functions_and_fb_types() -> None:
    pou = with_body(SCALE, "F_Scale := MyScale(raw);\nspan := TO_REAL(raw) + ABS(span);\n"
                           "span := REAL_TRUNC_INT(span) + FOO_TO_BAR(raw);\nTON(IN := TRUE);\n"
                           "raw(1);")
    messages = [e["message"] for e in st_pou.check_identifiers(pou)["errors"]]
    assert messages == [
        "undeclared identifier 'MyScale'",
        "undeclared identifier 'FOO_TO_BAR'",
        "'TON' is a function block type: declare an instance (e.g. inst : TON;) and call that",
        "'raw' is a INT, not a function block instance: it cannot be called",
    ]


def test_writing_a_standard_fb_output() -> None:
    pou = with_body(MOTOR, "startDelay.IN := start;\nstartDelay.Q := TRUE;")
    err = only_error(st_pou.check_identifiers(pou))
    assert err["message"] == "'Q' is an output of TON: it cannot be assigned"


def test_pou_name_only_assignable_in_a_function() -> None:
    assert st_pou.check_identifiers(SCALE)["ok"]
    pou = with_body(MOTOR, "FB_MotorControl := TRUE;")
    assert only_error(st_pou.check_identifiers(pou))["message"] == (
        "undeclared identifier 'FB_MotorControl'")


def test_duplicate_variable() -> None:
    pou = copy.deepcopy(MOTOR)
    pou["variables"].append(var("VAR", "START", "INT"))
    text = st_pou.render_pou(pou)
    err = only_error(st_pou.check_identifiers(pou))
    first = text.split("\n").index("    start : BOOL := FALSE; // start push button (NO)") + 1
    second = text.split("\n").index("    START : INT;") + 1
    assert err == {"line": second, "column": 5,
                   "message": f"duplicate variable 'START' (first declared on line {first})"}


def test_reserved_variable_names() -> None:
    pou = copy.deepcopy(AVERAGE)
    pou["variables"] += [var("VAR", "then", "BOOL"), var("VAR", "Time", "INT"),
                         var("VAR", "ton", "BOOL"), var("VAR", "FB_Average", "BOOL")]
    messages = [e["message"] for e in st_pou.validate_pou(pou)["identifiers"]["errors"]]
    assert messages == [
        "variable name 'then' is a reserved keyword or type name",
        "variable name 'Time' is a reserved keyword or type name",
        "variable name 'ton' is a reserved keyword or type name",
        "variable 'FB_Average' has the name of the POU",
    ]


# --- no parser, speed, threads ------------------------------------------------------------------

def test_without_a_parser_nothing_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st_pou, "_PARSER", [None])
    result = st_pou.validate_pou(MOTOR)
    assert result["text"] == st_pou.render_pou(MOTOR)
    for check in (result["st_syntax"], result["identifiers"], st_pou.check_syntax("x := 1;")):
        assert check["ok"] is False
        assert check["errors"][-1]["message"].startswith("no ST parser installed")


def test_missing_grammar_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st_pou, "_PARSER", [])
    monkeypatch.setattr(st_pou, "_PARSER_PROBLEM", [])
    monkeypatch.setitem(sys.modules, "tree_sitter_iec61131_3_st", None)  # import fails
    err = only_error(st_pou.check_syntax("PROGRAM P\nEND_PROGRAM\n"))
    assert err["message"].startswith("no ST parser installed")
    assert "tree_sitter_iec61131_3_st is not importable" in err["message"]


def test_parser_is_built_once_and_checks_are_fast() -> None:
    st_pou.validate_pou(CONVEYOR)
    parser = st_pou._parser()
    assert parser is not None and st_pou._parser() is parser
    start = time.perf_counter()
    for _ in range(20):
        st_pou.validate_pou(CONVEYOR)
    per_check = (time.perf_counter() - start) / 20
    assert per_check < 0.05, per_check  # ~1 ms on a laptop core


def test_concurrent_validation() -> None:
    expected = {name: st_pou.validate_pou(pou) for name, pou in GOOD.items()}
    failures: list[str] = []

    def worker() -> None:
        for _ in range(10):
            for name, pou in GOOD.items():
                if st_pou.validate_pou(pou) != expected[name]:
                    failures.append(name)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
