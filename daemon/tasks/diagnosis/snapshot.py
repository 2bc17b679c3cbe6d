"""What code knows of a diagnosis request, computed once for the shaper and the judge.

A diagnosis answer has four ISO 13374 sections. Code decides what it can decide from the
request alone, the grammar makes it so (``narrow``: the request's output schema and the
answer's computed start), and the validator checks it again (``check``):

- **state detection**: each point's state by its limits (``states``);
- **evidence**: a fault may cite only a point that is not normal: in alert or alarm by its
  limits (a boolean point whose limits name the value that is its alert or alarm:
  ``{"alarm": true}``), or without a reading (``value`` null); each at most once per
  fault, at least one. With no such point no fault can be asserted;
- **priority**: at least the task's minimum for the worst computed state
  (``x-minimum-priority`` on the output schema's ``advisory.priority``); with no point to
  cite, exactly the minimum for ``normal``;
- **prognosis**: a trend needs a history: without one, ``not_assessed`` (code's reason).
  With ``history`` (``[[t, value], ...]``, t in seconds, increasing) code fits each
  point's trend (Theil-Sen, ``theil_sen``) and writes the remaining useful life to its
  alarm limit with its interval; the model writes only a ``note``;
- **names**: free text may name only the request's points (a snake_case token that is no
  point of the request is refused).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

Schema = dict[str, Any]

STATES = ("normal", "alert", "alarm")
PRIORITIES = ("low", "medium", "high", "critical")
# the task setting: worst computed state -> the least advisory priority an answer may give
FLOOR_KEY = "x-minimum-priority"
DEFAULT_FLOOR = {"normal": "low", "alert": "medium", "alarm": "high"}

# evidence sets the grammar spells out (every non-empty subset of the points an answer
# may cite, in snapshot order): 2^6 - 1 = 63 alternatives compile in ~5 ms; with more
# citable points the grammar only keeps evidence to them and the validator refuses repeats
MAX_SPELLED = 6

# the trend fit
LEVEL = 0.95                 # two-sided coverage of the slope's (and so the RUL's) interval
Z = 1.959963984540054        # the standard normal quantile of (1 + LEVEL) / 2
MIN_SAMPLES = 5              # fewer samples give no trend

NO_HISTORY = ("a single snapshot has no trend; send each point's history to assess the "
              "remaining life")


# -- state detection and what an answer may cite --------------------------------------


def expected_state(value: Any, limits: Mapping[str, Any]) -> str | None:
    """normal / alert / alarm from a value and its limits; None when not decidable.

    A number against the numeric limits (``alarm``/``alert`` from above, ``low_alarm``/
    ``low_alert`` from below); a boolean against the boolean ones (a fault flag:
    ``{"alarm": true}`` is in alarm when true, ``{"alert": false}`` in alert when false).
    """
    if not limits:
        return None
    if isinstance(value, bool):
        flags = {k: v for k, v in limits.items() if k in ("alarm", "alert")
                 and isinstance(v, bool)}
        if not flags:
            return None
        return next((k for k in ("alarm", "alert") if k in flags and flags[k] is value),
                    "normal")
    if not isinstance(value, int | float):
        return None
    numeric = {k: v for k, v in limits.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    if not numeric:
        return None
    if ("alarm" in numeric and value >= numeric["alarm"]) or (
            "low_alarm" in numeric and value <= numeric["low_alarm"]):
        return "alarm"
    if ("alert" in numeric and value >= numeric["alert"]) or (
            "low_alert" in numeric and value <= numeric["low_alert"]):
        return "alert"
    return "normal"


def states(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each point whose state its limits decide, in snapshot order (points without limits,
    or with a value the limits do not judge, are left to the model's assessment)."""
    out = []
    for p in _points(data):
        state = expected_state(p.get("value"), p.get("limits") or {})
        if state is not None:
            out.append({"point": p["name"], "state": state})
    return out


@dataclass(frozen=True)
class Facts:
    """What code knows of one request."""

    states: list[dict[str, str]]
    citable: list[str]           # points a fault may cite, in snapshot order
    worst: str | None            # the worst computed state (None: no state computed)
    prognosis: dict[str, Any]    # the computed prognosis (an assessed one lacks its note)
    names: list[str] = field(default_factory=list)   # every point name of the request

    @property
    def faults_possible(self) -> bool:
        return bool(self.citable)


