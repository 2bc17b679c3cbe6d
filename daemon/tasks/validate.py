"""Validation of a task's output after decoding: the JSON Schema, then the task's semantic
validators. Each contributes named sections to one ``validation`` object, every section
``{"ok": bool, "errors": [...]}`` (plus what it computed):

    schema       jsonschema against the task's output schema
    st_syntax    the rendered POU parsed by an ST parser          (validator "st")
    identifiers  identifiers used in the body are declared        (validator "st")
    pou_text     the rendered POU (a string, not a section)       (validator "st")
    fault_tree   references, acyclicity, cut sets, probability    (validator "fault_tree")
    components   the basic events name the system's components    (validator "fault_tree")
    diagnosis    states, evidence, priority, prognosis, names     (validator "diagnosis")
                 against what code knows of the request
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

Section = dict[str, Any]


def check_schema(schema: Mapping[str, Any], output: Any) -> Section:
    v = jsonschema.Draft202012Validator(schema)
    errors = [{"path": "/".join(str(p) for p in e.absolute_path), "message": schema_message(e)}
              for e in v.iter_errors(output)]
    return {"ok": not errors, "errors": errors[:20]}


# -- what a schema error says: the rule broken, never the value ------------------------------

_JSON_TYPES = (("boolean", bool), ("integer", int), ("number", float), ("string", str),
               ("array", list), ("object", dict), ("null", type(None)))


def _json_type(value: Any) -> str:
    """The JSON type of a value, with its article (``an array``)."""
    name = next((n for n, t in _JSON_TYPES if isinstance(value, t)), type(value).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _short(value: Any, limit: int = 40) -> str:
    """A value the schema (or a field name) gives, quoted and cut to ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _count(n: int, schema: Any, noun: str) -> str:
    """``301 samples`` (the array's ``x-noun``: ``sample``), else ``301 items``."""
    word = schema.get("x-noun", noun) if isinstance(schema, dict) else noun
    return f"{n} {word}{'' if n == 1 else 's'}"


def _sized(e: jsonschema.ValidationError, noun: str, rule: str) -> str:
    size = len(e.instance) if isinstance(e.instance, list | str | dict) else 0
    return f"{_count(size, e.schema, noun)}, {rule} {e.validator_value}"


