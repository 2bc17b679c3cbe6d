"""ST archetypes that combine two behaviours in one POU, as plant requests do: two-point
control with a delayed high alarm, two-point control held off by an interlock, a latched
drive with run-time supervision and a latched alarm, a delayed low alarm with horn, lamp
and acknowledgement.

The single-behaviour archetypes teach each piece; a request from the plant usually asks
for two at once ("on below 175, off above 185, alarm above 200 for 10 s"), and a model that
has only seen them apart writes one and forgets the other. Like ``corpus_st_more``, each
builder comes as ``_name(k) -> (pair, params)`` (the parameters, for behaviour tests) and
as the archetype ``name(k) -> pair`` of the ``COMBINED`` table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rung.tools.corpus_st_kit import VOCAB, Kit, human_time, num, real

Pair = tuple[dict[str, Any], dict[str, Any]]
Params = dict[str, Any]

# concept -> (English, German); ``c_`` keys never meet the other tables' own
_VOCAB: dict[str, tuple[str, str]] = {
    "c_pv": ("processValue", "istWert"), "c_out": ("actuator", "stellglied"),
    "c_alarm": ("highAlarm", "grenzAlarm"), "c_onBelow": ("switchOn", "einschaltPunkt"),
    "c_offAbove": ("switchOff", "ausschaltPunkt"), "c_alarmAt": ("alarmLimit", "alarmGrenze"),
    "c_alarmTimer": ("alarmDelay", "alarmVerz"), "c_interlock": ("interlock", "verriegelung"),
    "c_demand": ("demand", "anforderung"), "c_start": ("startButton", "startTaster"),
    "c_stop": ("stopButton", "stopTaster"), "c_estop": ("estopOk", "notHaltOk"),
    "c_motion": ("motionSensor", "bewegungsMelder"), "c_drive": ("driveOn", "antriebEin"),
    "c_jam": ("jamAlarm", "stauAlarm"), "c_ack": ("alarmAck", "quittierung"),
    "c_watch": ("watchTimer", "ueberwachung"), "c_running": ("machineRunning", "maschineLaeuft"),
    "c_horn": ("hornOut", "hupe"), "c_lamp": ("alarmLamp", "meldeLampe"),
    "c_lowTimer": ("lowDelay", "unterVerz"), "c_lowAt": ("lowLimit", "untereGrenze"),
    "c_newAlarm": ("newAlarm", "neuerAlarm"), "c_acked": ("acknowledged", "quittiert"),
}
_CLASH = set(_VOCAB) & set(VOCAB)
assert not _CLASH, f"concepts already in VOCAB: {sorted(_CLASH)}"
VOCAB.update(_VOCAB)


def _limit(k: Kit, concept: str, x: float, inline: bool, note: str) -> str:
    """A threshold: its literal (``inline``) or a local REAL holding it."""
    return real(x) if inline else k.var("VAR", concept, "REAL", real(x), note)


# the plants a two-point control runs: (what, quantity, unit, low, high, alarm, rising):
# rising=True switches the output on below the low point (heating, filling, pressure),
# False on above the high point (draining, cooling)
def _plant(k: Kit) -> tuple[str, str, str, float, float, float, bool]:
    return k.pick((
        ("heater", "temperature", k.pick(("degC", "°C")), *k.pick(
            ((60.0, 65.0, 75.0), (175.0, 185.0, 200.0), (140.0, 150.0, 165.0),
             (38.0, 42.0, 50.0))), True),
        ("fill pump", "level", "%", *k.pick(((20.0, 80.0, 95.0), (30.0, 70.0, 90.0),
                                            (15.0, 85.0, 92.0))), True),
        ("compressor", "pressure", "bar", *k.pick(((6.5, 7.5, 9.0), (5.0, 6.0, 8.0),
                                                  (4.0, 5.5, 7.0))), True),
        ("drain pump", "level", "%", *k.pick(((35.0, 70.0, 95.0), (25.0, 60.0, 85.0),
                                             (40.0, 75.0, 90.0))), False),
        ("cooling fan", "temperature", k.pick(("degC", "°C")), *k.pick(
            ((30.0, 40.0, 55.0), (45.0, 55.0, 70.0), (25.0, 35.0, 60.0))), False),
    ))


def _two_point(k: Kit, pv: str, out: str, lo: str, hi: str, rising: bool) -> list[str]:
    on_cmp, off_cmp = k.pick((("<", ">"), ("<=", ">="), ("<", ">=")))
    if rising:
        return [f"IF {pv} {on_cmp} {lo} THEN", f"    {out} := TRUE;",
                f"ELSIF {pv} {off_cmp} {hi} THEN", f"    {out} := FALSE;", "END_IF;"]
    up, down = {"<": ">", "<=": ">="}[on_cmp], {">": "<", ">=": "<="}[off_cmp]
    return [f"IF {pv} {up} {hi} THEN", f"    {out} := TRUE;",
            f"ELSIF {pv} {down} {lo} THEN", f"    {out} := FALSE;", "END_IF;"]


def _switching(rising: bool, lo: str, hi: str, u: str) -> tuple[str, str]:
    """How the prose states the two points: (on, off)."""
    return ((f"below {lo} {u}", f"above {hi} {u}") if rising
            else (f"above {hi} {u}", f"below {lo} {u}"))


# --- 1. two-point control with a delayed high alarm -------------------------------------


def _two_point_alarm(k: Kit) -> tuple[Pair, Params]:
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    what, quantity, unit, low, high, alarm, rising = _plant(k)
    delay = k.pick((2000, 3000, 5000, 10_000, 15_000, 30_000))
    pv = k.var("VAR_INPUT", "c_pv", "REAL", comment=f"{quantity} in {unit}")
    out = k.var("VAR_OUTPUT", "c_out", "BOOL", comment=what)
    alm = k.var("VAR_OUTPUT", "c_alarm", "BOOL", comment=f"high {quantity} alarm")
    inline = k.chance(0.3)
    lo = _limit(k, "c_onBelow" if rising else "c_offAbove", low, inline, "low switching point")
    hi = _limit(k, "c_offAbove" if rising else "c_onBelow", high, inline,
                "high switching point")
    al = _limit(k, "c_alarmAt", alarm, inline, "alarm limit")
    timer = k.var("VAR", "c_alarmTimer", "TON")
    body = k.note("two-point control") + _two_point(k, pv, out, lo, hi, rising)
    body += k.note(f"alarm: above the limit for {human_time(delay)}")
    body += [f"{timer}(IN := {pv} > {al}, PT := {k.time(delay)});", f"{alm} := {timer}.Q;"]
    lo_t, hi_t, al_t, u, d = num(low), num(high), num(alarm), unit, human_time(delay)
    on, off = _switching(rising, lo_t, hi_t, u)
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"{big} for the {what}: switch it on when the {quantity} is {on} and off when it "
        f"is {off}. Raise an alarm if the {quantity} stays above {al_t} {u} for {d}.",
        f"Write {a}: {what} on {on}, off {off} (hysteresis). Alarm output when the "
        f"{quantity} has been over {al_t} {u} for longer than {d}; it clears when the "
        f"{quantity} drops again.",
        f"{quantity.capitalize()} control in {a}: the {what} runs {on} and stops {off}; "
        f"between the two points it keeps its state. A high alarm comes on after {d} above "
        f"{al_t} {u}.",
        f"{big}, {what} ({quantity} in {u}): ein {on}, aus {off}. If the {quantity} is "
        f"higher than {al_t} {u} for {d}, set the alarm.",
    ))
    pair = k.finish(pou_type, ("TwoPointAlarm", "ZweipunktAlarm"), desc, body,
                    assumptions=(f"{quantity} is scaled to {unit}",))
    params = {"pv": pv, "out": out, "alarm": alm, "low": low, "high": high,
              "alarm_at": alarm, "delay_s": delay / 1000, "rising": rising}
    return pair, params


def two_point_alarm(k: Kit) -> Pair:
    """Two-point control with a delayed high alarm."""
    return _two_point_alarm(k)[0]


# --- 2. two-point control held off by an interlock --------------------------------------


def _two_point_interlock(k: Kit) -> tuple[Pair, Params]:
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    what, quantity, unit, low, high, _, rising = _plant(k)
    lock_what, permissive = k.pick((
        ("the drain valve is open", False), ("the maintenance switch is on", False),
        ("the door is open", False), ("the supply pump runs", True),
        ("the enable from the line is present", True), ("the main contactor is on", True)))
    pv = k.var("VAR_INPUT", "c_pv", "REAL", comment=f"{quantity} in {unit}")
    lock = k.var("VAR_INPUT", "c_interlock", "BOOL",
                 comment=("TRUE = allowed" if permissive else "TRUE = hold off"))
    out = k.var("VAR_OUTPUT", "c_out", "BOOL", comment=what)
    inline = k.chance(0.3)
    lo = _limit(k, "c_onBelow" if rising else "c_offAbove", low, inline, "low switching point")
    hi = _limit(k, "c_offAbove" if rising else "c_onBelow", high, inline,
                "high switching point")
    demand = k.var("VAR", "c_demand", "BOOL", comment="two-point demand")
    body = k.note("demand by hysteresis") + _two_point(k, pv, demand, lo, hi, rising)
    body += k.note("the interlock overrides the demand")
    body += [f"{out} := {demand} AND {lock};" if permissive
             else f"{out} := {demand} AND NOT {lock};"]
    lo_t, hi_t, u = num(low), num(high), unit
    on, off = _switching(rising, lo_t, hi_t, u)
    rule = (f"only while {lock_what}" if permissive else f"never while {lock_what}")
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"{big} for the {what}: on {on}, off {off}; it may run {rule}. When the interlock "
        f"goes away the {what} follows the {quantity} again.",
        f"Write {a}: {quantity} two-point control of the {what} (on {on}, off {off}). "
        f"Interlock: the {what} stays off {'unless' if permissive else 'while'} "
        f"{lock_what}.",
        f"{big}: switch the {what} {on} and back off {off}. It is {rule}; the demand "
        f"is kept meanwhile.",
    ))
    pair = k.finish(pou_type, ("InterlockedControl", "VerriegelteRegelung"), desc, body,
                    assumptions=(f"{quantity} is scaled to {unit}",))
    params = {"pv": pv, "lock": lock, "out": out, "low": low, "high": high,
              "rising": rising, "permissive": permissive}
    return pair, params


def two_point_interlock(k: Kit) -> Pair:
    """Two-point control whose output an interlock (or a permissive) holds off."""
    return _two_point_interlock(k)[0]


# --- 3. a latched drive with run-time supervision ---------------------------------------


def _supervised_drive(k: Kit) -> tuple[Pair, Params]:
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    watch = k.pick((5000, 10_000, 15_000, 20_000, 30_000, 45_000, 60_000))
    what, sensor_what = k.pick((("belt", "the part sensor"), ("screw conveyor",
                                                              "the rotation monitor"),
                                ("chain conveyor", "the photo eye"),
                                ("feeder", "the product sensor")))
    start = k.var("VAR_INPUT", "c_start", "BOOL", comment="start push button")
    stop = k.var("VAR_INPUT", "c_stop", "BOOL", comment="stop push button, TRUE = pressed")
    estop = k.var("VAR_INPUT", "c_estop", "BOOL", comment="FALSE = e-stop hit")
    motion = k.var("VAR_INPUT", "c_motion", "BOOL", comment=sensor_what)
    ack = k.var("VAR_INPUT", "c_ack", "BOOL", comment="alarm reset")
    drive = k.var("VAR_OUTPUT", "c_drive", "BOOL", comment=f"{what} contactor")
    jam = k.var("VAR_OUTPUT", "c_jam", "BOOL", comment="latched until reset")
    timer = k.var("VAR", "c_watch", "TON", comment=f"no signal for {human_time(watch)}")
    body = k.note(f"supervision: running without a signal for {human_time(watch)}")
    body += [f"{timer}(IN := {drive} AND NOT {motion}, PT := {k.time(watch)});",
             f"IF {timer}.Q THEN", f"    {jam} := TRUE;", "END_IF;",
             f"IF {ack} AND NOT {timer}.Q THEN", f"    {jam} := FALSE;", "END_IF;"]
    body += k.note("start/stop latch; stop, e-stop and the alarm win")
    body += [f"IF {stop} OR NOT {estop} OR {jam} THEN", f"    {drive} := FALSE;",
             f"ELSIF {start} THEN", f"    {drive} := TRUE;", "END_IF;"]
    w = human_time(watch)
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"{big} for a {what}: the start button starts it, the stop button or the e-stop "
        f"stops it. If it runs for {w} without a signal from {sensor_what}, stop it and "
        f"latch a jam alarm until reset; no start while the alarm is set.",
        f"Write {a}: start/stop of the {what} with e-stop. Run supervision: {sensor_what} "
        f"must report within {w} while running, otherwise switch off and set the alarm "
        f"(stays until the reset input).",
        f"{big}: {what} drive, latched by start, dropped by stop or e-stop. Watchdog {w} on "
        f"{sensor_what}: when it expires the {what} stops and a jam alarm is held until "
        f"acknowledged. Starting needs the alarm cleared.",
    ))
    pair = k.finish(pou_type, ("SupervisedDrive", "UeberwachterAntrieb"), desc, body,
                    assumptions=("the stop button is wired as TRUE = pressed",))
    params = {"start": start, "stop": stop, "estop": estop, "motion": motion, "ack": ack,
              "drive": drive, "jam": jam, "watch_s": watch / 1000}
    return pair, params


def supervised_drive(k: Kit) -> Pair:
    """Start/stop latch with e-stop, run-time supervision and a latched alarm."""
    return _supervised_drive(k)[0]


# --- 4. delayed low alarm with horn, lamp and acknowledgement ---------------------------


def _low_alarm_ack(k: Kit) -> tuple[Pair, Params]:
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    quantity, unit, low = k.pick((
        ("lube oil pressure", "bar", k.pick((0.8, 1.2, 1.5, 2.0))),
        ("cooling water flow", "m3/h", k.pick((2.0, 3.5, 5.0, 12.0))),
        ("seal water pressure", "bar", k.pick((1.0, 2.5, 3.0))),
        ("tank level", "%", k.pick((10.0, 15.0, 20.0)))))
    delay = k.pick((1000, 2000, 3000, 5000, 10_000))
    machine = k.pick(("turbine", "pump", "compressor", "gearbox"))
    pv = k.var("VAR_INPUT", "c_pv", "REAL", comment=f"{quantity} in {unit}")
    running = k.var("VAR_INPUT", "c_running", "BOOL", comment=f"{machine} running")
    ack = k.var("VAR_INPUT", "c_ack", "BOOL", comment="acknowledge button")
    horn = k.var("VAR_OUTPUT", "c_horn", "BOOL")
    lamp = k.var("VAR_OUTPUT", "c_lamp", "BOOL")
    lo = _limit(k, "c_lowAt", low, k.chance(0.3), "low limit")
    timer = k.var("VAR", "c_lowTimer", "TON")
    edge = k.var("VAR", "c_newAlarm", "R_TRIG")
    acked = k.var("VAR", "c_acked", "BOOL")
    body = [f"{timer}(IN := {running} AND {pv} < {lo}, PT := {k.time(delay)});",
            f"{edge}(CLK := {timer}.Q);"]
    body += k.note("a new alarm sounds the horn and lights the lamp")
    body += [f"IF {edge}.Q THEN", f"    {horn} := TRUE;", f"    {lamp} := TRUE;",
             f"    {acked} := FALSE;", "END_IF;"]
    body += k.note("acknowledge silences the horn")
    body += [f"IF {ack} AND {lamp} THEN", f"    {horn} := FALSE;", f"    {acked} := TRUE;",
             "END_IF;"]
    body += k.note("the lamp goes out once acknowledged and back to normal")
    body += [f"IF {acked} AND {pv} >= {lo} THEN", f"    {lamp} := FALSE;",
             f"    {acked} := FALSE;", "END_IF;"]
    lo_t, u, d = num(low), unit, human_time(delay)
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"{big}: while the {machine} runs and the {quantity} is below {lo_t} {u} for more "
        f"than {d}, sound the horn and light the lamp. Acknowledge switches the horn off; "
        f"the lamp stays on until the alarm is acknowledged and the {quantity} is back.",
        f"Write {a} for a low {quantity} alarm on the {machine}: limit {lo_t} {u}, delay "
        f"{d}, only while running. Horn and lamp on alarm; the ack button silences the "
        f"horn, the lamp clears when acknowledged and normal again. A new alarm sounds "
        f"the horn again.",
        f"{big} (Stoermeldung) for the {machine}: {quantity} under {lo_t} {u} longer than "
        f"{d} with the {machine} running gives horn plus lamp. Quittieren stops the horn; "
        f"the lamp goes out when acknowledged and the {quantity} has recovered.",
    ))
    pair = k.finish(pou_type, ("LowAlarm", "UnterAlarm"), desc, body,
                    assumptions=(f"{quantity} is scaled to {unit}",))
    params = {"pv": pv, "running": running, "ack": ack, "horn": horn, "lamp": lamp,
              "low": low, "delay_s": delay / 1000}
    return pair, params


def low_alarm_ack(k: Kit) -> Pair:
    """Delayed low alarm while running: horn and lamp, acknowledgement, lamp until normal."""
    return _low_alarm_ack(k)[0]


WITH_PARAMS: dict[str, Callable[[Kit], tuple[Pair, Params]]] = {
    "two_point_alarm": _two_point_alarm,
    "two_point_interlock": _two_point_interlock,
    "supervised_drive": _supervised_drive,
    "low_alarm_ack": _low_alarm_ack,
}
"""Archetype name -> builder that also returns the sample's parameters (for tests)."""

COMBINED: dict[str, Callable[[Kit], Pair]] = {
    "two_point_alarm": two_point_alarm,
    "two_point_interlock": two_point_interlock,
    "supervised_drive": supervised_drive,
    "low_alarm_ack": low_alarm_ack,
}
