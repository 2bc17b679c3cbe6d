"""More ST archetypes: restart lockout, two-hand control, discrepancy alarm, pulse-pause
output, high-high trip, up/down counting, timed step sequence and a cyclic sequencer.

Each builder comes in two forms: ``_name(k) -> (pair, params)`` (the parameters the sample
was built from: its stated values and the interface names, for behaviour tests) and the
archetype ``name(k) -> pair`` of the ``MORE`` table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rung.tools.corpus_st_kit import VOCAB, Kit, cap, human_time, num, real

Pair = tuple[dict[str, Any], dict[str, Any]]
Params = dict[str, Any]

# concept -> (English, German); keys carry an ``m_`` prefix so they never meet the kit's own
_MORE_VOCAB: dict[str, tuple[str, str]] = {
    "m_pressure": ("pressure", "druck"), "m_cutIn": ("cutInPressure", "einschaltDruck"),
    "m_cutOut": ("cutOutPressure", "ausschaltDruck"), "m_compressor": ("compressorOn",
                                                                        "verdichterEin"),
    "m_boosterPump": ("boosterPump", "druckPumpe"), "m_lockout": ("lockoutTimer",
                                                                   "wiederanlaufSperre"),
    "m_locked": ("restartLocked", "anlaufGesperrt"),
    "m_handA": ("handButtonA", "tasterLinks"), "m_handB": ("handButtonB", "tasterRechts"),
    "m_pressValve": ("pressStroke", "presseAb"), "m_syncTimer": ("syncTimer", "gleichzeitigkeit"),
    "m_armed": ("armed", "bereitFuerZyklus"),
    "m_dampOpenCmd": ("openCommand", "auf"), "m_travelTimer": ("travelTimer", "laufzeitUeberw"),
    "m_bothTimer": ("bothLimitsTimer", "beideEndlagen"), "m_discAlarm": ("discrepancyAlarm",
                                                                          "laufzeitStoerung"),
    "m_damperOut": ("damperOut", "klappeAuf"),
    "m_duty": ("dutyPct", "tastgrad"), "m_minDuty": ("minDutyPct", "minTastgrad"),
    "m_pwmOut": ("pulseOut", "taktAusgang"), "m_period": ("periodTimer", "periodenZeit"),
    "m_onTime": ("onTime", "einZeit"),
    "m_hhLimit": ("tripLimit", "abschaltGrenze"), "m_resetLimit": ("resetLimit",
                                                                    "rueckstellGrenze"),
    "m_hhTimer": ("tripDelay", "abschaltVerz"), "m_runRequest": ("runRequest", "laufAnforderung"),
    "m_resetEdge": ("resetEdge", "resetFlanke"), "m_plantOut": ("plantOn", "anlageEin"),
    "m_entrySensor": ("entrySensor", "einlaufSensor"), "m_exitSensor": ("exitSensor",
                                                                         "auslaufSensor"),
    "m_entryEdge": ("entryEdge", "einlaufFlanke"), "m_exitEdge": ("exitEdge", "auslaufFlanke"),
    "m_udCounter": ("bufferCounter", "pufferZaehler"), "m_itemCount": ("itemCount",
                                                                        "anzahlTeile"),
    "m_holdInfeed": ("holdInfeed", "zulaufStopp"), "m_fullAt": ("fullAt", "vollBei"),
    "m_releaseBelow": ("releaseBelow", "freigabeUnter"),
    "m_seqStep": ("seqStep", "ablaufSchritt"), "m_startEdge": ("startEdge", "startFlanke"),
    "m_seqDone": ("seqDone", "ablaufFertig"),
    "m_intervalTimer": ("intervalTimer", "intervallZeit"), "m_pulseTimer": ("pulseTimer",
                                                                             "impulsZeit"),
    "m_channel": ("channel", "kanal"), "m_fire": ("firePulse", "ausloesen"),
}
for _i in range(1, 6):
    _MORE_VOCAB[f"m_jetValve{_i}"] = (f"jetValve{_i}", f"spuelVentil{_i}")
    _MORE_VOCAB[f"m_stepTimer{_i}"] = (f"stepTimer{_i}", f"schrittZeit{_i}")

# step outputs of a timed sequence: (concept, English, German, prose)
_SEQ_FAMILIES: tuple[tuple[tuple[str, str, str, str], ...], ...] = (
    (("m_fillValve", "fillValve", "fuellVentil", "fill valve"),
     ("m_mixer", "mixer", "ruehrwerk", "mixer"),
     ("m_heater", "heaterOut", "heizung", "heater"),
     ("m_drainOut", "drainValve", "ablassVentil", "drain valve")),
    (("m_prewash", "prewashPump", "vorwaschPumpe", "pre-wash pump"),
     ("m_washPump", "washPump", "waschPumpe", "wash pump"),
     ("m_rinseValve", "rinseValve", "spuelVentil", "rinse valve"),
     ("m_dryFan", "dryerFan", "trocknerLuefter", "drying fan")),
    (("m_clampOut", "clampValve", "spannVentil", "clamp"),
     ("m_pressDown", "pressDown", "presseSenken", "press ram"),
     ("m_blowOff", "blowOff", "abblasen", "blow-off valve"),
     ("m_ejector", "ejector", "auswerfer", "ejector")),
)
for _fam in _SEQ_FAMILIES:
    for _c, _en, _de, _ in _fam:
        _MORE_VOCAB[_c] = (_en, _de)

_CLASH = set(_MORE_VOCAB) & set(VOCAB)
assert not _CLASH, f"concepts already in VOCAB: {sorted(_CLASH)}"
VOCAB.update(_MORE_VOCAB)


def _fb_var(k: Kit, concept: str, fb_type: str) -> str:
    """A local FB instance; for a type the kit has no Hungarian prefix for (CTUD), the
    prefix is its lower-case type name."""
    try:
        return k.var("VAR", concept, fb_type)
    except KeyError:
        name = fb_type.lower() + cap(VOCAB[concept][1 if k.german else 0])
        k.variables.append({"section": "VAR", "name": name, "type": fb_type})
        return name


def _a(word: str) -> str:
    """``word`` with its indefinite article: ``an air damper``, ``a flap``."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


