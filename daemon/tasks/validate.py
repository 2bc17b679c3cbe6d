"""Validation of a task's output after decoding: the JSON Schema, then the task's semantic
validators. Each contributes named sections to one ``validation`` object, every section
``{"ok": bool, "errors": [...]}`` (plus what it computed):

    schema       jsonschema against the task's output schema
    st_syntax    the rendered POU parsed by an ST parser          (validator "st")
    identifiers  identifiers used in the body are declared        (validator "st")
    pou_text     the rendered POU (a string, not a section)       (validator "st")
    fault_tree   references, acyclicity, cut sets, probability    (validator "fault_tree")
    diagnosis    points and states agree with the input snapshot  (validator "diagnosis")
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

Section = dict[str, Any]


def check_schema(schema: Mapping[str, Any], output: Any) -> Section:
    v = jsonschema.Draft202012Validator(schema)
    errors = [{"path": "/".join(str(p) for p in e.absolute_path), "message": e.message}
              for e in v.iter_errors(output)]
    return {"ok": not errors, "errors": errors[:20]}


def _st(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    from rung.daemon.tasks.st import validate_pou

    result = validate_pou(output)
    return {"st_syntax": result["st_syntax"], "identifiers": result["identifiers"],
            "pou_text": result["text"],
            "relevance": stated_values_used(str(data.get("description", "")),
                                            result["text"])}


# a number in a request, with the unit that follows it, if any
_STATED = re.compile(r"(?<![\w.#])(\d+(?:\.\d+)?)\s*(ms|s|min|h|%|[a-zA-Z]+\d*)?")
_TIME = re.compile(r"T#(\d+(?:\.\d+)?)(ms|s|m|h)", re.IGNORECASE)
_LITERAL = re.compile(r"(?<![\w#])(\d+(?:\.\d+)?)(?![\w#])")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def stated_values_used(description: str, pou_text: str) -> dict[str, Any]:
    """Relevance, as far as code can check it: each time (``30 s``, ``500 ms``) and each
    threshold with a unit the request states appears in the POU, as a numeric literal or a
    TIME literal of the same duration (a percentage also as a fraction). Numbers inside
    names (``P1``, ``line 2``) and bare counts are not taken as stated values. Reported,
    not gating (``advisory``): a correct POU may compute a value instead of writing it."""
    values = {float(v) for v in _LITERAL.findall(pou_text)}
    seconds = {float(v) * _SECONDS[u.lower()] for v, u in _TIME.findall(pou_text)}
    stated, missing = [], []
    for number, unit in _STATED.findall(description):
        if not unit:
            continue
        v = float(number)
        u = unit if unit in _SECONDS or unit == "%" else "unit"
        stated.append(f"{number} {unit}")
        found = (v * _SECONDS[u] in seconds or v in values) if u in _SECONDS else (
            v in values or (u == "%" and v / 100 in values))
        if not found:
            missing.append(f"{number} {unit}")
    return {"ok": not missing, "advisory": True, "stated": stated,
            "errors": [{"path": "body", "message": f"the request states {m}; the POU does "
                        "not use it"} for m in missing]}


def _fault_tree(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    from rung.daemon.tasks.fault_tree import analyze_fault_tree

    points = data.get("points")
    known = [p["name"] for p in points] if isinstance(points, list) else None
    return {"fault_tree": analyze_fault_tree(output, known_points=known)}


def expected_state(value: Any, limits: Mapping[str, float]) -> str | None:
    """normal / alert / alarm from a value and its limits; None when not decidable."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not limits:
        return None
    if ("alarm" in limits and value >= limits["alarm"]) or (
            "low_alarm" in limits and value <= limits["low_alarm"]):
        return "alarm"
    if ("alert" in limits and value >= limits["alert"]) or (
            "low_alert" in limits and value <= limits["low_alert"]):
        return "alert"
    return "normal"


def _diagnosis(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    points = {p["name"]: p for p in data.get("points", [])}
    errors: list[dict[str, str]] = []
    for i, s in enumerate(output.get("state_detection", [])):
        p = points.get(s["point"])
        if p is None:
            errors.append({"path": f"state_detection/{i}/point",
                           "message": f"unknown point {s['point']!r}"})
            continue
        want = expected_state(p.get("value"), p.get("limits") or {})
        if want is not None and want != s["state"]:
            errors.append({"path": f"state_detection/{i}/state",
                           "message": f"{s['point']} = {p.get('value')} is {want} by its "
                                      f"limits, not {s['state']}"})
    for i, h in enumerate(output.get("health_assessment", [])):
        for j, ev in enumerate(h.get("evidence", [])):
            if ev not in points:
                errors.append({"path": f"health_assessment/{i}/evidence/{j}",
                               "message": f"unknown point {ev!r}"})
    return {"diagnosis": {"ok": not errors, "errors": errors[:20]}}


VALIDATORS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]] = {
    "st": _st, "fault_tree": _fault_tree, "diagnosis": _diagnosis}


def validate_output(schema: Mapping[str, Any], validators: tuple[str, ...], output: Any,
                    data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(all ok, the validation object). Semantic validators run on schema-valid output."""
    validation: dict[str, Any] = {"schema": check_schema(schema, output)}
    if validation["schema"]["ok"]:
        for name in validators:
            validation.update(VALIDATORS[name](output, data))
    ok = all(s.get("ok", True) for s in validation.values()
             if isinstance(s, dict) and not s.get("advisory"))
    return ok, validation
