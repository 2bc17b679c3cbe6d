"""The ST interpreter: statements, expressions, types, the standard FBs' timing diagrams on
the simulated clock, FUNCTION results, errors, and test vectors."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rung.daemon.tasks.st.interpreter import (
    DEFAULT_WORK_BUDGET,
    Program,
    StExecError,
    check_vectors,
    run_vectors,
)


def var(section: str, name: str, type_: str, initial: str | None = None) -> dict[str, str]:
    v = {"section": section, "name": name, "type": type_}
    if initial is not None:
        v["initial"] = initial
    return v


def pou(body: str, *variables: dict[str, str], pou_type: str = "FUNCTION_BLOCK",
        name: str = "FB_Test", return_type: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"pou_type": pou_type, "name": name, "variables": list(variables),
                         "body": body}
    if return_type is not None:
        p["return_type"] = return_type
    return p


def run_body(body: str, *variables: dict[str, str], scans: int = 1,
             **inputs: Any) -> Program:
    prog = Program(pou(body, *variables))
    for _ in range(scans):
        prog.scan(inputs, 0.1)
    return prog


# --- statements ---------------------------------------------------------------------------------


def test_assignment_and_arithmetic_precedence() -> None:
    prog = run_body(
        "a := 2 + 3 * 4;\nb := (2 + 3) * 4;\nc := -7 / 2;\nd := -7 MOD 3;\n"
        "e := 10 - -3;\nf := 7 / 2;\ng := 2 ** 10;\nh := -(a);\n",
        *(var("VAR", n, "DINT") for n in "abcdeh"), var("VAR", "f", "REAL"),
        var("VAR", "g", "LREAL"))
    assert [prog.value(n) for n in "abcdeh"] == [14, 20, -3, -1, 13, -14]
    assert prog.value("f") == 3.0   # integer division of two integer literals, then widened
    assert prog.value("g") == 1024.0


def test_if_elsif_else() -> None:
    body = ("IF x > 10 THEN\n  y := 1;\nELSIF x > 5 THEN\n  y := 2;\nELSIF x = 5 THEN\n"
            "  y := 3;\nELSE\n  y := 4;\nEND_IF;\n")
    prog = Program(pou(body, var("VAR_INPUT", "x", "INT"), var("VAR_OUTPUT", "y", "INT")))
    assert [prog.scan({"x": x})["y"] for x in (11, 6, 5, 0)] == [1, 2, 3, 4]


def test_case_with_lists_ranges_negative_and_else() -> None:
    body = ("CASE x OF\n  1, 2: y := 10;\n  3..5: y := 20;\n  -1: y := 30;\n"
            "  16#10: y := 40;\nELSE\n  y := 0;\nEND_CASE;\n")
    prog = Program(pou(body, var("VAR_INPUT", "x", "INT"), var("VAR_OUTPUT", "y", "INT")))
    got = [prog.scan({"x": x})["y"] for x in (1, 2, 3, 5, 6, -1, 16, 99)]
    assert got == [10, 10, 20, 20, 0, 30, 40, 0]


def test_case_without_else_leaves_state() -> None:
    prog = Program(pou("CASE x OF 1: y := 1; END_CASE;",
                       var("VAR_INPUT", "x", "INT"), var("VAR_OUTPUT", "y", "INT", "7")))
    assert prog.scan({"x": 2})["y"] == 7


def test_for_loops_by_and_counter_value_after() -> None:
    prog = run_body(
        "s := 0;\nFOR i := 1 TO 10 DO\n  s := s + i;\nEND_FOR;\n"
        "d := 0;\nFOR j := 10 TO 1 BY -3 DO\n  d := d * 100 + j;\nEND_FOR;\n"
        "n := 0;\nFOR k := 5 TO 1 DO\n  n := n + 1;\nEND_FOR;\n",
        var("VAR", "s", "INT"), var("VAR", "i", "INT"), var("VAR", "d", "DINT"),
        var("VAR", "j", "INT"), var("VAR", "n", "INT"), var("VAR", "k", "INT"))
    assert prog.value("s") == 55
    assert prog.value("i") == 11
    assert prog.value("d") == 10070401   # 10, 7, 4, 1
    assert prog.value("n") == 0


def test_while_repeat_exit_continue() -> None:
    prog = run_body(
        "i := 0;\nWHILE i < 100 DO\n  i := i + 1;\n  IF i = 7 THEN\n    EXIT;\n  END_IF;\n"
        "END_WHILE;\nr := 0;\nREPEAT\n  r := r + 2;\nUNTIL r >= 9\nEND_REPEAT;\n"
        "odd := 0;\nFOR k := 1 TO 10 DO\n  IF k MOD 2 = 0 THEN\n    CONTINUE;\n  END_IF;\n"
        "  odd := odd + k;\nEND_FOR;\n"
        "m := 0;\nFOR k := 1 TO 3 DO\n  FOR j := 1 TO 3 DO\n    IF j = 2 THEN\n      EXIT;\n"
        "    END_IF;\n    m := m + 1;\n  END_FOR;\nEND_FOR;\n",
        var("VAR", "i", "INT"), var("VAR", "r", "INT"), var("VAR", "odd", "INT"),
        var("VAR", "k", "INT"), var("VAR", "j", "INT"), var("VAR", "m", "INT"))
    assert prog.value("i") == 7
    assert prog.value("r") == 10        # REPEAT runs its body before the first test
    assert prog.value("odd") == 25
    assert prog.value("m") == 3          # EXIT leaves the inner loop only


def test_return_ends_the_scan() -> None:
    prog = Program(pou("y := 1;\nIF stop THEN\n  RETURN;\nEND_IF;\ny := 2;\n",
                       var("VAR_INPUT", "stop", "BOOL"), var("VAR_OUTPUT", "y", "INT")))
    assert prog.scan({"stop": True})["y"] == 1
    assert prog.scan({"stop": False})["y"] == 2


def test_fb_call_named_parameters_output_capture_and_members() -> None:
    body = ("tmr(IN := start, PT := T#1s, Q => done, ET => elapsed);\n"
            "q2 := tmr.Q;\nleft := tmr.PT - tmr.ET;\n")
    prog = Program(pou(body, var("VAR_INPUT", "start", "BOOL"),
                       var("VAR_OUTPUT", "done", "BOOL"), var("VAR_OUTPUT", "elapsed", "TIME"),
                       var("VAR_OUTPUT", "q2", "BOOL"), var("VAR_OUTPUT", "left", "TIME"),
                       var("VAR", "tmr", "TON")))
    prog.scan({"start": True}, 0.0)
    out = prog.scan({}, 0.4)
    assert out == {"done": False, "elapsed": 0.4, "q2": False, "left": pytest.approx(0.6)}
    out = prog.scan({}, 0.6)
    assert out["done"] is True and out["q2"] is True and out["elapsed"] == 1.0
    assert prog.value("tmr") == {"IN": True, "PT": 1.0, "Q": True, "ET": 1.0}
    assert prog.value("TMR.et") == 1.0


def test_fb_inputs_by_member_then_call_without_arguments() -> None:
    body = "ctr.CU := pulse;\nctr.PV := 2;\nctr();\nfull := ctr.Q;\n"
    prog = Program(pou(body, var("VAR_INPUT", "pulse", "BOOL"),
                       var("VAR_OUTPUT", "full", "BOOL"), var("VAR", "ctr", "CTU")))
    states = [prog.scan({"pulse": p})["full"] for p in (True, False, True, False)]
    assert states == [False, False, True, True]


def test_inputs_not_passed_keep_their_last_value() -> None:
    body = "IF first THEN\n  t(IN := TRUE, PT := T#1s);\nELSE\n  t();\nEND_IF;\nq := t.Q;\n"
    prog = Program(pou(body, var("VAR_INPUT", "first", "BOOL", "TRUE"),
                       var("VAR_OUTPUT", "q", "BOOL"), var("VAR", "t", "TON")))
    prog.scan({}, 0.0)
    assert prog.scan({"first": False}, 1.0)["q"] is True


# --- expressions, literals, types ---------------------------------------------------------------


def test_boolean_operators_and_comparisons() -> None:
    prog = Program(pou("o1 := a AND NOT b;\no2 := a OR b;\no3 := a XOR b;\no4 := a & b;\n"
                       "o5 := NOT (a AND b) = (NOT a OR NOT b);\no6 := 3 <> 4 AND 2 <= 2;\n",
                       var("VAR_INPUT", "a", "BOOL"), var("VAR_INPUT", "b", "BOOL"),
                       *(var("VAR_OUTPUT", f"o{i}", "BOOL") for i in range(1, 7))))
    for a in (False, True):
        for b in (False, True):
            out = prog.scan({"a": a, "b": b})
            assert out == {"o1": a and not b, "o2": a or b, "o3": a != b, "o4": a and b,
                           "o5": True, "o6": True}


def test_literals() -> None:
    prog = run_body(
        "r1 := 1.5E3;\nr2 := REAL#1.0;\nr3 := 2.5e-1;\nt1 := T#1m30s;\nt2 := TIME#500ms;\n"
        "t3 := T#1.5s;\nt4 := t#1h2m;\ni1 := 16#FF;\ni2 := 2#1010;\ni3 := 1_000;\n"
        "i4 := INT#-5;\nb1 := BOOL#1;\nw := WORD#16#FFFF;\ns := 'it$'s $$5';\n",
        var("VAR", "r1", "REAL"), var("VAR", "r2", "REAL"), var("VAR", "r3", "LREAL"),
        var("VAR", "t1", "TIME"), var("VAR", "t2", "TIME"), var("VAR", "t3", "TIME"),
        var("VAR", "t4", "TIME"), var("VAR", "i1", "INT"), var("VAR", "i2", "INT"),
        var("VAR", "i3", "DINT"), var("VAR", "i4", "INT"), var("VAR", "b1", "BOOL"),
        var("VAR", "w", "WORD"), var("VAR", "s", "STRING"))
    assert prog.value("r1") == 1500.0 and prog.value("r2") == 1.0 and prog.value("r3") == 0.25
    assert [prog.value(f"t{i}") for i in range(1, 5)] == [90.0, 0.5, 1.5, 3720.0]
    assert [prog.value(f"i{i}") for i in range(1, 5)] == [255, 10, 1000, -5]
    assert prog.value("b1") is True and prog.value("w") == 0xFFFF
    assert prog.value("s") == "it's $5"


def test_initial_values_and_defaults() -> None:
    prog = Program(pou("x := x;", var("VAR", "x", "INT", "-3"), var("VAR", "r", "REAL", "2.5"),
                       var("VAR", "t", "TIME", "T#1m30s"), var("VAR", "b", "BOOL", "TRUE"),
                       var("VAR", "n", "UINT"), var("VAR", "f", "LREAL"),
                       var("VAR", "d", "TIME"), var("VAR", "z", "BOOL"),
                       var("VAR", "a", "ARRAY[1..5] OF INT", "[1, 2, 2(7)]"),
                       var("VAR", "s", "STRING[4]", "'abcdef'")))
    assert prog.value("x") == -3 and prog.value("r") == 2.5 and prog.value("t") == 90.0
    assert prog.value("b") is True
    assert (prog.value("n"), prog.value("f"), prog.value("d"), prog.value("z")) == (
        0, 0.0, 0.0, False)
    assert prog.value("a") == [1, 2, 7, 7, 0]
    assert prog.value("s") == "abcd"


def test_integer_types_wrap_like_the_plc() -> None:
    prog = run_body("i := i + 1;\nu := u - 1;\nb := b + 1;\nd := d * 2;\nsi := si + 100;\n"
                    "w := NOT w;\n",
                    var("VAR", "i", "INT", "32767"), var("VAR", "u", "UINT"),
                    var("VAR", "b", "BYTE", "255"), var("VAR", "d", "DINT", "2147483647"),
                    var("VAR", "si", "SINT", "100"), var("VAR", "w", "WORD", "16#00FF"))
    assert prog.value("i") == -32768
    assert prog.value("u") == 65535
    assert prog.value("b") == 0
    assert prog.value("d") == -2
    assert prog.value("si") == -56
    assert prog.value("w") == 0xFF00


def test_standard_functions() -> None:
    prog = run_body(
        "a := ABS(-5);\nb := MIN(4, 2, 9);\nc := MAX(4, 2, 9);\nd := LIMIT(0, 150, 100);\n"
        "e := LIMIT(MN := 0, IN := -3, MX := 100);\nf := SEL(TRUE, 1, 2);\n"
        "g := MUX(2, 10, 20, 30);\n"
        "r := SQRT(16.0) + ABS(-0.5);\nm := MAX(1, 2.5);\nsh := SHL(WORD#1, 4);\n"
        "ro := ROL(BYTE#16#81, 1);\ns := CONCAT('ab', 'cd');\nn := LEN(s);\np := FIND(s, 'c');\n"
        "ex := EXPT(2.0, 3);\nok := GT(3, 2, 1) AND EQ(1, 1, 1);\n",
        *(var("VAR", n, "INT") for n in "abcdefgn"), var("VAR", "r", "REAL"),
        var("VAR", "m", "REAL"), var("VAR", "sh", "WORD"), var("VAR", "ro", "BYTE"),
        var("VAR", "s", "STRING"), var("VAR", "p", "INT"), var("VAR", "ex", "REAL"),
        var("VAR", "ok", "BOOL"))
    assert [prog.value(n) for n in "abcdefg"] == [5, 2, 9, 100, 0, 2, 30]
    assert prog.value("r") == 4.5 and prog.value("m") == 2.5
    assert prog.value("sh") == 16 and prog.value("ro") == 0x03
    assert prog.value("s") == "abcd" and prog.value("n") == 4 and prog.value("p") == 3
    assert prog.value("ex") == 8.0 and prog.value("ok") is True


def test_conversions() -> None:
    prog = run_body(
        "r := INT_TO_REAL(i) / 2.0;\na := REAL_TO_INT(2.5);\nb := REAL_TO_INT(-1.5);\n"
        "c := REAL_TO_INT(1.6);\nd := TRUNC(-1.6);\ne := REAL_TRUNC_INT(3.9);\n"
        "ms := TIME_TO_DINT(T#1.5s);\nt := REAL_TO_TIME(250.0);\nx := TO_INT(3.5);\n"
        "bb := INT_TO_BOOL(i);\ns := INT_TO_STRING(i);\nk := STRING_TO_INT('42');\n"
        "sec := TIME_TO_REAL(T#2s) / 1000.0;\ny := DINT_TO_INT(70000);\n",
        var("VAR", "i", "INT", "7"), var("VAR", "r", "REAL"),
        *(var("VAR", n, "INT") for n in "abcdexky"), var("VAR", "ms", "DINT"),
        var("VAR", "t", "TIME"), var("VAR", "bb", "BOOL"), var("VAR", "s", "STRING"),
        var("VAR", "sec", "REAL"))
    assert prog.value("r") == 3.5
    # REAL -> integer: nearest, ties to even (IEC 61131-3 Table 22 note b); TRUNC toward 0
    assert [prog.value(n) for n in "abcde"] == [2, -2, 2, -1, 3]
    assert prog.value("ms") == 1500 and prog.value("t") == 0.25 and prog.value("x") == 4
    assert prog.value("bb") is True and prog.value("s") == "7" and prog.value("k") == 42
    assert prog.value("sec") == 2.0
    assert prog.value("y") == 70000 - 65536


def test_time_arithmetic() -> None:
    prog = run_body("a := T#1s + T#500ms;\nb := T#10s / 4;\nc := T#2s * 1.5;\n"
                    "d := MUL_TIME(T#1s, 3);\nlate := T#3s > T#2999ms;\n",
                    var("VAR", "a", "TIME"), var("VAR", "b", "TIME"), var("VAR", "c", "TIME"),
                    var("VAR", "d", "TIME"), var("VAR", "late", "BOOL"))
    assert [prog.value(n) for n in "abcd"] == [1.5, 2.5, 3.0, 3.0]
    assert prog.value("late") is True


def test_arrays_and_bits() -> None:
    prog = run_body("FOR i := 1 TO 5 DO\n  a[i] := i * i;\nEND_FOR;\ns := a[2] + a[5];\n"
                    "w.3 := TRUE;\nbit := w.0;\n",
                    var("VAR", "a", "ARRAY[1..5] OF INT"), var("VAR", "i", "INT"),
                    var("VAR", "s", "INT"), var("VAR", "w", "WORD", "1"),
                    var("VAR", "bit", "BOOL"))
    assert prog.value("a") == [1, 4, 9, 16, 25] and prog.value("s") == 29
    assert prog.value("w") == 9 and prog.value("bit") is True


def test_names_are_case_insensitive() -> None:
    prog = Program(pou("OUT_Val := In_Val * 2;", var("VAR_INPUT", "in_val", "INT"),
                       var("VAR_OUTPUT", "out_val", "INT")))
    assert prog.scan({"IN_VAL": 4}) == {"out_val": 8}


# --- the standard FBs' timing diagrams ----------------------------------------------------------


def timer_program(fb: str, pt: str = "T#1s") -> Program:
    return Program(pou(f"t(IN := x, PT := {pt});\nq := t.Q;\net := t.ET;\n",
                       var("VAR_INPUT", "x", "BOOL"), var("VAR_OUTPUT", "q", "BOOL"),
                       var("VAR_OUTPUT", "et", "TIME"), var("VAR", "t", fb)))


def trace(prog: Program, pattern: str, dt: float = 0.1) -> list[tuple[bool, float]]:
    """One scan per character of ``pattern`` (``1``: input TRUE), ``dt`` apart."""
    out = []
    for i, c in enumerate(pattern):
        o = prog.scan({"x": c == "1"}, 0.0 if i == 0 else dt)
        out.append((o["q"], round(o["et"], 6)))
    return out


def test_ton_rises_after_pt_with_in_held_and_resets_when_in_drops() -> None:
    got = trace(timer_program("TON"), "1" * 15 + "0" * 2 + "11111" + "0")
    q = [g[0] for g in got]
    assert q[:10] == [False] * 10          # t = 0.0 .. 0.9
    assert q[10:15] == [True] * 5          # from t = 1.0: PT reached
    assert got[5] == (False, 0.5)
    assert got[14] == (True, 1.0)           # ET stops at PT
    assert got[15] == (False, 0.0)          # IN dropped: Q and ET reset at once
    assert q[17:22] == [False] * 5          # IN back for 0.5 s < PT: no Q
    assert got[21] == (False, 0.4)


def test_tof_holds_q_for_pt_after_in_falls() -> None:
    got = trace(timer_program("TOF"), "0" + "111" + "0" * 14 + "1")
    q = [g[0] for g in got]
    assert q[0] is False                    # never on yet
    assert q[1:4] == [True] * 3
    assert q[4:14] == [True] * 10           # falls at t = 0.4: held for 1 s (to 1.3)
    assert q[14] is False                   # t = 1.4
    assert got[9] == (True, 0.5)
    assert got[17] == (False, 1.0)          # ET holds PT while IN stays FALSE
    assert got[18] == (True, 0.0)           # IN again: ET back to 0


def test_tp_pulse_has_exactly_pt_length() -> None:
    got = trace(timer_program("TP"), "1" * 3 + "0" + "1" * 12 + "00" + "1")
    q = [g[0] for g in got]
    assert q[:10] == [True] * 10            # retriggering at t = 0.4 does not extend it
    assert q[10:18] == [False] * 8
    assert got[12] == (False, 1.0)          # pulse over, IN still TRUE: ET holds PT
    assert got[16] == (False, 0.0)          # IN FALSE: ET back to 0
    assert got[18] == (True, 0.0)           # a new rising edge: a new pulse
    assert sum(q) == 11


def test_r_trig_and_f_trig_last_one_scan() -> None:
    body = "r(CLK := x);\nf(CLK := x);\nrq := r.Q;\nfq := f.Q;\n"
    prog = Program(pou(body, var("VAR_INPUT", "x", "BOOL"), var("VAR_OUTPUT", "rq", "BOOL"),
                       var("VAR_OUTPUT", "fq", "BOOL"), var("VAR", "r", "R_TRIG"),
                       var("VAR", "f", "F_TRIG")))
    outs = [prog.scan({"x": c == "1"}, 0.1) for c in "0011100"]
    assert [o["rq"] for o in outs] == [False, False, True, False, False, False, False]
    # IEC 61131-3 ed. 2/3: F_TRIG's M starts FALSE, so its first call with CLK FALSE
    # reports an edge (CODESYS's ed. 1 F_TRIG does not)
    assert [o["fq"] for o in outs] == [True, False, False, False, False, True, False]


def test_r_trig_with_clk_true_on_the_first_scan() -> None:
    prog = Program(pou("r(CLK := x, Q => q);", var("VAR_INPUT", "x", "BOOL"),
                       var("VAR_OUTPUT", "q", "BOOL"), var("VAR", "r", "R_TRIG")))
    assert [prog.scan({"x": True})["q"] for _ in range(3)] == [True, False, False]


def test_ctu_counts_rising_edges_to_pv_and_resets() -> None:
    body = "c(CU := pulse, R := reset, PV := 3, Q => done, CV => count);\n"
    prog = Program(pou(body, var("VAR_INPUT", "pulse", "BOOL"),
                       var("VAR_INPUT", "reset", "BOOL"), var("VAR_OUTPUT", "done", "BOOL"),
                       var("VAR_OUTPUT", "count", "INT"), var("VAR", "c", "CTU")))
    seq = [prog.scan({"pulse": c == "1", "reset": False}) for c in "1101011010"]
    assert [o["count"] for o in seq] == [1, 1, 1, 2, 2, 3, 3, 3, 4, 4]   # edges only
    assert [o["done"] for o in seq] == [False] * 5 + [True] * 5
    out = prog.scan({"pulse": True, "reset": True})
    assert out == {"done": False, "count": 0}          # R wins, the edge is consumed
    assert prog.scan({"pulse": True, "reset": False})["count"] == 0
    assert prog.scan({"pulse": False})["count"] == 0
    assert prog.scan({"pulse": True})["count"] == 1


def test_ctd_and_ctud() -> None:
    body = ("d(CD := down, LD := load, PV := 2, Q => empty, CV => dcv);\n"
            "ud(CU := up, CD := down, R := FALSE, LD := load, PV := 2, QU => high, QD => low, "
            "CV => udcv);\n")
    prog = Program(pou(body, *(var("VAR_INPUT", n, "BOOL") for n in ("up", "down", "load")),
                       *(var("VAR_OUTPUT", n, "BOOL") for n in ("empty", "high", "low")),
                       var("VAR_OUTPUT", "dcv", "INT"), var("VAR_OUTPUT", "udcv", "INT"),
                       var("VAR", "d", "CTD"), var("VAR", "ud", "CTUD")))
    out = prog.scan({"load": True})
    assert out == {"empty": False, "high": True, "low": False, "dcv": 2, "udcv": 2}
    prog.scan({"load": False})
    for _ in range(3):
        prog.scan({"down": True})
        out = prog.scan({"down": False})
    assert out["dcv"] == -1 and out["empty"] is True
    assert out["udcv"] == -1 and out["low"] is True and out["high"] is False
    prog.scan({"up": True})
    out = prog.scan({"up": False})
    assert out["udcv"] == 0
    out = prog.scan({"up": True, "down": True})     # both edges at once: no count
    assert out["udcv"] == 0


def test_sr_and_rs_latches() -> None:
    body = "sr(S1 := s, R := r, Q1 => qsr);\nrs(S := s, R1 := r, Q1 => qrs);\n"
    prog = Program(pou(body, var("VAR_INPUT", "s", "BOOL"), var("VAR_INPUT", "r", "BOOL"),
                       var("VAR_OUTPUT", "qsr", "BOOL"), var("VAR_OUTPUT", "qrs", "BOOL"),
                       var("VAR", "sr", "SR"), var("VAR", "rs", "RS")))
    assert prog.scan({"s": True, "r": False}) == {"qsr": True, "qrs": True}
    assert prog.scan({"s": False, "r": False}) == {"qsr": True, "qrs": True}   # latched
    assert prog.scan({"s": True, "r": True}) == {"qsr": True, "qrs": False}    # dominance
    assert prog.scan({"s": False, "r": True}) == {"qsr": False, "qrs": False}


# --- FUNCTION, scans, state ---------------------------------------------------------------------


def test_function_result_and_no_memory() -> None:
    f = pou("IF x < lo THEN\n  F_Scale := 0.0;\n  RETURN;\nEND_IF;\n"
            "calls := calls + 1;\nF_Scale := INT_TO_REAL(x - lo) * k;\n",
            var("VAR_INPUT", "x", "INT"), var("VAR_INPUT", "lo", "INT", "10"),
            var("VAR", "calls", "INT"), var("VAR", "k", "REAL", "0.5"),
            pou_type="FUNCTION", name="F_Scale", return_type="REAL")
    prog = Program(f)
    assert prog.scan({"x": 30}) == {"F_Scale": 10.0}
    assert prog.scan({"x": 30}) == {"F_Scale": 10.0}
    assert prog.value("calls") == 1          # a FUNCTION's variables restart each call
    assert prog.scan({"x": 3}) == {"F_Scale": 0.0}
    result = run_vectors(f, {"steps": [{"t": 0, "set": {"x": 14, "lo": 4},
                                        "expect": {"f_scale": 5.0}}]})
    assert result == {"ok": True, "failures": [], "error": None, "steps": result["steps"]}


def test_state_persists_and_var_temp_restarts() -> None:
    prog = Program(pou("n := n + 1;\ntmp := tmp + 1;\nseen := tmp;\n",
                       var("VAR_OUTPUT", "seen", "INT"), var("VAR", "n", "INT"),
                       var("VAR_TEMP", "tmp", "INT")))
    for _ in range(3):
        out = prog.scan()
    assert prog.value("n") == 3 and out == {"seen": 1}


def test_var_in_out_is_input_and_output() -> None:
    prog = Program(pou("acc := acc + 1;", var("VAR_IN_OUT", "acc", "DINT")))
    assert prog.scan({"acc": 41}) == {"acc": 42}


def test_simulated_clock() -> None:
    prog = timer_program("TON", "T#10s")
    prog.scan({"x": True}, 0.0)
    prog.scan({}, 9.999)
    assert prog.value("t.Q") is False
    prog.scan({}, 0.001)
    assert prog.value("t.Q") is True and prog.now_s == pytest.approx(10.0)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    "WHILE TRUE DO\n  n := n + 1;\nEND_WHILE;",
    "REPEAT\n  n := n + 1;\nUNTIL FALSE\nEND_REPEAT;",
    "FOR n := 0 TO 32767 DO\n  ;\nEND_FOR;",       # INT counter wraps: never passes 32767
    "FOR n := 0 TO 10 BY 0 DO\nEND_FOR;",
])
def test_endless_loops_hit_the_step_budget(body: str) -> None:
    prog = Program(pou(body, var("VAR", "n", "INT")), step_budget=5_000)
    with pytest.raises(StExecError, match="more than 5000 loop iterations") as e:
        prog.scan()
    assert e.value.line == 1


def test_division_by_zero_is_an_error_with_its_place() -> None:
    prog = Program(pou("a := 1;\nb := a / d;\n", var("VAR_INPUT", "d", "INT"),
                       var("VAR", "a", "INT"), var("VAR", "b", "INT")))
    assert prog.scan({"d": 2}) == {}
    with pytest.raises(StExecError, match="division by zero") as e:
        prog.scan({"d": 0})
    assert (e.value.line, e.value.column) == (2, 6)
    prog = Program(pou("r := x / 0.0;", var("VAR_INPUT", "x", "REAL"), var("VAR", "r", "REAL")))
    with pytest.raises(StExecError, match="division by zero"):
        prog.scan({"x": 1.0})
    # IEC defines x MOD 0 as 0
    assert run_body("m := 7 MOD z;", var("VAR", "z", "INT"), var("VAR", "m", "INT",
                                                                  "5")).value("m") == 0


def test_constant_division_by_zero_is_refused_at_build() -> None:
    with pytest.raises(StExecError, match="division by zero"):
        Program(pou("a := 1 / 0;", var("VAR", "a", "INT")))


def test_runtime_errors() -> None:
    prog = Program(pou("y := a[i];", var("VAR_INPUT", "i", "INT"),
                       var("VAR", "a", "ARRAY[0..2] OF INT"), var("VAR_OUTPUT", "y", "INT")))
    assert prog.scan({"i": 2}) == {"y": 0}
    with pytest.raises(StExecError, match=r"index 3 is outside 'a' \[0..2\]"):
        prog.scan({"i": 3})
    prog = Program(pou("y := MUX(i, 1, 2);", var("VAR_INPUT", "i", "INT"),
                       var("VAR_OUTPUT", "y", "INT")))
    with pytest.raises(StExecError, match="MUX selector 2"):
        prog.scan({"i": 2})
    prog = Program(pou("y := SQRT(x);", var("VAR_INPUT", "x", "REAL"),
                       var("VAR_OUTPUT", "y", "REAL")))
    with pytest.raises(StExecError, match="SQRT"):
        prog.scan({"x": -1.0})


@pytest.mark.parametrize(("body", "variables", "message"), [
    ("y := x", [var("VAR", "x", "INT"), var("VAR", "y", "INT")], "syntax"),
    ("y := nope;", [var("VAR", "y", "INT")], "undeclared identifier 'nope'"),
    ("y := r;", [var("VAR", "r", "REAL"), var("VAR", "y", "INT")], "REAL_TO_INT"),
    ("y := 40000;", [var("VAR", "y", "INT")], "does not fit"),
    ("IF n THEN\n  n := 1;\nEND_IF;", [var("VAR", "n", "INT")], "must be BOOL"),
    ("t := 5;", [var("VAR", "t", "TIME")], "TIME does not mix"),
    ("b := t + 5;", [var("VAR", "t", "TIME"), var("VAR", "b", "TIME")], "does not apply"),
    ("tmr.Q := TRUE;", [var("VAR", "tmr", "TON")], "output of TON"),
    ("tmr(IN := TRUE, PT := 5);", [var("VAR", "tmr", "TON")], "TIME does not mix"),
    ("x := tmr;", [var("VAR", "tmr", "TON"), var("VAR", "x", "BOOL")], "read a member"),
    ("k := 2;", [var("VAR CONSTANT", "k", "INT", "1")], "constant"),
    ("EXIT;", [var("VAR", "k", "INT")], "EXIT outside a loop"),
    ("d := DATE#2020-01-01;", [var("VAR", "d", "INT")], "not supported"),
    ("x := 1;", [var("VAR", "x", "DATE")], "not supported"),
])
def test_build_errors(body: str, variables: list[dict[str, str]], message: str) -> None:
    with pytest.raises(StExecError, match=message):
        Program(pou(body, *variables))


def test_scan_refuses_unknown_and_ill_typed_inputs() -> None:
    prog = Program(pou("y := x;", var("VAR_INPUT", "x", "INT"), var("VAR_OUTPUT", "y", "INT")))
    with pytest.raises(StExecError, match="not declared"):
        prog.scan({"z": 1})
    with pytest.raises(StExecError, match="not an input"):
        prog.scan({"y": 1})
    with pytest.raises(StExecError, match="out of its range"):
        prog.scan({"x": 40000})
    with pytest.raises(StExecError, match="not an INT value"):
        prog.scan({"x": 1.5})


def test_constants_fold_and_can_label_cases() -> None:
    prog = Program(pou("CASE x OF\n  1: y := LIMIT_HI * 2;\nELSE\n  y := 0;\nEND_CASE;",
                       var("VAR_INPUT", "x", "INT"), var("VAR_OUTPUT", "y", "INT"),
                       var("VAR CONSTANT", "LIMIT_HI", "INT", "21")))
    assert prog.scan({"x": 1}) == {"y": 42}


# --- test vectors -------------------------------------------------------------------------------

HYSTERESIS_VARS = [var("VAR_INPUT", "level", "REAL"), var("VAR_OUTPUT", "pump_on", "BOOL"),
                   var("VAR", "on_level", "REAL", "70.0"), var("VAR", "off_level", "REAL", "35.0")]
HYSTERESIS = pou("IF level >= on_level THEN\n  pump_on := TRUE;\n"
                 "ELSIF level <= off_level THEN\n  pump_on := FALSE;\nEND_IF;\n",
                 *HYSTERESIS_VARS, name="FB_LevelControl")
# one setpoint in both branches: a plain threshold, no hysteresis
HYSTERESIS_WRONG = pou("IF level >= on_level THEN\n  pump_on := TRUE;\n"
                       "ELSIF level < on_level THEN\n  pump_on := FALSE;\nEND_IF;\n",
                       *HYSTERESIS_VARS, name="FB_LevelControl")
HYSTERESIS_VECTORS: dict[str, Any] = {"scan_s": 0.1, "steps": [
    {"t": 0.0, "set": {"level": 50.0}},
    {"t": 1.0, "expect": {"pump_on": False}},
    {"t": 2.0, "set": {"level": 71.0}},
    {"t": 2.0, "expect": {"pump_on": True}},
    {"t": 3.0, "set": {"level": 50.0}},
    {"t": 4.0, "expect": {"pump_on": True}},        # between the setpoints: stays on
    {"t": 5.0, "set": {"level": 34.0}},
    {"t": 5.5, "expect": {"pump_on": False}},
    {"t": 6.0, "set": {"level": 60.0}},
    {"t": 7.0, "expect": {"PUMP_ON": False}},       # between the setpoints: stays off
]}


def test_hysteresis_passes_its_vectors() -> None:
    result = run_vectors(HYSTERESIS, HYSTERESIS_VECTORS)
    assert result == {"ok": True, "failures": [], "error": None, "steps": result["steps"]}


def test_wrong_hysteresis_fails_them() -> None:
    result = run_vectors(HYSTERESIS_WRONG, HYSTERESIS_VECTORS)
    assert result["ok"] is False and result["error"] is None
    assert [(f["t"], f["name"], f["expected"], f["got"]) for f in result["failures"]] == [
        (4.0, "pump_on", True, False)]


def test_vectors_timing_with_a_timer() -> None:
    p = pou("t(IN := run, PT := T#5s);\ndone := t.Q;\nremaining := t.PT - t.ET;\n",
            var("VAR_INPUT", "run", "BOOL"), var("VAR_OUTPUT", "done", "BOOL"),
            var("VAR_OUTPUT", "remaining", "TIME"), var("VAR", "t", "TON"))
    vectors = {"scan_s": 0.1, "steps": [
        {"t": 1.0, "set": {"run": True}},
        {"t": 5.9, "expect": {"done": False, "remaining": {"value": 0.1, "tol": 1e-9}}},
        {"t": 6.0, "expect": {"done": True, "remaining": "T#0s"}},
        {"t": 6.1, "set": {"run": False}},
        {"t": 6.1, "expect": {"done": False}},   # steps at one time: sets, a scan, expects
    ]}
    result = run_vectors(p, vectors)
    assert result == {"ok": True, "failures": [], "error": None, "steps": result["steps"]}


def test_real_tolerances() -> None:
    p = pou("y := x / 3.0;", var("VAR_INPUT", "x", "REAL"), var("VAR_OUTPUT", "y", "REAL"))
    ok = run_vectors(p, {"steps": [{"t": 0, "set": {"x": 10}, "expect": {
        "y": 3.3333334}}]})
    assert ok["ok"], ok
    bad = run_vectors(p, {"steps": [{"t": 0, "set": {"x": 10}, "expect": {"y": 3.33}}]})
    assert not bad["ok"]
    loose = run_vectors(p, {"steps": [{"t": 0, "set": {"x": 10},
                                       "expect": {"y": {"value": 3.33, "tol": 0.01}}}]})
    assert loose["ok"], loose


def test_vectors_report_names_outside_the_interface() -> None:
    p = pou("out := inp;\nhidden := inp;", var("VAR_INPUT", "inp", "BOOL"),
            var("VAR_OUTPUT", "out", "BOOL"), var("VAR", "hidden", "BOOL"))
    result = run_vectors(p, {"steps": [
        {"t": 0, "set": {"inp": True, "speed": 3, "out": False}},
        {"t": 1, "expect": {"out": True, "alarm": False, "hidden": True}}]})
    assert result["ok"] is False and result["error"] is None
    messages = {f["name"]: f["message"] for f in result["failures"]}
    assert set(messages) == {"speed", "out", "alarm", "hidden"}
    assert "not declared" in messages["speed"] and "not declared" in messages["alarm"]
    assert "VAR_OUTPUT, not as an input" in messages["out"]
    assert "declared as VAR, not as an output" in messages["hidden"]


def test_vectors_report_ill_typed_inputs_and_outputs() -> None:
    p = pou("out := n > 3;", var("VAR_INPUT", "n", "INT"), var("VAR_OUTPUT", "out", "BOOL"))
    result = run_vectors(p, {"steps": [{"t": 0, "set": {"n": 2.5}},
                                       {"t": 0.5, "expect": {"out": 1}}]})
    assert [f["name"] for f in result["failures"]] == ["n", "out"]
    assert "INT" in result["failures"][0]["message"]


def test_vectors_report_runtime_and_build_errors() -> None:
    p = pou("q := 100 / n;", var("VAR_INPUT", "n", "INT"), var("VAR_OUTPUT", "q", "INT"))
    result = run_vectors(p, {"scan_s": 0.5, "steps": [
        {"t": 0, "set": {"n": 4}, "expect": {"q": 25}}, {"t": 2, "set": {"n": 0}},
        {"t": 3, "expect": {"q": 0}}]})
    assert result["ok"] is False and result["failures"] == []
    assert "t=2 s" in result["error"] and "division by zero" in result["error"]
    result = run_vectors(pou("q := ;", var("VAR_OUTPUT", "q", "INT")),
                         {"steps": [{"t": 0, "expect": {"q": 0}}]})
    assert result["ok"] is False and result["error"].startswith("the POU does not run")


def test_endless_loop_in_vectors() -> None:
    p = pou("WHILE run DO\n  n := n + 1;\nEND_WHILE;", var("VAR_INPUT", "run", "BOOL"),
            var("VAR", "n", "DINT"))
    result = run_vectors(p, {"steps": [{"t": 0}, {"t": 1, "set": {"run": True}}]},
                         step_budget=1000)
    assert result["ok"] is False and "endless loop" in result["error"]


# --- the run's work budget ---------------------------------------------------------------------


def test_steps_are_counted_as_documented() -> None:
    """A step: a scan, each syntax node a statement evaluates (a nested statement counts
    when it runs), each loop iteration; the branch an IF does not take is not counted."""
    p = pou("FOR i := 1 TO 10 DO\n  s := s + i;\nEND_FOR;\nIF s > 1000 THEN\n  s := 0;\n"
            "END_IF;", var("VAR", "i", "INT"), var("VAR", "s", "DINT"))
    prog = Program(p)
    prog.scan()
    # scan 1; FOR i, 1, 10: 4; IF s > 1000: 4; ten iterations of 1 + (s := s + i: 5)
    assert prog.steps == 1 + 4 + 4 + 10 * (1 + 5)
    prog.scan()
    assert prog.steps == 2 * 69
    # array elements count: declared once, reset each scan when VAR_TEMP
    arr = Program(pou("a[0] := 1;", var("VAR_TEMP", "a", "ARRAY[0..99] OF INT")))
    assert arr.steps == 100
    arr.scan()
    assert arr.steps == 100 + 1 + 100 + 5   # scan, reset, a[0] := 1 (a, [0], 0 and :=)


MOVING_AVERAGE = pou(   # as a capable model writes one: the sum over 1,000 samples each scan
    "buf[k] := x;\nk := (k + 1) MOD 1000;\nsum := 0.0;\nFOR i := 0 TO 999 DO\n"
    "  sum := sum + buf[i];\nEND_FOR;\navg := sum / 1000.0;\n",
    var("VAR_INPUT", "x", "REAL"), var("VAR_OUTPUT", "avg", "REAL"),
    var("VAR", "buf", "ARRAY[0..999] OF REAL"), var("VAR", "i", "INT"),
    var("VAR", "k", "INT"), var("VAR", "sum", "REAL"))


def test_a_run_stops_at_its_work_budget() -> None:
    vectors = {"scan_s": 0.1, "steps": [{"t": 0, "set": {"x": 2.0}},
                                        {"t": 1.0, "expect": {"avg": 0.022}}]}
    whole = run_vectors(MOVING_AVERAGE, vectors)
    assert whole["ok"] and whole["error"] is None, whole
    need = whole["steps"]
    assert need > 11 * 8000   # 11 scans of 1,000 iterations of 8 steps
    assert run_vectors(MOVING_AVERAGE, vectors, work_budget=need)["ok"]
    short = run_vectors(MOVING_AVERAGE, vectors, work_budget=need - 1)
    assert not short["ok"] and short["steps"] == need - 1
    assert "work budget of" in short["error"] and "spent" in short["error"]


def test_a_heavy_answer_fails_within_the_default_budget() -> None:
    """The longest vectors a request may send (20,000 scans) against a loop over 1,000
    samples a scan: the run stops at the default budget, ~1,250 scans in."""
    vectors = {"scan_s": 0.1, "steps": [{"t": 0, "set": {"x": 1.0}},
                                        {"t": 1999.9, "expect": {"avg": 1.0}}]}
    result = run_vectors(MOVING_AVERAGE, vectors)
    assert not result["ok"] and result["steps"] == DEFAULT_WORK_BUDGET
    assert f"work budget of {DEFAULT_WORK_BUDGET} steps is spent" in result["error"]
    assert "line 4, column 1" in result["error"]   # the FOR loop


def test_an_endless_loop_past_the_run_budget_says_so() -> None:
    p = pou("WHILE TRUE DO\nEND_WHILE;", var("VAR", "n", "INT"))
    with pytest.raises(StExecError, match="more than 100000 loop iterations"):
        Program(p).scan()
    with pytest.raises(StExecError, match="work budget of 5000 steps"):
        Program(p, work_budget=5000).scan()


@pytest.mark.parametrize(("vectors", "message"), [
    ({"scan_s": 0.01, "steps": [{"t": 0}, {"t": 1000.0}]},
     "is 100001 scans, more than the 20000 a test may run"),
    ({"scan_s": 0.1, "steps": [{"t": 0, "set": {"a": [0] * 1000}}, {"t": 1500.0}]},
     "15001 scans copying in the arrays they set take at least 15016001 steps"),
])
def test_vectors_no_answer_can_run_are_refused(vectors: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_vectors(vectors)
    fine = {"scan_s": 0.1, "steps": [{"t": 0, "set": {"a": [0] * 1000}},
                                     {"t": 10.0, "set": {"a": 1}}, {"t": 1500.0}]}
    check_vectors(fine)   # the array is held for 100 scans only


@pytest.mark.parametrize("vectors", [
    {"steps": []},
    {"scan_s": 0, "steps": [{"t": 0}]},
    {"steps": [{"t": 1}, {"t": 0}]},
    {"steps": [{"t": 0, "expected": {}}]},
    {"steps": [{"t": 0, "expect": {"x": None}}]},
    {"scan_s": 0.001, "steps": [{"t": 1e6}]},
])
def test_malformed_vectors_are_the_tests_mistake(vectors: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="vectors"):
        run_vectors(HYSTERESIS, vectors)


def test_a_few_hundred_scans_well_under_a_second() -> None:
    body = ("IF level >= 70.0 THEN\n  pump_on := TRUE;\nELSIF level <= 35.0 THEN\n"
            "  pump_on := FALSE;\nEND_IF;\ndelay(IN := pump_on, PT := T#3s);\n"
            "starts(CU := pump_on, R := FALSE, PV := 100);\nrunning := delay.Q;\n"
            "total := 0.0;\nFOR i := 1 TO 10 DO\n  total := total + level * 0.1;\nEND_FOR;\n")
    p = pou(body, var("VAR_INPUT", "level", "REAL"), var("VAR_OUTPUT", "pump_on", "BOOL"),
            var("VAR_OUTPUT", "running", "BOOL"), var("VAR_OUTPUT", "total", "REAL"),
            var("VAR", "delay", "TON"), var("VAR", "starts", "CTU"), var("VAR", "i", "INT"))
    steps = [{"t": float(s), "set": {"level": 80.0 if s % 20 < 10 else 20.0}}
             for s in range(0, 60)]
    start = time.perf_counter()
    result = run_vectors(p, {"scan_s": 0.1, "steps": steps})   # 591 scans
    assert time.perf_counter() - start < 0.5
    assert result["ok"], result


def test_vectors_with_time_inputs_and_array_outputs() -> None:
    p = pou("FOR i := 0 TO 2 DO\n  hist[i] := TIME_TO_DINT(delay) * (i + 1);\nEND_FOR;",
            var("VAR_INPUT", "delay", "TIME"), var("VAR_OUTPUT", "hist", "ARRAY[0..2] OF DINT"),
            var("VAR", "i", "INT"))
    vectors = {"steps": [{"t": 0, "set": {"delay": "T#2s"}, "expect": {"hist": [2000, 4000, 6000]}},
                         {"t": 1, "set": {"delay": 0.5}, "expect": {"hist": [500, 1000, 1500]}}]}
    assert run_vectors(p, vectors)["ok"]
    bad = run_vectors(p, {"steps": [{"t": 0, "set": {"delay": 1}, "expect": {"hist": [1000, 2000]}},
                                    {"t": 1, "expect": {"hist": [1000, 2000, 3001]}}]})
    assert [f["message"] for f in bad["failures"]] == [
        "expected [1000, 2000], the output is an array of 3",
        "element 2: expected 3001, got 3000"]


def test_value_reads_any_variable() -> None:
    prog = timer_program("TON")
    prog.scan({"x": True}, 0.0)
    assert prog.value("x") is True and prog.value("T.in") is True
    with pytest.raises(KeyError):
        prog.value("nope")
    with pytest.raises(KeyError):
        prog.value("t.nope")
    assert prog.declaration("T") == ("VAR", "TON") and prog.declaration("nope") is None