# --- 1. restart lockout -------------------------------------------------------------------


def _restart_lockout(k: Kit) -> tuple[Pair, Params]:
    """Two-point pressure control with a minimum off time before a restart (TOF or TON)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    unit, on_x = k.pick((("bar", k.pick((4.0, 4.5, 5.0, 5.5, 6.0))),
                         ("kPa", k.pick((300.0, 400.0, 450.0))),
                         ("psi", k.pick((60.0, 70.0, 80.0, 90.0)))))
    off_x = on_x + {"bar": k.pick((1.0, 1.5, 2.0)), "kPa": k.pick((100.0, 150.0)),
                    "psi": k.pick((15.0, 20.0, 25.0))}[unit]
    lock = k.pick((10_000, 20_000, 30_000, 60_000, 90_000, 120_000, 180_000, 300_000))
    use_tof = k.chance(0.6)
    pump = k.chance(0.4)
    pv = k.var("VAR_INPUT", "m_pressure", "REAL", comment=f"line pressure in {unit}")
    run = k.var("VAR_OUTPUT", "m_boosterPump" if pump else "m_compressor", "BOOL")
    locked = k.var("VAR_OUTPUT", "m_locked", "BOOL", comment="restart blocked") \
        if k.chance(0.5) else ""
    inline = k.chance(0.3)
    cut_in = real(on_x) if inline else k.var("VAR", "m_cutIn", "REAL", real(on_x),
                                             f"start below {num(on_x)} {unit}")
    cut_out = real(off_x) if inline else k.var("VAR", "m_cutOut", "REAL", real(off_x),
                                               f"stop above {num(off_x)} {unit}")
    timer = k.var("VAR", "m_lockout", "TOF" if use_tof else "TON",
                  comment=f"minimum off time {human_time(lock)}")
    if use_tof:
        body = k.note("TOF: Q stays TRUE for the lockout time after the last stop")
        body += [f"{timer}(IN := {run}, PT := {k.time(lock)});"]
        blocked = f"{timer}.Q"
    else:
        body = k.note("TON: the machine must have been stopped for the lockout time")
        body += [f"{timer}(IN := NOT {run}, PT := {k.time(lock)});"]
        blocked = f"NOT {timer}.Q"
    cmp_on = k.pick(("<", "<="))
    body += [f"IF {pv} {'>=' if cmp_on == '<' else '>'} {cut_out} THEN", f"    {run} := FALSE;",
             f"ELSIF {pv} {cmp_on} {cut_in} AND NOT ({blocked}) THEN", f"    {run} := TRUE;",
             "END_IF;"]
    if locked:
        body += [f"{locked} := NOT {run} AND {blocked};"]
    what = k.pick(("booster pump", "pressure pump")) if pump else k.pick(
        ("compressor", "air compressor", "compressor motor"))
    on, off, u, t = num(on_x), num(off_x), unit, human_time(lock)
    a, big = k.an_pou(pou_type)
    power = ("" if use_tof else k.pick((" (this also holds after power-up)",
                                         "; after power-up the lockout runs first")))
    desc = k.pick((
        f"Write {a} for {_a(what)}: start it when the pressure falls below {on} {u} and stop "
        f"it above {off} {u}. Never restart within {t} of the last stop{power}.",
        f"{big} controlling {_a(what)} by hysteresis: cut-in {on} {u}, cut-out {off} {u}. "
        f"Minimum off time {t} before a restart (restart lockout, Wiedereinschaltsperre)"
        f"{power}.",
        f"Pressure switch logic in {a}: run the {what} below {on} {u}, switch it off above "
        f"{off} {u}; once stopped it must stay off for at least {t}{power}.",
        f"{big}: two-point pressure control of {_a(what)}, on below {on} {u} and off above "
        f"{off} {u}, with an "
        f"anti-short-cycle timer so it is never started again less than {t} after it "
        f"stopped{power}.",
    ))
    if locked:
        desc += k.pick((" Report the lockout on an output.",
                        " Show the blocked restart on an output."))
    pair = k.finish(pou_type, ("PressureControl", "Druckregelung"), desc, body,
                    assumptions=(f"pressure is scaled to {unit}",))
    params = {"pv": pv, "run": run, "on": on_x, "off": off_x, "lock_s": lock / 1000,
              "tof": use_tof, "strict": cmp_on == "<"}
    return pair, params


def restart_lockout(k: Kit) -> Pair:
    """Pressure on/off control by hysteresis with a minimum off time before a restart."""
    return _restart_lockout(k)[0]


# --- 2. two-hand control ------------------------------------------------------------------


def _two_hand(k: Kit) -> tuple[Pair, Params]:
    """Two-hand control: both buttons within a window of the first press (TON or TP)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    window = k.pick((200, 300, 400, 500, 500, 500, 800, 1000))
    use_tp = k.chance(0.4)
    a_btn = k.var("VAR_INPUT", "m_handA", "BOOL", comment="left palm button")
    b_btn = k.var("VAR_INPUT", "m_handB", "BOOL", comment="right palm button")
    guard = k.chance(0.3)
    estop = k.var("VAR_INPUT", "estopOk", "BOOL", comment="E-stop chain healthy") if guard \
        else ""
    out = k.var("VAR_OUTPUT", "m_pressValve", "BOOL", comment="press down valve")
    timer = k.var("VAR", "m_syncTimer", "TP" if use_tp else "TON",
                  comment=f"synchronous window {human_time(window)}")
    armed = k.var("VAR", "m_armed", "BOOL", "TRUE", "both buttons were released")
    in_window = f"{timer}.Q" if use_tp else f"NOT {timer}.Q"
    body = k.note("the window starts with the first button pressed")
    body += [f"{timer}(IN := {a_btn} OR {b_btn}, PT := {k.time(window)});"]
    both = f"{a_btn} AND {b_btn}" + (f" AND {estop}" if guard else "")
    body += [f"IF {both} THEN", f"    IF {armed} AND {in_window} THEN",
             f"        {out} := TRUE;", "    END_IF;", f"    {armed} := FALSE;", "ELSE",
             f"    {out} := FALSE;"]
    body += k.note("a new cycle needs both buttons released first", "    ")
    body += [f"    IF NOT {a_btn} AND NOT {b_btn} THEN", f"        {armed} := TRUE;",
             "    END_IF;", "END_IF;"]
    w = human_time(window)
    a, big = k.an_pou(pou_type)
    es = " The E-stop chain (NC) must be healthy too." if guard else ""
    desc = k.pick((
        f"Write {a} for two-hand control of a press: the stroke output comes on only if both "
        f"buttons are pressed within {w} of each other, drops when either is released, and "
        f"both must be released before the next cycle.",
        f"{big} implementing a two-hand safety control (Zweihandbedienung): both palm "
        f"buttons within {w}, releasing one stops the output; no new start until both "
        f"buttons are let go.",
        f"Two-hand operation in {a}: if the second button follows the first within {w} "
        f"the output is switched on and held while both are held. Releasing either one "
        f"switches it off; a restart needs both released.",
        f"{big}: synchronous actuation check, both hand buttons must be operated within "
        f"{w} (use a {'TP' if use_tp else 'TON'} started by the first button). Output off "
        f"as soon as one button is released; re-arm only after both are released.",
    )) + es
    k.constrain(f"Window {w}, measured from the first button.", 0.3)
    pair = k.finish(pou_type, ("TwoHand", "ZweiHand"), desc, body,
                    assumptions=("buttons are NO contacts, TRUE when pressed",))
    params = {"a": a_btn, "b": b_btn, "out": out, "window_s": window / 1000, "estop": estop}
    return pair, params


