"""ST archetypes for drives and process control: motors, tanks, pumps, PI, sequences, valves."""

from __future__ import annotations

from typing import Any

from rung.tools.corpus_st_kit import Kit, human_time, real

Pair = tuple[dict[str, Any], dict[str, Any]]


def motor_start_stop(k: Kit) -> Pair:
    """Motor start/stop with seal-in, E-stop, overload, optional guard and start delay (TON)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    delay = k.pick((500, 1000, 2000, 3000, 5000, 10_000))
    guard = k.chance(0.5)
    start = k.var("VAR_INPUT", "start", "BOOL", comment="start push button (NO)")
    stop_ok = k.var("VAR_INPUT", "stopOk", "BOOL", "TRUE", "stop push button (NC)")
    estop = k.var("VAR_INPUT", "estopOk", "BOOL", comment="E-stop chain healthy (NC)")
    overload = k.var("VAR_INPUT", "overload", "BOOL", comment="thermal overload tripped")
    guard_v = k.var("VAR_INPUT", "guardClosed", "BOOL", comment="guard door closed") if guard \
        else ""
    motor = k.var("VAR_OUTPUT", "motorOn", "BOOL", comment="motor contactor")
    fault = k.var("VAR_OUTPUT", "fault", "BOOL")
    latch = k.var("VAR", "runLatch", "BOOL")
    timer = k.var("VAR", "startDelay", "TON", comment=f"start delay {human_time(delay)}")
    permit_expr = f"{estop} AND {stop_ok} AND NOT {overload}" + (f" AND {guard_v}" if guard
                                                                   else "")
    body = k.note("interlocks: E-stop and stop are NC contacts")
    if k.chance(0.5):
        body += [f"{latch} := ({start} OR {latch}) AND {permit_expr};"]
    else:
        body += [f"IF NOT ({permit_expr}) THEN", f"    {latch} := FALSE;",
                 f"ELSIF {start} THEN", f"    {latch} := TRUE;", "END_IF;"]
    body += k.note("start delay before the contactor closes")
    body += [f"{timer}(IN := {latch}, PT := {k.time(delay)});", f"{motor} := {timer}.Q;",
             f"{fault} := NOT {estop} OR {overload};"]
    extra = " and a closed guard door" if guard else ""
    desc = k.pick((
        "Write {a} for a motor starter: start button with seal-in, NC stop and E-stop, thermal "
        "overload{extra}; the contactor closes {d} after start. Report a fault output.",
        "{A} that starts a motor on a start push button and keeps it running (self-holding) "
        "until stop, E-stop or overload{extra}. Delay the motor output by {d} using a TON.",
        "Motor control in {a}: seal-in circuit, interlocks (E-stop, overload{extra}), start "
        "delay of {d}, fault signal when E-stop or overload is active.",
    ))
    a = k.a_pou(pou_type)
    desc = desc.format(a=a, A=a[0].upper() + a[1:], extra=extra, d=human_time(delay))
    k.constrain("Stop and E-stop inputs are NC (TRUE = healthy).", 0.4)
    k.constrain(f"Start delay {human_time(delay)} with a TON.", 0.3)
    return k.finish(pou_type, ("MotorControl", "Motorsteuerung"), desc, body,
                    assumptions=("stop and E-stop are wired NC",
                                 "overload contact is TRUE when tripped"))


def tank_level(k: Kit) -> Pair:
    """Tank level control with hysteresis between low and high setpoints (REAL levels)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    unit, span = k.pick((("%", 100.0), ("m", k.pick((2.0, 4.0, 5.0, 8.0))), ("mm", 2000.0)))
    low = round(span * k.pick((0.2, 0.25, 0.3, 0.35)), 1)
    high = round(span * k.pick((0.7, 0.75, 0.8, 0.85)), 1)
    alarm = round(span * 0.95, 1)
    fill = k.chance(0.6)
    as_inputs = k.chance(0.4)
    level = k.var("VAR_INPUT", "level", "REAL", comment=f"tank level in {unit}")
    sec = "VAR_INPUT" if as_inputs else "VAR"
    lo = k.var(sec, "lowSp", "REAL", real(low), f"{'start' if fill else 'stop'} level")
    hi = k.var(sec, "highSp", "REAL", real(high), f"{'stop' if fill else 'start'} level")
    pump = k.var("VAR_OUTPUT", "fillPump" if fill else "drainPump", "BOOL")
    high_alarm = k.var("VAR_OUTPUT", "highAlarm", "BOOL")
    al = k.var("VAR", "alarmSp", "REAL", real(alarm))
    on_cond, off_cond = (f"{level} <= {lo}", f"{level} >= {hi}") if fill else (
        f"{level} >= {hi}", f"{level} <= {lo}")
    body = k.note("two-point control with hysteresis")
    body += [f"IF {on_cond} THEN", f"    {pump} := TRUE;", f"ELSIF {off_cond} THEN",
             f"    {pump} := FALSE;", "END_IF;", f"{high_alarm} := {level} >= {al};"]
    if k.chance(0.4):
        sensor = k.var("VAR_OUTPUT", "sensorFault", "BOOL")
        body += k.note("out-of-range reading: stop the pump")
        body += [f"{sensor} := ({level} < {real(-0.05 * span)}) OR "
                 f"({level} > {real(1.05 * span)});",
                 f"IF {sensor} THEN", f"    {pump} := FALSE;", "END_IF;"]
    what = "fill pump" if fill else "drain pump"
    on, off = (low, high) if fill else (high, low)
    desc = k.pick((
        "Write {a} for tank level control: switch the {what} on at {on} {u} and off at {off} "
        "{u} (hysteresis), high-level alarm at {al} {u}.",
        "{A} that keeps a tank between {lo} and {hi} {u} with a {what} (two-point control) "
        "and raises a high alarm at {al} {u}. Level is a REAL in {u}.",
        "Level control with hysteresis in {a}: {what} ON when level reaches {on} {u}, OFF at "
        "{off} {u}; alarm output at {al} {u}.",
    ))
    a = k.a_pou(pou_type)
    desc = desc.format(a=a, A=a[0].upper() + a[1:], what=what, on=on, off=off, u=unit, lo=low,
                       hi=high, al=alarm)
    if as_inputs:
        k.constrain("Setpoints are inputs of the POU.", 0.7)
    return k.finish(pou_type, ("TankLevel", "Fuellstand"), desc, body,
                    assumptions=(f"level is already scaled to {unit}",))


