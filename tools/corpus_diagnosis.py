"""The ``diagnosis`` task of the corpus: an ISO 13374 style diagnosis of an asset snapshot.

A scenario (zero to two compatible fault modes of the asset) sets some points to alert or
alarm; about half the snapshots carry each relevant point's ``history`` (a drift toward
the limit, a step, a recovery or a flat line, with noise). The answer is what code knows
of the input (``rung.daemon.tasks.diagnosis``: the states, the prognosis the histories give
or ``not_assessed`` with code's reason, the priorities the worst state allows) and what a
maintenance engineer adds: the fault modes whose signatures the abnormal points match (a
differential, ranked, each citing its points in snapshot order), a note on the prognosis
and an advisory.
"""

from __future__ import annotations

import random
from typing import Any

from rung.daemon.tasks.diagnosis import snapshot
from rung.daemon.tasks.diagnosis.snapshot import expected_state
from rung.tools.corpus_plant import (
    ASSETS,
    FAULTS,
    HIGH,
    LOW,
    NORMAL,
    SWITCHES,
    Asset,
    label,
    point,
    sample_times,
)

CONTEXT = ("Routine round, values read from the HMI.", "Running at full load since shift start.",
           "Snapshot taken during normal production.", "Unit restarted after a weekend stop.",
           "Condition check requested by the shift supervisor.")
NORMAL_ACTIONS = ("Continue normal operation", "No action needed; keep the routine inspection "
                  "interval", "Continue operation and re-check at the next routine round")


def _scenario(rng: random.Random, asset: Asset) -> dict[str, str]:
    """Symptoms (point key -> high/low) of zero to two compatible faults of the asset."""
    n = rng.choices((0, 1, 2), (0.2, 0.55, 0.25))[0]
    symptoms: dict[str, str] = {}
    for key in rng.sample(list(asset.faults), len(asset.faults)):
        if n == 0:
            break
        sig = {k: d for k, d in FAULTS[key].signature.items() if k in asset.points}
        if any(k in symptoms and symptoms[k] != d for k, d in sig.items()):
            continue
        symptoms.update({k: d for k, d in sig.items() if d != NORMAL})
        n -= 1
    return symptoms


Drawn = dict[str, str]  # point name -> the state its value was drawn in


def _points(rng: random.Random, asset: Asset,
            symptoms: dict[str, str]) -> tuple[list[dict[str, Any]], Drawn]:
    """The snapshot's points (the symptoms and a few others; the asset's fault switches
    declared as fault flags) and the state each numeric point was drawn in."""
    others = [k for k in asset.points if k not in symptoms]
    extra = rng.sample(others, min(len(others), rng.randint(2, 5)))
    keys = [k for k in asset.points if k in symptoms or k in extra]
    points: list[dict[str, Any]] = []
    drawn: Drawn = {}
    offline = rng.choice(extra) if extra and rng.random() < 0.06 else None
    for key in keys:
        p = point(asset, key)
        side = symptoms.get(key, NORMAL)
        state = NORMAL if side == NORMAL else rng.choice(("alert", "alert", "alarm"))
        item: dict[str, Any] = {"name": rng.choice(p.names),
                                "value": None if key == offline else p.draw(rng, state, side),
                                "unit": p.unit}
        if p.limits() and (key in symptoms or rng.random() < 0.9):
            item["limits"] = p.limits()
        points.append(item)
        drawn[item["name"]] = state
    for sw in asset.switches:
        if rng.random() < 0.35:
            names, healthy = SWITCHES[sw]
            item = {"name": rng.choice(names), "value": healthy}
            if sw == "filter_switch":   # a fault flag: its limits say which value is abnormal
                item["value"] = (not healthy) if rng.random() < 0.3 else healthy
                item["limits"] = {rng.choice(("alert", "alert", "alert", "alarm")): not healthy}
            points.append(item)
    return points, drawn


