"""ST archetypes for signal logic: alarms, timers, counters, edges, and small FUNCTIONs."""

from __future__ import annotations

from typing import Any

from rung.tools.corpus_st_kit import Kit, human_time, real

Pair = tuple[dict[str, Any], dict[str, Any]]


def alarm_latch(k: Kit) -> Pair:
    """Alarm with on-delay, latched until acknowledged (R_TRIG on ack) and cleared."""
    analog = k.chance(0.5)
    delay = k.pick((500, 1000, 2000, 5000, 10_000))
    if analog:
        cond = k.var("VAR_INPUT", "value", "REAL")
        lim = k.var("VAR_INPUT", "alarmLimit", "REAL")
        raw = f"{cond} > {lim}"
    else:
        raw = k.var("VAR_INPUT", "condition", "BOOL", comment="raw alarm condition")
    ack = k.var("VAR_INPUT", "ack", "BOOL", comment="acknowledge button")
    alarm = k.var("VAR_OUTPUT", "alarm", "BOOL", comment="latched alarm")
    horn = k.var("VAR_OUTPUT", "unacked", "BOOL", comment="not yet acknowledged")
    t = k.var("VAR", "alarmDelay", "TON")
    edge = k.var("VAR", "ackEdge", "R_TRIG")
    body = [f"{t}(IN := {raw}, PT := {k.time(delay)});", f"{edge}(CLK := {ack});"]
    body += k.note("latch a new alarm")
    body += [f"IF {t}.Q AND NOT {alarm} THEN", f"    {alarm} := TRUE;", f"    {horn} := TRUE;",
             "END_IF;"]
    body += k.note("acknowledge: the alarm stays while the condition persists")
    body += [f"IF {edge}.Q THEN", f"    {horn} := FALSE;", f"    {alarm} := {t}.Q;", "END_IF;"]
    what = "a value above its limit (REAL inputs)" if analog else "a BOOL condition"
    a, big = k.an_pou("FUNCTION_BLOCK")
    desc = k.pick((
        f"Write {a} for a latching alarm on {what}: on-delay {human_time(delay)}, latched until "
        "acknowledged on the rising edge of ack; outputs alarm and unacknowledged.",
        f"{big} implementing alarm handling with acknowledge: {what} must persist "
        f"{human_time(delay)}; ack (edge-triggered) clears the horn and resets the alarm if the "
        "condition is gone.",
    ))
    return k.finish("FUNCTION_BLOCK", ("AlarmLatch", "Alarmspeicher"), desc, body)


def fan_run_on(k: Kit) -> Pair:
    """Cooling fan with run-on after the heater/motor stops (TOF)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    run_on = k.pick((30_000, 60_000, 90_000, 120_000, 300_000))
    airflow = k.chance(0.6)
    supervise = k.pick((3000, 5000, 10_000))
    src = k.var("VAR_INPUT", "heaterOn", "BOOL")
    flow_ok = k.var("VAR_INPUT", "airflowOk", "BOOL", comment="airflow switch") if airflow \
        else ""
    fan = k.var("VAR_OUTPUT", "fanOn", "BOOL")
    enable = k.var("VAR_OUTPUT", "heaterEnable", "BOOL") if airflow else ""
    fault = k.var("VAR_OUTPUT", "fanFault", "BOOL") if airflow else ""
    t = k.var("VAR", "runOn", "TOF", comment=f"run-on {human_time(run_on)}")
    t_air = k.var("VAR", "airflowTimer", "TON") if airflow else ""
    body = k.note("fan follows the heater and keeps running after it stops")
    body += [f"{t}(IN := {src}, PT := {k.time(run_on)});", f"{fan} := {t}.Q;"]
    if airflow:
        body += k.note("no airflow while the fan runs: fault, heater blocked")
        body += [f"{t_air}(IN := {fan} AND NOT {flow_ok}, PT := {k.time(supervise)});",
                 f"IF {t_air}.Q THEN", f"    {fault} := TRUE;", "END_IF;",
                 f"{enable} := NOT {fault};"]
    a, big = k.an_pou(pou_type)
    air = (f"; if the airflow switch stays open {human_time(supervise)} while the fan runs, "
           "latch a fan fault and drop the heater enable") if airflow else ""
    desc = k.pick((
        f"{big}: the cooling fan runs whenever the heater is on and for {human_time(run_on)} "
        f"after it switches off (use TOF){air}.",
        f"Write {a} with a fan run-on time of {human_time(run_on)} after the heater stops{air}.",
    ))
    return k.finish(pou_type, ("FanRunOn", "LuefterNachlauf"), desc, body)


def lube_pulse(k: Kit) -> Pair:
    """Periodic lubrication: a self-resetting TON for the pause, a TP for the pulse."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    pause, pulse = k.pick((60_000, 300_000, 600_000, 900_000)), k.pick((500, 2000, 3000, 5000))
    level = k.chance(0.6)
    en = k.var("VAR_INPUT", "running", "BOOL", comment="machine running")
    low = k.var("VAR_INPUT", "lowLevel", "BOOL", comment="grease reservoir low") if level else ""
    valve = k.var("VAR_OUTPUT", "lubeValve", "BOOL")
    warn = k.var("VAR_OUTPUT", "lubeWarning", "BOOL") if level else ""
    t = k.var("VAR", "cycleTimer", "TON")
    p = k.var("VAR", "lubePulse", "TP")
    body = [f"{t}(IN := {en} AND NOT {t}.Q, PT := {k.time(pause)});"]
    body += k.note("one pulse per elapsed pause")
    trigger = f"{t}.Q AND NOT {low}" if level else f"{t}.Q"
    body += [f"{p}(IN := {trigger}, PT := {k.time(pulse)});", f"{valve} := {p}.Q;"]
    body += [f"{warn} := {low} AND {en};"] if level else []
    a, _ = k.an_pou(pou_type)
    lv = "; skip pulses and warn while the reservoir is low" if level else ""
    desc = k.pick((
        f"Write {a} for central lubrication: while the machine runs, open the lube valve for "
        f"{human_time(pulse)} every {human_time(pause)} (TON + TP){lv}.",
        f"Lubrication pulse in {a}: every {human_time(pause)} of running time, one "
        f"{human_time(pulse)} pulse on the valve{lv}.",
    ))
    return k.finish(pou_type, ("LubePulse", "Schmierung"), desc, body)


