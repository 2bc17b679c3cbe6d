"""Building blocks for the ST archetypes of the corpus: naming styles, literals, POU assembly.

An archetype builder receives a fresh :class:`Kit` (one per sample), declares variables
through it (``k.var("VAR_INPUT", "start", "BOOL")`` returns the name in the sample's naming
style), writes its body lines and calls :meth:`Kit.finish` for the ``(input, output)`` pair.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

# concept -> (English, German), camelCase, ASCII. Never a keyword, type or standard function
# name in any style (no "step", "time", "max", "limit"...).
VOCAB: dict[str, tuple[str, str]] = {
    "start": ("start", "start"), "stopOk": ("stopOk", "stoppOk"),
    "estopOk": ("eStopOk", "notAusOk"), "overload": ("overload", "ueberlast"),
    "guardClosed": ("guardClosed", "schutztuerZu"), "motorOn": ("motorOn", "motorEin"),
    "fault": ("fault", "stoerung"), "runLatch": ("runLatch", "selbsthaltung"),
    "startDelay": ("startDelay", "anlaufVerz"), "permit": ("permit", "einschaltFreigabe"),
    "level": ("level", "fuellstand"), "lowSp": ("lowSetpoint", "sollwertMin"),
    "highSp": ("highSetpoint", "sollwertMax"), "alarmSp": ("alarmLevel", "alarmGrenze"),
    "fillPump": ("fillPump", "fuellpumpe"), "drainPump": ("drainPump", "entleerpumpe"),
    "highAlarm": ("highAlarm", "alarmHoch"), "sensorFault": ("sensorFault", "sensorFehler"),
    "demand": ("demand", "anforderung"), "pump1Fault": ("pump1Fault", "pumpe1Stoerung"),
    "pump2Fault": ("pump2Fault", "pumpe2Stoerung"), "pump1Run": ("pump1Run", "pumpe1Ein"),
    "pump2Run": ("pump2Run", "pumpe2Ein"), "demandEdge": ("demandEdge", "anfFlanke"),
    "dutyIsTwo": ("dutyIsPump2", "fuehrungP2"), "starts": ("startCount", "anzahlStarts"),
    "enable": ("enable", "freigabe"), "setpoint": ("setpoint", "sollwert"),
    "pv": ("processValue", "istwert"), "rangeLow": ("rangeLow", "messbereichMin"),
    "rangeHigh": ("rangeHigh", "messbereichMax"), "kp": ("kp", "kp"), "tiSec": ("tiSec", "tnSek"),
    "cycleSec": ("cycleSec", "zyklusSek"), "output": ("outputPct", "stellwert"),
    "error": ("controlError", "regelabw"), "integral": ("integral", "integralAnteil"),
    "spPct": ("spPct", "sollProzent"), "pvPct": ("pvPct", "istProzent"),
    "stopCmd": ("stopCmd", "stoppBefehl"), "partAtEnd": ("partAtEnd", "teilAmEnde"),
    "horn": ("horn", "hupe"), "conveyorRun": ("conveyorRun", "bandEin"),
    "ready": ("ready", "bereit"), "state": ("seqState", "schritt"),
    "warnTimer": ("warnTimer", "warnZeit"), "dwellTimer": ("dwellTimer", "verweilZeit"),
    "transportTimer": ("transportTimer", "transportZeit"), "seqFault": ("seqFault", "ablaufFehler"),
    "clamp": ("clamp", "spannen"), "clampDone": ("clamped", "gespannt"),
    "clampTimer": ("clampTimer", "spannZeit"),
    "condition": ("condition", "bedingung"), "value": ("value", "messwert"),
    "alarmLimit": ("alarmLimit", "alarmGrenzwert"), "alertLimit": ("alertLimit", "warnGrenzwert"),
    "ack": ("ack", "quittieren"), "alarm": ("alarm", "alarm"),
    "unacked": ("unacked", "unquittiert"), "airflowOk": ("airflowOk", "luftstromOk"),
    "airflowTimer": ("airflowTimer", "luftstromZeit"), "heaterEnable": ("heaterEnable",
                                                                        "heizungFreigabe"),
    "fanFault": ("fanFault", "luefterStoerung"), "lowLevel": ("lowLevel", "fuellstandMin"),
    "lubeWarning": ("lubeWarning", "schmierWarnung"), "allOff": ("allOff", "zentralAus"),
    "remaining": ("remaining", "rest"), "boxChange": ("boxChange", "kartonWechsel"),
    "rawReal": ("rawReal", "rohReal"), "span": ("span", "spanne"), "lo": ("lowPair", "kleiner"),
    "hi": ("highPair", "groesser"), "hornOut": ("horn", "hupe"),
    "ackEdge": ("ackEdge", "quittFlanke"), "alarmDelay": ("alarmDelay", "alarmVerz"),
    "heaterOn": ("heaterOn", "heizungEin"), "fanOn": ("fanOn", "luefterEin"),
    "runOn": ("fanRunOn", "nachlauf"), "lubeValve": ("lubeValve", "schmierventil"),
    "cycleTimer": ("cycleTimer", "pausenZeit"), "lubePulse": ("lubePulse", "schmierImpuls"),
    "rawIn": ("rawInput", "eingangRoh"), "debounced": ("debounced", "entprellt"),
    "onTimer": ("onTimer", "einVerz"), "offTimer": ("offTimer", "ausVerz"),
    "partSensor": ("partSensor", "teileSensor"), "reset": ("reset", "ruecksetzen"),
    "batchSize": ("batchSize", "losgroesse"), "batchDone": ("batchDone", "losFertig"),
    "count": ("partCount", "stueckzahl"), "counter": ("partCounter", "teileZaehler"),
    "button": ("button", "taster"), "light": ("light", "licht"),
    "buttonEdge": ("buttonEdge", "tasterFlanke"), "running": ("running", "laeuft"),
    "command": ("command", "befehl"), "tripped": ("tripped", "ausgeloest"),
    "runRise": ("runRise", "laufSteigend"), "runFall": ("runFall", "laufFallend"),
    "raw": ("raw", "rohwert"), "engLow": ("engLow", "physMin"), "engHigh": ("engHigh", "physMax"),
    "scaled": ("scaled", "skaliert"), "openCmd": ("openCmd", "oeffnenBefehl"),
    "openFb": ("openFb", "rmOffen"), "closedFb": ("closedFb", "rmZu"),
    "valveOut": ("valveOut", "ventilAus"), "fbTimer": ("feedbackTimer", "rmUeberwachung"),
    "mains": ("mainContactor", "netzschuetz"), "star": ("starContactor", "sternschuetz"),
    "delta": ("deltaContactor", "dreieckschuetz"), "starTimer": ("starTimer", "sternZeit"),
    "pauseTimer": ("pauseTimer", "umschaltPause"), "run": ("runCmd", "betrieb"),
    "lamp": ("lamp", "leuchte"), "blink": ("blink", "blinkTakt"),
    "secTimer": ("secondTimer", "sekundenTakt"), "runSeconds": ("runSeconds", "laufSekunden"),
    "runHours": ("runHours", "betriebsstunden"), "serviceAfter": ("serviceHours", "wartungNach"),
    "serviceDue": ("serviceDue", "wartungFaellig"), "target": ("target", "zielwert"),
    "rampRate": ("rampRate", "rampe"), "cycleTime": ("cycleTime", "zykluszeit"),
    "current": ("rampOut", "rampenwert"), "maxDelta": ("maxChange", "maxAenderung"),
    "buffer": ("samples", "puffer"), "index": ("writeIdx", "schreibIdx"), "i": ("i", "i"),
    "sum": ("total", "summe"), "average": ("average", "mittelwert"),
    "filled": ("sampleCount", "anzahlWerte"), "a": ("sensorA", "sensorA"),
    "b": ("sensorB", "sensorB"), "c": ("sensorC", "sensorC"),
    "bias": ("bias", "offset"),
    "reverse": ("reverseActing", "umgekehrt"),
}

# the interface sections a request states
INTERFACE = ("VAR_INPUT", "VAR_OUTPUT", "VAR_IN_OUT")
# plant tags the interface names carry (motor M3, tank T1, pump P101, north door...)
TAGS = ("M3", "_M1", "T1", "_T2", "P101", "_P2", "K4", "_C2", "Nord", "_Sued", "A", "_B",
        "01", "_02", "XV12", "_HW3", "Line2", "_L1", "West", "_Ost")
_PLAIN_INITIAL = re.compile(r"-?\d+(?:\.\d+)?|TRUE|FALSE")

STYLES = ("camel", "camel", "pascal", "hungarian", "german", "german_hungarian")
_PREFIX = {"BOOL": "b", "INT": "i", "DINT": "di", "UINT": "ui", "REAL": "r", "LREAL": "lr",
           "TIME": "t", "WORD": "w", "TON": "ton", "TOF": "tof", "TP": "tp", "R_TRIG": "rt",
           "F_TRIG": "ft", "CTU": "ctu", "CTD": "ctd", "CTUD": "ctud"}
_FB_TYPES = frozenset({"TON", "TOF", "TP", "R_TRIG", "F_TRIG", "CTU", "CTD", "CTUD"})
_POU_PREFIXES = {"FUNCTION_BLOCK": ("FB_", "FB_", "fb", "FB"), "PROGRAM": ("PRG_", "P_", "prg", ""),
                 "FUNCTION": ("FC_", "F_", "fn", "FUN_")}
_ARTICLE = {"FUNCTION_BLOCK": ("a function block", "an FB", "a function block (FB)"),
            "PROGRAM": ("a program", "a PLC program", "a PROGRAM"),
            "FUNCTION": ("a function", "an IEC function", "a FUNCTION")}
_GENERIC = ("a POU", "Structured Text", "IEC 61131-3 ST", "PLC code")


def num(x: float) -> str:
    """A stated value for prose: ``5``, ``5.5``."""
    return str(int(x)) if x == int(x) else str(x)


def cap(word: str) -> str:
    """``word`` with its first letter upper case."""
    return word[:1].upper() + word[1:]


def human_time(ms: int) -> str:
    """A duration for prose: ``500 ms``, ``5 s``, ``1 min 30 s``, ``2 min``."""
    if ms < 1000:
        return f"{ms} ms"
    s = ms // 1000
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    return f"{m} min {s} s" if s else f"{m} min"


def time_literal(ms: int, upper: bool = True) -> str:
    """An IEC TIME literal: ``T#500MS``, ``T#5S``, ``T#1M30S`` (lower-case units if not upper)."""
    parts = []
    m, rest = divmod(ms, 60_000)
    s, milli = divmod(rest, 1000)
    if m:
        parts.append(f"{m}M")
    if s:
        parts.append(f"{s}S")
    if milli or not parts:
        parts.append(f"{milli}MS")
    text = "".join(parts)
    return "T#" + (text if upper else text.lower())


