"""Fault-tree checks and analysis for the fault-tree task's JSON answers.

A model answers an engineer with a fault tree as a JSON object (already valid against the
task's JSON schema when it reaches this module)::

    {"top": "G_TOP", "description": "...", "mission_time_h": 8760,
     "gates": [{"id": "G_TOP", "type": "OR", "inputs": ["G1", "E_LEAK"]}, ...],
     "basic_events": [{"id": "E_LEAK", "probability": 0.01, "evidence": {...}}, ...]}

:func:`analyze_fault_tree` checks what a schema cannot (references, cycles, gates the top
does not reach, gate arities, probabilities, evidence points and the readings they quote,
basic events named like gates) and, for a sound tree, computes

* the exact top-event probability for independent basic events, from a reduced ordered BDD
  (the ``dd`` package, pure-Python ``dd.autoref`` backend): no rare-event or min-cut
  approximation, shared events and NOT gates handled exactly;
* the minimal cut sets of the top event, as the prime implicants of its BDD (Coudert &
  Madre's recursion). For a coherent tree (a monotone top function) these are the classic
  minimal cut sets. For a non-coherent tree (NOT gates that matter) they are the prime
  implicants, in which a negated literal is written ``"NOT E4"`` ("E4 does not occur");
* for coherent trees, the rare-event approximation (sum over the minimal cut sets of the
  product of their event probabilities), which engineers often quote.

Cut-set enumeration is bounded (``max_cut_sets`` sets, ``max_order`` events per set); past
a bound the answer lists the sets it could list, says so in a warning and sets
``cut_sets_complete`` to false. The exact probability does not depend on those bounds.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from dd.autoref import BDD, Function

__all__ = [
    "DEFAULT_MISSION_TIME_H",
    "GATE_PREFIX",
    "GATE_TYPES",
    "MAX_BDD_NODES",
    "MAX_CUT_SETS",
    "MAX_CUT_SET_ORDER",
    "MAX_REQUIRED",
    "MIN_COMPONENTS",
    "Component",
    "analyze_fault_tree",
    "check_components",
    "named_components",
    "point_reading",
    "required_components",
    "state_events",
    "system_components",
]

DEFAULT_MISSION_TIME_H: Final = 8760.0
"""Mission time for events given by a failure rate when the tree names none (one year)."""
MAX_CUT_SETS: Final = 10_000
"""Default bound on the number of cut sets (and on any intermediate set while computing)."""
MAX_CUT_SET_ORDER: Final = 8
"""Default bound on the number of events (literals) in one cut set."""
MAX_BDD_NODES: Final = 500_000
"""Past this many BDD nodes the computation stops (results null, with a warning)."""
MAX_EVENTS: Final = 400
"""Past this many basic events under the top the computation is not attempted."""

GATE_TYPES: Final = ("AND", "OR", "ATLEAST", "NOT", "INHIBIT")
GATE_PREFIX: Final = "G_"
"""The fault-tree task names its gates ``G_...`` and no basic event so (the validator is
told with ``gate_prefix``; the request's grammar writes gate ids only so)."""

_CREATED_PER_SET: Final = 10  # cubes built while enumerating, per cube allowed in the answer

_Issue = dict[str, str]
_Literal = tuple[str, bool]  # (basic event id, True for "occurs", False for "NOT")
_Cube = frozenset[_Literal]


def analyze_fault_tree(
    tree: Mapping[str, Any],
    known_points: Collection[str] | None = None,
    *,
    points: Mapping[str, Mapping[str, Any]] | None = None,
    gate_prefix: str | None = None,
    max_cut_sets: int = MAX_CUT_SETS,
    max_order: int = MAX_CUT_SET_ORDER,
) -> dict[str, Any]:
    """Check a fault tree and compute its minimal cut sets and exact top-event probability.

    Args:
        tree: the fault-tree object (``top``, ``gates``, ``basic_events``, optional
            ``mission_time_h``, ``description``).
        known_points: the data points evidence may cite; when given, an evidence ``point``
            not in it is an error. ``None`` skips that check.
        points: the input's points by name (``value``, ``unit``); an evidence that cites
            one with a reading (:func:`point_reading`) must start its ``observation`` with
            it: the same number within the precision it is written with, and the unit.
        gate_prefix: when given, a basic event whose id starts with it is an error (it is
            named like a gate: mostly a gate referenced and never written).
        max_cut_sets: most cut sets listed (also bounds intermediate sets).
        max_order: most events in a listed cut set.

    Returns:
        A JSON-ready dict:

        * ``ok``: no errors.
        * ``errors`` / ``warnings``: lists of ``{"path": "gates[2].inputs[1]", "message"}``.
          A gate the top does not reach is an error, an unreachable basic event a warning.
        * ``minimal_cut_sets``: lists of event ids (each sorted by id), sorted by size then
          lexicographically; for a non-coherent tree, prime implicants whose negated
          literals read ``"NOT <id>"``. ``[]``: the top event cannot occur; ``[[]]``: it
          always occurs. ``null`` when there are errors or the bounds left nothing sound.
        * ``cut_set_kind``: ``"minimal_cut_sets"`` or ``"prime_implicants"`` (non-coherent).
        * ``cut_sets_complete``: false when a bound cut the enumeration short.
        * ``coherent``: whether the top event is a monotone function of the basic events.
        * ``top_probability``: exact, for independent basic events.
        * ``rare_event_approximation``: sum over the listed minimal cut sets of the product
          of their probabilities (coherent trees only, else ``null``).
        * ``basic_event_probabilities``: ``{id: p}`` for every basic event whose numbers are
          valid (failure rates converted with ``1 - exp(-rate * mission_time_h)``).
    """
    checker = _Checker(tree, known_points, points, gate_prefix)
    checker.run()
    result: dict[str, Any] = {
        "ok": not checker.errors,
        "errors": checker.errors,
        "warnings": checker.warnings,
        "minimal_cut_sets": None,
        "cut_set_kind": None,
        "cut_sets_complete": None,
        "coherent": None,
        "top_probability": None,
        "rare_event_approximation": None,
        "basic_event_probabilities": dict(checker.probabilities),
    }
    if checker.errors:
        return result
    _compute(checker, result, max_cut_sets=max(1, max_cut_sets), max_order=max(1, max_order))
    return result


# --------------------------------------------------------------------------------------------
# Checks


class _Gate:
    __slots__ = ("condition", "gid", "inputs", "k", "path", "type")

    def __init__(self, gid: str, path: str, gtype: str, inputs: list[str], k: int,
                 condition: str | None) -> None:
        self.gid, self.path, self.type = gid, path, gtype
        self.inputs, self.k, self.condition = inputs, k, condition


class _Checker:
    """Collects errors and warnings, and the well-formed gates and events for the analysis."""

    def __init__(self, tree: Mapping[str, Any], known_points: Collection[str] | None,
                 points: Mapping[str, Mapping[str, Any]] | None = None,
                 gate_prefix: str | None = None) -> None:
        self.tree = tree
        self.known_points = None if known_points is None else frozenset(known_points)
        self.points = points or {}
        self.gate_prefix = gate_prefix
        self.errors: list[_Issue] = []
        self.warnings: list[_Issue] = []
        self.gates: dict[str, _Gate] = {}  # first definition of each gate id
        self.events: dict[str, str] = {}  # basic event id -> its path (first definition)
        self.probabilities: dict[str, float] = {}
        self.top: str | None = None

    def error(self, path: str, message: str) -> None:
        self.errors.append({"path": path, "message": message})

    def warn(self, path: str, message: str) -> None:
        self.warnings.append({"path": path, "message": message})

    def run(self) -> None:
        gates = self._list("gates")
        events = self._list("basic_events")
        self._collect_ids(gates, events)
        self._check_top()
        for i, g in enumerate(gates):
            self._check_gate(i, g)
        self._check_events(events)
        self._check_cycles()
        self._check_reachability()

    def _list(self, key: str) -> list[Any]:
        value = self.tree.get(key, [])
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            return list(value)
        self.error(key, f"'{key}' must be a list")
        return []

    def _collect_ids(self, gates: list[Any], events: list[Any]) -> None:
        seen: dict[str, str] = {}
        for key, items in (("gates", gates), ("basic_events", events)):
            for i, item in enumerate(items):
                path = f"{key}[{i}]"
                if not isinstance(item, Mapping):
                    self.error(path, "must be an object")
                    continue
                nid = item.get("id")
                if not isinstance(nid, str) or not nid:
                    self.error(f"{path}.id", "id must be a non-empty string")
                    continue
                if nid in seen:
                    self.error(f"{path}.id", f"duplicate id '{nid}' (first defined at "
                                             f"{seen[nid]})")
                    continue
                seen[nid] = path
                if key == "basic_events":
                    self.events[nid] = path
                    if self.gate_prefix and nid.startswith(self.gate_prefix):
                        self.error(f"{path}.id", f"basic event '{nid}' is named like a gate "
                                                 f"({self.gate_prefix}...): a gate "
                                                 "referenced and never written?")
                else:
                    # Placeholder; filled by _check_gate (keeps first-definition order).
                    self.gates[nid] = _Gate(nid, path, "", [], 0, None)

    def _check_top(self) -> None:
        top = self.tree.get("top")
        if not isinstance(top, str) or not top:
            self.error("top", "top must be the id of a gate or basic event")
        elif top not in self.gates and top not in self.events:
            self.error("top", f"top '{top}' is not defined as a gate or basic event")
        else:
            self.top = top

    def _check_gate(self, i: int, g: Any) -> None:
        path = f"gates[{i}]"
        if not isinstance(g, Mapping):
            return  # reported by _collect_ids
        gid = g.get("id")
        gate = self.gates.get(gid) if isinstance(gid, str) else None
        if gate is not None and gate.path != path:
            gate = None  # a duplicate: its references are still checked below
        gtype = g.get("type")
        if gtype not in GATE_TYPES:
            self.error(f"{path}.type", f"unknown gate type {gtype!r} (expected one of "
                                       f"{', '.join(GATE_TYPES)})")
        raw_inputs = g.get("inputs")
        inputs: list[str] = []
        n = 0
        if not isinstance(raw_inputs, Sequence) or isinstance(raw_inputs, str | bytes):
            self.error(f"{path}.inputs", "inputs must be a list of ids")
        else:
            n = len(raw_inputs)
            seen: set[str] = set()
            for j, ref in enumerate(raw_inputs):
                ipath = f"{path}.inputs[{j}]"
                if not isinstance(ref, str):
                    self.error(ipath, "input must be an id (string)")
                    continue
                if ref not in self.gates and ref not in self.events:
                    self.error(ipath, f"'{ref}' names no gate or basic event")
                if ref in seen:
                    self.warn(ipath, f"'{ref}' is listed twice among the inputs of '{gid}'")
                seen.add(ref)
                inputs.append(ref)
        k = 0
        condition: str | None = None
        if gtype in ("AND", "OR") and n < 2:
            self.error(f"{path}.inputs", f"{gtype} gate '{gid}' needs at least 2 inputs, "
                                         f"has {n}")
        elif gtype in ("NOT", "INHIBIT") and n != 1:
            self.error(f"{path}.inputs", f"{gtype} gate '{gid}' needs exactly 1 input, "
                                         f"has {n}")
        if gtype == "ATLEAST":
            raw_k = g.get("k")
            if isinstance(raw_k, bool) or not isinstance(raw_k, int):
                self.error(f"{path}.k", f"ATLEAST gate '{gid}' needs an integer k")
            elif n < 1:
                self.error(f"{path}.inputs", f"ATLEAST gate '{gid}' has no inputs")
            elif raw_k < 1 or raw_k > n:
                self.error(f"{path}.k", f"k = {raw_k} is out of range for ATLEAST gate "
                                        f"'{gid}' with {n} inputs (need 1 <= k <= {n})")
            else:
                k = raw_k
        elif "k" in g and gtype in GATE_TYPES:
            self.warn(f"{path}.k", f"k is ignored on a {gtype} gate")
        raw_cond = g.get("condition")
        if gtype == "INHIBIT":
            if raw_cond is None:
                self.error(f"{path}.condition", f"INHIBIT gate '{gid}' needs a condition "
                                                "(a basic event)")
            elif not isinstance(raw_cond, str):
                self.error(f"{path}.condition", "condition must be a basic event id")
            elif raw_cond in self.gates:
                self.error(f"{path}.condition", f"condition '{raw_cond}' is a gate; it must "
                                                "be a basic event")
            elif raw_cond not in self.events:
                self.error(f"{path}.condition", f"'{raw_cond}' names no basic event")
            else:
                condition = raw_cond
        elif raw_cond is not None and gtype in GATE_TYPES:
            self.warn(f"{path}.condition", f"condition is ignored on a {gtype} gate")
        if gate is not None and isinstance(gtype, str):
            gate.type, gate.inputs, gate.k, gate.condition = gtype, inputs, k, condition

    def _check_events(self, events: list[Any]) -> None:
        mission = self.tree.get("mission_time_h")
        mission_ok = True
        if mission is None:
            mission_h = DEFAULT_MISSION_TIME_H
        elif _is_number(mission) and math.isfinite(mission) and mission > 0:
            mission_h = float(mission)
        else:
            self.error("mission_time_h", f"mission_time_h must be a positive number of hours, "
                                         f"got {mission!r}")
            mission_ok, mission_h = False, DEFAULT_MISSION_TIME_H
        rate_without_mission = ""
        for i, e in enumerate(events):
            path = f"basic_events[{i}]"
            if not isinstance(e, Mapping):
                continue
            eid = e.get("id")
            first = isinstance(eid, str) and self.events.get(eid) == path
            has_p, has_rate = "probability" in e, "failure_rate" in e
            if has_p == has_rate:
                which = "both" if has_p else "neither"
                self.error(path, f"basic event '{eid}' has {which} of probability and "
                                 "failure_rate (exactly one is required)")
            elif has_p:
                p = e["probability"]
                if not _is_number(p) or not 0.0 <= p <= 1.0:
                    self.error(f"{path}.probability", f"probability of '{eid}' must be a "
                                                      f"number in [0, 1], got {p!r}")
                elif first:
                    self.probabilities[str(eid)] = float(p)
            else:
                rate = e["failure_rate"]
                if not _is_number(rate) or not math.isfinite(rate) or rate < 0:
                    self.error(f"{path}.failure_rate", f"failure_rate of '{eid}' must be a "
                                                       f"number >= 0 per hour, got {rate!r}")
                elif first and mission_ok:
                    self.probabilities[str(eid)] = -math.expm1(-float(rate) * mission_h)
                    if mission is None and not rate_without_mission:
                        rate_without_mission = str(eid)
            self._check_evidence(path, e)
        if rate_without_mission:
            self.warn("mission_time_h", f"no mission_time_h: failure rates (e.g. of "
                                        f"'{rate_without_mission}') are converted over "
                                        f"{DEFAULT_MISSION_TIME_H:g} h")

    def _check_evidence(self, path: str, e: Mapping[str, Any]) -> None:
        evidence = e.get("evidence")
        if evidence is None:
            return
        if not isinstance(evidence, Mapping):
            self.error(f"{path}.evidence", "evidence must be an object")
            return
        point = evidence.get("point")
        if not isinstance(point, str):
            self.error(f"{path}.evidence.point", "evidence needs a point (string)")
        elif self.known_points is not None and point not in self.known_points:
            self.error(f"{path}.evidence.point", f"evidence point '{point}' is not a known "
                                                 "data point")
        elif point in self.points:
            observation = evidence.get("observation")
            wrong = _misquoted(observation if isinstance(observation, str) else "",
                               self.points[point])
            if wrong:
                self.error(f"{path}.evidence.observation", f"{point}: {wrong}")

    def _check_cycles(self) -> None:
        """Report each cycle among gates once, at the input that closes it."""
        state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
        reported: set[frozenset[str]] = set()
        for root in self.gates:
            if root in state:
                continue
            stack: list[tuple[str, Iterator[tuple[int, str]]]] = [
                (root, iter(enumerate(self.gates[root].inputs)))]
            on_path = [root]
            state[root] = 1
            while stack:
                gid, it = stack[-1]
                step = next(it, None)
                if step is None:
                    stack.pop()
                    on_path.pop()
                    state[gid] = 2
                    continue
                j, child = step
                if child not in self.gates:
                    continue
                if state.get(child) == 1:
                    cycle = on_path[on_path.index(child):] + [child]
                    key = frozenset(cycle)
                    if key not in reported:
                        reported.add(key)
                        self.error(f"{self.gates[gid].path}.inputs[{j}]",
                                   "cycle: " + " -> ".join(cycle))
                elif child not in state:
                    state[child] = 1
                    on_path.append(child)
                    stack.append((child, iter(enumerate(self.gates[child].inputs))))

    def _check_reachability(self) -> None:
        if self.top is None:
            return
        reached = {self.top}
        todo = [self.top]
        while todo:
            gate = self.gates.get(todo.pop())
            if gate is None:
                continue
            refs = gate.inputs + ([gate.condition] if gate.condition else [])
            for ref in refs:
                if ref not in reached:
                    reached.add(ref)
                    todo.append(ref)
        for gid, gate in self.gates.items():
            if gid not in reached:
                self.error(gate.path, f"gate '{gid}' is not reachable from top '{self.top}'")
        for eid, path in self.events.items():
            if eid not in reached:
                self.warn(path, f"basic event '{eid}' is not reachable from top "
                                f"'{self.top}'")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def point_reading(point: Mapping[str, Any]) -> str | None:
    """A point's reading as the task's prompt shows it (``42.5 A``, ``True``); None when
    the point has no value."""
    value = point.get("value")
    if value is None:
        return None
    unit = point.get("unit")
    return f"{value} {unit}" if isinstance(unit, str) and unit else str(value)


_NUMBER = re.compile(r"\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")


def _misquoted(observation: str, point: Mapping[str, Any]) -> str | None:
    """Why ``observation`` does not start with the point's reading (None: it does, or the
    point has none): a number must equal the value within the precision it is written with
    (``42`` or ``42.50`` for 42.5) and be followed by the unit; a boolean reads
    true/false."""
    value, unit = point.get("value"), point.get("unit")
    if value is None or not (isinstance(value, bool) or _is_number(value)):
        return None
    reading = point_reading(point)
    want = f"the observation must start with the reading '{reading}'"
    if isinstance(value, bool):
        word = re.match(r"\s*([A-Za-z]+)", observation)
        ok = word is not None and word.group(1).lower() == str(value).lower()
        return None if ok else want
    m = _NUMBER.match(observation)
    if m is None:
        return want
    number = float(value)
    try:
        written = Decimal(m.group(1))
        exponent = written.as_tuple().exponent   # 42.50: -2, the last digit written
        half = 0.5 * 10.0 ** exponent if isinstance(exponent, int) else 0.0
        close = abs(float(written) - number) <= half * (1 + 1e-9) + 1e-12 * abs(number)
    except (InvalidOperation, OverflowError):
        close = False
    if not close:
        return f"it quotes {m.group(1)}, the point reads {value}; {want}"
    rest = observation[m.end():].lstrip()
    if isinstance(unit, str) and unit and not (
            rest.startswith(unit) and not rest[len(unit):len(unit) + 1].isalnum()):
        return f"the unit is not '{unit}'; {want}"
    return None


# --------------------------------------------------------------------------------------------
# Computation


class _TooLarge(Exception):
    """A computation bound was exceeded."""


def _compute(checker: _Checker, result: dict[str, Any], *, max_cut_sets: int,
             max_order: int) -> None:
    from dd import autoref

    assert checker.top is not None
    order, gate_order = _orders(checker)
    if len(order) > MAX_EVENTS:
        checker.warn("basic_events", f"{len(order)} basic events under the top (more than "
                                     f"{MAX_EVENTS}): not analysed")
        return
    bdd = autoref.BDD()
    bdd.configure(reordering=False)
    if order:
        bdd.declare(*order)
    try:
        top = _build(bdd, checker, gate_order)
    except _TooLarge:
        checker.warn("top", f"the tree's BDD grew past {MAX_BDD_NODES} nodes: not analysed")
        return
    probs = checker.probabilities
    result["top_probability"] = _probability(bdd, top, probs)
    coherent = all(bdd.let({v: False}, top) <= bdd.let({v: True}, top) for v in top.support)
    result["coherent"] = coherent
    result["cut_set_kind"] = "minimal_cut_sets" if coherent else "prime_implicants"
    if not coherent:
        checker.warn("top", "the tree is non-coherent (its top event is not monotone in "
                            "the basic events): minimal_cut_sets lists prime implicants, "
                            "where 'NOT <id>' means that event does not occur")
    if top == bdd.false:
        checker.warn("top", "the top event can never occur (its logic is always false)")
    elif top == bdd.true:
        checker.warn("top", "the top event always occurs (its logic is always true)")

    cubes, complete, reason = _bounded_prime_implicants(bdd, top, coherent, max_cut_sets,
                                                        max_order)
    result["cut_sets_complete"] = complete
    if reason:
        checker.warn("minimal_cut_sets", reason)
    if cubes is None:
        return
    ordered = sorted((sorted(c, key=_literal_key) for c in cubes),
                     key=lambda lits: (len(lits), [_literal_key(x) for x in lits]))
    result["minimal_cut_sets"] = [[eid if pos else f"NOT {eid}" for eid, pos in lits]
                                  for lits in ordered]
    if coherent:
        result["rare_event_approximation"] = math.fsum(
            math.prod(probs[eid] for eid, _ in lits) for lits in ordered)


def _literal_key(lit: _Literal) -> tuple[str, bool]:
    return lit[0], not lit[1]


def _orders(checker: _Checker) -> tuple[list[str], list[str]]:
    """Variable order (basic events by depth-first first visit from the top: a good BDD
    order for fault trees) and the reachable gates in post-order (inputs first)."""
    assert checker.top is not None
    events: list[str] = []
    post: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[str, bool]] = [(checker.top, False)]
    while stack:
        nid, expanded = stack.pop()
        gate = checker.gates.get(nid)
        if gate is None:
            if nid not in seen:
                seen.add(nid)
                events.append(nid)
            continue
        if expanded:
            post.append(nid)
            continue
        if nid in seen:
            continue
        seen.add(nid)
        stack.append((nid, True))
        refs = gate.inputs + ([gate.condition] if gate.condition else [])
        stack.extend((ref, False) for ref in reversed(refs))
    return events, post


