"""An ST request's output shape (``shaping.Shape``): the POU's type and name as the request
fixes them (or code chooses them), each variable's name new and its initial value a literal
of its type, the answer's start written by code where the request states an interface or
values, and the body under the ST grammar over the declarations just written
(``grammar``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonschema

from rung.daemon.tasks.shaping import Schema, Shape, compact
from rung.daemon.tasks.st import grammar, request
from rung.engines.grammar import Lark

# the variables an answer may declare beyond the stated interface and the setpoints (the
# corpus answers declare at most 13)
OWN_VARIABLES = 16


def shape(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """Type and name as the request fixes them (or code chooses them: ``_prefix``);
    each variable's name one no variable
    before it took (nor a keyword or type name, nor the POU's: ``grammar.names_at``);
    once the declarations are written, the body follows the ST grammar over them
    (``grammar``): its syntax and names hold."""
    s = copy.deepcopy(schema)
    props = s["properties"]
    # the request's type and name; where it leaves them open and code has something to
    # declare (an interface, a stated value), code's choice (``request.pou``)
    chosen = dict(zip(("pou_type", "name"), request.pou(data) or (), strict=False))
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
    item = grammar.resolved(raw_item, defs)
    item_props = item.get("properties") or {}
    if not _free_text(item_props.get("name")):
        return Shape(s)
    # the numbers and durations the request states are the only ones the answer may write
    stated = request.read(data)
    numbers, durations = request.literals(stated), request.durations(stated)
    if _free_text(item_props.get("initial")):   # a literal of its type, not free text
        variables["items"] = grammar.typed_item(item, numbers, durations)
    if not _free_text(props.get("body")):
        return Shape(s, names=grammar.names_at)
    required = set(s.get("required") or ())
    after_body = [(k, grammar.resolved(props[k], defs), k in required)
                  for k in keys[keys.index("body") + 1:]]

    prefix, setpoints = _prefix(s, data)
    stated_interface = request.interface(data)
    if prefix and _free_text(item_props.get("initial")):
        # past what code declared, the model's own variables: none holds a value a setpoint
        # holds, nor says it was stated (a copy beside the setpoint, read in its place)
        written = len(stated_interface) + len(setpoints)
        variables["prefixItems"] = [variables["items"]] * written
        variables["items"] = _own_item(item, numbers, durations, setpoints)
    # the setpoints code declared hold the request's values: the body reads them, never
    # assigns them
    fixed = [v["name"] for v in setpoints]
    # room for the model's own variables beside what the request states: more than any
    # taught answer declares, so a model that repeats declarations closes the list and
    # still has the tokens to write the body
    most = len(stated_interface) + len(setpoints) + OWN_VARIABLES
    if not isinstance(variables.get("maxItems"), int) or variables["maxItems"] > most:
        variables["maxItems"] = most

    def restage(text: str) -> Lark | None:
        found = grammar.head_pou(text)
        body = None if found is None else grammar.body_grammar(*found, after_body,
                                                                  numbers, fixed, durations)
        return None if body is None else Lark(body)

    # asked at each bracket: the body's grammar from the one that closes the declarations
    return Shape(s, prefix, restage=restage, restage_at="]", names=grammar.names_at)


def _prefix(schema: Schema, data: Mapping[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The answer's start when code knows the POU's type and name (the request's, or code's
    choice where the request leaves them open: ``request.pou``) and the request states
    an interface or values (``request.declared``): type, name, the stated variables and
    a setpoint per stated value, written by code; the model goes on with more variables or
    closes the list; and the setpoints it holds. Only where the schema puts nothing between
    the name and the variables that the answer may need (a FUNCTION's return type), and
    only what the schema's ``variables`` accept (more than its ``maxItems``, a value no
    literal may write: the setpoints are left out, then the interface)."""
    props = schema.get("properties") or {}
    room = (props.get("variables") or {}).get("maxItems") if isinstance(
        props.get("variables"), dict) else None
    interface, setpoints = request.declared(
        data, room if isinstance(room, int) and not isinstance(room, bool) else None)
    chosen = request.pou(data)
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


# a comment that does not start with "stated:" (the mark of a setpoint code declares)
_NOT_STATED = (r"^([^s].*|s([^t].*)?|st([^a].*)?|sta([^t].*)?|stat([^e].*)?|state([^d].*)?"
               r"|stated[^:].*)?$")


def _own_item(item: Mapping[str, Any], numbers: list[str], durations: list[str],
              setpoints: list[dict[str, str]]) -> dict[str, Any]:
    """A variable the model declares after code's: its initial value a literal of its type
    that no setpoint holds, its comment not one that says the value was stated."""
    held = {float(v["initial"]) for v in setpoints if v["type"] != "TIME"}
    seconds = {round(request.time_seconds(v["initial"]), 6) for v in setpoints
               if v["type"] == "TIME"}
    own = grammar.typed_item(
        item, [n for n in numbers if float(n) not in held],
        [d for d in durations if round(request.time_seconds(d), 6) not in seconds])
    for branch in own["anyOf"]:
        props = branch["properties"]
        if isinstance(props.get("comment"), dict):
            props["comment"] = {**props["comment"], "pattern": _NOT_STATED}
    return own


def _free_text(schema: Any) -> bool:
    """A schema for a string the model writes freely (not fixed by a const or an enum)."""
    return (isinstance(schema, dict) and schema.get("type") == "string"
            and not {"const", "enum"} & set(schema))