def debounce(k: Kit) -> Pair:
    """Input debounce with separate on- and off-delays (two TONs)."""
    on_ms, off_ms = k.pick((20, 50, 100, 200, 500)), k.pick((20, 50, 100, 300, 1000))
    raw = k.var("VAR_INPUT", "rawIn", "BOOL")
    out = k.var("VAR_OUTPUT", "debounced", "BOOL")
    t_on = k.var("VAR", "onTimer", "TON")
    t_off = k.var("VAR", "offTimer", "TON")
    body = [f"{t_on}(IN := {raw}, PT := {k.time(on_ms)});",
            f"{t_off}(IN := NOT {raw}, PT := {k.time(off_ms)});",
            f"IF {t_on}.Q THEN", f"    {out} := TRUE;", f"ELSIF {t_off}.Q THEN",
            f"    {out} := FALSE;", "END_IF;"]
    a, big = k.an_pou("FUNCTION_BLOCK")
    desc = k.pick((
        f"Write {a} debouncing a digital input: output goes TRUE after the input is stable "
        f"TRUE for {human_time(on_ms)} and FALSE after {human_time(off_ms)} stable FALSE.",
        f"{big} for contact debounce with TON: on-delay {human_time(on_ms)}, off-delay "
        f"{human_time(off_ms)}.",
    ))
    return k.finish("FUNCTION_BLOCK", ("Debounce", "Entprellung"), desc, body)