def two_hand(k: Kit) -> Pair:
    """Two-hand control with a synchronous window and re-arm after both are released."""
    return _two_hand(k)[0]


# --- 3. discrepancy alarm -----------------------------------------------------------------


def _discrepancy(k: Kit) -> tuple[Pair, Params]:
    """On/off valve or damper with limit switches: travel and both-limits discrepancy,
    latched until an acknowledge (R_TRIG) while the fault is gone."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    travel = k.pick((5000, 10_000, 15_000, 20_000, 30_000, 45_000, 60_000))
    both_ms = k.pick((500, 1000, 2000, 3000))
    damper = k.chance(0.5)
    drop = k.chance(0.4)
    cmd = k.var("VAR_INPUT", "m_dampOpenCmd" if damper else "openCmd", "BOOL",
                comment="open command")
    fb_open = k.var("VAR_INPUT", "openFb", "BOOL", comment="limit switch open")
    fb_closed = k.var("VAR_INPUT", "closedFb", "BOOL", comment="limit switch closed")
    ack = k.var("VAR_INPUT", "ack", "BOOL", comment="acknowledge")
    out = k.var("VAR_OUTPUT", "m_damperOut" if damper else "valveOut", "BOOL")
    alarm = k.var("VAR_OUTPUT", "m_discAlarm", "BOOL")
    t_travel = k.var("VAR", "m_travelTimer", "TON", comment=f"travel time {human_time(travel)}")
    t_both = k.var("VAR", "m_bothTimer", "TON")
    edge = k.var("VAR", "ackEdge", "R_TRIG")
    body = k.note("commanded end position not reached in time")
    body += [f"{t_travel}(IN := ({cmd} AND NOT {fb_open}) OR (NOT {cmd} AND NOT {fb_closed}), "
             f"PT := {k.time(travel)});"]
    body += k.note("both limit switches made: wiring or switch fault")
    body += [f"{t_both}(IN := {fb_open} AND {fb_closed}, PT := {k.time(both_ms)});",
             f"{edge}(CLK := {ack});",
             f"IF {t_travel}.Q OR {t_both}.Q THEN", f"    {alarm} := TRUE;",
             f"ELSIF {edge}.Q THEN", f"    {alarm} := FALSE;", "END_IF;"]
    body += [f"{out} := {cmd} AND NOT {alarm};" if drop else f"{out} := {cmd};"]
    thing = k.pick(("damper", "air damper", "flap")) if damper else k.pick(
        ("on/off valve", "shut-off valve", "solenoid valve"))
    tr, bo = human_time(travel), human_time(both_ms)
    a, big = k.an_pou(pou_type)
    dr = k.pick((" While the alarm is on, the output is switched off.",
                 " The output drops while the alarm is active.")) if drop else ""
    desc = k.pick((
        f"Write {a} for {_a(thing)} with open and closed limit switches: raise a discrepancy "
        f"alarm if the commanded end position is not reached within {tr} of the command "
        f"change, or if both limit switches are made for longer than {bo}. The alarm stays "
        f"latched until acknowledged (rising edge) with the fault gone.",
        f"{big} supervising {_a(thing)} (Laufzeitueberwachung): travel time {tr}, both end "
        f"switches on together for more than {bo} is a fault as well. Latch the alarm; a "
        f"rising edge of ack clears it only when no fault is present.",
        f"Discrepancy monitoring in {a}: {thing} commanded open/closed, limit switches for "
        f"both end positions. Alarm when the feedback does not follow the command after "
        f"{tr}, or both switches stay on {bo}; reset by acknowledge (edge) once healthy.",
        f"{big} for {_a(thing)}: the open/closed feedback must match the command within {tr}; "
        f"open and closed at the same time for {bo} also trips the alarm (defaut de "
        f"discordance). Latched, cleared by the rising edge of an acknowledge button when "
        f"the fault has gone.",
    )) + dr
    pair = k.finish(pou_type, ("Discrepancy", "Laufzeit"), desc, body,
                    assumptions=("limit switches are TRUE when made",))
    params = {"cmd": cmd, "open": fb_open, "closed": fb_closed, "ack": ack, "out": out,
              "alarm": alarm, "travel_s": travel / 1000, "both_s": both_ms / 1000,
              "drop": drop}
    return pair, params


def discrepancy(k: Kit) -> Pair:
    """Valve/damper discrepancy alarm, latched until acknowledged."""
    return _discrepancy(k)[0]


# --- 4. pulse-pause output ----------------------------------------------------------------


def _pulse_pause(k: Kit) -> tuple[Pair, Params]:
    """PWM from a 0..100 % REAL: fixed cycle time, on at the start of each cycle."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    period = k.pick((2000, 5000, 10_000, 20_000, 30_000, 60_000))
    min_pct = k.pick((2.0, 3.0, 5.0, 5.0, 8.0, 10.0))
    same_scan = k.chance(0.5)
    via_time = k.chance(0.5)
    enable = k.var("VAR_INPUT", "enable", "BOOL")
    duty = k.var("VAR_INPUT", "m_duty", "REAL", comment="0..100 %")
    out = k.var("VAR_OUTPUT", "m_pwmOut", "BOOL", comment="heater contactor / SSR")
    min_v = k.var("VAR", "m_minDuty", "REAL", real(min_pct), "below this: off") \
        if k.chance(0.6) else real(min_pct)
    timer = k.var("VAR", "m_period", "TON", comment=f"cycle {human_time(period)}")
    on_t = k.var("VAR", "m_onTime", "TIME") if via_time else ""
    body = k.note("cycle timer restarts itself")
    if same_scan:
        body += [f"{timer}(IN := {enable}, PT := {k.time(period)});",
                 f"IF {timer}.Q THEN", f"    {timer}(IN := FALSE);",
                 f"    {timer}(IN := {enable});", "END_IF;"]
    else:
        body += [f"{timer}(IN := {enable} AND NOT {timer}.Q, PT := {k.time(period)});"]
    share = f"LIMIT(0.0, {duty}, 100.0) / 100.0"
    if via_time:
        body += k.note("on time = share of the cycle")
        body += [f"{on_t} := REAL_TO_TIME({share} * TIME_TO_REAL({k.time(period)}));",
                 f"{out} := {enable} AND {duty} >= {min_v} AND "
                 f"({timer}.ET < {on_t} OR {duty} >= 100.0);"]
    else:
        body += [f"{out} := {enable} AND {duty} >= {min_v} AND "
                 f"(TIME_TO_REAL({timer}.ET) < {share} * TIME_TO_REAL({k.time(period)}) OR "
                 f"{duty} >= 100.0);"]
    p, m = human_time(period), num(min_pct)
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"Write {a} turning a 0..100 % REAL into a pulse-pause output: cycle time {p}, the "
        f"output is on for that share of each cycle, starting at the beginning of the cycle. "
        f"Off below {m} % and when not enabled.",
        f"{big} for time-proportioning (PWM) control of a heater: fixed period of {p}, on "
        f"time = demand % of the period at the start of every period; demand below {m} % "
        f"gives no pulse at all; enable FALSE switches the output off.",
        f"Pulse-width output in {a} (Puls-Pause-Verhaeltnis): period {p}, duty cycle from a "
        f"REAL 0..100 %, minimum {m} % (below that: off), output off while disabled. Use a "
        f"TON as the cycle timer that restarts itself.",
        f"{big}: slow PWM for a solid-state relay, one cycle every {p}. Each cycle begins "
        f"with the output on for (percent / 100) x {p}, then off for the rest. Ignore "
        f"demands under {m} %; nothing happens without enable.",
    ))
    pair = k.finish(pou_type, ("PulsePause", "PulsPause"), desc, body,
                    assumptions=("demand is clamped to 0..100 %",))
    params = {"enable": enable, "duty": duty, "out": out, "period_s": period / 1000,
              "min_pct": min_pct}
    return pair, params


