"""Plant tags in an ST request (P-101, TT-204A, XV-12) name equipment: their numbers are not
values the request states, so no setpoint is declared for them and no answer is refused
for leaving them out."""

from __future__ import annotations

from rung.daemon.tasks.st import request as st_request


def _values(text: str) -> list[tuple[str, str | None]]:
    return [(v.text, v.unit) for v in st_request.read({"description": text}).values]


def test_tag_numbers_are_not_stated_values() -> None:
    assert _values("Start pump P-101 when the level in LT-204A is above 80 %.") == [("80", "%")]
    assert _values("Open XV-12 after 5 s, close it below 2.5 bar.") == [("5", "s"),
                                                                        ("2.5", "bar")]
    assert st_request.setpoints({"description": "Run P-101 for 10 s."})[0]["initial"] == "T#10s"
    assert len(st_request.setpoints({"description": "Run P-101 for 10 s."})) == 1


def test_numbers_that_are_values_still_are() -> None:
    assert _values("heat to -5 °C, 7.5 bar, 3 parts, 1 min 30 s") == [
        ("90", "s"), ("-5", "°C"), ("7.5", "bar"), ("3", "parts")]
    assert ("12", None) in _values("a batch of 12, tank T1")