def batch_counter(k: Kit) -> Pair:
    """Parts counter with CTU, reset and batch-complete output."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    size = k.pick((10, 12, 24, 50, 100, 250, 500))
    preset_input = k.chance(0.5)
    sensor = k.var("VAR_INPUT", "partSensor", "BOOL")
    reset = k.var("VAR_INPUT", "reset", "BOOL")
    pv = k.var("VAR_INPUT" if preset_input else "VAR", "batchSize", "INT", str(size))
    auto = k.chance(0.5)
    change = k.pick((1000, 2000, 3000))
    done = k.var("VAR_OUTPUT", "batchDone", "BOOL")
    count = k.var("VAR_OUTPUT", "count", "INT")
    left = k.var("VAR_OUTPUT", "remaining", "INT")
    ctu = k.var("VAR", "counter", "CTU")
    box = k.var("VAR", "boxChange", "TP") if auto else ""
    body = k.note("CTU counts rising edges of the sensor")
    rst = f"{reset} OR {box}.Q" if auto else reset
    body += [f"{ctu}(CU := {sensor}, R := {rst}, PV := {pv});", f"{done} := {ctu}.Q;",
             f"{count} := {ctu}.CV;", f"{left} := {pv} - {ctu}.CV;"]
    if auto:
        body += k.note("box change: pulse, then count the next batch")
        body += [f"{box}(IN := {ctu}.Q, PT := {k.time(change)});"]
    a, big = k.an_pou(pou_type)
    au = (f"; when the batch is full, a {human_time(change)} box-change pulse (TP) resets the "
          "counter") if auto else ""
    desc = k.pick((
        f"Write {a} counting parts with a CTU: batch of {size}, reset input, outputs for the "
        f"count, parts remaining and batch complete{au}.",
        f"{big} with a parts counter (CTU) that signals when {size} parts have passed the "
        f"sensor and shows how many remain; reset clears the count{au}.",
    ))
    if preset_input:
        k.constrain("The batch size is an INT input.", 0.7)
    return k.finish(pou_type, ("BatchCounter", "Stueckzaehler"), desc, body)


def toggle_button(k: Kit) -> Pair:
    """Impulse relay: each press (R_TRIG) toggles the output."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    btn = k.var("VAR_INPUT", "button", "BOOL")
    light = k.var("VAR_OUTPUT", "light", "BOOL")
    central = k.chance(0.6)
    off = k.var("VAR_INPUT", "allOff", "BOOL", comment="central off") if central else ""
    edge = k.var("VAR", "buttonEdge", "R_TRIG")
    body = [f"{edge}(CLK := {btn});", f"IF {edge}.Q THEN", f"    {light} := NOT {light};",
            "END_IF;"]
    if central:
        body += [f"IF {off} THEN", f"    {light} := FALSE;", "END_IF;"]
    a, _ = k.an_pou(pou_type)
    c = "; a central-off input switches it off" if central else ""
    desc = k.pick((f"Write {a} for an impulse relay: each press of the button toggles the "
                   f"light (rising edge with R_TRIG){c}.",
                   f"Toggle an output on every rising edge of a push button, in {a}{c}."))
    return k.finish(pou_type, ("Toggle", "Stromstoss"), desc, body)


def trip_detect(k: Kit) -> Pair:
    """Count starts (R_TRIG) and detect an unexpected stop (F_TRIG while still commanded)."""
    cmd = k.var("VAR_INPUT", "command", "BOOL", comment="run command")
    running = k.var("VAR_INPUT", "running", "BOOL", comment="running feedback")
    reset = k.var("VAR_INPUT", "reset", "BOOL")
    starts = k.var("VAR_OUTPUT", "starts", "DINT")
    tripped = k.var("VAR_OUTPUT", "tripped", "BOOL")
    rise = k.var("VAR", "runRise", "R_TRIG")
    fall = k.var("VAR", "runFall", "F_TRIG")
    body = [f"{rise}(CLK := {running});", f"{fall}(CLK := {running});",
            f"IF {rise}.Q THEN", f"    {starts} := {starts} + 1;", "END_IF;"]
    body += k.note("stopped although still commanded: a trip")
    body += [f"IF {fall}.Q AND {cmd} THEN", f"    {tripped} := TRUE;", "END_IF;",
             f"IF {reset} THEN", f"    {tripped} := FALSE;", "END_IF;"]
    a, big = k.an_pou("FUNCTION_BLOCK")
    desc = k.pick((
        f"Write {a} that counts motor starts on the rising edge of the running feedback and "
        "latches a trip when running drops (F_TRIG) while the command is still on.",
        f"{big}: R_TRIG counts starts, F_TRIG on the running signal detects an unexpected "
        "stop; reset clears the trip flag.",
    ))
    return k.finish("FUNCTION_BLOCK", ("TripMonitor", "Ausloesung"), desc, body)


def analog_scaling(k: Kit) -> Pair:
    """FUNCTION: raw INT to engineering REAL, clamped with LIMIT."""
    raw_lo, raw_hi, card = k.pick(((0, 27648, "S7 0..27648"), (0, 32767, "0..32767"),
                                   (5530, 27648, "4..20 mA as 5530..27648"),
                                   (0, 4095, "12-bit 0..4095")))
    eng = k.pick((("bar", 0.0, 10.0), ("degC", -50.0, 150.0), ("%", 0.0, 100.0),
                  ("m3/h", 0.0, 250.0), ("mm", 0.0, 2000.0)))
    raw = k.var("VAR_INPUT", "raw", "INT")
    lo = k.var("VAR_INPUT", "engLow", "REAL")
    hi = k.var("VAR_INPUT", "engHigh", "REAL")
    raw_r = k.var("VAR", "rawReal", "REAL")
    span = k.var("VAR", "span", "REAL")
    tmp = k.var("VAR", "scaled", "REAL")
    fname = k.pou_name("FUNCTION", "ScaleAnalog", "Skalierung")
    body = [f"{raw_r} := INT_TO_REAL({raw});", f"{span} := {hi} - {lo};"]
    body += k.note(f"linear: raw {raw_lo}..{raw_hi} -> engLow..engHigh")
    body += [f"{tmp} := {lo} + ({raw_r} - {real(raw_lo)}) * {span} / {real(raw_hi - raw_lo)};"]
    body += k.note("clamp to the engineering range")
    body += [f"{fname} := LIMIT({lo}, {tmp}, {hi});"]
    desc = k.pick((
        f"Write a FUNCTION that scales a raw analog value ({card}) to engineering units "
        f"between engLow and engHigh (e.g. {eng[1]}..{eng[2]} {eng[0]}), clamped with LIMIT.",
        f"Analog input scaling function: INT raw {raw_lo}..{raw_hi} -> REAL, linear, limited "
        "to the engineering range.",
    ))
    return _finish_function(k, fname, "REAL", desc, body)