def pulse_pause(k: Kit) -> Pair:
    """Pulse-pause (slow PWM) output from a percentage."""
    return _pulse_pause(k)[0]


# --- 5. high-high trip --------------------------------------------------------------------


def _hh_trip(k: Kit) -> tuple[Pair, Params]:
    """High-high trip: value above the limit for a delay latches a trip; reset by a push
    button (R_TRIG) only once the value is back below the reset limit."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    quantity, unit, hh, gap, plant = k.pick((
        ("temperature", k.pick(("degC", "°C")), k.pick((85.0, 90.0, 95.0, 120.0, 180.0)),
         k.pick((5.0, 10.0, 15.0)), k.pick(("heater", "heating element"))),
        ("pressure", "bar", k.pick((6.0, 8.0, 10.0, 16.0)), k.pick((1.0, 1.5, 2.0)),
         k.pick(("pump", "feed pump"))),
        ("level", "%", k.pick((90.0, 92.0, 95.0)), k.pick((5.0, 10.0, 20.0)),
         k.pick(("fill pump", "inlet pump"))),
    ))
    reset_x = hh - gap
    delay = k.pick((1000, 2000, 3000, 5000, 10_000))
    value = k.var("VAR_INPUT", "value", "REAL", comment=f"{quantity} in {unit}")
    request = k.var("VAR_INPUT", "m_runRequest", "BOOL")
    reset = k.var("VAR_INPUT", "reset", "BOOL", comment="reset push button")
    out = k.var("VAR_OUTPUT", "m_plantOut", "BOOL", comment=plant)
    tripped = k.var("VAR_OUTPUT", "tripped", "BOOL")
    inline = k.chance(0.3)
    lim = real(hh) if inline else k.var("VAR", "m_hhLimit", "REAL", real(hh), "HH limit")
    rlim = real(reset_x) if inline else k.var("VAR", "m_resetLimit", "REAL", real(reset_x))
    timer = k.var("VAR", "m_hhTimer", "TON")
    edge = k.var("VAR", "m_resetEdge", "R_TRIG")
    body = [f"{timer}(IN := {value} > {lim}, PT := {k.time(delay)});",
            f"{edge}(CLK := {reset});"]
    body += k.note("trip latches; reset only below the reset limit")
    body += [f"IF {timer}.Q THEN", f"    {tripped} := TRUE;",
             f"ELSIF {edge}.Q AND {value} < {rlim} THEN", f"    {tripped} := FALSE;", "END_IF;",
             f"{out} := {request} AND NOT {tripped};"]
    h, r, d, u = num(hh), num(reset_x), human_time(delay), unit
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"Write {a} for a high-high trip: if the {quantity} stays above {h} {u} for {d}, "
        f"trip and latch, switching the {plant} off. Reset by the reset push button (rising "
        f"edge), accepted only when the {quantity} is below {r} {u}.",
        f"{big} with a latched HH trip (Abschaltung): {quantity} > {h} {u} for longer than "
        f"{d} switches off the {plant} until it is reset. The reset button works only once "
        f"the value has fallen below {r} {u}; use its rising edge.",
        f"High-high {quantity} protection in {a}: trip limit {h} {u}, delay {d}. While "
        f"tripped the {plant} output is off even if it is requested. Reset limit {r} {u} "
        f"(below it a press of the reset button clears the trip).",
        f"{big}: the {plant} runs on request unless tripped. A {quantity} above {h} {u} "
        f"persisting {d} trips it (latched). Clearing needs the {quantity} back under "
        f"{r} {u} and a new push on reset (edge, R_TRIG).",
    ))
    pair = k.finish(pou_type, ("HighHighTrip", "HHAbschaltung"), desc, body,
                    assumptions=(f"{quantity} is scaled to {unit}",))
    params = {"value": value, "request": request, "reset": reset, "out": out,
              "tripped": tripped, "hh": hh, "reset_limit": reset_x, "delay_s": delay / 1000}
    return pair, params


def hh_trip(k: Kit) -> Pair:
    """Latched high-high trip with a delay, a reset limit and an edge-triggered reset."""
    return _hh_trip(k)[0]


# --- 6. up/down counting ------------------------------------------------------------------


def _updown_count(k: Kit) -> tuple[Pair, Params]:
    """Items entering and leaving a buffer: up/down count, hold at N, release below M."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    full = k.pick((8, 12, 15, 20, 25, 30, 40, 50))
    release = full - k.pick((2, 3, 5)) if full > 10 else full - 2
    use_ctud = k.chance(0.5)
    thing = k.pick(("items", "parts", "boxes", "bottles", "cartons", "pallets"))
    entry = k.var("VAR_INPUT", "m_entrySensor", "BOOL", comment="photo eye at the infeed")
    leave = k.var("VAR_INPUT", "m_exitSensor", "BOOL", comment="photo eye at the outfeed")
    reset = k.var("VAR_INPUT", "reset", "BOOL")
    count = k.var("VAR_OUTPUT", "m_itemCount", "INT")
    hold = k.var("VAR_OUTPUT", "m_holdInfeed", "BOOL", comment="stop the infeed")
    consts = k.chance(0.6)
    full_v = k.var("VAR", "m_fullAt", "INT", str(full)) if consts else str(full)
    rel_v = k.var("VAR", "m_releaseBelow", "INT", str(release)) if consts else str(release)
    if use_ctud:
        ctr = _fb_var(k, "m_udCounter", "CTUD")
        body = k.note("CTUD: up on the infeed sensor, down on the outfeed sensor")
        body += [f"{ctr}(CU := {entry}, CD := {leave}, R := {reset}, PV := {full_v});",
                 f"{count} := {ctr}.CV;"]
    else:
        e_in = k.var("VAR", "m_entryEdge", "R_TRIG")
        e_out = k.var("VAR", "m_exitEdge", "R_TRIG")
        body = [f"{e_in}(CLK := {entry});", f"{e_out}(CLK := {leave});",
                f"IF {e_in}.Q THEN", f"    {count} := {count} + 1;", "END_IF;",
                f"IF {e_out}.Q AND {count} > 0 THEN", f"    {count} := {count} - 1;", "END_IF;",
                f"IF {reset} THEN", f"    {count} := 0;", "END_IF;"]
    body += k.note("hysteresis on the hold signal")
    body += [f"IF {count} >= {full_v} THEN", f"    {hold} := TRUE;",
             f"ELSIF {count} < {rel_v} THEN", f"    {hold} := FALSE;", "END_IF;"]
    a, big = k.an_pou(pou_type)
    how = "a CTUD" if use_ctud else k.pick(("R_TRIG on each sensor", "rising edges of the "
                                                                      "two sensors"))
    floor = "" if use_ctud else " The count never goes below zero."
    desc = k.pick((
        f"Write {a} counting {thing} into and out of a buffer section with two sensors "
        f"(infeed and outfeed, {how}). Output the count; stop the infeed at {full} {thing} "
        f"or more and release it again below {release} {thing}. A reset input sets the "
        f"count to zero.{floor}",
        f"{big} for an accumulation conveyor: up/down count of {thing} (entry sensor up, exit "
        f"sensor down, using {how}). Hold output ON at >= {full} {thing}, OFF again when the "
        f"count drops below {release} {thing} (hysteresis). Reset to zero.{floor}",
        f"Buffer occupancy in {a}: {thing} entering and leaving are counted up and down "
        f"({how}); the infeed stop (Zulaufstopp) is set at {full} {thing} and cleared under "
        f"{release} {thing}; reset clears the count.{floor}",
    ))
    pair = k.finish(pou_type, ("BufferCount", "PufferZaehler"), desc, body)
    params = {"in": entry, "out": leave, "reset": reset, "count": count, "hold": hold,
              "full": full, "release": release, "ctud": use_ctud}
    return pair, params


