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

import jsonschema

from rung.daemon.tasks import diagnosis, st_grammar, st_request
from rung.daemon.tasks.fault_tree_shape import fault_tree_shape
from rung.daemon.tasks.names import NamesAt
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


def state_detection(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each point whose state its limits decide, in snapshot order (points without limits,
    or with a value the limits do not judge, are left to the model's assessment)."""
    return diagnosis.states(data)


def _diagnosis(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """What code knows of the snapshot (``daemon/tasks/diagnosis.py``): the states as the
    answer's start; evidence only from the points that are not normal, each once; the
    priorities the worst state allows; the prognosis from the points' history; no fault
    asserted twice (``diagnosis.fault_names_at``)."""
    narrowed, prefix = diagnosis.narrow(schema, data)
    return Shape(narrowed, prefix, names=diagnosis.fault_names_at)


def _fault_tree(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """Every gate under the top, gate and basic-event ids told apart, no reference
    dangling, evidence quoting its point's reading (``daemon/tasks/fault_tree_shape.py``):
    narrowed again after each token with a quote, as the tree is written."""
    narrowed, restage = fault_tree_shape(schema, data)
    return Shape(narrowed, restage=restage, restage_at='"')


def _st(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """Type and name as the request fixes them (or code chooses them: ``_st_prefix``);
    each variable's name one no variable
    before it took (nor a keyword or type name, nor the POU's: ``st_grammar.names_at``);
    once the declarations are written, the body follows the ST grammar over them
    (``st_grammar``): its syntax and names hold."""
    s = copy.deepcopy(schema)
    props = s["properties"]
    # the request's type and name; where it leaves them open and code has something to
    # declare (an interface, a stated value), code's choice (``st_request.pou``)
    chosen = dict(zip(("pou_type", "name"), st_request.pou(data) or (), strict=False))
    for key in ("pou_type", "name"):
        if isinstance(data.get(key), str):
            props[key] = {"const": data[key]}
        elif key in chosen and key in props:
            props[key] = {"const": chosen[key]}
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
    # the numbers and durations the request states are the only ones the answer may write
    numbers = st_request.literals(st_request.read(data))
    if _free_text(item_props.get("initial")):   # a literal of its type, not free text
        variables["items"] = st_grammar.typed_item(item, numbers)
    if not _free_text(props.get("body")):
        return Shape(s, names=st_grammar.names_at)
    required = set(s.get("required") or ())
    after_body = [(k, st_grammar.resolved(props[k], defs), k in required)
                  for k in keys[keys.index("body") + 1:]]

    prefix, setpoints = _st_prefix(s, data)
    # the setpoints code declared hold the request's values: the body reads them, never
    # assigns them
    fixed = [v["name"] for v in setpoints]

    def restage(text: str) -> Lark | None:
        found = st_grammar.head_pou(text)
        body = None if found is None else st_grammar.body_grammar(*found, after_body,
                                                                  numbers, fixed)
        return None if body is None else Lark(body)

    return Shape(s, prefix, restage=restage, restage_at='"', names=st_grammar.names_at)


def _st_prefix(schema: Schema, data: Mapping[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The answer's start when code knows the POU's type and name (the request's, or code's
    choice where the request leaves them open: ``st_request.pou``) and the request states
    an interface or values (``st_request.declared``): type, name, the stated variables and
    a setpoint per stated value, written by code; the model goes on with more variables or
    closes the list; and the setpoints it holds. Only where the schema puts nothing between
    the name and the variables that the answer may need (a FUNCTION's return type), and
    only what the schema's ``variables`` accept (more than its ``maxItems``, a value no
    literal may write: the setpoints are left out, then the interface)."""
    props = schema.get("properties") or {}
    room = (props.get("variables") or {}).get("maxItems") if isinstance(
        props.get("variables"), dict) else None
    interface, setpoints = st_request.declared(
        data, room if isinstance(room, int) and not isinstance(room, bool) else None)
    chosen = st_request.pou(data)
    keys = list(props)
    if (chosen is None or not interface + setpoints or keys[:2] != ["pou_type", "name"]
            or "variables" not in keys):
        return "", []
    between = keys[2:keys.index("variables")]
    if any(k in (schema.get("required") or ()) for k in between):
        return "", []
    accepts = jsonschema.Draft202012Validator(
        {**props["variables"], "$defs": schema.get("$defs") or {}}).is_valid
    for declared, held in ((interface + setpoints, setpoints), (interface, [])):
        if declared and accepts(declared):
            head = compact({"pou_type": chosen[0], "name": chosen[1], "variables": declared})
            return head[:-2], held   # open: the list goes on ("]" or ",{"), the object too
    return "", []


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