def facts(data: Mapping[str, Any]) -> Facts:
    """What code knows of ``data`` (a diagnosis input): states, the points a fault may
    cite, the worst state, the prognosis."""
    rows = states(data)
    state_of = {r["point"]: r["state"] for r in rows}
    points = _points(data)
    citable = list(dict.fromkeys(
        p["name"] for p in points
        if state_of.get(p["name"], "normal") != "normal" or p.get("value", 0) is None))
    worst = max((r["state"] for r in rows), key=STATES.index, default=None)
    names = list(dict.fromkeys(p["name"] for p in points))
    return Facts(rows, citable, worst, prognosis(data), names)


def floor(schema: Mapping[str, Any]) -> dict[str, str]:
    """The task's minimum priority per worst state (``x-minimum-priority`` on the output
    schema's ``advisory.priority``; DEFAULT_FLOOR where the schema has none).

    Raises:
        ValueError: the setting names a state or priority that does not exist, or lowers
            the minimum for a worse state.
    """
    try:
        raw = schema["properties"]["advisory"]["properties"]["priority"].get(FLOOR_KEY)
    except (KeyError, TypeError, AttributeError):
        raw = None
    if raw is None:
        return dict(DEFAULT_FLOOR)
    if not isinstance(raw, Mapping) or set(raw) != set(STATES) or not all(
            v in PRIORITIES for v in raw.values()):
        raise ValueError(f"output_schema advisory.priority.{FLOOR_KEY}: a priority "
                         f"({', '.join(PRIORITIES)}) for each of {', '.join(STATES)}")
    ranks = [PRIORITIES.index(raw[s]) for s in STATES]
    if ranks != sorted(ranks):
        raise ValueError(f"output_schema advisory.priority.{FLOOR_KEY}: a worse state "
                         "cannot have a lower minimum")
    return {s: str(raw[s]) for s in STATES}


@lru_cache(maxsize=1)
def builtin_floor() -> dict[str, str]:
    """The setting of the built-in diagnosis task (what the validator judges by)."""
    import yaml

    text = (resources.files("rung.configs") / "tasks" / "diagnosis.yaml").read_text("utf-8")
    return floor(yaml.safe_load(text)["output_schema"])


def priorities(f: Facts, minimum: Mapping[str, str]) -> list[str]:
    """The advisory priorities an answer may give."""
    least = PRIORITIES.index(minimum[f.worst or "normal"])
    if not f.faults_possible:
        return [PRIORITIES[least]]
    return list(PRIORITIES[least:])


# -- the trend fit ----------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """A Theil-Sen line through (t, y): ``slope`` (units per second) with its ``LEVEL``
    interval ``[lo, hi]``, ``level`` the line's value at the newest t."""

    slope: float
    lo: float
    hi: float
    level: float
    n: int
    span_s: float