def updown_count(k: Kit) -> Pair:
    """Up/down count of a buffer with a hold output by hysteresis."""
    return _updown_count(k)[0]


# --- 7. timed step sequence ---------------------------------------------------------------


def _timed_sequence(k: Kit) -> tuple[Pair, Params]:
    """CASE step sequence started by a rising edge: k timed steps, one output each."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM", "PROGRAM"))
    n = k.pick((2, 3, 3, 4))
    family = k.pick(_SEQ_FAMILIES)[:n]
    durations = [k.pick((2000, 3000, 5000, 10_000, 15_000, 20_000, 30_000, 60_000))
                 for _ in range(n)]
    numbers = k.pick(((1, 2, 3, 4), (10, 20, 30, 40), (100, 200, 300, 400)))[:n]
    start = k.var("VAR_INPUT", "start", "BOOL")
    stop = k.var("VAR_INPUT", "stopCmd", "BOOL")
    outs = [k.var("VAR_OUTPUT", c, "BOOL") for c, _, _, _ in family]
    done = k.var("VAR_OUTPUT", "m_seqDone", "BOOL")
    step = k.var("VAR", "m_seqStep", "INT", "0")
    edge = k.var("VAR", "m_startEdge", "R_TRIG")
    timers = [k.var("VAR", f"m_stepTimer{i + 1}", "TON") for i in range(n)]
    body = [f"{edge}(CLK := {start});"]
    body += k.note("start on the rising edge, only from idle")
    body += [f"IF {edge}.Q AND {step} = 0 THEN", f"    {step} := {numbers[0]};",
             f"    {done} := FALSE;", "END_IF;"]
    body += [f"{t}(IN := {step} = {s}, PT := {k.time(d)});"
             for t, s, d in zip(timers, numbers, durations, strict=True)]
    body += [f"CASE {step} OF"]
    for i, (t, s) in enumerate(zip(timers, numbers, strict=True)):
        nxt = numbers[i + 1] if i + 1 < n else 0
        body += [f"    {s}:", f"        IF {t}.Q THEN", f"            {step} := {nxt};"]
        if i + 1 == n:
            body += [f"            {done} := TRUE;"]
        body += ["        END_IF;"]
    body += ["END_CASE;"]
    body += k.note("stop aborts at once")
    body += [f"IF {stop} THEN", f"    {step} := 0;", f"    {done} := FALSE;", "END_IF;"]
    body += [f"{o} := {step} = {s};" for o, s in zip(outs, numbers, strict=True)]
    steps = [f"{fam[3]} for {human_time(d)}" for fam, d in zip(family, durations, strict=True)]
    listing = ", then ".join(steps)
    numbered = "; ".join(f"step {i + 1}: {s}" for i, s in enumerate(steps))
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"Write {a} with a step sequence (CASE on an INT step): on the rising edge of start "
        f"run {listing}. Only one output is on at a time; stop aborts at once to step 0 with "
        f"all outputs off. Set a done flag after the last step until the next start or stop.",
        f"{big}: timed sequence (Schrittkette) started by a start push button (rising edge). "
        f"{cap(numbered)}. Stop returns to idle immediately, outputs off; done is set "
        f"after the last step and cleared by the next start or by stop.",
        f"Sequencer in {a} using CASE: {numbered}. Start on the rising edge of the start "
        f"button (ignored while running), one output per step, stop = abort to idle with "
        f"everything off. A done output shows the sequence completed.",
    ))
    k.constrain(f"Step numbers {', '.join(str(s) for s in numbers)}; 0 is idle.", 0.4)
    pair = k.finish(pou_type, ("TimedSequence", "Schrittkette"), desc, body)
    params = {"start": start, "stop": stop, "outs": outs, "done": done,
              "durations_s": [d / 1000 for d in durations]}
    return pair, params


def timed_sequence(k: Kit) -> Pair:
    """Timed CASE step sequence with start edge, abort and done flag."""
    return _timed_sequence(k)[0]


# --- 8. cyclic sequencer ------------------------------------------------------------------


def _cyclic_sequencer(k: Kit) -> tuple[Pair, Params]:
    """While enabled, pulse n outputs one after another, one every interval, round robin."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    n = k.pick((3, 4, 5))
    interval = k.pick((5000, 10_000, 15_000, 20_000, 30_000, 60_000))
    pulse = k.pick((100, 150, 200, 300, 500, 1000, 2000))
    enable = k.var("VAR_INPUT", "enable", "BOOL", comment="cleaning enabled")
    outs = [k.var("VAR_OUTPUT", f"m_jetValve{i + 1}", "BOOL") for i in range(n)]
    t_int = k.var("VAR", "m_intervalTimer", "TON")
    t_pulse = k.var("VAR", "m_pulseTimer", "TP")
    chan = k.var("VAR", "m_channel", "INT", "0", "valve fired last, 0 = none")
    fire = k.var("VAR", "m_fire", "BOOL")
    body = [f"{t_int}(IN := {enable}, PT := {k.time(interval)});", f"{fire} := {t_int}.Q;"]
    body += k.note("restart the interval in the same scan")
    body += [f"IF {fire} THEN", f"    {t_int}(IN := FALSE);", f"    {t_int}(IN := {enable});",
             f"    {chan} := {chan} + 1;", f"    IF {chan} > {n} THEN", f"        {chan} := 1;",
             "    END_IF;", "END_IF;", f"IF NOT {enable} THEN", f"    {chan} := 0;", "END_IF;",
             f"{t_pulse}(IN := {fire}, PT := {k.time(pulse)});"]
    body += [f"{o} := {enable} AND {t_pulse}.Q AND {chan} = {i + 1};"
             for i, o in enumerate(outs)]
    iv, pu = human_time(interval), human_time(pulse)
    a, big = k.an_pou(pou_type)
    desc = k.pick((
        f"Write {a} for a dust filter cleaning sequencer (Abreinigung): while enabled, fire "
        f"the {n} jet valves one after another, one every {iv}, each with a pulse of {pu}, "
        f"then start again at the first. The first pulse comes {iv} after enable; all "
        f"outputs off when disabled.",
        f"{big}: cyclic sequencer with {n} outputs. Enabled: every {iv} the next output gets "
        f"a {pu} pulse (1, 2, ... {n}, 1, ...), the first {iv} after enable. Disabled: "
        f"everything off and the sequence restarts at output 1.",
        f"Pulse-jet valve control in {a}: {n} solenoid valves, interval {iv} between pulses, "
        f"pulse length {pu} (TP), round robin while the enable is on; first valve fires "
        f"{iv} after enabling, no output while disabled.",
    ))
    pair = k.finish(pou_type, ("FilterCleaning", "FilterAbreinigung"), desc, body)
    params = {"enable": enable, "outs": outs, "interval_s": interval / 1000,
              "pulse_s": pulse / 1000}
    return pair, params


def cyclic_sequencer(k: Kit) -> Pair:
    """Round-robin pulse sequencer of n outputs while enabled."""
    return _cyclic_sequencer(k)[0]


WITH_PARAMS: dict[str, Callable[[Kit], tuple[Pair, Params]]] = {
    "restart_lockout": _restart_lockout,
    "two_hand": _two_hand,
    "discrepancy": _discrepancy,
    "pulse_pause": _pulse_pause,
    "hh_trip": _hh_trip,
    "updown_count": _updown_count,
    "timed_sequence": _timed_sequence,
    "cyclic_sequencer": _cyclic_sequencer,
}
"""Archetype name -> builder that also returns the sample's parameters (for tests)."""

MORE: dict[str, Callable[[Kit], Pair]] = {
    "restart_lockout": restart_lockout,
    "two_hand": two_hand,
    "discrepancy": discrepancy,
    "pulse_pause": pulse_pause,
    "hh_trip": hh_trip,
    "updown_count": updown_count,
    "timed_sequence": timed_sequence,
    "cyclic_sequencer": cyclic_sequencer,
}