def _wanted(types: Any) -> str:
    """``number``; ``number, boolean or null``."""
    names = [str(t) for t in types] if isinstance(types, list) else [str(types)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _unexpected(e: jsonschema.ValidationError) -> str:
    known = set((e.schema.get("properties") or {}) if isinstance(e.schema, dict) else ())
    extra = [k for k in e.instance if k not in known] if isinstance(e.instance, dict) else []
    names = ", ".join(_short(k) for k in extra[:3]) + (", ..." if len(extra) > 3 else "")
    return f"unknown field{'s' if len(extra) > 1 else ''} {names}"


# keyword -> what its error says (the path comes with it); rung's own input keywords
# (``task.INPUT_KEYWORDS``) write their messages themselves
_MESSAGES: dict[str, Callable[[jsonschema.ValidationError], str]] = {
    "type": lambda e: f"{_json_type(e.instance)}; the schema wants {_wanted(e.validator_value)}",
    "enum": lambda e: f"not one of {_short(e.validator_value, 120)}",
    "const": lambda e: f"must be {_short(e.validator_value)}",
    "maxItems": lambda e: _sized(e, "item", "at most"),
    "minItems": lambda e: _sized(e, "item", "at least"),
    "maxLength": lambda e: _sized(e, "character", "at most"),
    "minLength": lambda e: _sized(e, "character", "at least"),
    "maxProperties": lambda e: _sized(e, "field", "at most"),
    "minProperties": lambda e: _sized(e, "field", "at least"),
    "maximum": lambda e: f"more than the maximum {e.validator_value}",
    "minimum": lambda e: f"less than the minimum {e.validator_value}",
    "exclusiveMaximum": lambda e: f"not less than {e.validator_value}",
    "exclusiveMinimum": lambda e: f"not more than {e.validator_value}",
    "multipleOf": lambda e: f"not a multiple of {e.validator_value}",
    "pattern": lambda e: f"does not match the pattern {_short(e.validator_value, 120)}",
    "format": lambda e: f"not a valid {e.validator_value}",
    "required": lambda e: e.message,   # names the schema's field, not the value
    "dependentRequired": lambda e: e.message,
    "additionalProperties": _unexpected,
    "unevaluatedProperties": _unexpected,
    "items": lambda e: (f"{_count(len(e.instance), e.schema, 'item')}, at most "
                        f"{len(e.schema.get('prefixItems') or ())}"
                        if isinstance(e.instance, list) and e.validator_value is False
                        and isinstance(e.schema, dict) else "an item of the wrong form"),
    "uniqueItems": lambda e: "holds the same item twice",
    "contains": lambda e: "holds no item of the form the schema asks for",
    "anyOf": lambda e: f"{_json_type(e.instance)} of none of the forms the schema allows",
    "oneOf": lambda e: f"{_json_type(e.instance)} not of exactly one of the forms the "
                       "schema allows",
    "not": lambda e: f"{_json_type(e.instance)} of a form the schema does not allow",
    "False": lambda e: "not allowed here",
}


def schema_message(e: jsonschema.ValidationError) -> str:
    """What a JSON Schema error says without the value it found: the rule and the size or
    type of what broke it (``301 samples, at most 300``, ``a string, where the schema wants
    number``); jsonschema's own message echoes the value (a 16 KB array in a log line)."""
    keyword = "False" if e.validator is None else str(e.validator)
    say = _MESSAGES.get(keyword)
    if say is not None:
        return say(e)
    if keyword in _OWN:
        return e.message
    return f"fails the schema's {keyword!r} rule"


_OWN = frozenset({"uniqueBy", "notReserved", "noControlCharacters"})


def _st(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The POU parses and names only what it declares (valid); it uses the values the
    request states, the building blocks its behaviour needs, and never assigns a VAR_INPUT
    (right, as far as code can tell: ``st_request``). All gating."""
    from rung.daemon.tasks import st_request
    from rung.daemon.tasks.st import assigned_names, reserved_kind, validate_pou

    result = validate_pou(output)
    stated = st_request.read(data)
    identifiers = result["identifiers"]
    kind = reserved_kind(str(output.get("name", "")))
    if kind is not None:   # a name the model chose (a request's name is refused earlier)
        identifiers = {**identifiers, "ok": False, "errors": [*identifiers.get("errors", []), {
            "path": "name", "message": f"the POU name {output.get('name')!r} is {kind} in "
            "IEC 61131-3"}]}
    return {"st_syntax": result["st_syntax"], "identifiers": identifiers,
            "pou_text": result["text"],
            "relevance": st_request.values_used(stated, output),
            "building_blocks": st_request.blocks_used(stated, output),
            "inputs": st_request.inputs_not_assigned(output, assigned_names(result["text"])),
            **_behaviour(output, data)}


def _behaviour(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    """With the request's test vectors: the POU executed on a simulated clock gives the
    expected outputs (``st_exec.run_vectors``)."""
    vectors = data.get("vectors")
    if not isinstance(vectors, Mapping):
        return {}
    from rung.daemon.tasks.st_exec import run_vectors

    try:
        run = run_vectors(output, vectors)
    except ValueError as e:   # vectors the input schema let through but cannot run
        return {"behaviour": {"ok": False, "errors": [{"path": "vectors", "message": str(e)}]}}
    errors = [{"path": "body", "message": f"at t = {f.get('t')} s: {f.get('message') or f}"}
              for f in run.get("failures") or []]
    if run.get("error"):
        errors.insert(0, {"path": "body", "message": str(run["error"])})
    return {"behaviour": {"ok": bool(run.get("ok")), "errors": errors[:20],
                          "steps": run.get("steps", 0)}}


def _fault_tree(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    """The tree's checks and analysis; evidence names a point of the request and quotes its
    reading; no basic event is named like a gate (``G_``); the basic events name the
    components the request's ``system`` lists (``fault_tree.check_components``)."""
    from rung.daemon.tasks.fault_tree import GATE_PREFIX, analyze_fault_tree, check_components

    points = data.get("points")
    known = [p["name"] for p in points] if isinstance(points, list) else None
    by_name = ({p["name"]: p for p in reversed(points) if isinstance(p, dict)}
               if isinstance(points, list) else None)
    system = data.get("system")
    return {"fault_tree": analyze_fault_tree(output, known_points=known, points=by_name,
                                             gate_prefix=GATE_PREFIX),
            "components": check_components(output, system if isinstance(system, str) else "")}


def expected_state(value: Any, limits: Mapping[str, Any]) -> str | None:
    """normal / alert / alarm from a value and its limits; None when not decidable.

    A number against the numeric limits (``alarm``/``alert`` from above, ``low_alarm``/
    ``low_alert`` from below); a boolean against the boolean ones (a fault flag:
    ``{"alarm": true}`` is in alarm when true, ``{"alert": false}`` in alert when false).
    """
    if not limits:
        return None
    if isinstance(value, bool):
        flags = {k: v for k, v in limits.items() if k in ("alarm", "alert")
                 and isinstance(v, bool)}
        if not flags:
            return None
        return next((k for k in ("alarm", "alert") if k in flags and flags[k] is value),
                    "normal")
    if not isinstance(value, int | float):
        return None
    numeric = {k: v for k, v in limits.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    if not numeric:
        return None
    if ("alarm" in numeric and value >= numeric["alarm"]) or (
            "low_alarm" in numeric and value <= numeric["low_alarm"]):
        return "alarm"
    if ("alert" in numeric and value >= numeric["alert"]) or (
            "low_alert" in numeric and value <= numeric["low_alert"]):
        return "alert"
    return "normal"


def _diagnosis(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    """The answer against what code knows of the request (``daemon/tasks/diagnosis.py``):
    states, evidence, faults, priority, prognosis, the names in free text."""
    from rung.daemon.tasks.diagnosis import check

    return {"diagnosis": check(output, data)}


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
