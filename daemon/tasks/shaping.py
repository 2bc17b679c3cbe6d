"""Per-request output shapes: what the request fixes, the grammar enforces, and what code
can compute, code writes.

A task's published output schema is the contract; a request narrows it. For each task a
shaper (a table, keyed by validator) turns the request's input into a ``Shape``:

- ``schema``: the task's output schema specialized to this input, so whole classes of
  wrong answers cannot be generated (names that must come from the input are enums of the
  input's names; values the input states are constants);
- ``prefix``: the start of the answer, computed by code and fed to the model as prompt
  (one prefill, no decode steps): the diagnosis's state detection is the snapshot's
  values against their limits (ISO 13374 puts it below health assessment), so answer and
  snapshot cannot disagree.

The answer is always a document of the published schema (a narrowed schema accepts a
subset of it); the validators stay the judge.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rung.daemon.tasks.validate import expected_state

Schema = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    schema: Schema
    prefix: str = ""      # compact JSON the answer starts with (computed by code)


def compact(value: Any) -> str:
    """JSON as the grammar writes it (no whitespace)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _point_names(data: Mapping[str, Any]) -> list[str]:
    points = data.get("points")
    if not isinstance(points, list):
        return []
    names = [p["name"] for p in points if isinstance(p, dict) and isinstance(p.get("name"), str)]
    return list(dict.fromkeys(names))


def state_detection(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each point whose state its limits decide, in snapshot order (points without limits,
    or with a non-numeric value, are left to the model's assessment)."""
    out = []
    for p in data.get("points") or []:
        state = expected_state(p.get("value"), p.get("limits") or {})
        if state is not None:
            out.append({"point": p["name"], "state": state})
    return out


def _diagnosis(schema: Schema, data: Mapping[str, Any]) -> Shape:
    s = copy.deepcopy(schema)
    names = _point_names(data)
    props = s["properties"]
    if names:
        evidence = props["health_assessment"]["items"]["properties"]["evidence"]
        evidence["items"] = {"enum": names}
    states = state_detection(data)
    props["state_detection"] = {"const": states}
    return Shape(s, '{"state_detection":' + compact(states) + ",")


def _fault_tree(schema: Schema, data: Mapping[str, Any]) -> Shape:
    names = _point_names(data)
    if not names:
        return Shape(schema)
    s = copy.deepcopy(schema)
    event = s["properties"]["basic_events"]["items"]["properties"]
    event["evidence"]["properties"]["point"] = {"enum": names}
    return Shape(s)


def _st(schema: Schema, data: Mapping[str, Any]) -> Shape:
    s = copy.deepcopy(schema)
    props = s["properties"]
    for key in ("pou_type", "name"):
        if isinstance(data.get(key), str):
            props[key] = {"const": data[key]}
    return Shape(s)


# the task's semantic validator names the kind of answer it is
SHAPERS: dict[str, Callable[[Schema, Mapping[str, Any]], Shape]] = {
    "diagnosis": _diagnosis, "fault_tree": _fault_tree, "st": _st}


def shape(schema: Schema, validators: tuple[str, ...], data: Any) -> Shape:
    """The output shape for one request (the task's own schema when nothing narrows it)."""
    if not isinstance(data, Mapping):
        return Shape(schema)
    for name in validators:
        shaper = SHAPERS.get(name)
        if shaper is not None:
            return shaper(schema, data)
    return Shape(schema)