def _build(bdd: BDD, checker: _Checker, gate_order: list[str]) -> Function:
    assert checker.top is not None
    funcs: dict[str, Function] = {}

    def node(nid: str) -> Function:
        return funcs[nid] if nid in funcs else bdd.var(nid)

    for gid in gate_order:
        gate = checker.gates[gid]
        xs = [node(ref) for ref in gate.inputs]
        if gate.type == "AND":
            f = bdd.true
            for x in xs:
                f = f & x
        elif gate.type == "OR":
            f = bdd.false
            for x in xs:
                f = f | x
        elif gate.type == "ATLEAST":
            # atleast[j]: at least j of the inputs seen so far are true.
            atleast = [bdd.true] + [bdd.false] * gate.k
            for x in xs:
                for j in range(gate.k, 0, -1):
                    atleast[j] = atleast[j] | (atleast[j - 1] & x)
            f = atleast[gate.k]
        elif gate.type == "NOT":
            f = ~xs[0]
        else:  # INHIBIT
            assert gate.condition is not None
            f = xs[0] & bdd.var(gate.condition)
        funcs[gid] = f
        if len(bdd) > MAX_BDD_NODES:
            raise _TooLarge
    return node(checker.top)


def _cofactors(f: Function) -> tuple[Function, Function]:
    """(f with its top variable false, f with it true), minding complemented edges."""
    low, high = f.low, f.high
    assert low is not None and high is not None
    return (~low, ~high) if f.negated else (low, high)


