"""A fault-tree answer's shape: what the request fixes and what the answer so far decides,
the grammar enforces (``shaping.Shape``: the narrowed schema and its ``restage``).

The answer is written top-down in the schema's order: ``top``, the gates, the basic events.
Code follows the text (asked after every token that carries a quote) and narrows the
grammar as soon as the text decides something:

- ``top`` is a gate id and the first gate is the top; gate ids start with ``G_``
  (``GATE_PREFIX``), basic event ids never do: a reader, and the checks, tell them apart;
- once a gate's inputs are written, the next gate's id is one of the gate references
  still open (``G_...`` ids a gate so far names and none defines, in the order named),
  and the gates close exactly when none is open: every gate is under the top, and no gate
  is referenced and left unwritten (near the schema's bound on gates, a gate names only as
  many new gates as there is room for). Each gate carries its description here (optional in
  the published schema; the corpus always writes one): there is text between a gate's
  inputs and its end, so this happens before a token such as ``"]}],"`` could close the
  inputs, the gate and the gates at once. (An INHIBIT gate's condition comes before its
  inputs, as the corpus writes it: in the published order the demo model wrote nonsense
  condition ids.)
- the basic events are exactly the ids the gates name and no gate defines, in the order
  named (``declare_referenced``), so no reference dangles; each has exactly one of
  ``probability`` and ``failure_rate``;
- where the request's ``system`` lists components (``fault_tree.system_components``),
  while the events written so far name fewer of them than the ``components`` check needs,
  the next event that is not a state (an INHIBIT condition, a NOT input) starts its
  description with one none of them names yet (``naming_pattern``); decided from the
  events written whole, before the next one's description starts;
- an evidence that cites a point with a reading starts its observation with that reading
  as the prompt shows it (``42.5 A``; the grammar writes it, the model may add
  ``, <note>``), so it cannot quote another value.

Every stage accepts a subset of the published schema's documents; the validators
(``fault_tree.analyze_fault_tree``) stay the judge. A gate input that names an ancestor
(a cycle) is still possible; the validator refuses it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from rung.daemon.tasks.fault_tree.analysis import (
    GATE_PREFIX,
    MIN_COMPONENTS,
    Component,
    named_components,
    point_reading,
    required_components,
    state_events,
    system_components,
)

Schema = dict[str, Any]

GATES_MARK = '"gates":['
EVENTS_MARK = '"basic_events":['
# the ids of the published pattern ^[A-Za-z][A-Za-z0-9_]{0,31}$ (but "G_" alone), told
# apart by GATE_PREFIX; a reference (a gate's input) is either
_GATE_ID = "G_[A-Za-z0-9_]{1,30}"
_EVENT_ID = "[A-FH-Za-z][A-Za-z0-9_]{0,31}|G(?:[A-Za-z0-9][A-Za-z0-9_]{0,30})?"
GATE_ID: Schema = {"type": "string", "pattern": f"^{_GATE_ID}$"}
EVENT_ID: Schema = {"type": "string", "pattern": f"^(?:{_EVENT_ID})$"}
REF_ID: Schema = {"type": "string", "pattern": f"^(?:{_GATE_ID}|{_EVENT_ID})$"}
GATE_REF = {"$ref": "#/$defs/gate"}
_TOP = re.compile(r'\{"top":"([^"\\]*)"')
_ID_KEY = re.compile(r'\{"id":"([^"\\]*)"')   # a gate's start, its id written
_INPUTS = '"inputs":'
_REGEX_SPECIAL = frozenset("\\.^$*+?{}[]|()")

Restage = Callable[[str], Schema | None]


def fault_tree_shape(schema: Schema, data: Mapping[str, Any]) -> tuple[Schema, Restage]:
    """The fault-tree task's schema narrowed by the request, and the restage that narrows
    it further as the answer is written."""
    s = copy.deepcopy(schema)
    props = s["properties"]
    props["top"] = GATE_ID
    event = props["basic_events"]["items"]
    event["properties"]["id"] = EVENT_ID
    event["anyOf"] = [{"required": [number], "properties": {other: False}}
                      for number, other in (("probability", "failure_rate"),
                                            ("failure_rate", "probability"))]
    event["properties"]["evidence"] = _evidence(event["properties"]["evidence"], data)
    gates = props["gates"]
    s.setdefault("$defs", {})["gate"] = {"anyOf": gate_kinds(gates["items"])}
    gates["items"] = GATE_REF
    system = data.get("system")
    components = system_components(system) if isinstance(system, str) else []
    return s, _Stages(s, components if len(components) >= MIN_COMPONENTS else [])


def gate_kinds(gate: Schema) -> list[Schema]:
    """A gate's schema per type, with the arity and fields its type needs: AND/OR at least
    2 inputs; ATLEAST its k; NOT one input; INHIBIT one input and a condition (a basic
    event id, written before the inputs as the corpus writes it); a gate id, each input a
    gate or basic event id, a description always."""
    props = gate["properties"]

    def kind(types: list[str], inputs: tuple[int, int], with_k: bool = False,
             with_condition: bool = False) -> Schema:
        p = {"id": GATE_ID, "type": {"enum": types}}
        if with_k:
            p["k"] = props["k"]
        if with_condition:
            p["condition"] = EVENT_ID
        p["inputs"] = {**props["inputs"], "items": REF_ID, "minItems": inputs[0],
                       "maxItems": inputs[1]}
        p["description"] = {**props["description"], "minLength": 1}
        required = ["id", "type", *(["k"] if with_k else []),
                    *(["condition"] if with_condition else []), "inputs", "description"]
        return {"type": "object", "additionalProperties": False, "required": required,
                "properties": p}

    most = props["inputs"]["maxItems"]
    return [kind(["AND", "OR"], (2, most)), kind(["ATLEAST"], (1, most), with_k=True),
            kind(["NOT"], (1, 1)), kind(["INHIBIT"], (1, 1), with_condition=True)]


def _evidence(evidence: Schema, data: Mapping[str, Any]) -> Schema:
    """Evidence names a point of the request, and an observation of a point with a reading
    starts with it (then ends, or goes on with ``, `` and a note): one whole object per
    point (an ``anyOf`` beside ``properties`` costs llguidance time quadratic in the
    points: 4 s to compile with 100 of them, against 0.1 s so)."""
    points = [p for p in data.get("points") or [] if isinstance(p, dict)
              and isinstance(p.get("name"), str)]
    readings: dict[str, str | None] = {}
    for p in points:
        readings.setdefault(p["name"], point_reading(p))
    if not readings:
        return evidence
    props = evidence["properties"]

    def cites(point: Schema, observation: Schema) -> Schema:
        return {**evidence, "properties": {**props, "point": point,
                                           "observation": observation}}

    free = [name for name, r in readings.items() if r is None]
    return {"anyOf": [cites({"const": name}, {**props["observation"],
                                              "pattern": observation_pattern(r)})
                      for name, r in readings.items() if r is not None]
            + ([cites({"enum": free}, props["observation"])] if free else [])}


def observation_pattern(reading: str) -> str:
    """An observation that starts with ``reading``: it alone, or ``, `` and a note."""
    return f"^{_literal(reading)}(, .*)?$"


class _Stages:
    """The restage of one request's fault tree: the text so far -> the schema its rest
    follows, or None (nothing new). Each stage's schema is built once and then returned as
    the same object, which the runner recognizes as the stage it is in."""

    def __init__(self, schema: Schema, components: list[Component]) -> None:
        self.schema = schema
        self.components = components
        self.need = required_components(len(components)) if components else 0
        self.built: dict[tuple[Any, ...], Schema | None] = {}

    def __call__(self, text: str) -> Schema | None:
        if EVENTS_MARK in text:
            return self._events(text)
        top = _TOP.match(text)
        if top is None:
            return None
        at = text.find(GATES_MARK)
        written, closed = (([], False) if at < 0
                           else _gates_written(text, at + len(GATES_MARK)))
        if closed:
            return None   # nothing new until the basic events
        key = ("gates", top.group(1), tuple((g, tuple(i)) for g, i in written))
        if key not in self.built:
            self.built[key] = self._gates(top.group(1), written)
        return self.built[key]

    def _gates(self, top: str, written: list[tuple[str, list[str]]]) -> Schema | None:
        """The gates after ``written`` (each gate's id and inputs, its inputs closed): the
        next gate's id one of the open references, and as many gates more at least, or
        none more when none is open."""
        declared = [gid for gid, _ in written]
        named = [top] + [ref for _, inputs in written for ref in inputs]
        open_refs = [r for r in dict.fromkeys(named)
                     if r.startswith(GATE_PREFIX) and r not in declared]
        n = len(written)
        if not n and not open_refs:
            return None   # a top that is no gate id: not written under this shape
        gates = dict(self.schema["properties"]["gates"])
        prefix: list[Schema] = [GATE_REF] * n
        if open_refs:
            most = gates["maxItems"]
            # new gate references the next gate may name and still leave room for a gate
            # per reference (the tree's gates are bounded)
            room = most - n - len(open_refs)
            prefix.append(self._named(open_refs, room, declared + open_refs))
            gates.update(prefixItems=prefix, minItems=min(n + len(open_refs), most))
        else:
            gates.update(prefixItems=prefix, items=False, maxItems=n)
        return {**self.schema, "properties": {**self.schema["properties"], "gates": gates}}

    def _named(self, ids: list[str], room: int, gates: list[str]) -> Schema:
        """A gate whose id is one of ``ids``, naming at most ``room`` gates not in
        ``gates`` (with less room than inputs: that many inputs at most; with none, inputs
        only basic events and those gates)."""
        kinds = []
        for k in self.schema["$defs"]["gate"]["anyOf"]:
            props = {**k["properties"], "id": {"enum": ids}}
            inputs = props["inputs"]
            if room <= 0:
                props["inputs"] = {**inputs, "items": {"anyOf": [EVENT_ID, {"enum": gates}]}}
            elif room < inputs["maxItems"]:
                if inputs["minItems"] > room:
                    continue
                props["inputs"] = {**inputs, "maxItems": room}
            kinds.append({**k, "properties": props})
        return {"anyOf": kinds}

    def _events(self, text: str) -> Schema | None:
        head = _head(text)
        if head is None:
            return None
        needed = referenced(head)
        names = self._to_name(head, needed, text)
        key = ("events", *needed, names)
        if key not in self.built:
            self.built[key] = declare_referenced(self.schema, needed, names)
        return self.built[key]

    def _to_name(self, head: Mapping[str, Any], needed: list[str],
                 text: str) -> tuple[int, tuple[str, ...]] | None:
        """While the events written so far name fewer of the system's components than the
        check needs: the next event (unless it stands for a state) and the components its
        description may start with, those none of them names yet."""
        if not self.need:
            return None
        written = _events_written(text)
        named: set[int] = set()
        for e in written:
            named |= named_components(str(e.get("description", "")), self.components)
        k = len(written)
        if len(named) >= self.need or k >= len(needed) or needed[k] in state_events(head):
            return None
        return k, tuple(c.name for i, c in enumerate(self.components) if i not in named)


def _events_written(text: str) -> list[dict[str, Any]]:
    """The basic events the text has written whole (past ``EVENTS_MARK``)."""
    events, _, _ = _whole_items(text, text.find(EVENTS_MARK) + len(EVENTS_MARK))
    return [e for e in events if isinstance(e, dict)]


def _whole_items(text: str, at: int) -> tuple[list[Any], int, bool]:
    """The items of the JSON array whose text starts at ``at`` (past its ``[``) that are
    written whole, where the whole ones end, and whether the array is closed."""
    decoder = json.JSONDecoder()
    items: list[Any] = []
    i = at
    while i < len(text):
        if text[i] == "]":
            return items, i, True
        if text[i] in ", ":
            i += 1
            continue
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        items.append(item)
    return items, i, False


def naming_pattern(names: tuple[str, ...]) -> str:
    """A description that starts with one of ``names`` (its first letter either case)."""
    def one(name: str) -> str:
        first, rest = name[0], _literal(name[1:])
        head = f"[{first.upper()}{first.lower()}]" if first.isalpha() else _literal(first)
        return head + rest
    return f"^(?:{'|'.join(one(n) for n in names)})([ ,;:.'/-].*)?$"


def _literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def _gates_written(text: str, at: int) -> tuple[list[tuple[str, list[str]]], bool]:
    """From the text of the gates array (from ``at``, past its ``[``): the gates whose
    inputs are written (each one's id and inputs), and whether the array is closed."""
    gates, i, closed = _whole_items(text, at)
    written = [(str(g.get("id")), _ids(g.get("inputs"))) for g in gates if isinstance(g, dict)]
    if closed:
        return written, True
    rest = text[i:]
    gid = _ID_KEY.match(rest)
    cut = rest.find(_INPUTS + "[")
    if gid is not None and cut >= 0:
        try:
            inputs, _ = json.JSONDecoder().raw_decode(rest, cut + len(_INPUTS))
        except json.JSONDecodeError:
            return written, False
        written.append((gid.group(1), _ids(inputs)))
    return written, False


def _ids(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _head(text: str) -> dict[str, Any] | None:
    """The answer up to its basic events, as an object (None: not there yet)."""
    cut = text.find(EVENTS_MARK)   # the token that closed it may carry more ('[{"')
    if cut < 0:
        return None
    try:
        head = json.loads(text[:cut].rstrip(",") + "}")
    except json.JSONDecodeError:
        return None
    return head if isinstance(head, dict) else None


def referenced(head: Mapping[str, Any]) -> list[str]:
    """The ids the top and the gates name that no gate declares, in the order named."""
    gates = [g for g in head.get("gates") or [] if isinstance(g, dict)]
    declared = {g.get("id") for g in gates}
    named = [head.get("top")] + [ref for g in gates
                                 for ref in [*_ids(g.get("inputs")), g.get("condition")]]
    return [r for r in dict.fromkeys(named) if isinstance(r, str) and r not in declared]


def declare_referenced(schema: Schema, needed: list[str],
                       names: tuple[int, tuple[str, ...]] | None = None) -> Schema | None:
    """The basic events exactly ``needed``, in that order, so no reference can dangle.
    (Under this shape they are never gate ids: the gates close only when every gate
    reference is written.) ``names``: an event's index and the components its description
    starts with (``naming_pattern``)."""
    if not needed:
        return None
    s = copy.deepcopy(schema)
    events = s["properties"]["basic_events"]
    item = events.pop("items")
    events["prefixItems"] = [
        {**item, "properties": {**item["properties"], "id": {"const": r}}} for r in needed]
    if names is not None:
        k, components = names
        props = events["prefixItems"][k]["properties"]
        props["description"] = {**props["description"], "pattern": naming_pattern(components)}
    events["items"] = False
    events["minItems"] = events["maxItems"] = len(needed)
    return s