def pump_alternation(k: Kit) -> Pair:
    """Duty/standby pump pair: duty swaps on each start (R_TRIG); a faulted pump is skipped."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    faults = k.chance(0.6)
    count = k.chance(0.4)
    demand = k.var("VAR_INPUT", "demand", "BOOL", comment="pumping required")
    f1 = k.var("VAR_INPUT", "pump1Fault", "BOOL") if faults else ""
    f2 = k.var("VAR_INPUT", "pump2Fault", "BOOL") if faults else ""
    p1 = k.var("VAR_OUTPUT", "pump1Run", "BOOL")
    p2 = k.var("VAR_OUTPUT", "pump2Run", "BOOL")
    starts = k.var("VAR_OUTPUT", "starts", "DINT") if count else ""
    edge = k.var("VAR", "demandEdge", "R_TRIG")
    duty2 = k.var("VAR", "dutyIsTwo", "BOOL", comment="TRUE: pump 2 is duty")
    body = [f"{edge}(CLK := {demand});"]
    body += k.note("swap duty and standby on every new demand")
    body += [f"IF {edge}.Q THEN", f"    {duty2} := NOT {duty2};"]
    body += [f"    {starts} := {starts} + 1;"] if count else []
    body += ["END_IF;"]
    if faults:
        body += k.note("standby takes over when the duty pump is faulted")
        body += [f"{p1} := {demand} AND NOT {f1} AND (NOT {duty2} OR {f2});",
                 f"{p2} := {demand} AND NOT {f2} AND ({duty2} OR {f1});"]
    else:
        body += [f"{p1} := {demand} AND NOT {duty2};", f"{p2} := {demand} AND {duty2};"]
    desc = k.pick((
        "Write {a} for duty/standby alternation of two pumps: swap the duty pump on every "
        "rising edge of the demand signal (R_TRIG){f}.",
        "{A} alternating two pumps: each new demand starts the other pump, so run hours are "
        "shared{f}.",
        "Pump alternation in {a}: demand input, two run outputs, duty changes at each start{f}.",
    ))
    a = k.a_pou(pou_type)
    f = "; if the duty pump is faulted the standby runs instead" if faults else ""
    f += ", and count the starts" if count else ""
    desc = desc.format(a=a, A=a[0].upper() + a[1:], f=f)
    return k.finish(pou_type, ("PumpAlternation", "PumpenWechsel"), desc, body)


def pi_controller(k: Kit) -> Pair:
    """A P or PI FUNCTION_BLOCK: scale SP/PV to %, clamp the output (and integral) with LIMIT."""
    pi = k.chance(0.6)
    reverse = k.chance(0.3)
    lo, hi = k.pick(((0.0, 10.0), (0.0, 16.0), (0.0, 100.0), (-20.0, 120.0), (0.0, 250.0)))
    kp, ti = k.pick((0.5, 0.8, 1.0, 1.5, 2.0, 4.0)), k.pick((5.0, 10.0, 20.0, 30.0, 60.0))
    cycle = k.pick((0.01, 0.05, 0.1, 0.2))
    enable = k.var("VAR_INPUT", "enable", "BOOL")
    sp = k.var("VAR_INPUT", "setpoint", "REAL", comment="engineering units")
    pv = k.var("VAR_INPUT", "pv", "REAL", comment="engineering units")
    out = k.var("VAR_OUTPUT", "output", "REAL", comment="0..100 %")
    r_lo = k.var("VAR", "rangeLow", "REAL", real(lo))
    r_hi = k.var("VAR", "rangeHigh", "REAL", real(hi))
    gain = k.var("VAR", "kp", "REAL", real(kp))
    ti_v = k.var("VAR", "tiSec", "REAL", real(ti)) if pi else ""
    cyc = k.var("VAR", "cycleSec", "REAL", real(cycle), "task cycle in s") if pi else ""
    err = k.var("VAR", "error", "REAL")
    integ = k.var("VAR", "integral", "REAL") if pi else ""
    sp_pct = k.var("VAR", "spPct", "REAL")
    pv_pct = k.var("VAR", "pvPct", "REAL")
    body = k.note("scale to percent of range")
    body += [f"{sp_pct} := ({sp} - {r_lo}) / ({r_hi} - {r_lo}) * 100.0;",
             f"{pv_pct} := ({pv} - {r_lo}) / ({r_hi} - {r_lo}) * 100.0;",
             f"{err} := {pv_pct} - {sp_pct};" if reverse else f"{err} := {sp_pct} - {pv_pct};",
             f"IF NOT {enable} THEN", f"    {out} := 0.0;"]
    body += [f"    {integ} := 0.0;"] if pi else []
    if pi:
        body += ["ELSE"] + k.note("integral with anti-windup clamp", "    ")
        body += [f"    {integ} := LIMIT(-100.0, {integ} + {err} * {cyc} / {ti_v}, 100.0);",
                 f"    {out} := LIMIT(0.0, {gain} * ({err} + {integ}), 100.0);", "END_IF;"]
    else:
        body += ["ELSE", f"    {out} := LIMIT(0.0, {gain} * {err}, 100.0);", "END_IF;"]
    kind = "PI" if pi else "P"
    act = " (reverse acting, e.g. cooling)" if reverse else ""
    desc = k.pick((
        "Write a {kind} controller function block{act}: setpoint and process value in "
        "engineering units {lo}..{hi}, scaled to %, output 0..100 % clamped with LIMIT. "
        "Kp = {kp}{ti}.",
        "I need a simple {kind} control FB{act} without a vendor PID block. Range {lo} to {hi}, "
        "gain {kp}{ti}; output in percent, limited to 0..100, zero when disabled.",
    ))
    ti_text = f", Ti = {ti} s, cycle {cycle} s" if pi else ""
    desc = desc.format(kind=kind, act=act, lo=lo, hi=hi, kp=kp, ti=ti_text)
    return k.finish("FUNCTION_BLOCK", (f"{kind}Control", f"{kind}Regler"), desc, body,
                    assumptions=(f"called every {cycle} s",) if pi else ())


def conveyor_sequence(k: Kit) -> Pair:
    """Conveyor sequencer as a CASE state machine (INT state, one TON per timed step)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    warn, dwell = k.pick((2000, 3000, 5000)), k.pick((1000, 2000, 4000, 10_000))
    timeout = k.pick((20_000, 30_000, 60_000, 90_000)) if k.chance(0.5) else 0
    s = k.pick(((0, 10, 20, 30, 90), (0, 1, 2, 3, 9), (0, 100, 200, 300, 900)))
    start = k.var("VAR_INPUT", "start", "BOOL")
    stop = k.var("VAR_INPUT", "stopCmd", "BOOL")
    part = k.var("VAR_INPUT", "partAtEnd", "BOOL", comment="photo eye at the discharge end")
    horn = k.var("VAR_OUTPUT", "horn", "BOOL")
    run = k.var("VAR_OUTPUT", "conveyorRun", "BOOL")
    fault = k.var("VAR_OUTPUT", "seqFault", "BOOL") if timeout else ""
    state = k.var("VAR", "state", "INT", "0")
    t_warn = k.var("VAR", "warnTimer", "TON")
    t_dwell = k.var("VAR", "dwellTimer", "TON")
    t_move = k.var("VAR", "transportTimer", "TON") if timeout else ""
    body = [f"{t_warn}(IN := {state} = {s[1]}, PT := {k.time(warn)});",
            f"{t_dwell}(IN := {state} = {s[3]}, PT := {k.time(dwell)});"]
    if timeout:
        body += [f"{t_move}(IN := {state} = {s[2]}, PT := {k.time(timeout)});"]
    body += [f"CASE {state} OF", f"    {s[0]}:" + (" // idle" if k.chance(0.4) else ""),
             f"        IF {start} THEN", f"            {state} := {s[1]};", "        END_IF;",
             f"    {s[1]}:" + (" // warning horn" if k.chance(0.4) else ""),
             f"        IF {t_warn}.Q THEN", f"            {state} := {s[2]};", "        END_IF;",
             f"    {s[2]}:", f"        IF {part} THEN", f"            {state} := {s[3]};"]
    if timeout:
        body += [f"        ELSIF {t_move}.Q THEN", f"            {state} := {s[4]};"]
    body += ["        END_IF;", f"    {s[3]}:", f"        IF {t_dwell}.Q THEN",
             f"            {state} := {s[0]};", "        END_IF;"]
    if timeout:
        body += [f"    {s[4]}:", f"        {fault} := TRUE;"]
    body += ["ELSE", f"    {state} := {s[0]};", "END_CASE;",
             f"IF {stop} THEN", f"    {state} := {s[0]};"]
    body += [f"    {fault} := FALSE;"] if timeout else []
    body += ["END_IF;", f"{horn} := {state} = {s[1]};", f"{run} := {state} = {s[2]};"]
    to = (f"; if no part arrives within {human_time(timeout)} go to a fault step and "
          "latch a fault until stop") if timeout else ""
    desc = k.pick((
        "Write {a} sequencing a conveyor as a CASE state machine: on start sound the horn for "
        "{w}, run the belt until the part reaches the end sensor, wait {d}, return to idle{to}.",
        "Conveyor step sequence in {a} with an INT state and CASE: idle -> warning horn ({w}) "
        "-> transport until partAtEnd -> dwell {d} -> idle{to}. Stop returns to idle.",
    ))
    a = k.a_pou(pou_type)
    desc = desc.format(a=a, w=human_time(warn), d=human_time(dwell), to=to)
    k.constrain(f"State numbers {', '.join(str(x) for x in s[:4])}.", 0.4)
    return k.finish(pou_type, ("ConveyorSeq", "BandAblauf"), desc, body)


