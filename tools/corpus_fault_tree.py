"""The ``fault_tree`` task of the corpus: a top event, an asset snapshot, a fault tree.

The snapshot shows the top event's symptoms (e.g. high oil temperature and low pressure);
the tree is an OR of cause branches from the asset's physics (``corpus_plant``), with
redundancy as ATLEAST / AND sub-gates, INHIBIT where a cause needs a condition, rarely a NOT.
Basic events cite snapshot points as evidence where the values support them.
"""

from __future__ import annotations

import random
from typing import Any

from rung.tools.corpus_plant import (
    ASSETS,
    FAULTS,
    HIGH,
    LOW,
    NORMAL,
    SWITCHES,
    Asset,
    Fault,
    Group,
    Point,
    Top,
    label,
    point,
)

MISSION_TIMES = (720, 2000, 4380, 8760)
MAX_EVENTS = 7
MAX_TRIES = 8


def observed(p: Point, value: float) -> str:
    """high / low / normal for a value against the point's alert limits."""
    if p.high and value >= p.high[0]:
        return HIGH
    if p.low and value <= p.low[0]:
        return LOW
    return NORMAL


def _fmt(x: float) -> str:
    return f"{x:g}"


class _Tree:
    """Accumulates gates and basic events of one tree with shared numbering choices."""

    def __init__(self, rng: random.Random, snapshot: dict[str, tuple[str, Any, Point]]) -> None:
        self.rng = rng
        self.snapshot = snapshot  # point key -> (name, value, point)
        self.ev = rng.choice(("E_", "E_", "BE_"))
        self.mode = rng.choice(("p", "p", "p", "rate", "mixed", "mixed"))
        self.mission = rng.choice(MISSION_TIMES)
        self.gates: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.used_rate = False

    def number(self, log_p: tuple[float, float]) -> dict[str, float]:
        """probability or failure_rate (per hour, over the mission time), 2 digits."""
        p = 10 ** self.rng.uniform(*log_p)
        if self.mode == "rate" or (self.mode == "mixed" and self.rng.random() < 0.5):
            self.used_rate = True
            rate = min(1e-3, max(1e-7, p / self.mission))
            return {"failure_rate": float(f"{rate:.2g}")}
        return {"probability": float(f"{min(0.2, max(1e-5, p)):.2g}")}

    def event(self, eid: str, description: str, log_p: tuple[float, float],
              fault: Fault | None = None) -> str:
        """Add a basic event (with evidence from the snapshot when it supports it)."""
        if any(e["id"] == eid for e in self.events):
            return eid  # a cause shared by two branches: one event, referenced twice
        e: dict[str, Any] = {"id": eid, "description": description, **self.number(log_p)}
        evidence = self.evidence(fault) if fault else None
        if evidence:
            e["evidence"] = evidence
        self.events.append(e)
        return eid

    def gate(self, gid: str, gtype: str, inputs: list[str], description: str,
             **extra: Any) -> str:
        """Add a gate; ``extra`` holds k (ATLEAST) or condition (INHIBIT)."""
        self.gates.append({"id": gid, "type": gtype, **extra, "inputs": inputs,
                           "description": description})
        return gid

    def evidence(self, fault: Fault) -> dict[str, str] | None:
        """The first snapshot point whose value matches the fault's signature (abnormal first)."""
        matches = []
        for key, want in fault.signature.items():
            if key not in self.snapshot:
                continue
            name, value, p = self.snapshot[key]
            if observed(p, value) == want:
                matches.append((want == NORMAL, name, value, p, want))
        if not matches:
            return None
        _, name, value, p, want = min(matches, key=lambda m: m[0])
        lo, hi = p.normal
        where = {HIGH: "above", LOW: "below"}.get(want)
        text = (f"{value} {p.unit}, {where} normal {_fmt(lo)}-{_fmt(hi)}" if where
                else f"{value} {p.unit}, normal")
        return {"point": name, "observation": text}


def _cause(tree: _Tree, asset: Asset, cause: str) -> str:
    """A cause of a branch: a (possibly INHIBIT-wrapped) basic event or a group sub-gate."""
    if cause[0] in "@&":
        return _group(tree, asset.groups[cause[1:]])
    f = FAULTS[cause]
    eid = tree.event(tree.ev + cause.upper(), f.event, f.log_p, f)
    if f.condition and tree.rng.random() < 0.45:
        cid, cdesc = f.condition
        gid = f"G_{cause.upper()}_INH"
        if any(g["id"] == gid for g in tree.gates):
            return gid
        if not any(e["id"] == cid for e in tree.events):
            tree.events.append({"id": cid, "description": cdesc,
                                "probability": float(f"{tree.rng.uniform(0.02, 0.2):.2g}")})
        return tree.gate(gid, "INHIBIT", [eid],
                         f"{f.event} while: {cdesc.lower()}", condition=cid)
    return eid