def _finish_function(k: Kit, fname: str, rtype: str, desc: str, body: list[str]) -> Pair:
    return k.finish("FUNCTION", fname, desc, body, return_type=rtype)


def flasher(k: Kit) -> Pair:
    """Warning lamp: flashes while an alarm is unacknowledged, steady after ack (two TONs)."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    on_ms, off_ms = k.pick((250, 500, 1000)), k.pick((250, 500, 1000))
    alarm = k.var("VAR_INPUT", "alarm", "BOOL")
    acked = k.var("VAR_INPUT", "ack", "BOOL", comment="alarm acknowledged")
    lamp = k.var("VAR_OUTPUT", "lamp", "BOOL")
    horn = k.var("VAR_OUTPUT", "hornOut", "BOOL")
    t_off = k.var("VAR", "offTimer", "TON")
    t_on = k.var("VAR", "onTimer", "TON")
    body = k.note("free-running blinker")
    body += [f"{t_off}(IN := NOT {t_on}.Q, PT := {k.time(off_ms)});",
             f"{t_on}(IN := {t_off}.Q, PT := {k.time(on_ms)});",
             f"{lamp} := {alarm} AND ({t_off}.Q OR {acked});",
             f"{horn} := {alarm} AND NOT {acked};"]
    a, _ = k.an_pou(pou_type)
    desc = k.pick((
        f"Write {a} for an alarm beacon: flash ({human_time(on_ms)} on / {human_time(off_ms)} "
        "off, built from two TONs) while the alarm is unacknowledged, steady on after ack; "
        "the horn sounds until ack.",
        f"Blinking lamp in {a}: {human_time(on_ms)} on, {human_time(off_ms)} off while alarm "
        "and not acknowledged; steady when acknowledged; off without alarm. Horn output "
        "until acknowledged.",
    ))
    return k.finish(pou_type, ("Beacon", "Blinkleuchte"), desc, body)


def operating_hours(k: Kit) -> Pair:
    """Run-hours meter: 1 s pulses from a self-resetting TON, service-due flag."""
    pou_type = k.pick(("FUNCTION_BLOCK", "PROGRAM"))
    service = k.pick((500.0, 1000.0, 2000.0, 4000.0, 8000.0))
    running = k.var("VAR_INPUT", "running", "BOOL")
    reset = k.var("VAR_INPUT", "reset", "BOOL", comment="after service")
    hours = k.var("VAR_OUTPUT", "runHours", "REAL")
    due = k.var("VAR_OUTPUT", "serviceDue", "BOOL")
    secs = k.var("VAR", "runSeconds", "DINT")
    after = k.var("VAR", "serviceAfter", "REAL", real(service))
    t = k.var("VAR", "secTimer", "TON")
    body = [f"{t}(IN := {running} AND NOT {t}.Q, PT := {k.time(1000)});",
            f"IF {t}.Q THEN", f"    {secs} := {secs} + 1;", "END_IF;",
            f"IF {reset} THEN", f"    {secs} := 0;", "END_IF;",
            f"{hours} := DINT_TO_REAL({secs}) / 3600.0;", f"{due} := {hours} >= {after};"]
    a, _ = k.an_pou(pou_type)
    desc = k.pick((
        f"Write {a} for an operating-hours counter: count running seconds with a 1 s TON "
        f"pulse, output hours as REAL, service due after {service:g} h, reset input.",
        f"Run-hour meter in {a}; flag service after {service:g} running hours.",
    ))
    return k.finish(pou_type, ("RunHours", "Betriebsstunden"), desc, body,
                    assumptions=("the seconds counter should be declared RETAIN in the PLC",))


def moving_average(k: Kit) -> Pair:
    """Moving average over an ARRAY ring buffer, summed with a FOR loop."""
    n = k.pick((4, 5, 8, 10, 16))
    val = k.var("VAR_INPUT", "value", "REAL")
    avg = k.var("VAR_OUTPUT", "average", "REAL")
    buf = k.var("VAR", "buffer", f"ARRAY[0..{n - 1}] OF REAL")
    idx = k.var("VAR", "index", "INT")
    cnt = k.var("VAR", "filled", "INT")
    i = k.var("VAR", "i", "INT")
    total = k.var("VAR", "sum", "REAL")
    body = [f"{buf}[{idx}] := {val};", f"{idx} := ({idx} + 1) MOD {n};",
            f"IF {cnt} < {n} THEN", f"    {cnt} := {cnt} + 1;", "END_IF;",
            f"{total} := 0.0;", f"FOR {i} := 0 TO {n - 1} DO",
            f"    {total} := {total} + {buf}[{i}];", "END_FOR;"]
    body += k.note("unfilled slots are zero")
    body += [f"{avg} := {total} / INT_TO_REAL({cnt});"]
    desc = k.pick((
        f"Write a function block computing the moving average of the last {n} samples of a "
        "REAL value (one sample per call, ring buffer, FOR loop).",
        f"Moving-average filter FB over {n} values using an ARRAY; average over the samples "
        "collected so far until the buffer is full.",
    ))
    return k.finish("FUNCTION_BLOCK", ("MovingAverage", "Mittelwert"), desc, body)


def median_of_three(k: Kit) -> Pair:
    """FUNCTION: 2oo3 sensor selection, the median of three REALs (MIN/MAX)."""
    a = k.var("VAR_INPUT", "a", "REAL")
    b = k.var("VAR_INPUT", "b", "REAL")
    c = k.var("VAR_INPUT", "c", "REAL")
    fname = k.pou_name("FUNCTION", "Median3", "Median3")
    body = k.note("median = 2-out-of-3 selection")
    if k.chance(0.25):
        body += [f"{fname} := MAX(MIN({a}, {b}), MIN(MAX({a}, {b}), {c}));"]
    else:
        lo = k.var("VAR", "lo", "REAL")
        hi = k.var("VAR", "hi", "REAL")
        body += [f"{lo} := MIN({a}, {b});", f"{hi} := MAX({a}, {b});",
                 f"IF {c} < {lo} THEN", f"    {fname} := {lo};", f"ELSIF {c} > {hi} THEN",
                 f"    {fname} := {hi};", "ELSE", f"    {fname} := {c};", "END_IF;"]
    desc = k.pick((
        "Write a FUNCTION returning the median of three redundant sensor readings (2oo3 "
        "selection) using MIN and MAX.",
        "Function for 2-out-of-3 voting of three REAL transmitters: return the middle value.",
    ))
    return _finish_function(k, fname, "REAL", desc, body)


def limit_classify(k: Kit) -> Pair:
    """FUNCTION: 0 normal / 1 alert / 2 alarm from a value and its high limits."""
    low = k.chance(0.4)
    val = k.var("VAR_INPUT", "value", "REAL")
    alert = k.var("VAR_INPUT", "alertLimit", "REAL")
    alarm = k.var("VAR_INPUT", "alarmLimit", "REAL")
    fname = k.pou_name("FUNCTION", "LimitState", "Grenzwert")
    op = "<=" if low else ">="
    body = [f"IF {val} {op} {alarm} THEN", f"    {fname} := 2;",
            f"ELSIF {val} {op} {alert} THEN", f"    {fname} := 1;", "ELSE",
            f"    {fname} := 0;", "END_IF;"]
    side = "low" if low else "high"
    desc = k.pick((
        f"Write a FUNCTION classifying a measurement against {side} limits: 0 = normal, "
        f"1 = alert, 2 = alarm (limits inclusive).",
        f"Function returning an INT state (0 normal, 1 alert, 2 alarm) for a value with "
        f"{side} alert and alarm limits.",
    ))
    return _finish_function(k, fname, "INT", desc, body)


LOGIC = {
    "alarm_latch": alarm_latch,
    "fan_run_on": fan_run_on,
    "lube_pulse": lube_pulse,
    "debounce": debounce,
    "batch_counter": batch_counter,
    "toggle_button": toggle_button,
    "trip_detect": trip_detect,
    "analog_scaling": analog_scaling,
    "flasher": flasher,
    "operating_hours": operating_hours,
    "moving_average": moving_average,
    "median_of_three": median_of_three,
    "limit_classify": limit_classify,
}