def _probability(bdd: BDD, f: Function, probs: Mapping[str, float]) -> float:
    """Exact P(f) for independent variables, by Shannon expansion over the BDD.

    Each regular node keeps (P(node), P(not node)) so that complemented edges never compute
    1 - P: small probabilities keep full relative precision.
    """
    memo: dict[int, tuple[float, float]] = {}

    def pq(u: Function) -> tuple[float, float]:
        if u == bdd.true:
            return 1.0, 0.0
        if u == bdd.false:
            return 0.0, 1.0
        key = abs(int(u))
        if key not in memo:
            regular = ~u if u.negated else u
            low, high = _cofactors(regular)
            p = probs[str(regular.var)]
            (p0, q0), (p1, q1) = pq(low), pq(high)
            memo[key] = (p * p1 + (1.0 - p) * p0, p * q1 + (1.0 - p) * q0)
        p_u, q_u = memo[key]
        return (q_u, p_u) if u.negated else (p_u, q_u)

    return min(1.0, max(0.0, pq(f)[0]))


class _PrimeImplicants:
    """Prime implicants of at most ``order`` literals (Coudert & Madre's recursion)::

        PI(f) = PI(f0 & f1) | x.(PI(f1) - PI(f0 & f1)) | ~x.(PI(f0) - PI(f0 & f1))

    with f0, f1 the cofactors of f on its top variable x. Restricting every set to cubes of
    at most ``order`` literals gives exactly the prime implicants of that size (membership of
    a short cube in PI(f0 & f1) only depends on the short ones). For a monotone f, f0 <= f1,
    so f0 & f1 == f0 and this is Rauzy's minimal-cut-set recursion. Raises ``_TooLarge``
    when a set exceeds ``max_sets`` or more than ``_CREATED_PER_SET * max_sets`` cubes were
    built in all.
    """

    def __init__(self, bdd: BDD, order: int, max_sets: int) -> None:
        self.bdd, self.order, self.max_sets = bdd, order, max_sets
        self.memo: dict[int, tuple[Function, frozenset[_Cube]]] = {}
        # Some cube was left out for being too long. A prime implicant of f0, f1 or f0 & f1
        # longer than the order makes one of f too (it either is one or gains a literal),
        # so this flag, raised anywhere under f, says exactly whether f has one.
        self.dropped = False
        self.created = 0  # cubes built, all nodes together: bounds memory

    def __call__(self, f: Function) -> frozenset[_Cube]:
        if f == self.bdd.false:
            return frozenset()
        if f == self.bdd.true:
            return frozenset({frozenset()})
        hit = self.memo.get(int(f))
        if hit is not None:
            return hit[1]
        x = str(f.var)
        f0, f1 = _cofactors(f)
        both = f0 & f1
        p_both = self(both)
        out = set(p_both)
        for cubes, positive in ((self(f1), True), (self(f0), False)):
            for c in cubes - p_both:
                if len(c) < self.order:
                    out.add(c | {(x, positive)})
                    self.created += 1
                else:
                    self.dropped = True
        if len(out) > self.max_sets or self.created > _CREATED_PER_SET * self.max_sets:
            raise _TooLarge
        result = frozenset(out)
        self.memo[int(f)] = (f, result)  # keeps f (so its node) alive while memoised
        return result


