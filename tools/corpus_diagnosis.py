"""The ``diagnosis`` task of the corpus: an ISO 13374 style diagnosis of an asset snapshot.

A scenario (zero to two compatible fault modes of the asset) sets some points to alert or
alarm; the answer is then derived from the input alone: states as
``rung.daemon.tasks.validate.expected_state`` computes them, the fault modes whose signatures the
abnormal points match (a differential, ranked), a prognosis when the description gives a
trend, and an advisory whose priority follows the worst state.
"""

from __future__ import annotations

import random
from typing import Any

from rung.daemon.tasks.validate import expected_state
from rung.tools.corpus_plant import ASSETS, FAULTS, HIGH, LOW, NORMAL, SWITCHES, Asset, label, point

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


def _points(rng: random.Random, asset: Asset, symptoms: dict[str, str]) -> list[dict[str, Any]]:
    others = [k for k in asset.points if k not in symptoms]
    extra = rng.sample(others, min(len(others), rng.randint(2, 5)))
    keys = [k for k in asset.points if k in symptoms or k in extra]
    points: list[dict[str, Any]] = []
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
    for sw in asset.switches:
        if rng.random() < 0.35:
            names, healthy = SWITCHES[sw]
            active = sw == "filter_switch" and rng.random() < 0.3
            points.append({"name": rng.choice(names), "value": (not healthy) if active
                           else healthy})
    return points


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


def _states(points: list[dict[str, Any]], rng: random.Random) -> list[dict[str, str]]:
    rows = []
    for p in points:
        limits = p.get("limits") or {}
        state = expected_state(p["value"], limits)
        if p["value"] is None:
            rows.append({"point": p["name"], "state": "alert", "note": "no reading (offline)"})
        elif isinstance(p["value"], bool):
            if p["name"].startswith("filter") and p["value"]:
                rows.append({"point": p["name"], "state": "alert", "note": "switch active"})
        elif state is not None:
            row = {"point": p["name"], "state": state}
            if state != NORMAL and rng.random() < 0.5:
                row["note"] = _limit_note(p["value"], limits, state)
            rows.append(row)
    return rows


def _limit_note(value: float, limits: dict[str, float], state: str) -> str:
    key = ("alarm" if state == "alarm" else "alert") if "alert" in limits else (
        "low_alarm" if state == "alarm" else "low_alert")
    word = "above" if key in ("alert", "alarm") else "below"
    return f"{value} {word} {key} {limits[key]:g}"


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
        elif p["value"] is True and p["name"].startswith("filter"):
            out.append(({"fault": "Filter element clogged", "component": "filter",
                         "confidence": 0.6, "evidence": [p["name"]]},
                        ("Change the filter element",)))
    return out


def _trend(rng: random.Random, asset: Asset, points: list[dict[str, Any]],
           seen: dict[str, tuple[str, str, str]]) -> tuple[str, dict[str, Any]] | None:
    """A trend sentence for the description and the prognosis it supports (alert points)."""
    alerts = [(k, v) for k, v in seen.items() if v[1] == "alert"]
    if not alerts or rng.random() < 0.45:
        return None
    key, (name, _, side) = rng.choice(alerts)
    p = point(asset, key)
    item = next(x for x in points if x["name"] == name)
    value, limits, days = item["value"], item["limits"], rng.randint(3, 30)
    past = round(rng.uniform(*p.normal), p.decimals)
    if side == HIGH:
        rate, limit, verb = (value - past) / (days * 24), limits["alarm"], "risen"
        rul = (limit - value) / rate
    else:
        rate, limit, verb = (past - value) / (days * 24), limits["low_alarm"], "fallen"
        rul = (value - limit) / rate
    sentence = f"Trend: {name} has {verb} from {past} to {value} {p.unit} over {days} days."
    return sentence, {"status": "assessed", "remaining_useful_life_h": max(0, round(rul)),
                      "confidence": 0.5 if days >= 10 else 0.4,
                      "note": f"linear extrapolation of {name} to the alarm limit {limit:g}"}


def _advisory(rows: list[dict[str, str]], findings: list[Finding],
              rng: random.Random) -> dict[str, Any]:
    alarms = sum(r["state"] == "alarm" for r in rows)
    alerts = sum(r["state"] == "alert" for r in rows)
    priority = ("critical" if alarms >= 2 else "high" if alarms else
                "medium" if alerts else "low")
    actions: list[str] = []
    if priority == "critical":
        actions.append("Stop the unit in a controlled way and lock out before inspection")
    elif priority == "high":
        actions.append("Reduce load and prepare a controlled shutdown")
    for i, (_, todo) in enumerate(findings):
        actions += [a for a in (todo if i == 0 else todo[:1]) if a not in actions]
    if not actions:
        actions.append(rng.choice(NORMAL_ACTIONS))
    return {"priority": priority, "actions": actions[:6], "requires_human_confirmation": True}


def diagnosis_sample(rng: random.Random, asset_key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``(input, output)`` pair of the ``diagnosis`` task for ``asset_key``."""
    asset = ASSETS[asset_key]
    points = _points(rng, asset, _scenario(rng, asset))
    seen = _observe(asset, points)
    rows = _states(points, rng)
    findings = (_sensor_faults(points) + _faults(asset, seen))[:4]
    data: dict[str, Any] = {"asset": label(rng, asset)}
    trend = _trend(rng, asset, points, seen)
    if trend:
        data["description"] = trend[0]
        prognosis = trend[1]
    else:
        if rng.random() < 0.4:
            data["description"] = rng.choice(CONTEXT)
        reason = ("all points normal, nothing to extrapolate" if not findings
                  else "single snapshot, no trend history")
        prognosis = {"status": "not_assessed", "reason": reason}
    data["points"] = points
    output = {"state_detection": rows, "health_assessment": [f for f, _ in findings],
              "prognosis": prognosis, "advisory": _advisory(rows, findings, rng)}
    return data, output