def theil_sen(t: Sequence[float], y: Sequence[float]) -> Fit:
    """The median of the pairwise slopes, its interval by ranks (Sen 1968: the variance of
    Kendall's S with ties in t and in y, as ``scipy.stats.theilslopes``), the intercept as
    the median of ``y - slope * t`` at the newest t.

    Raises:
        ValueError: fewer than 2 samples, or no two distinct times.
    """
    tt = np.asarray(t, dtype=np.float64)
    yy = np.asarray(y, dtype=np.float64)
    n = len(tt)
    if n < 2 or len(yy) != n:
        raise ValueError("a fit needs at least 2 samples of (t, value)")
    tt = tt - tt[-1]   # newest at 0: the intercept is the level now (and unix times stay exact)
    i, j = np.triu_indices(n, 1)
    dt = tt[j] - tt[i]
    keep = dt != 0
    if not keep.any():
        raise ValueError("a fit needs two distinct times")
    slopes = (yy[j] - yy[i])[keep] / dt[keep]
    total = len(slopes)
    var = (n * (n - 1) * (2 * n + 5) - _ties(tt) - _ties(yy)) / 18.0
    c = Z * math.sqrt(max(var, 0.0))
    lo_at = max(int(np.round((total - c) / 2.0)) - 1, 0)
    hi_at = min(int(np.round((total + c) / 2.0)), total - 1)
    mid = sorted({(total - 1) // 2, total // 2})
    ranked = np.partition(slopes, sorted({lo_at, hi_at, *mid}))   # the ranks, not a sort
    m = float(np.mean(ranked[mid]))
    level = float(np.median(yy - m * tt))
    return Fit(m, float(ranked[lo_at]), float(ranked[hi_at]), level, n, float(-tt[0]))


def _ties(values: np.ndarray) -> float:
    _, counts = np.unique(values, return_counts=True)
    k = counts[counts > 1].astype(np.float64)
    return float(np.sum(k * (k - 1) * (2 * k + 5)))


@dataclass(frozen=True)
class Trend:
    """One point's trend toward its alarm limit: ``rul_h`` None when there is none (and
    ``why`` says so)."""

    point: str
    fit: Fit
    limit: float | None
    rul_h: float | None = None
    rul_ci_h: tuple[float, float] | None = None
    why: str = ""


def trend(p: Mapping[str, Any]) -> Trend | str:
    """The trend of one point with a history toward its alarm limit: ``alarm`` when it
    rises, ``low_alarm`` when it falls; a remaining life only when the slope's interval
    excludes zero. A point already at its limit has none left. Or why no fit (a string
    naming the point)."""
    name = p["name"]
    hist = p.get("history") or []
    try:
        t = [float(s[0]) for s in hist]
        y = [float(s[1]) for s in hist]
    except (TypeError, ValueError, IndexError):
        return f"{name}: history is not [t, value] pairs"
    if not all(math.isfinite(v) for v in t + y):
        return f"{name}: history has a value that is not a finite number"
    if any(b <= a for a, b in itertools.pairwise(t)):
        return f"{name}: history times do not increase"
    if len(t) < MIN_SAMPLES:
        return f"{name}: {len(t)} samples, a trend needs {MIN_SAMPLES}"
    fit = theil_sen(t, y)
    limits = {k: float(v) for k, v in (p.get("limits") or {}).items()
              if k in ("alarm", "low_alarm") and isinstance(v, int | float)
              and not isinstance(v, bool)}
    value = p.get("value")
    if isinstance(value, int | float) and not isinstance(value, bool):
        for key, past in (("alarm", value >= limits.get("alarm", math.inf)),
                          ("low_alarm", value <= limits.get("low_alarm", -math.inf))):
            if past:
                return Trend(name, fit, limits[key], 0.0, (0.0, 0.0))
    rising = fit.slope > 0
    if fit.slope == 0 or not (fit.lo > 0 if rising else fit.hi < 0):
        return Trend(name, fit, None, why=f"{name}: no significant trend ({_per_h(fit)})")
    key, other = ("alarm", "low_alarm") if rising else ("low_alarm", "alarm")
    way = "rising" if rising else "falling"
    if key not in limits:
        away = f", away from its {other} {limits[other]:g}" if other in limits else ""
        return Trend(name, fit, None,
                     why=f"{name}: {way} ({_per_h(fit)}){away}, no {key} limit to reach")
    limit = limits[key]
    gap = limit - fit.level
    if gap == 0 or (gap > 0) != rising:   # the fitted line is at its limit already
        return Trend(name, fit, limit, 0.0, (0.0, 0.0))
    near, far = (fit.hi, fit.lo) if rising else (fit.lo, fit.hi)
    return Trend(name, fit, limit, gap / fit.slope / 3600.0,
                 (gap / near / 3600.0, gap / far / 3600.0))


def _per_h(fit: Fit) -> str:
    return (f"{_num(fit.slope * 3600)}/h, {LEVEL:.0%} CI {_num(fit.lo * 3600)} to "
            f"{_num(fit.hi * 3600)}, {fit.n} samples over {_num(fit.span_s / 3600)} h")


def _num(x: float) -> float | int:
    """A number as code writes it into an answer: 3 significant digits, whole from 100 on
    (so the grammar's rendering of the constant reads back as the same number)."""
    if not math.isfinite(x) or x == 0:
        return 0
    if abs(x) >= 100:
        return int(round(x))
    v = float(f"{x:.3g}")
    return int(v) if v.is_integer() else v


def prognosis(data: Mapping[str, Any]) -> dict[str, Any]:
    """The prognosis code writes: the point that reaches its alarm limit first, with its
    remaining useful life and interval; else ``not_assessed`` with the reason."""
    trends: list[Trend | str] = [trend(p) for p in _points(data) if p.get("history")]
    if not trends:
        return {"status": "not_assessed", "reason": NO_HISTORY}
    found = [x for x in trends if isinstance(x, Trend) and x.rul_h is not None]
    if not found:
        why = [x if isinstance(x, str) else x.why for x in trends]
        return {"status": "not_assessed", "reason": _reason(why)}
    best = min(found, key=lambda x: (x.rul_h or 0.0))
    fit = best.fit
    assert best.rul_ci_h is not None and best.limit is not None
    return {"status": "assessed", "remaining_useful_life_h": _num(best.rul_h or 0.0),
            "confidence": LEVEL, "point": best.point, "limit": _num(best.limit),
            "remaining_useful_life_ci_h": [_num(best.rul_ci_h[0]), _num(best.rul_ci_h[1])],
            "trend_per_h": _num(fit.slope * 3600),
            "trend_ci_per_h": [_num(fit.lo * 3600), _num(fit.hi * 3600)],
            "samples": fit.n, "span_h": _num(fit.span_s / 3600)}


def _reason(parts: list[str], most: int = 200) -> str:
    """Why no remaining life, within ``most`` characters: as many points as fit, cut only
    between words (a cut name would read as a point that does not exist)."""
    head = "no trend toward an alarm limit: "
    for k in range(len(parts), 0, -1):
        text = head + "; ".join(parts[:k]) + (f"; and {len(parts) - k} more"
                                              if k < len(parts) else "")
        if len(text) <= most:
            return text
    return (head + parts[0])[:most - 3].rsplit(" ", 1)[0] + "..."


# -- the request's shape ----------------------------------------------------------------


def narrow(schema: Schema, data: Mapping[str, Any]) -> tuple[Schema, str]:
    """The output schema narrowed to this request, and the answer's start code writes
    (state detection; when no fault can be asserted, the empty health assessment, and the
    prognosis when code wrote all of it)."""
    f = facts(data)
    s = copy.deepcopy(schema)
    props = s["properties"]
    props["state_detection"] = {"const": f.states}
    health = props["health_assessment"]
    if f.faults_possible:
        item = health["items"]["properties"]
        item["evidence"] = _evidence(f.citable, item["evidence"].get("maxItems", 10))
    else:
        props["health_assessment"] = {"type": "array", "maxItems": 0}
    advisory = props["advisory"]["properties"]
    advisory["priority"] = {"enum": priorities(f, floor(schema))}
    pattern = names_pattern(f.names)
    if f.faults_possible:
        item = health["items"]["properties"]
        for key in ("fault", "component"):
            item[key] = _named(item[key], pattern)
    advisory["actions"]["items"] = _named(advisory["actions"]["items"], pattern)
    note = _named(_note_schema(props["prognosis"]), pattern)
    if f.prognosis["status"] == "assessed":
        props["prognosis"] = {
            "type": "object", "additionalProperties": False,
            "required": [*f.prognosis, "note"],
            "properties": {**{k: {"const": v} for k, v in f.prognosis.items()}, "note": note}}
    else:
        props["prognosis"] = {"const": f.prognosis}
    start = ['"state_detection":' + _compact(f.states)]
    if not f.faults_possible:
        start.append('"health_assessment":[]')
        if f.prognosis["status"] != "assessed":
            start.append('"prognosis":' + _compact(f.prognosis))
    return s, "{" + ",".join(start) + ","


def _evidence(citable: list[str], most: int) -> Schema:
    """Evidence from the citable points, each at most once (``uniqueItems``, which the
    constraint engine cannot enforce, spelled out as the sets in snapshot order while
    there are few)."""
    if len(citable) <= MAX_SPELLED:
        return {"anyOf": [
            {"type": "array", "prefixItems": [{"const": n} for n in subset], "items": False,
             "minItems": len(subset), "maxItems": len(subset)}
            for size in range(1, min(len(citable), most) + 1)
            for subset in itertools.combinations(citable, size)]}
    return {"type": "array", "minItems": 1, "maxItems": min(len(citable), most),
            "items": {"enum": citable}}


def names_pattern(names: Sequence[str]) -> str:
    """A regular expression for free text whose snake_case words are all points of
    ``names`` (or the task's own vocabulary): an underscore only inside one of them, each
    whole between non-word characters (``unknown_names`` refuses the rest)."""
    known = sorted({*names, *VOCABULARY}, key=len, reverse=True)
    word = "|".join([*(re.escape(n) for n in known), "[A-Za-z0-9]+"])
    sep = "[^A-Za-z0-9_]"
    return f"^{sep}*(?:(?:{word}){sep}+)*(?:{word})?$"


def _named(text: Any, pattern: str) -> Any:
    """A free-text string schema that may name only the request's points."""
    if not isinstance(text, dict) or text.get("type") != "string" or {
            "const", "enum", "pattern"} & set(text):
        return text
    return {**text, "pattern": pattern}


def _note_schema(published: Any) -> Schema:
    for variant in (published or {}).get("anyOf", []):
        note = variant.get("properties", {}).get("note")
        if isinstance(note, dict):
            return copy.deepcopy(note)
    return {"type": "string", "maxLength": 200}


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- the judge --------------------------------------------------------------------------

# a token that looks like a point name: letters and digits joined by underscores
_SNAKE = re.compile(r"(?<![\w])[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+(?![\w])")
# snake_case words an answer may use that are no point: the task's own vocabulary
VOCABULARY = frozenset({
    "low_alarm", "low_alert", "state_detection", "health_assessment", "not_assessed",
    "remaining_useful_life_h", "requires_human_confirmation", "trend_per_h",
    "remaining_useful_life_ci_h", "trend_ci_per_h", "span_h"})
CHECKS = ("states", "evidence", "faults", "priority", "prognosis", "names")


def check(output: Mapping[str, Any], data: Mapping[str, Any],
          minimum: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``diagnosis`` section: the answer against what code knows of the request.
    ``checks`` says which rightness checks passed (``CHECKS``); each failure is an error."""
    f = facts(data)
    minimum = minimum or builtin_floor()
    points = {p["name"]: p for p in _points(data)}
    errors: dict[str, list[dict[str, str]]] = {c: [] for c in CHECKS}

    def err(check: str, path: str, message: str) -> None:
        errors[check].append({"path": path, "message": message})

    # states: every computed state, as computed, of known points
    want = {r["point"]: r["state"] for r in f.states}
    listed: set[str] = set()
    for i, s in enumerate(output.get("state_detection", [])):
        p = points.get(s["point"])
        if p is None:
            err("states", f"state_detection/{i}/point", f"unknown point {s['point']!r}")
            continue
        listed.add(s["point"])
        w = want.get(s["point"])
        if w is not None and w != s["state"]:
            err("states", f"state_detection/{i}/state",
                f"{s['point']} = {p.get('value')} is {w} by its limits, not {s['state']}")
    for name, state in want.items():
        if name not in listed and state != "normal":
            err("states", "state_detection", f"{name} is {state} by its limits and not listed")

    # evidence: known, citable, once each, at least one per fault
    faults = output.get("health_assessment", [])
    for i, h in enumerate(faults):
        seen: set[str] = set()
        evidence = h.get("evidence", [])
        if not evidence:
            err("evidence", f"health_assessment/{i}/evidence",
                f"{h.get('fault')!r} cites no point")
        for j, ev in enumerate(evidence):
            where = f"health_assessment/{i}/evidence/{j}"
            if ev not in points:
                err("evidence", where, f"unknown point {ev!r}")
            elif ev in seen:
                err("evidence", where, f"{ev} is cited twice")
            elif ev not in f.citable:
                err("evidence", where, f"{ev} is {want.get(ev, 'not judged')} by its limits: "
                    "it cannot support a fault")
            seen.add(ev)
    if faults and not f.faults_possible:
        err("faults", "health_assessment", "every point is normal (or not judged by limits): "
            "no fault can be asserted")
    asserted: dict[str, int] = {}
    for i, h in enumerate(faults):   # one entry per fault, its evidence together
        key = " ".join(str(h.get("fault", "")).lower().split())
        if key in asserted:
            err("faults", f"health_assessment/{i}/fault",
                f"{h.get('fault')!r} is asserted twice (health_assessment/{asserted[key]})")
        asserted.setdefault(key, i)

    # priority: at least the minimum for the worst state; the normal one with nothing to cite
    allowed = priorities(f, minimum)
    given = output.get("advisory", {}).get("priority")
    if given not in allowed:
        worst = [n for n, s in want.items() if s == f.worst]
        why = (f"{f.worst} ({', '.join(worst)})" if f.faults_possible and worst
               else "every point normal")
        err("priority", "advisory/priority",
            f"priority {given} with {why}: expected {' or '.join(allowed)}")

    # prognosis: what the history says, or not_assessed without a trend
    _check_prognosis(output.get("prognosis") or {}, f.prognosis, err)

    # names: free text names only points of the request
    for path, text in _free_text(output):
        for token in unknown_names(text, f.names):
            err("names", path, f"{token!r} is no point of the request")

    flat = [e for c in CHECKS for e in errors[c]]
    return {"ok": not flat, "errors": flat[:20],
            "checks": {c: not errors[c] for c in CHECKS}}


def _check_prognosis(got: Mapping[str, Any], want: Mapping[str, Any], err: Any) -> None:
    path = "prognosis"
    if want["status"] != "assessed":
        if got.get("status") == "assessed":
            err("prognosis", f"{path}/status", f"assessed, but {want['reason']}")
        return
    if got.get("status") != "assessed":
        err("prognosis", f"{path}/status",
            f"the history of {want['point']} gives {want['remaining_useful_life_h']} h to its "
            f"alarm limit {want['limit']}; the answer says {got.get('status')}")
        return
    for key, value in want.items():
        if not _same(got.get(key), value):
            err("prognosis", f"{path}/{key}",
                f"{key} is {got.get(key)!r}; the history gives {value!r}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(b, int | float) and not isinstance(b, bool):
        return (isinstance(a, int | float) and not isinstance(a, bool)
                and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9))
    return bool(a == b)


def _free_text(output: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for i, s in enumerate(output.get("state_detection", [])):
        if isinstance(s.get("note"), str):
            out.append((f"state_detection/{i}/note", s["note"]))
    for i, h in enumerate(output.get("health_assessment", [])):
        for key in ("fault", "component"):
            if isinstance(h.get(key), str):
                out.append((f"health_assessment/{i}/{key}", h[key]))
    for key in ("note", "reason"):
        value = (output.get("prognosis") or {}).get(key)
        if isinstance(value, str):
            out.append((f"prognosis/{key}", value))
    for i, a in enumerate((output.get("advisory") or {}).get("actions", [])):
        if isinstance(a, str):
            out.append((f"advisory/actions/{i}", a))
    return out


def unknown_names(text: str, names: Sequence[str]) -> list[str]:
    """snake_case tokens in ``text`` that are neither a point of ``names`` (compared
    case-insensitively) nor the task's own vocabulary, in order, each once."""
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w]){re.escape(name)}(?![\w])", " ", text, flags=re.IGNORECASE)
    known = {n.lower() for n in names} | VOCABULARY
    found = [t for t in _SNAKE.findall(text) if t.lower() not in known]
    return list(dict.fromkeys(found))


def _points(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    points = data.get("points")
    if not isinstance(points, list):
        return []
    return [p for p in points if isinstance(p, Mapping) and isinstance(p.get("name"), str)]


_ASSESSMENT = '"health_assessment":['
_FAULT = '"fault":'
_FAULT_TEXT = re.compile(r'"fault":"((?:[^"\\]|\\.)*)"')


def fault_names_at(text: str) -> tuple[str | None, list[str]] | None:
    """When ``text`` (an answer so far) is at a fault's name in the health assessment: what
    of it is written (None: its opening quote comes next) and the faults asserted before it
    (``names.NameGuard`` refuses them): one entry per fault, its evidence together, so
    the answer cannot assert one twice; else None."""
    start = text.find(_ASSESSMENT)
    at = text.rfind(_FAULT)
    if start < 0 or at < start:
        return None
    rest = text[at + len(_FAULT):]
    if rest and (not rest.startswith('"') or '"' in rest[1:]):
        return None   # past the name (written and closed)
    earlier = [_unquoted(m) for m in _FAULT_TEXT.findall(text, start, at)]
    return (rest[1:] if rest else None), earlier


def _unquoted(escaped: str) -> str:
    try:
        return str(json.loads(f'"{escaped}"'))
    except json.JSONDecodeError:   # not JSON the grammar wrote: compared as it stands
        return escaped