def _bounded_prime_implicants(
    bdd: BDD, top: Function, coherent: bool, max_sets: int, max_order: int,
) -> tuple[frozenset[_Cube] | None, bool, str]:
    """Prime implicants within the bounds: (cubes or None, complete, warning or "").

    Tries ``max_order`` first, then lower orders while a set grows past ``max_sets``.
    Completeness is exact: a cube left out anywhere in the recursion means the top event has
    a prime implicant longer than the order (see :class:`_PrimeImplicants`).
    """
    what = "minimal cut sets" if coherent else "prime implicants"
    for order in range(max_order, 0, -1):
        pi = _PrimeImplicants(bdd, order, max_sets)
        try:
            cubes = pi(top)
        except _TooLarge:
            continue
        if not pi.dropped:
            return cubes, True, ""
        if order < max_order:
            return cubes, False, (
                f"more than {max_sets} {what} (or intermediate sets) of at most {order + 1} "
                f"events: only the {len(cubes)} of at most {order} events are listed")
        return cubes, False, f"{what} of more than {max_order} events exist and are not listed"
    return None, False, (f"more than {max_sets} {what} (or intermediate sets) even of one "
                         "event: none listed")


# --------------------------------------------------------------------------------------------
# The system's components: what the basic events are drawn from (docs/tasks.md, "Fault
# trees for a named system")