def _histories(rng: random.Random, asset: Asset, points: list[dict[str, Any]],
               drawn: Drawn) -> None:
    """About half the snapshots: each relevant point's ``history`` (every numeric point, as
    a PLC's register map keeps them, or the abnormal ones and a few others)."""
    if rng.random() < 0.5:
        return
    numeric = [p for p in points if p["name"] in drawn and p["value"] is not None]
    if not numeric:
        return
    if rng.random() < 0.3:
        chosen = numeric
    else:   # a point in alarm already has no life left: its history is less often sent
        odds = {NORMAL: 0.25, "alert": 1.0, "alarm": 0.35}
        chosen = [p for p in numeric if rng.random() < odds[drawn[p["name"]]]]
        if not chosen:
            judged = [p for p in numeric if p.get("limits")] or numeric
            chosen = rng.sample(judged, min(len(judged), rng.randint(1, 2)))
    by_name = {n: k for k in asset.points for n in point(asset, k).names}
    times = sample_times(rng)
    for p in chosen:
        p["history"] = point(asset, by_name[p["name"]]).history(rng, p["value"], times,
                                                                drawn[p["name"]])


def _observe(asset: Asset, points: list[dict[str, Any]]) -> dict[str, tuple[str, str, str]]:
    """Point key -> (name, state, side) for every point whose state is decidable."""
    out = {}
    by_name = {n: k for k in asset.points for n in point(asset, k).names}
    for p in points:
        key = by_name.get(p["name"])
        state = expected_state(p["value"], p.get("limits") or {})
        if key is None or state is None:
            continue
        limits = p["limits"]
        side = HIGH if "alert" in limits and p["value"] >= limits["alert"] else (
            LOW if state != NORMAL else NORMAL)
        out[key] = (p["name"], state, side)
    return out


Finding = tuple[dict[str, Any], tuple[str, ...]]  # health_assessment item, its actions


def _faults(asset: Asset, seen: dict[str, tuple[str, str, str]]) -> list[Finding]:
    """The asset's fault modes matched by the abnormal points, best first (at most 3)."""
    ranked = []
    for key in asset.faults:
        f = FAULTS[key]
        matched, present, contradicted = [], 0, False
        for k, want in f.signature.items():
            if k not in seen:
                continue
            name, state, side = seen[k]
            if want == NORMAL:
                contradicted |= state != NORMAL
                continue
            present += 1
            if state != NORMAL and side == want:
                matched.append((name, state))
            elif state != NORMAL:
                contradicted = True
        if matched and not contradicted and 2 * len(matched) >= present:
            ranked.append((-len(matched) / present, -len(matched), key, matched))
    ranked.sort()
    # the best match, then rivals backed by two or more points (a one-point match is noise)
    ranked = ranked[:1] + [r for r in ranked[1:] if len(r[3]) >= 2 or len(ranked[0][3]) == 1]
    out = []
    for rank, (_, _, key, matched) in enumerate(ranked[:3]):
        alarm = any(state == "alarm" for _, state in matched)
        conf = 0.3 + 0.2 * len(matched) + (0.1 if alarm else 0.0) - 0.12 * rank
        f = FAULTS[key]
        out.append(({"fault": f.name, "component": f.component,
                     "confidence": round(min(0.95, max(0.2, conf)), 2),
                     "evidence": [name for name, _ in matched]}, f.actions))
    return out


