"""The quality figure (daemon/tasks/quality.py): right beside valid, with the reason an
answer is not right; ST behaviour judged by running the answer against test vectors."""

from __future__ import annotations

from typing import Any

from rung.daemon.tasks.kinds import KINDS
from rung.daemon.tasks.quality import Tally, judge
from rung.daemon.tasks.validate import validate_output

DRAIN = {"description": "Switch the drain pump on at 70.0 % and off at 35.0 % "
                        "(hysteresis).", "pou_type": "FUNCTION_BLOCK",
         "vectors": {"scan_s": 0.1, "steps": [
             {"t": 0.0, "set": {"rLevel": 50.0}, "expect": {"bPump": False}},
             {"t": 1.0, "set": {"rLevel": 75.0}, "expect": {"bPump": True}},
             {"t": 2.0, "set": {"rLevel": 50.0}, "expect": {"bPump": True}},   # held
             {"t": 3.0, "set": {"rLevel": 30.0}, "expect": {"bPump": False}},
             {"t": 4.0, "set": {"rLevel": 50.0}, "expect": {"bPump": False}}]}}


def _pou(body: str) -> dict[str, Any]:
    return {"pou_type": "FUNCTION_BLOCK", "name": "FB_Drain", "body": body, "variables": [
        {"section": "VAR_INPUT", "name": "rLevel", "type": "REAL"},
        {"section": "VAR_OUTPUT", "name": "bPump", "type": "BOOL"}]}


RIGHT = ("IF rLevel >= 70.0 THEN\n    bPump := TRUE;\nELSIF rLevel <= 35.0 THEN\n"
         "    bPump := FALSE;\nEND_IF;")
# uses both values, passes every static check, and still does not hold the pump on
# between the setpoints: only running it shows that
NO_HYSTERESIS = "bPump := rLevel >= 70.0 OR rLevel <= 35.0 AND FALSE;"


def _judge(body: str, data: dict[str, Any] = DRAIN) -> Any:
    output = _pou(body)
    ok, validation = validate_output({}, KINDS["st"], output, data)
    return ok, judge(KINDS["st"], validation)


def test_a_pou_that_behaves_is_right() -> None:
    ok, v = _judge(RIGHT)
    assert ok and v.valid and v.right and v.reason is None


def test_a_valid_pou_that_misbehaves_is_not_right_and_says_why() -> None:
    ok, v = _judge(NO_HYSTERESIS)
    assert not ok and v.valid and not v.right
    assert v.reason is not None and v.reason.startswith("behaviour: at t = 2.0 s")


def test_a_pou_that_does_not_parse_is_not_even_valid() -> None:
    ok, v = _judge("IF rLevel > 70.0 bPump := TRUE;")
    assert not ok and not v.valid and not v.right and v.reason.startswith("st_syntax")


def test_no_answer_is_neither() -> None:
    v = judge(KINDS["diagnosis"], None, error="max_tokens reached")
    assert not v.valid and not v.right and v.reason == "max_tokens reached"


def test_the_tally_reports_right_beside_valid_per_task() -> None:
    t = Tally()
    for body in (RIGHT, NO_HYSTERESIS, "x"):
        t.add("st_code", _judge(body)[1])
    report = t.report()["st_code"]
    assert report["n"] == 3 and report["right"] == 1 / 3 and report["valid"] == 2 / 3
    assert report["not_right_because"] == {"behaviour": 1, "st_syntax": 1}
    assert t.line("st_code") == "st_code: 1 of 3 right, 2 of 3 valid"


def test_malformed_vectors_are_the_requests_mistake() -> None:
    """Refused before any answer is written (``bad_request``), not judged against it."""
    import pytest

    from rung.daemon.tasks.task import TaskError, load_tasks

    st = load_tasks()["st_code"]
    st.check_input(DRAIN)   # fine
    bad = {**DRAIN, "vectors": {"scan_s": 0.1, "steps": [{"t": 2.0}, {"t": 1.0}]}}
    with pytest.raises(TaskError, match="input vectors: step 1"):
        st.check_input(bad)
    ok, v = validate_output({}, KINDS["st"], _pou(RIGHT), {"description": "x"})
    assert "behaviour" not in v   # no vectors, no behaviour section