def valve_feedback(k: Kit) -> Pair:
    """Valve with open/closed limit switches and a feedback timeout (TON) latching a fault."""
    pou_type = k.pick(("FUNCTION_BLOCK", "FUNCTION_BLOCK", "PROGRAM"))
    timeout = k.pick((3000, 5000, 10_000, 15_000, 30_000))
    cmd = k.var("VAR_INPUT", "openCmd", "BOOL")
    fb_open = k.var("VAR_INPUT", "openFb", "BOOL", comment="limit switch open")
    fb_closed = k.var("VAR_INPUT", "closedFb", "BOOL", comment="limit switch closed")
    reset = k.var("VAR_INPUT", "reset", "BOOL")
    out = k.var("VAR_OUTPUT", "valveOut", "BOOL", comment="solenoid")
    fault = k.var("VAR_OUTPUT", "fault", "BOOL")
    timer = k.var("VAR", "fbTimer", "TON")
    body = k.note("feedback must follow the command within the timeout")
    body += [f"{timer}(IN := ({cmd} AND NOT {fb_open}) OR (NOT {cmd} AND NOT {fb_closed}), "
             f"PT := {k.time(timeout)});",
             f"IF {timer}.Q THEN", f"    {fault} := TRUE;",
             f"ELSIF {reset} THEN", f"    {fault} := FALSE;", "END_IF;",
             f"{out} := {cmd} AND NOT {fault};"]
    desc = k.pick((
        "Write {a} for an on/off valve with open and closed limit switches: if the feedback "
        "does not match the command within {t}, latch a fault and drop the output until reset.",
        "{A} controlling a solenoid valve with feedback supervision (TON {t}); fault is "
        "latched, cleared by a reset input.",
    ))
    a = k.a_pou(pou_type)
    desc = desc.format(a=a, A=a[0].upper() + a[1:], t=human_time(timeout))
    return k.finish(pou_type, ("Valve", "Ventil"), desc, body)


