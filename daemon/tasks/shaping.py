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

from rung.daemon.tasks import st_grammar
from rung.daemon.tasks.names import NamesAt
from rung.daemon.tasks.validate import expected_state
from rung.engines.grammar import Lark

Schema = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    schema: Schema
    prefix: str = ""      # compact JSON the answer starts with (computed by code)
    # (the answer's text so far) -> the schema or grammar the whole answer must follow,
    # once the text decides it (None: nothing new); applied each time it says something new
    restage: Callable[[str], Schema | Lark | None] | None = None
    restage_at: str = "["   # asked only after a token carrying this character
    # names the answer declares that must be new (``names.NameGuard``): at such a name,
    # what of it is written and the names it may not be
    names: NamesAt | None = None


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


EVENTS_MARK = '"basic_events":['


def _fault_tree(schema: Schema, data: Mapping[str, Any]) -> Shape:
    s = copy.deepcopy(schema)
    names = _point_names(data)
    if names:
        event = s["properties"]["basic_events"]["items"]["properties"]
        event["evidence"]["properties"]["point"] = {"enum": names}
    gates = s["properties"]["gates"]
    gates["items"] = {"anyOf": _gate_kinds(gates["items"])}
    return Shape(s, restage=lambda text: _declare_referenced(s, text))


def _gate_kinds(gate: Schema) -> list[Schema]:
    """A gate's schema per type, with the arity and fields its type needs: AND/OR at least
    2 inputs; ATLEAST its k; NOT one input; INHIBIT one input and a condition."""
    props = gate["properties"]

    def kind(types: list[str], inputs: tuple[int, int], with_k: bool = False,
             with_condition: bool = False) -> Schema:
        p = {"id": props["id"], "type": {"enum": types}}
        if with_k:
            p["k"] = props["k"]
        p["inputs"] = {**props["inputs"], "minItems": inputs[0], "maxItems": inputs[1]}
        if with_condition:
            p["condition"] = props["condition"]
        p["description"] = props["description"]
        required = ["id", "type", *(["k"] if with_k else []), "inputs",
                    *(["condition"] if with_condition else [])]
        return {"type": "object", "additionalProperties": False, "required": required,
                "properties": p}

    most = props["inputs"]["maxItems"]
    return [kind(["AND", "OR"], (2, most)), kind(["ATLEAST"], (1, most), with_k=True),
            kind(["NOT"], (1, 1)), kind(["INHIBIT"], (1, 1), with_condition=True)]


def _declare_referenced(schema: Schema, text: str) -> Schema | None:
    """Once the gates are written (the text reaches ``"basic_events":[``): the basic
    events must be exactly the ids the top and the gates name that no gate declares, in
    the order they were named, so no reference can dangle. (A gate input meant as a gate
    that was never written becomes an undeveloped basic event.)"""
    cut = text.find(EVENTS_MARK)   # the token that closed it may carry more ('[{"')
    if cut < 0:
        return None
    try:
        head = json.loads(text[:cut].rstrip(",") + "}")
    except json.JSONDecodeError:
        return None
    gates = head.get("gates") or []
    declared = {g.get("id") for g in gates}
    named = [head.get("top")] + [ref for g in gates
                                 for ref in [*g.get("inputs", []), g.get("condition")]]
    needed = [r for r in dict.fromkeys(named) if isinstance(r, str) and r not in declared]
    if not needed:
        return None
    s = copy.deepcopy(schema)
    events = s["properties"]["basic_events"]
    item = events.pop("items")
    events["prefixItems"] = [
        {**item, "properties": {**item["properties"], "id": {"const": r}}} for r in needed]
    events["items"] = False
    events["minItems"] = events["maxItems"] = len(needed)
    return s


def _st(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """Type and name as the request fixes them; each variable's name one no variable
    before it took (nor a keyword or type name, nor the POU's: ``st_grammar.names_at``);
    once the declarations are written, the body follows the ST grammar over them
    (``st_grammar``): its syntax and names hold."""
    s = copy.deepcopy(schema)
    props = s["properties"]
    for key in ("pou_type", "name"):
        if isinstance(data.get(key), str):
            props[key] = {"const": data[key]}
    keys = list(props)
    defs = s.get("$defs") or {}
    variables = props.get("variables")
    raw_item = variables.get("items") if isinstance(variables, dict) else None
    # the grammar takes over only where the schema leaves text free: a schema that fixes
    # the names or the body (a const, an enum) keeps them as it says
    if not (isinstance(raw_item, dict) and "body" in keys):
        return Shape(s)
    item = st_grammar.resolved(raw_item, defs)
    item_props = item.get("properties") or {}
    if not _free_text(item_props.get("name")):
        return Shape(s)
    if _free_text(item_props.get("initial")):   # a literal, not free text after ':='
        item_props["initial"] = {**item_props["initial"],
                                 "pattern": st_grammar.LITERAL_PATTERN}
        variables["items"] = item
    if not _free_text(props.get("body")):
        return Shape(s, names=st_grammar.names_at)
    required = set(s.get("required") or ())
    after_body = [(k, st_grammar.resolved(props[k], defs), k in required)
                  for k in keys[keys.index("body") + 1:]]

    def restage(text: str) -> Lark | None:
        found = st_grammar.head_pou(text)
        body = None if found is None else st_grammar.body_grammar(*found, after_body)
        return None if body is None else Lark(body)

    return Shape(s, restage=restage, restage_at='"', names=st_grammar.names_at)


def _free_text(schema: Any) -> bool:
    """A schema for a string the model writes freely (not fixed by a const or an enum)."""
    return (isinstance(schema, dict) and schema.get("type") == "string"
            and not {"const", "enum"} & set(schema))


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