MIN_COMPONENTS: Final = 2
"""A system that names fewer components is not checked (``Screw compressor K1``)."""
MAX_REQUIRED: Final = 4
"""The most components a tree must name, however many the system lists."""

# a list item is cut at the first of these: what follows places or qualifies the component
# (``check valve on the discharge``, ``flow meter per valve``, ``safety valve set at 11.5``)
_CUT = re.compile(
    r"\b(?:of|on|in|at|for|per|from|to|through|into|by|via|between|under|over|upstream|"
    r"downstream|inside|near|behind|before|after|above|below|across|along|around|within|"
    r"set\s+(?:at|to))\b", re.I)
_SPLIT = re.compile(r"[,;&]|\b(?:and|with|plus)\b", re.I)
_WORD = re.compile(r"[^\W_]+")
# determiners and quantities a component is written with (``two feed pumps``)
_QUANTITY: Final = frozenset((
    "a", "an", "the", "its", "their", "his", "her", "them", "both", "each", "every", "all",
    "any", "some", "several", "multiple", "single", "one", "two", "three", "four", "five",
    "six", "seven", "eight", "nine", "ten", "eleven", "twelve"))
_IRREGULAR: Final = {"axes": "axis"}


def _singular(word: str) -> str:
    """The word lower-cased, a simple plural made singular (``pumps``, ``batteries``,
    ``switches``, ``axes``); both sides of a match go through it, so a wrong singular
    (``lens`` -> ``len``) still matches itself."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if w.endswith("sses"):
        return w[:-2]
    if len(w) > 4 and w.endswith(("ches", "shes", "xes", "zes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is", "as", "os")):
        return w[:-1]
    return w


@dataclass(frozen=True)
class Component:
    """A component the system names: as written (``two feed pumps`` -> ``feed pumps``), its
    head noun and other words, singular and lower-case (``pump``; ``feed``)."""

    name: str
    head: str
    modifiers: frozenset[str]


def _component(item: str) -> Component | None:
    cut = _CUT.search(item)
    kept: list[str] = []                       # the item's words as written
    after_number = False
    for chunk in (item[:cut.start()] if cut else item).split():
        if any(c.isdigit() for c in chunk):    # a quantity, a rating, a tag (P-101, m3)
            after_number = True
            continue
        word = chunk.strip(".,;:!?\"'`")
        short_unit = after_number and len(word) <= 3   # 24 V, 75 kW, 20 t
        after_number = False
        if short_unit or len(word) < 2 or word.lower() in _QUANTITY \
                or not _WORD.search(word):
            continue
        kept.append(word)
    while len(kept) > 1 and kept[-1].lower().endswith("ed") \
            and not kept[-1].lower().endswith("eed"):
        kept.pop()                             # injector fed (by ...), hot water set heated
    if not kept:
        return None
    # the head noun: the last word of the last chunk not written as a tag (PLC, VFD)
    plain = [i for i, w in enumerate(kept) if not (w.isupper() and len(w) > 1)]
    at = plain[-1] if plain else len(kept) - 1
    words = [_singular(w) for i, chunk in enumerate(kept) for w in _WORD.findall(chunk)
             if i != at]
    *rest, head = (_singular(w) for w in _WORD.findall(kept[at]))
    return Component(" ".join(kept), head, frozenset([*words, *rest]))


def system_components(system: str) -> list[Component]:
    """The components a request's ``system`` names, in order, each once.

    The list is what follows the first colon (``Cooling circuit: pump, plate heat
    exchanger, ...``), else the first ``with`` (``Steam boiler B1 with two feed pumps, level
    transmitter and ...``), else the whole text when it joins a list with ``and`` (``a
    centrifugal pump, suction strainer, motor, contactor and check valve``); a text with
    none of these names no components (``Hydraulic power unit of press 1, line 3``: a
    designation and a place, not a list). Items are split on commas, semicolons, ``and``,
    ``with``, ``plus``; a parenthesis holding a comma is a list of its own (``power unit
    (motor, gear pump, relief valve)``), another is left out (``(duty/standby)``). Each
    item is cut at its first preposition (``on the discharge``, ``per valve``), quantities,
    ratings and tags dropped (``two``, ``24 V``, ``PSL-301``); its head noun is its last
    word.
    """
    text = system.strip()
    colon = re.search(r":(?:\s|$)", text)
    if colon:
        listed = text[colon.end():]
    else:
        with_ = re.search(r"\bwith\b", text, re.I)
        if with_:
            listed = text[with_.end():]
        elif re.search(r"\band\b|&", text, re.I):
            listed = text
        else:
            return []
    listed = re.sub(r"\(([^()]*)\)",
                    lambda m: f", {m.group(1)}," if "," in m.group(1) else " ", listed)
    listed = re.sub(r"[()]", " ", listed)
    out: list[Component] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    for item in _SPLIT.split(listed):
        c = _component(item)
        if c is not None and (c.head, c.modifiers) not in seen:
            seen.add((c.head, c.modifiers))
            out.append(c)
    return out


def _names(words: frozenset[str], c: Component, shared: frozenset[str]) -> bool:
    """Whether a text of ``words`` names ``c``: its head noun, and where another component
    has the same head (``inlet valve``, ``minimum pressure valve``) one of its other words."""
    if c.head not in words:
        return False
    return c.head not in shared or not c.modifiers or bool(c.modifiers & words)


def required_components(n: int) -> int:
    """How many of a system's ``n`` components the basic events must name together: half,
    rounded up, at least 2 and at most ``MAX_REQUIRED``."""
    return min(n, MAX_REQUIRED, max(MIN_COMPONENTS, math.ceil(n / 2)))


def named_components(description: str, components: list[Component]) -> set[int]:
    """The indices of ``components`` a basic event's ``description`` names (``_names``)."""
    heads = Counter(c.head for c in components)
    shared = frozenset(h for h, k in heads.items() if k > 1)
    words = frozenset(_singular(w) for w in _WORD.findall(description))
    return {i for i, c in enumerate(components) if _names(words, c, shared)}