def real(x: float) -> str:
    """A REAL literal with at least one decimal: ``80.0``, ``0.25``, ``-5.0``."""
    text = f"{x:.4f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


class Kit:
    """Per-sample state of one ST archetype: naming style, variables, literals, prose."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.style = rng.choice(STYLES)
        self.bool_prefix = rng.choice("bbx")
        self.typed_fb_prefix = rng.random() < 0.5  # tonDelay vs fbDelay
        self.comment_rate = rng.choice((0.0, 0.3, 0.6, 0.9))
        self.block_comments = rng.random() < 0.25
        self.upper_time = rng.random() < 0.7
        self.variables: list[dict[str, str]] = []
        self.constraints: list[str] = []
        # most plant requests state the POU's interface (the PLC's tags exist already): the
        # answer then declares exactly those names first (code writes them, ``shaping``),
        # often the plant's own, which no vocabulary predicts: the model learns to copy them
        self.states_interface = rng.random() < 0.6
        self.tag = rng.choice(TAGS) if self.states_interface and rng.random() < 0.6 else ""

    # --- names ---------------------------------------------------------------------------

    @property
    def german(self) -> bool:
        """Whether identifiers are German."""
        return self.style.startswith("german")

    def name(self, concept: str, iec_type: str) -> str:
        """The identifier of ``concept`` (a VOCAB key) in this sample's style."""
        en, de = VOCAB[concept]
        word = de if self.german else en
        if len(word) == 1:  # loop index
            return word
        if self.style == "pascal":
            return cap(word)
        if self.style.endswith("hungarian"):
            base = iec_type.split("[", 1)[0].split(" ", 1)[0]
            if base in _FB_TYPES:
                prefix = _PREFIX[base] if self.typed_fb_prefix else "fb"
            elif base == "ARRAY":
                prefix = "a"
            elif base == "BOOL":
                prefix = self.bool_prefix
            else:
                prefix = _PREFIX.get(base, "v")
            return prefix + cap(word)
        return word

    def pou_name(self, pou_type: str, en: str, de: str) -> str:
        """A POU name: a prefix for its kind (``FB_``, ``fb``, ``PRG_``, ``FC_``...) + base."""
        prefixes = _POU_PREFIXES[pou_type]
        base = de if self.german else en
        name = self.rng.choice(prefixes) + base
        if name.upper() in {v["name"].upper() for v in self.variables}:
            name = prefixes[0] + base  # a bare program name may clash with a variable
        return name

    # --- declarations and body -----------------------------------------------------------

    def var(self, section: str, concept: str, iec_type: str, initial: str | None = None,
            comment: str | None = None) -> str:
        """Declare a variable; return its name. The comment is kept at the sample's rate."""
        name = self.name(concept, iec_type)
        if self.tag and section in INTERFACE:
            name += self.tag
        v = {"section": section, "name": name, "type": iec_type}
        if initial is not None:
            v["initial"] = initial
        if comment and self.rng.random() < self.comment_rate:
            v["comment"] = comment
        self.variables.append(v)
        return v["name"]

    def note(self, text: str, indent: str = "") -> list[str]:
        """A body comment line (or none, at the sample's comment rate)."""
        if self.rng.random() >= self.comment_rate:
            return []
        return [f"{indent}(* {text} *)" if self.block_comments else f"{indent}// {text}"]

    def time(self, ms: int) -> str:
        """``ms`` as a TIME literal in the sample's case."""
        return time_literal(ms, self.upper_time)

    def pick(self, seq: Sequence[Any]) -> Any:
        """One element of ``seq``."""
        return self.rng.choice(seq)

    def chance(self, p: float) -> bool:
        """True with probability ``p``."""
        return self.rng.random() < p

    def constrain(self, text: str, p: float = 0.5) -> None:
        """Add a constraint line to the instruction with probability ``p``."""
        if self.chance(p):
            self.constraints.append(text)

    # --- the sample ------------------------------------------------------------------------

    def a_pou(self, pou_type: str) -> str:
        """How the instruction names the POU kind (sometimes generically)."""
        choices = _GENERIC if self.chance(0.25) else _ARTICLE[pou_type]
        return self.rng.choice(choices)

    def an_pou(self, pou_type: str) -> tuple[str, str]:
        """``a_pou`` as written inside a sentence and at its start (capitalised)."""
        a = self.a_pou(pou_type)
        return a, cap(a)

    def finish(self, pou_type: str, names: tuple[str, str] | str, description: str,
               body: list[str], return_type: str | None = None,
               assumptions: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``(input, output)`` pair of the sample.

        ``names`` is the (English, German) base of the POU name, or the finished name (a
        FUNCTION body assigns its own name, so it is chosen before the body is written).
        """
        name = names if isinstance(names, str) else self.pou_name(pou_type, *names)
        output: dict[str, Any] = {"pou_type": pou_type, "name": name}
        if return_type:
            output["return_type"] = return_type
        stated = self._interface_constraints() if self.states_interface else []
        output["variables"] = self._stated_first(stated)
        output["body"] = "\n".join(body)
        if assumptions and self.chance(0.3):
            output["assumptions"] = list(assumptions)
        self._style_constraint()
        self.constraints = stated + self.constraints
        data: dict[str, Any] = {"description": description}
        if stated or self.chance(0.5):
            data["name"] = name
        if stated or self.chance(0.5):
            data["pou_type"] = pou_type
        if self.constraints:
            data["constraints"] = self.constraints
        return data, output

    def _interface_constraints(self) -> list[str]:
        """The interface as a plant engineer states it: a line per variable, per section,
        or ``Inputs: a : REAL (...), b : BOOL``, the variables' comments in parentheses."""
        form = self.rng.choice(("line", "line", "section", "plain"))
        lines: list[str] = []
        for section in INTERFACE:
            decls = [self._decl(v) for v in self.variables if v["section"] == section]
            if not decls:
                continue
            if form == "line":
                lines += [f"{section} {d}" for d in decls]
            elif form == "section":
                lines.append(f"{section} " + ", ".join(decls))
            else:
                word = {"VAR_INPUT": "Inputs", "VAR_OUTPUT": "Outputs",
                        "VAR_IN_OUT": "In/out"}[section]
                word = word if self.chance(0.5) else word.lower()
                lines.append(f"{word}: " + ", ".join(decls))
        return lines

    def _decl(self, v: dict[str, str]) -> str:
        text = f"{v['name']} : {v['type']}"
        if "initial" in v and _PLAIN_INITIAL.fullmatch(v["initial"]):
            text += f" with initial value {v['initial']}"
        if v.get("comment") and self.chance(0.7):
            text += f" ({v['comment']})"
        return text

    def _stated_first(self, stated: list[str]) -> list[dict[str, str]]:
        """The variables in the answer's order: those the request states first, exactly as
        code writes them from the request (no comment; an initial value only where stated),
        then the POU's own."""
        from rung.daemon.tasks.st.request import interface

        declared = interface({"constraints": stated})
        names = {d["name"] for d in declared}
        return declared + [v for v in self.variables if v["name"] not in names]

    def _style_constraint(self) -> None:
        b = self.bool_prefix
        fb = "tonDelay" if self.typed_fb_prefix else "fbDelay"
        texts = {"german": "Use German identifiers.",
                 "german_hungarian": f"German identifiers with type prefixes ({b}Start, rWert).",
                 "hungarian": f"Use Hungarian notation ({b}Start, rLevel, {fb}).",
                 "pascal": "Use PascalCase variable names."}
        if self.style in texts:
            self.constrain(texts[self.style], 0.7)