def star_delta(k: Kit) -> Pair:
    """Star-delta starter: mains/star/delta contactors, TON changeover and a short pause."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    changeover, pause = k.pick((4000, 5000, 6000, 8000, 10_000)), k.pick((50, 80, 100))
    start = k.var("VAR_INPUT", "start", "BOOL")
    stop_ok = k.var("VAR_INPUT", "stopOk", "BOOL", comment="NC")
    overload = k.var("VAR_INPUT", "overload", "BOOL")
    mains = k.var("VAR_OUTPUT", "mains", "BOOL")
    star = k.var("VAR_OUTPUT", "star", "BOOL")
    delta = k.var("VAR_OUTPUT", "delta", "BOOL")
    run = k.var("VAR", "run", "BOOL")
    t_star = k.var("VAR", "starTimer", "TON")
    t_pause = k.var("VAR", "pauseTimer", "TON")
    body = [f"{run} := ({start} OR {run}) AND {stop_ok} AND NOT {overload};",
            f"{t_star}(IN := {run}, PT := {k.time(changeover)});"]
    body += k.note("dead time between star and delta")
    body += [f"{t_pause}(IN := {t_star}.Q, PT := {k.time(pause)});",
             f"{mains} := {run};", f"{star} := {run} AND NOT {t_star}.Q;",
             f"{delta} := {run} AND {t_pause}.Q AND NOT {star};"]
    desc = k.pick((
        "Write {a} for a star-delta motor starter: mains and star contactor on start, switch "
        "to delta after {c} with a {p} pause, star and delta interlocked.",
        "Star/delta starting in {a}: run in star for {c}, then delta (pause {p} between), "
        "stop (NC) and overload drop everything.",
    ))
    a = k.a_pou(pou_type)
    desc = desc.format(a=a, c=human_time(changeover), p=human_time(pause))
    return k.finish(pou_type, ("StarDelta", "SternDreieck"), desc, body)


def setpoint_ramp(k: Kit) -> Pair:
    """Setpoint ramp: the output follows a target at a limited rate per second."""
    rate, unit = k.pick(((0.5, "bar"), (2.0, "%"), (5.0, "rpm"), (1.0, "degC"), (10.0, "l/min")))
    target = k.var("VAR_INPUT", "target", "REAL")
    rate_v = k.var("VAR_INPUT", "rampRate", "REAL", comment=f"{unit} per second")
    cycle = k.var("VAR_INPUT", "cycleTime", "TIME", k.time(k.pick((10, 20, 50, 100))))
    out = k.var("VAR_OUTPUT", "current", "REAL")
    delta = k.var("VAR_TEMP" if k.chance(0.5) else "VAR", "maxDelta", "REAL")
    body = [f"{delta} := {rate_v} * TIME_TO_REAL({cycle}) / 1000.0;"]
    body += k.note("move towards the target by at most one increment per call")
    body += [f"IF ABS({target} - {out}) <= {delta} THEN", f"    {out} := {target};",
             f"ELSIF {target} > {out} THEN", f"    {out} := {out} + {delta};", "ELSE",
             f"    {out} := {out} - {delta};", "END_IF;"]
    desc = k.pick((
        "Write a function block that ramps a setpoint: the output moves towards the target at "
        "most rampRate per second (e.g. {r} {u}/s), given the task cycle time as a TIME input.",
        "Setpoint ramp generator FB: limit the rate of change of a REAL setpoint to a "
        "configurable {u}/s value, using the cycle time.",
    ))
    desc = desc.format(r=rate, u=unit)
    return k.finish("FUNCTION_BLOCK", ("SetpointRamp", "Sollwertrampe"), desc, body)


CONTROL = {
    "motor_start_stop": motor_start_stop,
    "tank_level": tank_level,
    "pump_alternation": pump_alternation,
    "pi_controller": pi_controller,
    "conveyor_sequence": conveyor_sequence,
    "valve_feedback": valve_feedback,
    "star_delta": star_delta,
    "setpoint_ramp": setpoint_ramp,
}
