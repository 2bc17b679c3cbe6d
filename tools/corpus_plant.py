"""Plant knowledge shared by the fault-tree and diagnosis parts of the corpus.

Points (register-map style names, units, normal ranges, alert/alarm limits), fault modes (what
they do to the points, what to do about them) and assets (which points and faults they have,
their fault-tree top events). Values are drawn here too, so that a point's value and its
limits always agree with ``rung.daemon.tasks.diagnosis.snapshot.expected_state``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

HIGH, LOW, NORMAL = "high", "low", "normal"


@dataclass(frozen=True)
class Point:
    """A measured point: name variants, unit, normal band and limits (alert, alarm)."""

    key: str
    names: tuple[str, ...]
    unit: str
    normal: tuple[float, float]
    decimals: int
    high: tuple[float, float] | None = None  # (alert, alarm), alarm above alert
    low: tuple[float, float] | None = None  # (low_alert, low_alarm), alarm below alert

    def scaled(self, f: float) -> Point:
        """The same point for a bigger or smaller machine (values times ``f``)."""
        def s(pair: tuple[float, float] | None) -> tuple[float, float] | None:
            return None if pair is None else (round(pair[0] * f, 1), round(pair[1] * f, 1))
        return replace(self, normal=s(self.normal) or self.normal, high=s(self.high),
                       low=s(self.low))

    def limits(self) -> dict[str, float]:
        """The limits object of the diagnosis input."""
        out: dict[str, float] = {}
        if self.high:
            out.update(alert=self.high[0], alarm=self.high[1])
        if self.low:
            out.update(low_alert=self.low[0], low_alarm=self.low[1])
        return out

    def draw(self, rng: random.Random, state: str, side: str = HIGH) -> float:
        """A value in ``state`` (normal/alert/alarm) on ``side`` (high/low), rounded."""
        lo, hi = self.normal
        if state == NORMAL or (side == HIGH and not self.high) or (side == LOW and not self.low):
            x = rng.uniform(lo, hi)
        elif side == HIGH:
            assert self.high is not None
            alert, alarm = self.high
            x = rng.uniform(alert, alarm) if state == "alert" else rng.uniform(
                alarm, alarm + 0.6 * (alarm - alert))
        else:
            assert self.low is not None
            alert, alarm = self.low
            x = rng.uniform(alarm, alert) if state == "alert" else rng.uniform(
                max(0.0, alarm - 0.6 * (alert - alarm)), alarm)
        value = round(x, self.decimals)
        return int(value) if self.decimals == 0 else value

    def history(self, rng: random.Random, value: float, times: list[int],
                state: str = NORMAL) -> list[list[float]]:
        """``[[t, value], ...]`` at ``times`` ending at ``value`` (the snapshot's reading):
        an abnormal point drifted there from its normal band (linearly, accelerating, by
        a recent step, or is coming back from worse), a normal one is flat or drifts within
        the band; with noise, rounded like the point's readings."""
        lo, hi = self.normal
        n = len(times)
        band = hi - lo
        if state == NORMAL:
            shape = rng.choices(("flat", "drift"), (0.7, 0.3))[0]
            start = value if shape == "flat" else rng.uniform(lo, hi)
            sigma = band * rng.uniform(0.01, 0.05)
        else:
            shape = rng.choices(("linear", "accelerating", "step", "recovering"),
                                (0.5, 0.25, 0.1, 0.15))[0]
            start = rng.uniform(lo, hi)
            if shape == "recovering":   # it was worse and comes back toward the band
                start = value + (value - start) * rng.uniform(0.2, 0.6)
            sigma = abs(value - start) * rng.uniform(0.02, 0.1)
        power = rng.uniform(1.5, 3.0) if shape == "accelerating" else 1.0
        jump = n - rng.randint(1, 3)   # the step: flat until the last one to three samples
        out: list[list[float]] = []
        for i, t in enumerate(times):
            s = i / (n - 1)
            if i == n - 1:
                x = value
            elif shape == "step":
                x = (start if i < jump else value) + rng.gauss(0.0, sigma)
            else:
                x = start + (value - start) * s ** power + rng.gauss(0.0, sigma)
            x = round(max(0.0, x), self.decimals)
            out.append([t, int(x) if self.decimals == 0 else x])
        return out


def sample_times(rng: random.Random) -> list[int]:
    """The times of a history, in seconds, increasing: 10 to 60 samples a fixed period
    apart (with a little jitter), relative to the first or unix times."""
    n = rng.randint(10, 60)
    dt = rng.choices((60, 300, 900, 1800, 3600, 7200, 14400, 28800),
                     (1, 1, 1, 2, 3, 3, 2, 1))[0]
    t0 = 0 if rng.random() < 0.5 else 1_700_000_000 + rng.randrange(0, 40_000_000, 60)
    jitter = dt // 10
    return [t0 + i * dt + (rng.randint(-jitter, jitter) if i > 0 else 0) for i in range(n)]


def _p(key: str, names: str, unit: str, normal: tuple[float, float], decimals: int = 1,
       high: tuple[float, float] | None = None, low: tuple[float, float] | None = None) -> Point:
    return Point(key, tuple(names.split()), unit, normal, decimals, high, low)


POINTS: dict[str, Point] = {p.key: p for p in (
    _p("oil_temp", "oil_temp tank_oil_temp oil_temperature", "degC", (40, 55), 1, high=(60, 70)),
    _p("pressure", "pressure system_pressure p_system", "bar", (185, 205), 1, low=(175, 160)),
    _p("air_pressure", "net_pressure air_pressure p_net", "bar", (7.0, 7.6), 2, low=(6.6, 6.2)),
    _p("discharge_pressure", "discharge_pressure p_discharge pressure", "bar", (4.2, 5.0), 2,
       low=(3.8, 3.2)),
    _p("suction_pressure", "suction_pressure p_suction", "bar", (0.8, 1.5), 2, low=(0.5, 0.3)),
    _p("vibration_rms", "vibration_rms vib_rms bearing_vib_rms", "mm/s", (0.9, 2.6), 2,
       high=(4.5, 7.1)),
    _p("motor_current", "motor_current current i_motor", "A", (36, 44), 1, high=(50, 56)),
    _p("flow", "flow flow_rate q_flow", "m3/h", (80, 100), 1, low=(70, 55)),
    _p("level", "level tank_level oil_level", "%", (60, 85), 1, low=(45, 30)),
    _p("coolant_level", "level expansion_tank_level coolant_level", "%", (55, 80), 1,
       low=(40, 25)),
    _p("bearing_temp", "bearing_temp de_bearing_temp brg_temp", "degC", (45, 65), 1,
       high=(80, 90)),
    _p("winding_temp", "winding_temp motor_temp", "degC", (70, 95), 1, high=(120, 140)),
    _p("filter_dp", "filter_dp filter_delta_p", "bar", (0.3, 1.2), 2, high=(2.0, 3.0)),
    _p("inlet_dp", "inlet_dp filter_dp_mbar", "mbar", (20, 45), 0, high=(60, 80)),
    _p("discharge_temp", "discharge_temp air_discharge_temp", "degC", (75, 90), 1,
       high=(100, 110)),
    _p("coolant_temp", "coolant_temp supply_temp t_supply", "degC", (22, 28), 1, high=(32, 36)),
    _p("gear_oil_temp", "gear_oil_temp gearbox_oil_temp", "degC", (55, 70), 1, high=(80, 90)),
    _p("belt_speed", "belt_speed v_belt", "m/s", (1.95, 2.05), 2, low=(1.85, 1.7)),
    _p("belt_slip", "belt_slip slip_pct", "%", (0.2, 1.0), 2, high=(2.0, 4.0)),
    _p("ambient_temp", "ambient_temp t_ambient", "degC", (12, 31), 1),
    _p("speed", "speed motor_speed n_motor", "rpm", (1470, 1490), 0),
    _p("load_pct", "load_pct motor_load", "%", (55, 90), 0),
)}

# Status and fault switches (booleans): key -> (names, value when healthy).
SWITCHES: dict[str, tuple[tuple[str, ...], bool]] = {
    "running": (("running", "motor_running", "drive_on"), True),
    "pump_running": (("pump_on", "pump_running"), True),
    "filter_switch": (("filter_clogged", "filter_dp_switch"), False),
    "standby_ready": (("standby_ready", "standby_available"), True),
}


@dataclass(frozen=True)
class Fault:
    """A fault mode: its name and component, its basic-event text, its symptoms."""

    name: str
    component: str
    event: str
    signature: dict[str, str]  # point key -> high / low / normal
    actions: tuple[str, ...]
    log_p: tuple[float, float] = (-3.5, -1.5)  # log10 range of the event probability
    condition: tuple[str, str] | None = None  # INHIBIT condition (id, description)


def _f(name: str, component: str, event: str, signature: str, actions: str,
       log_p: tuple[float, float] = (-3.5, -1.5),
       condition: tuple[str, str] | None = None) -> Fault:
    sig = dict(item.split(":") for item in signature.split())
    return Fault(name, component, event, sig, tuple(actions.split(" | ")), log_p, condition)


HOT = ("C_HOT_AMBIENT", "Ambient temperature above 35 degC")
FAULTS: dict[str, Fault] = {
    "pump_wear": _f("Pump wear (volumetric efficiency loss)", "hydraulic pump",
                    "Hydraulic pump worn, low volumetric efficiency",
                    "pressure:low oil_temp:high",
                    "Measure pump case drain flow | Plan pump exchange at next stop"),
    "internal_leak": _f("Internal leakage", "valves / cylinder seals",
                        "Internal leakage across valve spools or piston seals",
                        "pressure:low oil_temp:high",
                        "Check cylinder piston seals for bypass | Inspect directional valves"),
    "relief_valve": _f("Relief valve stuck partly open", "pressure relief valve",
                       "Relief valve leaking / stuck partly open", "pressure:low oil_temp:high",
                       "Check relief valve setting and seat", (-4.0, -2.5)),
    "suction_strainer": _f("Clogged suction strainer", "suction strainer",
                           "Suction strainer clogged", "pressure:low vibration_rms:high",
                           "Clean or replace the suction strainer", (-3.0, -1.3)),
    "low_oil_level": _f("Low oil level", "reservoir", "Oil level low (leak or loss)",
                        "level:low oil_temp:high",
                        "Top up oil and search for external leaks", (-3.0, -1.5)),
    "cooler_fouled": _f("Oil cooler fouled", "oil cooler", "Oil cooler fouled",
                        "oil_temp:high pressure:normal",
                        "Clean the oil cooler | Check cooling water flow", (-3.0, -1.3), HOT),
    "cooling_water_valve": _f("Cooling water valve closed", "cooling water valve",
                              "Cooling water valve closed or failed",
                              "oil_temp:high", "Check the cooling water valve and actuator",
                              (-4.0, -2.5)),
    "bearing_damage": _f("Bearing damage", "rolling bearing", "Rolling bearing damaged",
                         "vibration_rms:high bearing_temp:high",
                         "Run envelope spectrum analysis | Plan bearing replacement"),
    "misalignment": _f("Shaft misalignment", "coupling", "Shaft misalignment at the coupling",
                       "vibration_rms:high bearing_temp:normal",
                       "Check alignment with a laser tool | Inspect the coupling"),
    "imbalance": _f("Rotor imbalance", "impeller / rotor", "Rotor or impeller imbalance",
                    "vibration_rms:high bearing_temp:normal",
                    "Check for deposits on the impeller | Balance the rotor", (-3.5, -2.0)),
    "looseness": _f("Mechanical looseness", "baseplate / foot bolts",
                    "Loose foot bolts or soft foot", "vibration_rms:high",
                    "Check foot bolt torque and soft foot", (-3.5, -2.0)),
    "mech_overload": _f("Mechanical overload", "driven machine", "Mechanical overload of drive",
                        "motor_current:high winding_temp:high",
                        "Check the driven load for binding | Reduce load",
                        (-3.0, -1.5), ("C_PEAK_LOAD", "Operation at peak throughput")),
    "blocked_impeller": _f("Blocked impeller", "impeller", "Impeller blocked by debris",
                           "motor_current:high flow:low",
                           "Open the pump and remove debris from the impeller", (-3.5, -2.0)),
    "undervoltage": _f("Supply undervoltage", "motor supply", "Supply undervoltage",
                       "motor_current:high", "Check supply voltage and phase balance",
                       (-4.0, -2.0), ("C_GRID_DIP", "Grid voltage dip below 90 %")),
    "blocked_strainer": _f("Blocked suction strainer", "suction strainer",
                           "Suction strainer blocked", "flow:low motor_current:normal "
                           "suction_pressure:low", "Clean the suction strainer", (-3.0, -1.3)),
    "closed_valve": _f("Discharge valve throttled or closed", "discharge valve",
                       "Discharge valve closed / throttled", "flow:low motor_current:normal",
                       "Check the discharge valve position", (-3.5, -2.0)),
    "impeller_wear": _f("Impeller wear", "impeller", "Impeller worn (low head)",
                        "flow:low discharge_pressure:low",
                        "Check pump curve against a performance test | Plan impeller exchange"),
    "cavitation": _f("Cavitation", "pump inlet", "Cavitation at the pump inlet",
                     "suction_pressure:low vibration_rms:high flow:low",
                     "Raise suction head or reduce flow | Check the inlet line",
                     (-3.5, -1.5), ("C_LOW_SUMP", "Sump level below minimum")),
    "inlet_filter": _f("Clogged air inlet filter", "inlet filter", "Air inlet filter clogged",
                       "inlet_dp:high air_pressure:low", "Replace the air inlet filter",
                       (-2.5, -1.0)),
    "element_wear": _f("Compressor element wear", "screw element", "Screw element worn",
                       "air_pressure:low discharge_temp:high",
                       "Check element clearances | Plan element overhaul", (-4.0, -2.5)),
    "oil_cooler_fouled": _f("Oil cooler fouled", "compressor oil cooler", "Oil cooler fouled",
                            "discharge_temp:high oil_temp:high",
                            "Clean the oil cooler fins", (-3.0, -1.3), HOT),
    "thermostatic_valve": _f("Thermostatic valve stuck", "thermostatic valve",
                             "Thermostatic bypass valve stuck", "discharge_temp:high",
                             "Test the thermostatic valve element", (-4.0, -2.5)),
    "net_leak": _f("Air net leakage", "air distribution", "Leaks in the compressed-air net",
                   "air_pressure:low motor_current:normal",
                   "Run an ultrasonic leak survey", (-2.0, -0.8)),
    "overfeed": _f("Overfeeding / jam", "conveyor load", "Conveyor overfed or jammed",
                   "motor_current:high belt_slip:high", "Check the feeder rate and chutes",
                   (-2.5, -1.0), ("C_WET_MATERIAL", "Wet, sticky bulk material")),
    "idler_seized": _f("Seized idlers", "idlers", "Several idlers seized",
                       "motor_current:high", "Inspect idlers along the carry side"),
    "lagging_worn": _f("Worn pulley lagging", "drive pulley", "Drive pulley lagging worn",
                       "belt_slip:high belt_speed:low", "Inspect and replace pulley lagging"),
    "low_tension": _f("Low belt take-up tension", "take-up", "Take-up tension too low",
                      "belt_slip:high belt_speed:low", "Adjust the take-up tension",
                      (-3.0, -1.5), ("C_WET_BELT", "Belt wet from rain or washdown")),
    "gear_wear": _f("Gear tooth wear", "gear stage", "Gear teeth worn or pitted",
                    "vibration_rms:high gear_oil_temp:high",
                    "Take an oil sample for wear metals | Inspect gear teeth"),
    "gear_lube": _f("Gear lubrication loss", "gearbox oil", "Gear oil level low or degraded",
                    "gear_oil_temp:high level:low", "Check gear oil level and condition"),
    "hx_fouled": _f("Heat exchanger fouled", "plate heat exchanger",
                    "Heat exchanger fouled", "coolant_temp:high flow:normal",
                    "Clean the heat exchanger plates", (-3.0, -1.3), HOT),
    "thermostat_stuck": _f("Three-way valve stuck in bypass", "mixing valve",
                           "Three-way valve stuck in bypass", "coolant_temp:high",
                           "Check the three-way valve actuator", (-4.0, -2.5)),
    "coolant_leak": _f("Coolant leak", "piping", "Coolant leak, inventory low",
                       "coolant_level:low coolant_temp:high", "Find and repair the leak; refill"),
    "air_lock": _f("Air lock in the circuit", "piping high points", "Air trapped in the circuit",
                   "flow:low motor_current:normal", "Vent the circuit at high points"),
}


@dataclass(frozen=True)
class Group:
    """A sub-gate of redundant items: ATLEAST k of n identical items, or AND of events."""

    gate: str  # gate id suffix
    description: str
    kind: str  # ATLEAST or AND
    items: tuple[tuple[str, str], ...]  # (event id suffix, description)
    k: int = 0
    log_p: tuple[float, float] = (-3.0, -1.5)


def fans(gate: str, what: str, n: int, k: int) -> Group:
    """An ATLEAST group of ``n`` identical fans, ``k`` failed lose the function."""
    return Group(gate, f"At least {k} of {n} {what}s failed", "ATLEAST",
                 tuple((f"FAN{i}", f"{what.capitalize()} {i} fails") for i in range(1, n + 1)),
                 k, (-2.5, -1.0))


def duty_standby(gate: str, what: str) -> Group:
    """An AND group: the duty unit fails and the standby fails to start."""
    return Group(gate, f"Duty and standby {what} unavailable", "AND",
                 (("DUTY_FAIL", f"Duty {what} fails"),
                  ("STANDBY_FTS", f"Standby {what} fails to start on demand")), 0, (-2.5, -1.0))


@dataclass(frozen=True)
class Top:
    """A fault-tree top event: text, the symptoms it shows, and its branches."""

    text: str
    symptoms: dict[str, str]
    branches: tuple[tuple[str, str, tuple[str, ...]], ...]  # (gate, description, causes)


@dataclass(frozen=True)
class Asset:
    """A plausible asset: labels, points (key -> scale factor), switches, faults, tops."""

    key: str
    labels: tuple[str, ...]
    points: dict[str, float]
    faults: tuple[str, ...]
    tops: tuple[Top, ...]
    groups: dict[str, Group] = field(default_factory=dict)
    switches: tuple[str, ...] = ()


def _top(text: str, symptoms: str, *branches: tuple[str, str, str]) -> Top:
    sig = dict(item.split(":") for item in symptoms.split())
    return Top(text, sig, tuple((g, d, tuple(c.split())) for g, d, c in branches))


ASSETS: dict[str, Asset] = {a.key: a for a in (
    Asset("hydraulic_unit",
          ("Hydraulic power unit HPU-{n} of a {t} t press", "Hydraulic unit {n}, injection "
           "moulding machine", "Press line {n} hydraulic power pack (2 x vane pump)"),
          {"oil_temp": 1, "pressure": 1, "level": 1, "filter_dp": 1, "vibration_rms": 1,
           "motor_current": 1.6, "ambient_temp": 1},
          ("pump_wear", "internal_leak", "relief_valve", "suction_strainer", "low_oil_level",
           "cooler_fouled", "cooling_water_valve"),
          (_top("Hydraulic pressure below 160 bar with oil overtemperature",
                "oil_temp:high pressure:low",
                ("DELIVERY", "Insufficient pump delivery",
                 "pump_wear suction_strainer low_oil_level"),
                ("LEAKAGE", "Internal leakage / bypass", "internal_leak relief_valve"),
                ("COOLING", "Cooling failure", "cooler_fouled @fans cooling_water_valve")),
           _top("Hydraulic unit trips on oil overtemperature", "oil_temp:high",
                ("COOLING", "Heat not removed", "cooler_fouled @fans cooling_water_valve"),
                ("HEAT", "Excess heat from throttling losses", "internal_leak relief_valve"),
                ("VOLUME", "Reduced oil volume", "low_oil_level")),
           _top("Hydraulic pump damaged by cavitation or wear", "vibration_rms:high pressure:low",
                ("CAVITATION", "Pump inlet starved", "suction_strainer low_oil_level"),
                ("MECH", "Mechanical pump damage", "pump_wear bearing_damage misalignment"))),
          {"fans": fans("FANS", "cooler fan", 3, 2)}, ("pump_running", "filter_switch")),
    Asset("pump",
          ("Centrifugal pump P-{n} (cooling water)", "Process water pump P{n}",
           "Cooling tower pump CT-P{n}, 30 kW"),
          {"flow": 1, "discharge_pressure": 1, "suction_pressure": 1, "motor_current": 1.4,
           "vibration_rms": 1, "bearing_temp": 1, "winding_temp": 1, "speed": 1},
          ("bearing_damage", "misalignment", "imbalance", "looseness", "blocked_impeller",
           "undervoltage", "blocked_strainer", "closed_valve", "impeller_wear", "cavitation",
           "mech_overload"),
          (_top("Cooling-water flow below minimum", "flow:low",
                ("FLOWPATH", "Flow path blocked", "blocked_strainer closed_valve"),
                ("HYDRAULIC", "Pump hydraulic performance lost", "impeller_wear cavitation"),
                ("NOPUMP", "No pump delivering", "&pumps")),
           _top("Pump motor trips on overcurrent", "motor_current:high",
                ("LOAD", "Mechanical overload", "mech_overload blocked_impeller bearing_damage"),
                ("SUPPLY", "Electrical supply problem", "undervoltage")),
           _top("Pump bearing failure", "vibration_rms:high bearing_temp:high",
                ("ROTOR", "Rotor-dynamic excitation", "misalignment imbalance looseness"),
                ("BEARING", "Bearing distress", "bearing_damage cavitation"))),
          {"pumps": duty_standby("PUMPS", "pump")}, ("pump_running", "standby_ready")),
    Asset("compressor",
          ("Screw compressor C-{n}, 75 kW", "Compressed-air station, compressor {n}",
           "Oil-injected screw compressor K{n}"),
          {"discharge_temp": 1, "oil_temp": 1.5, "air_pressure": 1, "inlet_dp": 1,
           "motor_current": 3.2, "vibration_rms": 1, "ambient_temp": 1},
          ("inlet_filter", "element_wear", "oil_cooler_fouled", "thermostatic_valve", "net_leak",
           "bearing_damage", "misalignment"),
          (_top("Compressor shuts down on high discharge temperature",
                "discharge_temp:high oil_temp:high",
                ("OILCOOL", "Oil cooling insufficient",
                 "oil_cooler_fouled thermostatic_valve @fans"),
                ("ELEMENT", "Excess compression heat", "element_wear inlet_filter")),
           _top("Air net pressure below 6.2 bar", "air_pressure:low",
                ("SUPPLY", "Compressor delivery low", "inlet_filter element_wear"),
                ("DEMAND", "Consumption exceeds supply", "net_leak"),
                ("STANDBY", "Backup compressor unavailable", "&backup"))),
          {"fans": fans("FANS", "cooling fan", 3, 2),
           "backup": duty_standby("BACKUP", "compressor")}, ("running",)),
    Asset("conveyor",
          ("Belt conveyor BC-{n} drive, 22 kW", "Overland conveyor {n} head drive",
           "Conveyor CV{n} (bulk material)"),
          {"motor_current": 1.0, "belt_speed": 1, "belt_slip": 1, "gear_oil_temp": 1,
           "vibration_rms": 1, "bearing_temp": 1, "load_pct": 1},
          ("overfeed", "idler_seized", "lagging_worn", "low_tension", "gear_wear",
           "bearing_damage", "mech_overload", "misalignment"),
          (_top("Conveyor stops on drive overload", "motor_current:high",
                ("LOAD", "Excess belt load", "overfeed idler_seized mech_overload"),
                ("DRIVE", "Drive train resistance", "gear_wear bearing_damage")),
           _top("Belt slips on the drive pulley", "belt_slip:high belt_speed:low",
                ("GRIP", "Loss of grip", "lagging_worn low_tension"),
                ("LOAD", "Belt overloaded", "overfeed idler_seized"))),
          {}, ("running",)),
    Asset("gearbox",
          ("Gearbox GB-{n} of a mixer drive", "Helical gearbox {n}, extruder drive",
           "Mill gearbox G{n}"),
          {"gear_oil_temp": 1, "vibration_rms": 1, "bearing_temp": 1, "level": 1,
           "motor_current": 2.0, "speed": 1},
          ("gear_wear", "gear_lube", "bearing_damage", "misalignment", "looseness",
           "mech_overload"),
          (_top("Gearbox failure", "vibration_rms:high gear_oil_temp:high",
                ("LUBE", "Lubrication failure", "gear_lube"),
                ("MECH", "Mechanical damage", "gear_wear bearing_damage misalignment"),
                ("LOAD", "Overload", "mech_overload")),),
          {}, ("running",)),
    Asset("cooling_circuit",
          ("Machine cooling circuit CC-{n} (glycol)", "Closed cooling loop {n} with dry cooler",
           "Chiller loop {n} for the moulding line"),
          {"coolant_temp": 1, "flow": 0.4, "coolant_level": 1, "motor_current": 0.5,
           "ambient_temp": 1},
          ("hx_fouled", "thermostat_stuck", "coolant_leak", "air_lock", "blocked_strainer"),
          (_top("Coolant supply temperature above limit", "coolant_temp:high",
                ("HEATREJ", "Heat rejection lost", "hx_fouled @fans thermostat_stuck"),
                ("CIRC", "Coolant circulation lost", "&pumps air_lock blocked_strainer"),
                ("INVENTORY", "Coolant inventory low", "coolant_leak")),),
          {"fans": fans("FANS", "dry-cooler fan", 4, 3),
           "pumps": duty_standby("PUMPS", "circulation pump")}, ("running",)),
)}


def point(asset: Asset, key: str) -> Point:
    """The asset's version of point ``key`` (scaled to its size)."""
    base = POINTS[key]
    f = asset.points.get(key, 1)
    return base if f == 1 else base.scaled(f)


def label(rng: random.Random, asset: Asset) -> str:
    """A concrete name for the asset (tag numbers filled in)."""
    return rng.choice(asset.labels).format(n=rng.randint(1, 12), t=rng.choice((250, 400, 630)))