def state_events(tree: Mapping[str, Any]) -> set[str]:
    """The ids that stand for a state, not a failure: INHIBIT conditions, NOT gates' inputs."""
    states: set[str] = set()
    gates = tree.get("gates")
    for g in gates if isinstance(gates, list) else []:
        if isinstance(g, Mapping):
            if g.get("type") == "INHIBIT" and isinstance(g.get("condition"), str):
                states.add(g["condition"])
            if g.get("type") == "NOT" and isinstance(g.get("inputs"), list):
                states.update(x for x in g["inputs"] if isinstance(x, str))
    return states


def check_components(tree: Mapping[str, Any], system: str) -> dict[str, Any]:
    """The ``components`` section: the basic events together name at least
    :func:`required_components` of the components ``system`` names (none checked when it
    names fewer than ``MIN_COMPONENTS``). A description names a component by its head noun
    (case-insensitive, singular or plural), also by one of its other words where two
    components share the head. Every event counts; an INHIBIT condition or a NOT gate's
    input (a state, not a failure) is never listed among the events to rename."""
    components = system_components(system)
    section: dict[str, Any] = {"ok": True, "errors": [],
                               "components": [c.name for c in components]}
    if len(components) < MIN_COMPONENTS:
        section["note"] = (f"the system names {len(components)} component"
                           f"{'' if len(components) == 1 else 's'}: not checked")
        return section
    states = state_events(tree)
    named: set[int] = set()
    unnamed: list[str] = []
    events = tree.get("basic_events")
    for e in events if isinstance(events, list) else []:
        if not isinstance(e, Mapping):
            continue
        hits = named_components(str(e.get("description", "")), components)
        named |= hits
        if not hits and isinstance(e.get("id"), str) and e["id"] not in states:
            unnamed.append(e["id"])
    need = required_components(len(components))
    section.update(required=need, named=[c.name for i, c in enumerate(components) if i in named],
                   unnamed_events=unnamed)
    if len(named) < need:
        listed = ", ".join(c.name for c in components)
        said = ", ".join(c.name for i, c in enumerate(components) if i in named) or "none"
        ids = ", ".join(unnamed[:12]) + (", ..." if len(unnamed) > 12 else "")
        section["ok"] = False
        section["errors"] = [{"path": "basic_events", "message": (
            f"the basic events name {len(named)} of the {len(components)} components the "
            f"system lists ({said}); name at least {need} of them in the events' "
            f"descriptions: {listed}" + (f"; events that name none: {ids}" if ids else ""))}]
    return section