def _group(tree: _Tree, g: Group) -> str:
    inputs = [tree.event(f"{tree.ev}{g.gate}_{suffix}", desc, g.log_p)
              for suffix, desc in g.items]
    if g.kind == "ATLEAST":
        return tree.gate(f"G_{g.gate}", "ATLEAST", inputs, g.description, k=g.k)
    return tree.gate(f"G_{g.gate}", "AND", inputs, g.description)


def _branches(rng: random.Random, top: Top) -> list[tuple[str, str, list[str]]]:
    n = len(top.branches)
    chosen = sorted(rng.sample(range(n), rng.randint(min(2, n), min(3, n))))
    out = []
    for i in chosen:
        gate, desc, causes = top.branches[i]
        keep = rng.randint(1, min(3, len(causes)))
        out.append((gate, desc, sorted(rng.sample(list(causes), keep), key=causes.index)))
    return out


def snapshot(rng: random.Random, asset: Asset,
             symptoms: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Input points showing ``symptoms`` (others normal) and their key -> (name, value, Point)."""
    keys = [k for k in asset.points if k in symptoms or rng.random() < 0.85]
    points: list[dict[str, Any]] = []
    seen: dict[str, tuple[str, Any, Point]] = {}
    for key in keys:
        p = point(asset, key)
        side = symptoms.get(key, NORMAL)
        state = NORMAL if side == NORMAL else rng.choice(("alert", "alarm", "alarm"))
        value = p.draw(rng, state, side)
        name = rng.choice(p.names)
        points.append({"name": name, "value": value, "unit": p.unit})
        seen[key] = (name, value, p)
    for sw in asset.switches:
        if rng.random() < 0.3:
            names, healthy = SWITCHES[sw]
            points.append({"name": rng.choice(names), "value": healthy})
    return points, seen


def fault_tree_sample(rng: random.Random, asset_key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``(input, output)`` pair of the ``fault_tree`` task for ``asset_key``."""
    asset = ASSETS[asset_key]
    top = rng.choice(asset.tops)
    points, seen = snapshot(rng, asset, top.symptoms)
    for _ in range(MAX_TRIES):  # keep the answer compact: a few events, not the whole catalogue
        output = _tree(rng, asset, top, seen)
        if len(output["basic_events"]) <= MAX_EVENTS:
            break
    data = {"top_event": top.text, "system": label(rng, asset), "points": points}
    return data, output


def _tree(rng: random.Random, asset: Asset, top: Top,
          seen: dict[str, tuple[str, Any, Point]]) -> dict[str, Any]:
    tree = _Tree(rng, seen)
    inputs = []
    branches = _branches(rng, top)
    for gate, desc, causes in branches:
        refs = [_cause(tree, asset, c) for c in causes]
        inputs.append(refs[0] if len(refs) == 1 else tree.gate(f"G_{gate}", "OR", refs, desc))
    top_id = rng.choice(("G_TOP", "G_TOP", "G_TOP_EVENT"))
    if rng.random() < 0.04:  # rare non-coherent variant: only outside maintenance mode
        core = tree.gate("G_CAUSES", "OR", inputs, top.text)
        maint = tree.event(tree.ev + "MAINT_MODE", "Unit in maintenance mode (trip bypassed)",
                           (-2.0, -1.3))
        inv = tree.gate("G_NOT_MAINT", "NOT", [maint], "Unit not in maintenance mode")
        tree.gate(top_id, "AND", [core, inv], f"{top.text} during production")
    else:
        tree.gate(top_id, "OR", inputs, top.text)
    output: dict[str, Any] = {"top": top_id, "description": _description(rng, top, branches)}
    if tree.used_rate:
        output["mission_time_h"] = tree.mission
    output["gates"], output["basic_events"] = _top_down(top_id, tree.gates, tree.events)
    return output


def _top_down(top_id: str, gates: list[dict[str, Any]],
              events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The gates in the order the answer is written (the request's grammar): the top first,
    then each gate after the gate that names it (depth first); the basic events in the
    order the gates name them (inputs, then an INHIBIT's condition)."""
    by_id = {g["id"]: g for g in gates}
    ordered: list[dict[str, Any]] = []

    def visit(gid: str) -> None:
        if gid in by_id and all(g["id"] != gid for g in ordered):
            ordered.append(by_id[gid])
            for ref in by_id[gid]["inputs"]:
                visit(ref)

    visit(top_id)
    assert len(ordered) == len(gates), "a gate the top does not reach"
    named = [ref for g in ordered for ref in [*g["inputs"], g.get("condition")]
             if ref is not None and ref not in by_id]
    rank = {eid: i for i, eid in enumerate(dict.fromkeys(named))}
    assert set(rank) == {e["id"] for e in events}, "a basic event no gate names"
    return ordered, sorted(events, key=lambda e: rank[e["id"]])


def _description(rng: random.Random, top: Top,
                 branches: list[tuple[str, str, list[str]]]) -> str:
    causes = ", ".join(d.lower() for _, d, _ in branches)
    return rng.choice((f"{top.text}: {causes}", top.text, f"Fault tree: {top.text}"))[:300]

