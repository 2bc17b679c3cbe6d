"""The archetypes of ``corpus_st_more`` and ``corpus_st_combined``: every sample passes the
st_code task's validation and is judged right, uses only numbers the request lets the
grammar write, and behaves as its description says when run on the ST interpreter (vectors
computed from its parameters)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from rung.daemon.tasks.kinds import KINDS
from rung.daemon.tasks.quality import judge
from rung.daemon.tasks.st import request as st_request
from rung.daemon.tasks.st.interpreter import run_vectors
from rung.daemon.tasks.task import Task, load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.tools.corpus_st import ARCHETYPES
from rung.tools.corpus_st_combined import COMBINED
from rung.tools.corpus_st_combined import WITH_PARAMS as COMBINED_WITH_PARAMS
from rung.tools.corpus_st_kit import Kit
from rung.tools.corpus_st_more import MORE as MORE_ONLY
from rung.tools.corpus_st_more import WITH_PARAMS as MORE_WITH_PARAMS
from rung.tools.corpus_st_setpoints import in_served_form

Params = dict[str, Any]
MORE = {**MORE_ONLY, **COMBINED}
WITH_PARAMS = {**MORE_WITH_PARAMS, **COMBINED_WITH_PARAMS}
Steps = list[dict[str, Any]]
SEEDS = range(50)
# archetypes whose requests state no value with a unit that the POU holds by name
NO_SETPOINTS: set[str] = set()
BEHAVIOUR_SEEDS = range(20)


@pytest.fixture(scope="module")
def task() -> Task:
    return load_tasks()["st_code"]


def _sample(name: str, seed: int) -> tuple[dict[str, Any], dict[str, Any], Params]:
    (data, output), params = WITH_PARAMS[name](Kit(random.Random(seed)))
    return data, output, params


def test_wired_in() -> None:
    assert set(MORE) == set(WITH_PARAMS)
    assert all(ARCHETYPES[name] is builder for name, builder in MORE.items())


def test_public_builder_matches() -> None:
    for name, builder in MORE.items():
        data, output, _ = _sample(name, 7)
        assert builder(Kit(random.Random(7))) == (data, output)


@pytest.mark.parametrize("name", sorted(MORE))
@pytest.mark.slow
def test_every_sample_valid_and_right(name: str, task: Task) -> None:
    descriptions = set()
    for seed in SEEDS:
        data, output, _ = _sample(name, seed)
        _, v = validate_output(task.output_schema, task.kind, output, data)
        verdict = judge(KINDS["st"], v)
        assert verdict.right, (seed, verdict.reason, data, output["body"])
        descriptions.add(data["description"])
    assert len(descriptions) >= 40   # varied values and prose


_CODE_NUMBER = re.compile(r"(?<![\w#.])(\d+(?:\.\d+)?)(?![\w#])")
_TIME = re.compile(r"\b(?:T|TIME)#[0-9a-zA-Z_.]+", re.I)


@pytest.mark.parametrize("name", sorted(MORE))
def test_numbers_are_the_stated_ones(name: str) -> None:
    """The grammar lets a POU write only the request's numbers (and small ones): the
    corpus must not teach others."""
    for seed in SEEDS:
        data, output, _ = _sample(name, seed)
        allowed = {float(x) for x in st_request.literals(st_request.read(data))}
        text = output["body"] + "\n" + "\n".join(str(v.get("initial", ""))
                                                 for v in output["variables"])
        code = _TIME.sub(" ", re.sub(r"\(\*.*?\*\)|//[^\n]*", " ", text, flags=re.S))
        used = {float(n) for n in _CODE_NUMBER.findall(code)}
        assert used <= allowed, (seed, used - allowed, data["description"])


# --- behaviour ----------------------------------------------------------------------------


def _run(output: dict[str, Any], steps: Steps, scan_s: float = 0.1) -> None:
    steps = sorted(steps, key=lambda s: float(s["t"]))
    result = run_vectors(output, {"scan_s": scan_s, "steps": steps})
    assert result["ok"], (result, output["body"])


def _set(t: float, **values: Any) -> dict[str, Any]:
    return {"t": round(t, 3), "set": values}


def _expect(t: float, **values: Any) -> dict[str, Any]:
    return {"t": round(t, 3), "expect": values}


def _restart_lockout(p: Params) -> tuple[Steps, float]:
    pv, run, lock = p["pv"], p["run"], p["lock_s"]
    gap = p["off"] - p["on"]
    low, mid, high = p["on"] - gap / 2, p["on"] + gap / 2, p["off"] + gap / 2
    steps = [_set(0, **{pv: low})]
    if p["tof"]:   # no lockout at power-up
        steps += [_expect(0.3, **{run: True})]
        t1 = 1.0
    else:          # stopped since power-up: the lockout runs first
        steps += [_expect(lock - 0.5, **{run: False}), _expect(lock + 0.5, **{run: True})]
        t1 = lock + 1.0
    steps += [_set(t1, **{pv: high}), _expect(t1 + 0.3, **{run: False}),
              _set(t1 + 0.5, **{pv: low}),
              _expect(t1 + lock - 0.5, **{run: False}),    # still locked out
              _expect(t1 + lock + 0.5, **{run: True})]
    t2 = t1 + lock + 1.0   # hysteresis: mid keeps the state
    steps += [_set(t2, **{pv: mid}), _expect(t2 + 0.5, **{run: True}),
              _set(t2 + 1, **{pv: high}), _expect(t2 + 1.3, **{run: False}),
              _set(t2 + 1.5, **{pv: mid}), _expect(t2 + lock + 3, **{run: False})]
    return steps, 0.1


def _two_hand(p: Params) -> tuple[Steps, float]:
    a, b, out, w = p["a"], p["b"], p["out"], p["window_s"]
    steps = [_set(0, **{a: True}), _expect(0.02, **{out: False}),
             _set(w / 2, **{b: True}), _expect(w / 2 + 0.02, **{out: True}),
             _set(1.0, **{a: False}), _expect(1.02, **{out: False}),
             _set(1.1, **{a: True}), _expect(1.2, **{out: False}),    # not re-armed
             _set(1.5, **{a: False, b: False}),
             _set(2.0, **{a: True}), _set(2.0 + 1.5 * w, **{b: True}),   # too late
             _expect(2.05 + 1.5 * w, **{out: False}), _expect(2.3 + 1.5 * w, **{out: False}),
             _set(4.0, **{a: False, b: False}),
             _set(4.5, **{a: True, b: True}), _expect(4.55, **{out: True}),   # together
             _expect(5.0, **{out: True})]
    if p["estop"]:
        steps += [_set(0, **{p["estop"]: True}), _set(5.2, **{p["estop"]: False}),
                  _expect(5.25, **{out: False})]
    return steps, 0.01


def _discrepancy(p: Params) -> tuple[Steps, float]:
    cmd, op, cl, ack, out, alarm = (p[x] for x in ("cmd", "open", "closed", "ack", "out",
                                                     "alarm"))
    tr, both = p["travel_s"], p["both_s"]
    steps = [_set(0, **{cl: True, cmd: False}), _expect(0.5, **{alarm: False}),
             _set(1, **{cmd: True}), _set(1.5, **{cl: False}), _set(1 + tr / 2, **{op: True}),
             _expect(1 + tr / 2 + 0.5, **{alarm: False, out: True})]
    t = 2 + tr   # close command, the closed switch never comes
    steps += [_set(t, **{cmd: False}), _set(t + 0.5, **{op: False}),
              _expect(t + tr - 0.5, **{alarm: False}), _expect(t + tr + 0.5, **{alarm: True})]
    t += tr
    steps += [_set(t + 1, **{ack: True}), _set(t + 1.5, **{ack: False}),
              _expect(t + 2, **{alarm: True}),     # fault still there: ack ignored
              _set(t + 3, **{cl: True}), _expect(t + 3.5, **{alarm: True}),   # latched
              _set(t + 4, **{ack: True}), _expect(t + 4.3, **{alarm: False}),
              _set(t + 4.5, **{ack: False})]
    t += 6   # both limit switches made
    steps += [_set(t, **{op: True}), _expect(t + both - 0.3, **{alarm: False}),
              _expect(t + both + 0.3, **{alarm: True}),
              _set(t + both + 0.5, **{cmd: True}),
              _expect(t + both + 0.7, **{out: not p["drop"]})]
    return steps, 0.1


def _pulse_pause(p: Params) -> tuple[Steps, float]:
    en, duty, out, per, mn = p["enable"], p["duty"], p["out"], p["period_s"], p["min_pct"]
    steps = [_set(0, **{en: True, duty: 40.0}),
             _expect(0.2 * per, **{out: True}), _expect(0.6 * per, **{out: False}),
             _expect(1.1 * per, **{out: True}), _expect(1.3 * per, **{out: True}),
             _expect(1.6 * per, **{out: False}),
             _set(2.5 * per, **{duty: mn - 1.0}),      # below the minimum: no pulse
             _expect(3.1 * per, **{out: False}), _expect(3.2 * per, **{out: False}),
             _set(4.0 * per, **{duty: 100.0}), _expect(4.5 * per, **{out: True}),
             _set(5.2 * per, **{en: False}), _expect(5.3 * per, **{out: False}),
             _set(6.0 * per, **{en: True, duty: 75.0}),
             _expect(6.5 * per, **{out: True}), _expect(6.9 * per, **{out: False})]
    return steps, per / 100


def _hh_trip(p: Params) -> tuple[Steps, float]:
    val, req, rst, out, trip = (p[x] for x in ("value", "request", "reset", "out", "tripped"))
    hh, rl, d = p["hh"], p["reset_limit"], p["delay_s"]
    gap = hh - rl
    normal, mid, high = rl - gap, hh - gap / 2, hh + gap / 2
    steps = [_set(0, **{req: True, val: normal}), _expect(0.5, **{out: True, trip: False}),
             _set(1, **{val: high}), _set(1 + d - 0.5, **{val: mid}),   # too short
             _expect(1 + d + 0.5, **{trip: False, out: True})]
    t = d + 3
    steps += [_set(t, **{val: high}), _expect(t + d - 0.3, **{trip: False}),
              _expect(t + d + 0.3, **{trip: True, out: False})]
    t += d
    steps += [_set(t + 1, **{val: mid}), _set(t + 1.5, **{rst: True}),
              _set(t + 2, **{rst: False}),
              _expect(t + 2.2, **{trip: True, out: False}),   # above the reset limit
              _set(t + 3, **{val: normal}), _expect(t + 3.5, **{trip: True}),   # no edge
              _set(t + 4, **{rst: True}), _expect(t + 4.2, **{trip: False, out: True})]
    return steps, 0.1


def _updown_count(p: Params) -> tuple[Steps, float]:
    ein, eout, rst, cnt, hold = (p[x] for x in ("in", "out", "reset", "count", "hold"))
    full, rel = p["full"], p["release"]
    steps: Steps = [_set(0, **{ein: False, eout: False, rst: False})]
    t = 0.5

    def pulses(sensor: str, n: int) -> None:
        nonlocal t
        for _ in range(n):
            steps.extend([_set(t, **{sensor: True}), _set(t + 0.1, **{sensor: False})])
            t += 0.2

    pulses(ein, full - 1)
    steps.append(_expect(t - 0.05, **{cnt: full - 1, hold: False}))
    pulses(ein, 1)
    steps.append(_expect(t - 0.05, **{cnt: full, hold: True}))
    pulses(eout, full - rel)
    steps.append(_expect(t - 0.05, **{cnt: rel, hold: True}))    # not yet below
    pulses(eout, 1)
    steps.append(_expect(t - 0.05, **{cnt: rel - 1, hold: False}))
    pulses(ein, 3)
    steps += [_expect(t - 0.05, **{cnt: rel + 2}), _set(t + 0.5, **{rst: True}),
              _expect(t + 0.7, **{cnt: 0, hold: False}), _set(t + 1, **{rst: False})]
    t += 1.5
    if not p["ctud"]:   # never below zero
        pulses(eout, 2)
        steps.append(_expect(t - 0.05, **{cnt: 0}))
    return steps, 0.1


def _timed_sequence(p: Params) -> tuple[Steps, float]:
    start, stop, outs, done, ds = p["start"], p["stop"], p["outs"], p["done"], p["durations_s"]
    off = {o: False for o in outs}
    steps = [_set(0, **{start: False, stop: False}), _expect(0.5, **off, **{done: False}),
             _set(1, **{start: True}), _set(1.5, **{start: False})]
    t = 1.0
    for i, d in enumerate(ds):
        steps.append(_expect(t + d / 2, **{**off, outs[i]: True, done: False}))
        t += d
    steps += [_expect(t + 1, **off, **{done: True}), _expect(t + 1.9, **{done: True}),
              _set(t + 2, **{start: True}), _set(t + 2.5, **{start: False}),
              _expect(t + 2.2, **{**off, outs[0]: True, done: False}),
              _set(t + 2.7, **{stop: True}), _expect(t + 2.9, **off, **{done: False}),
              _set(t + 3.0, **{stop: False}), _expect(t + 4 + ds[0], **off, **{done: False})]
    return steps, 0.1


def _cyclic_sequencer(p: Params) -> tuple[Steps, float]:
    en, outs, iv, pu = p["enable"], p["outs"], p["interval_s"], p["pulse_s"]
    n = len(outs)
    off = {o: False for o in outs}
    steps = [_set(0, **{en: True}), _expect(iv - 0.5, **off)]
    for j in range(n + 1):   # one full round and the wrap to the first
        fire = (j + 1) * iv
        steps += [_expect(fire + pu / 2, **{**off, outs[j % n]: True}),
                  _expect(fire + pu + 0.1, **off)]
    t = (n + 1) * iv + iv / 2
    steps += [_set(t, **{en: False}), _expect(t + 0.1, **off),
              _set(t + 1, **{en: True}), _expect(t + 1 + iv - 0.5, **off),
              _expect(t + 1 + iv + pu / 2, **{**off, outs[0]: True})]
    return steps, 0.05


def _two_point_alarm(p: Params) -> tuple[Steps, float]:
    pv, out, alm, d = p["pv"], p["out"], p["alarm"], p["delay_s"]
    low, high, at = p["low"], p["high"], p["alarm_at"]
    below, mid = low - (high - low) / 4, (low + high) / 2
    above, over = high + (at - high) / 2, at + (high - low) / 2
    on_at, off_at = (below, above) if p["rising"] else (above, below)
    steps = [_set(0, **{pv: on_at}), _expect(0.3, **{out: True, alm: False}),
             _set(0.5, **{pv: mid}), _expect(0.8, **{out: True}),           # hysteresis
             _set(1, **{pv: off_at}), _expect(1.3, **{out: False, alm: False}),
             _set(1.5, **{pv: mid}), _expect(1.8, **{out: False}),
             _set(2, **{pv: over}), _expect(2 + d - 0.4, **{alm: False}),  # delayed
             _expect(2 + d + 0.4, **{alm: True}),
             _set(3 + d, **{pv: mid}), _expect(3.3 + d, **{alm: False})]
    return steps, 0.1


def _two_point_interlock(p: Params) -> tuple[Steps, float]:
    pv, lock, out = p["pv"], p["lock"], p["out"]
    low, high = p["low"], p["high"]
    hold, free = (False, True) if p["permissive"] else (True, False)
    below, mid, above = low - (high - low) / 4, (low + high) / 2, high + (high - low) / 4
    on_at, off_at = (below, above) if p["rising"] else (above, below)
    steps = [_set(0, **{pv: on_at, lock: free}), _expect(0.3, **{out: True}),
             _set(0.5, **{lock: hold}), _expect(0.8, **{out: False}),
             _set(1, **{pv: mid}), _expect(1.3, **{out: False}),
             _set(1.5, **{lock: free}), _expect(1.8, **{out: True}),      # demand kept
             _set(2, **{pv: off_at}), _expect(2.3, **{out: False}),
             _set(2.5, **{lock: hold}), _set(3, **{lock: free, pv: mid}),
             _expect(3.3, **{out: False})]
    return steps, 0.1


def _supervised_drive(p: Params) -> tuple[Steps, float]:
    start, stop, estop, motion, ack, drive, jam = (
        p[x] for x in ("start", "stop", "estop", "motion", "ack", "drive", "jam"))
    w = p["watch_s"]
    steps = [_set(0, **{estop: True, stop: False, start: False, motion: False, ack: False}),
             _expect(0.2, **{drive: False}),
             _set(0.5, **{start: True}), _expect(0.7, **{drive: True}), _set(0.8, **{start: False}),
             _set(0.5 + 0.6 * w, **{motion: True}), _set(0.7 + 0.6 * w, **{motion: False}),
             _expect(0.5 + w + 0.3, **{drive: True, jam: False}),   # the signal came
             _expect(0.7 + 1.6 * w - 0.4, **{drive: True}),
             _expect(0.7 + 1.6 * w + 0.4, **{drive: False, jam: True})]
    t = 0.7 + 1.6 * w + 1
    steps += [_set(t, **{start: True}), _expect(t + 0.2, **{drive: False}),   # blocked
              _set(t + 0.3, **{start: False}), _set(t + 0.5, **{ack: True}),
              _expect(t + 0.7, **{jam: False, drive: False}), _set(t + 0.8, **{ack: False}),
              _set(t + 1, **{start: True}), _expect(t + 1.2, **{drive: True}),
              _set(t + 1.3, **{start: False}), _set(t + 1.5, **{stop: True}),
              _expect(t + 1.7, **{drive: False}), _set(t + 1.8, **{stop: False}),
              _set(t + 2, **{start: True}), _expect(t + 2.2, **{drive: True}),
              _set(t + 2.3, **{start: False}), _set(t + 2.5, **{estop: False}),
              _expect(t + 2.7, **{drive: False})]
    return steps, 0.1


def _low_alarm_ack(p: Params) -> tuple[Steps, float]:
    pv, run, ack, horn, lamp, d = (p[x] for x in ("pv", "running", "ack", "horn", "lamp",
                                                  "delay_s"))
    normal, low = p["low"] * 2, p["low"] / 2
    steps = [_set(0, **{run: True, pv: normal, ack: False}),
             _expect(0.3, **{horn: False, lamp: False}),
             _set(0.5, **{pv: low}), _expect(0.5 + d - 0.4, **{horn: False}),
             _set(0.5 + d - 0.2, **{pv: normal})]                       # a short dip
    t = 1 + d
    steps += [_set(t, **{pv: low}), _expect(t + d + 0.4, **{horn: True, lamp: True})]
    t += d + 1
    steps += [_set(t, **{ack: True}), _expect(t + 0.2, **{horn: False, lamp: True}),
              _set(t + 0.4, **{ack: False}), _expect(t + 0.8, **{lamp: True}),   # still low
              _set(t + 1, **{pv: normal}), _expect(t + 1.3, **{lamp: False})]
    t += 2
    steps += [_set(t, **{pv: low}), _expect(t + d + 0.4, **{horn: True, lamp: True})]
    t += d + 1
    steps += [_set(t, **{ack: True}), _set(t + 0.3, **{ack: False, pv: normal}),
              _expect(t + 0.6, **{horn: False, lamp: False}),
              _set(t + 1, **{run: False}), _set(t + 1.2, **{pv: low}),
              _expect(t + 1.2 + 2 * d, **{horn: False, lamp: False})]   # not running
    return steps, 0.1


VECTORS: dict[str, Callable[[Params], tuple[Steps, float]]] = {
    "two_point_alarm": _two_point_alarm,
    "two_point_interlock": _two_point_interlock,
    "supervised_drive": _supervised_drive,
    "low_alarm_ack": _low_alarm_ack,
    "restart_lockout": _restart_lockout,
    "two_hand": _two_hand,
    "discrepancy": _discrepancy,
    "pulse_pause": _pulse_pause,
    "hh_trip": _hh_trip,
    "updown_count": _updown_count,
    "timed_sequence": _timed_sequence,
    "cyclic_sequencer": _cyclic_sequencer,
}


def test_every_archetype_has_vectors() -> None:
    assert set(VECTORS) == set(MORE)


@pytest.mark.parametrize("name", sorted(MORE))
@pytest.mark.slow
def test_behaviour(name: str) -> None:
    for seed in BEHAVIOUR_SEEDS:
        _, output, params = _sample(name, seed)
        steps, scan_s = VECTORS[name](params)
        _run(output, steps, scan_s)


@pytest.mark.parametrize("name", sorted(MORE))
@pytest.mark.slow
def test_behaviour_in_served_form(name: str) -> None:
    """Put in the form rung serves (the stated values read from the setpoints code
    declares), a sample behaves as before."""
    served = 0
    for seed in BEHAVIOUR_SEEDS:
        data, output, params = _sample(name, seed)
        form = in_served_form(data, output)
        if form is None or form == output:
            continue
        served += 1
        steps, scan_s = VECTORS[name](params)
        _run(form, steps, scan_s)
    assert served or name in NO_SETPOINTS, name


def test_behaviour_catches_a_broken_lockout() -> None:
    """The vectors have teeth: a lockout shortened to nothing fails them."""
    _, output, params = _sample("restart_lockout", 0)
    steps, scan_s = _restart_lockout(params)
    broken = dict(output, body=re.sub(r"PT := \S+\)", "PT := T#0MS)", output["body"]))
    result = run_vectors(broken, {"scan_s": scan_s, "steps": steps})
    assert not result["ok"]


def test_behaviour_catches_a_forgotten_alarm() -> None:
    """A two-point control that writes the hysteresis and forgets the delayed alarm (what
    a model that saw the two apart writes) fails the combined archetype's vectors."""
    _, output, params = _sample("two_point_alarm", 3)
    steps, scan_s = _two_point_alarm(params)
    lines = [ln for ln in output["body"].splitlines() if params["alarm"] not in ln]
    result = run_vectors(dict(output, body="\n".join(lines)),
                         {"scan_s": scan_s, "steps": steps})
    assert not result["ok"]