def _sensor_faults(points: list[dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    for p in points:
        if p["value"] is None:
            out.append(({"fault": "Transmitter or signal failure",
                         "component": f"{p['name']} transmitter", "confidence": 0.7,
                         "evidence": [p["name"]]},
                        (f"Check the {p['name']} transmitter and its wiring",)))
        elif isinstance(p["value"], bool) and expected_state(
                p["value"], p.get("limits") or {}) not in (None, NORMAL):
            out.append(({"fault": "Filter element clogged", "component": "filter",
                         "confidence": 0.6, "evidence": [p["name"]]},
                        ("Change the filter element",)))
    return out


def _in_snapshot_order(findings: list[Finding], points: list[dict[str, Any]]) -> None:
    """Each fault's evidence in snapshot order (as the narrowed grammar spells the sets)."""
    at = {p["name"]: i for i, p in enumerate(points)}
    for item, _ in findings:
        item["evidence"] = sorted(item["evidence"], key=at.__getitem__)


def _note(rng: random.Random, prognosis: dict[str, Any], unit: str) -> str:
    """The one thing of an assessed prognosis the model writes."""
    name, limit, rul = prognosis["point"], prognosis["limit"], prognosis["remaining_useful_life_h"]
    lo, hi = prognosis["remaining_useful_life_ci_h"]
    rate = prognosis["trend_per_h"]
    kind = "alarm" if rate > 0 else "low alarm"
    if rul == 0:
        return rng.choice((
            f"{name} is at its {kind} limit {limit} {unit} already: no remaining life",
            f"{name} has reached {limit} {unit}; act now, there is no margin left",
        ))
    verb = "rising" if rate > 0 else "falling"
    return rng.choice((
        f"{name} {verb} {abs(rate)} {unit}/h; at this rate it reaches {limit} {unit} in "
        f"about {rul} h ({lo} to {hi} h)",
        f"Trend of {name} over {prognosis['span_h']} h extrapolated to the {kind} limit "
        f"{limit} {unit}: {lo} to {hi} h left",
        f"{name} reaches its {kind} {limit} {unit} in about {rul} h if the trend holds",
    ))


def _advisory(f: snapshot.Facts, findings: list[Finding], prognosis: dict[str, Any],
              rng: random.Random) -> dict[str, Any]:
    alarms = sum(r["state"] == "alarm" for r in f.states)
    alerts = sum(r["state"] == "alert" for r in f.states)
    soon = (prognosis["status"] == "assessed"
            and prognosis["remaining_useful_life_ci_h"][0] < 24)
    if not f.faults_possible:
        priority = "low"
    else:
        priority = ("critical" if alarms >= 2 else "high" if alarms or soon else "medium")
    allowed = snapshot.priorities(f, snapshot.builtin_floor())
    assert priority in allowed, (priority, allowed)
    actions: list[str] = []
    if priority == "critical":
        actions.append("Stop the unit in a controlled way and lock out before inspection")
    elif priority == "high" and (alarms or alerts):
        actions.append("Reduce load and prepare a controlled shutdown")
    if prognosis["status"] == "assessed":
        lo = prognosis["remaining_useful_life_ci_h"][0]
        actions.append(f"Plan the intervention on {prognosis['point']} within {lo} h"
                       if lo > 0 else f"Act on {prognosis['point']} now: it is at its limit")
    for i, (_, todo) in enumerate(findings):
        actions += [a for a in (todo if i == 0 else todo[:1]) if a not in actions]
    if not actions:
        actions.append(rng.choice(NORMAL_ACTIONS))
    return {"priority": priority, "actions": actions[:6], "requires_human_confirmation": True}


def diagnosis_sample(rng: random.Random, asset_key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``(input, output)`` pair of the ``diagnosis`` task for ``asset_key``."""
    asset = ASSETS[asset_key]
    points, drawn = _points(rng, asset, _scenario(rng, asset))
    _histories(rng, asset, points, drawn)
    data: dict[str, Any] = {"asset": label(rng, asset)}
    if rng.random() < 0.4:
        data["description"] = rng.choice(CONTEXT)
    data["points"] = points
    known = snapshot.facts(data)
    findings: list[Finding] = []
    if known.faults_possible:
        findings = (_sensor_faults(points) + _faults(asset, _observe(asset, points)))[:4]
        _in_snapshot_order(findings, points)
    prognosis = dict(known.prognosis)
    if prognosis["status"] == "assessed":
        unit = next(p.get("unit", "") for p in points if p["name"] == prognosis["point"])
        prognosis["note"] = _note(rng, prognosis, unit)
    output = {"state_detection": known.states, "health_assessment": [f for f, _ in findings],
              "prognosis": prognosis, "advisory": _advisory(known, findings, prognosis, rng)}
    return data, output
