"""Validation of a task's output after decoding: the JSON Schema, then the validator of the
task's kind (``kind.Kind``; the kinds' own sections are listed in docs/tasks.md). Each
contributes named sections to one ``validation`` object, every section ``{"ok": bool,
"errors": [...]}`` (plus what it computed); ``schema`` is jsonschema against the task's
output schema. What a schema error says (``schema_message``) is said here for every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

from rung.daemon.tasks.kind import Kind, Section


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


def validate_output(schema: Mapping[str, Any], kind: Kind, output: Any,
                    data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(all ok, the validation object). The kind's validator runs on schema-valid output."""
    validation: dict[str, Any] = {"schema": check_schema(schema, output)}
    if validation["schema"]["ok"]:
        validation.update(kind.validate(output, data))
    ok = all(s.get("ok", True) for s in validation.values()
             if isinstance(s, dict) and not s.get("advisory"))
    return ok, validation
