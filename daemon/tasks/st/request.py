"""What an st_code request states, read by code: the values it gives (``10 s``, ``6.5 bar``,
``70 %``, bare counts) and the building blocks its behaviour needs (a delay needs a timer,
an edge an edge detector, a count a counter).

The answer is then held to it twice:

- while it is written, the ST grammar offers only these values as the numbers it may write
  (beside small integers and unit conversions; ``literals``), so a POU cannot invent a
  setpoint the request did not give, and only its durations in the ways they are written
  (``T#1m30s``, ``T#90s``; ``durations``);
- when it is checked (``check``), every value stated with a unit appears in the POU (a
  TIME literal of the same duration, or the number; a percentage also as a fraction), each
  building block the request needs is declared and called, and no VAR_INPUT is assigned —
  gating checks: an answer that fails them is retried.

Where the request is silent (no number, no delay word) nothing is required.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rung.daemon.tasks.st.pou import RESERVED_NAMES

# a number in a request, with the unit that follows it, if any ("8.5 bar", "30 s", "70 %",
# "-40 °C": a minus after a space is the value's sign, in "10-20" it is a range's dash)
# a number in a plant tag (P-101, TT-204A, XV-12) names equipment, not a value
_STATED = re.compile(r"(?<![\w.#])(?<![A-Za-z]-)(-?\d+(?:\.\d+)?)\s*"
                     r"(%|°C|[a-zA-Zµ]+\d*(?:/[a-zA-Z]+)?)?")
_SECONDS = {"ms": 0.001, "msec": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
            "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
            "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
            "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0}
_DUR_UNIT = r"(?:h|hrs?|hours?|min|mins|minutes?|s|secs?|seconds?|ms)"
_PART = re.compile(rf"(\d+(?:\.\d+)?)\s*({_DUR_UNIT})\b", re.I)
_COMPOUND = re.compile(rf"(?<![\w.#])\d+(?:\.\d+)?\s*{_DUR_UNIT}\b(?:\s*(?:and\s+)?"
                       rf"\d+(?:\.\d+)?\s*{_DUR_UNIT}\b)+", re.I)
_SIGNAL = re.compile(r"(?<![\w.])(-?10|0|4)\s*(?:\.\.|-|to)\s*(10|20)\s*(?:mA|V)\b")
_EXAMPLE = re.compile(r"\b(e\.\s?g\.|for example|for instance|such as)(?:[^.;)]|\.(?!\s|$))*",
                      re.I)


def _is_unit(word: str) -> bool:
    """A word after a number that is a unit ("m" is a metre in a request, never a minute:
    that is "min"); counted things ("12 parts") count as units."""
    if word in ("a", "an", "as", "at"):   # "A" is an ampere, "a" an article
        return False
    w = word.lower()
    return w in _UNITS or (len(w) > 3 and (w.removesuffix("s") in _UNITS
                                           or w.removesuffix("es") in _UNITS))
# numbers a POU may always write: small integers (indices, states, booleans as numbers),
# a step sequence's states (10, 20, ..., 100, 200, ...) and unit conversions (s/min/h/day,
# ms, percent, 16-bit, 12-bit and 10-bit full scales, an S7 analog input's 27648)
SMALL = tuple(str(i) for i in [*range(11), *range(20, 101, 10), *range(200, 1001, 100),
                               3600, 86400, 255, 1023, 4095, 27648, 32767, 65535])

_DURATION_WORDS = "ms|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?"
# what a counter counts: discrete events, not a totalised quantity (operating seconds)
_COUNTED = (r"parts?|pieces?|pcs|items?|bottles?|boxes|cans?|bags?|pallets?|strokes?|"
            r"cycles?|pulses?|press(es)?|push(es)?|starts?|trips?|events?|edges?|products?|"
            r"packages?|cartons?|units?")
# units a stated value may carry (a word after a number is otherwise not a unit: "3
# voting", "500 are"); counted things are units too: "12 parts" must appear in the POU
_UNITS = {u.lower() for u in (
    "%", "bar", "mbar", "Pa", "kPa", "MPa", "hPa", "psi", "degC", "°C", "C", "K", "degF",
    "A", "mA", "V", "mV", "kV", "W", "kW", "MW", "Hz", "rpm", "mm", "cm", "m", "km", "l", "L",
    "ml", "m3", "kg", "g", "t", "N", "kN", "Nm", "ppm", "pH", "lux", "mm/s", "m/s",
    "m3/h", "l/min", "l/h", "kg/h", "t/h", "bpm", "dB", "Ohm", "kOhm", "µm", "um")} | {
    "part", "piece", "pcs", "item", "bottle", "box", "can", "bag", "pallet", "stroke", "cycle",
    "pulse", "press", "push", "start", "trip", "event", "edge", "product", "package",
    "carton", "unit"}

# building blocks: the request's words -> the standard FB types one of which must be
# declared and called (a table, not a chain of ifs)
BLOCKS: dict[str, tuple[re.Pattern[str], tuple[str, ...]]] = {
    "timer": (re.compile(rf"\b(delay(ed)?|timeouts?\b|time[- ]?outs?\b|debounce|on[- ]delay|"
                         rf"off[- ]delay|run[- ]on\b|(after|for|within|longer than|more than|"
                         rf"at least|pulse of|delay of|every|(stays?|persists?|remains?|"
                         rf"is)( \w+)?) \d+(\.\d+)? ?({_DURATION_WORDS})\b|"
                         rf"\d+(\.\d+)? ?({_DURATION_WORDS}) (after|later|delay|on|off|"
                         rf"pulse|pause)\b)", re.I),
              ("TON", "TOF", "TP")),
    "edge": (re.compile(r"\b(rising edge|falling edge|edge|each press|every press|"
                        r"each time|every time|push(es)? of|press(es)? of|once per)\b", re.I),
             ("R_TRIG", "F_TRIG")),
    "counter": (re.compile(rf"\b(CTU|CTD|CTUD|count(s|ing)? (the |each |every )?"
                           rf"({_COUNTED})|batch(es)? of \d+|every \d+(st|nd|rd|th)|"
                           rf"after \d+ ({_COUNTED})|\d+ ({_COUNTED}) (per|have passed|"
                           rf"are counted))\b", re.I),
                ("CTU", "CTD", "CTUD")),
}


@dataclass(frozen=True)
class Value:
    """One number the request states: its text, its unit (None: a bare number); ``label``
    how the request wrote it, where that differs (``1 min 30 s`` for 90 s)."""

    text: str
    unit: str | None
    label: str | None = None

    def __str__(self) -> str:
        return self.label or f"{self.text} {self.unit}"

    @property
    def number(self) -> float:
        return float(self.text)

    @property
    def seconds(self) -> float | None:
        u = (self.unit or "").lower()
        return self.number * _SECONDS[u] if u in _SECONDS else None


@dataclass(frozen=True)
class Stated:
    """What one request states."""

    values: tuple[Value, ...]
    needs: tuple[str, ...]    # keys of ``BLOCKS``

    @property
    def with_units(self) -> tuple[Value, ...]:
        return tuple(v for v in self.values if v.unit is not None)


def read(data: Mapping[str, Any]) -> Stated:
    """The values and building blocks of an st_code request (its description and
    constraints)."""
    text = " ".join([str(data.get("description", "")),
                     *(str(c) for c in data.get("constraints") or [])])
    needs = [name for name, (words, _) in BLOCKS.items() if words.search(text)]
    text = _EXAMPLE.sub(" ", text)   # "(e.g. 1.0 degC/s)": an example, not a value
    # a standard signal range ("4..20 mA", "0..10 V") names the wiring: its numbers may be
    # written, a POU that scales raw counts need not
    text = _SIGNAL.sub(lambda m: f" {m.group(1)} {m.group(2)} ", text)
    text = text.replace("..", " .. ")   # "0.0..16.0": two numbers
    values: dict[Value, None] = {}   # in order, each once

    def compound(m: re.Match[str]) -> str:
        """ "1 min 30 s": one duration of 90 s (its units largest first; "2 s and 10 s",
        "3 s and 2 min" are two)."""
        parts = [(float(n), _SECONDS[u.lower()]) for n, u in _PART.findall(m.group(0))]
        if any(a[1] <= b[1] for a, b in zip(parts, parts[1:], strict=False)):
            return m.group(0)
        total = sum(n * size for n, size in parts)
        values[Value(_forms(round(total, 3))[0], "s", " ".join(m.group(0).split()))] = None
        return " "

    text = _COMPOUND.sub(compound, text)
    for number, unit in _STATED.findall(text):
        u = unit if unit and (unit.lower() in _SECONDS or _is_unit(unit)) else None
        if u is not None and u.lower() in _SECONDS:
            number = number.removeprefix("-")   # a duration has no sign ("for -5 s": a dash)
        values.setdefault(Value(number, u))
    return Stated(tuple(values), tuple(needs))


def _forms(x: float) -> list[str]:
    """ST literal texts of one number: ``70`` and ``70.0``; ``6.5``; ``0.7``."""
    out = []
    if x == int(x) and abs(x) < 1e15:
        out += [str(int(x)), f"{int(x)}.0"]
    else:
        out.append(repr(x))
    return out


def literals(stated: Stated) -> list[str]:
    """The numeric literal texts a POU for this request may write: the stated values (a
    percentage also as its fraction, a count also one less: an array's last index) and
    ``SMALL``."""
    numbers: list[str] = []
    for v in stated.values:   # unsigned: the grammar writes a sign as the minus before it
        numbers += _forms(abs(v.number))
        if v.unit == "%":
            numbers += _forms(abs(v.number) / 100)
        if v.seconds is None and v.number == int(v.number) and 1 < v.number <= 10_000:
            numbers += _forms(v.number - 1)
    numbers += [s for i in SMALL for s in _forms(float(i))]
    return _unique(numbers)


# the durations a POU may write unstated: none, a scan's debounce or blink (10, 20, 50,
# 100 ms), one second
SMALL_SECONDS = (0.0, 0.01, 0.02, 0.05, 0.1, 1.0)
_DURATION_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001))


def _duration_forms(seconds: float) -> list[str]:
    """TIME literal texts after the ``T#`` of one duration: in each unit it is a whole
    number of, or a fraction of at least 0.1 with three places at most (``90s``, ``1.5m``,
    ``90000ms``), its parts largest first as code writes a setpoint (``1m30s``:
    ``time_literal``), units in either case."""
    out = []
    for unit, size in _DURATION_UNITS:
        q = round(seconds / size, 3)
        if abs(q * size - seconds) < 1e-9 and q < 1e6 and (
                q == int(q) or (unit != "ms" and q >= 0.1)):
            out.append(f"{int(q)}{unit}" if q == int(q) else f"{q:.3f}".rstrip("0") + unit)
    out.append(time_literal(seconds).removeprefix("T#"))
    return _unique([*out, *(f.upper() for f in out)])


def durations(stated: Stated) -> list[str]:
    """The TIME literal texts (after ``T#``) a POU for this request may write: the stated
    durations and ``SMALL_SECONDS``, as a model writes its own numbers otherwise
    (``T#3s`` for a stated 30 s, ``T#100ms`` for a stated 100 %)."""
    seconds = {round(v.seconds, 6) for v in stated.values if v.seconds is not None}
    return _unique(f for s in sorted(seconds | set(SMALL_SECONDS)) for f in _duration_forms(s))


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# -- the checks ------------------------------------------------------------------------

_TIME_LIT = re.compile(r"\b(?:T|TIME|LTIME)#(-?[0-9_.a-zA-Z]+)", re.IGNORECASE)
_UNIT_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|us|ns|d|h|m|s)", re.IGNORECASE)
# a minus right before a number, not after an operand (``x-40``, ``(a)-40``), is its sign
_NUMBER = re.compile(r"(?<![\w#.)\]])(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?![\w#])")
_PART_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6,
                 "ns": 1e-9}


def time_seconds(text: str) -> float:
    return sum(float(n) * _PART_SECONDS[u.lower()] for n, u in _UNIT_PART.findall(text))


# an ST comment (block or line)
COMMENT = re.compile(r"\(\*.*?\*\)|//[^\n]*", re.S)


def _used(code: str) -> tuple[set[float], set[float]]:
    """The numbers and durations (seconds) ST code without comments writes."""
    seconds = {round(time_seconds(t), 6) for t in _TIME_LIT.findall(code)}
    plain = _TIME_LIT.sub(" ", code)
    return {float(n) for n in _NUMBER.findall(plain)}, seconds


def _effective(pou: Mapping[str, Any]) -> str:
    """The POU's values that act: the body's code and the initial values of the variables
    it refers to (a setpoint declared and never read does nothing)."""
    code = COMMENT.sub(" ", str(pou.get("body", "")))
    refs = {w.upper() for w in re.findall(r"[A-Za-z_]\w*", code)}
    initials = [str(v.get("initial")) for v in pou.get("variables") or []
                if isinstance(v, Mapping) and v.get("initial") is not None
                and str(v.get("name", "")).upper() in refs]
    return "\n".join([code, *initials])


def values_used(stated: Stated, pou: Mapping[str, Any]) -> dict[str, Any]:
    """Each value stated with a unit is used by the POU: the body writes it, or reads a
    variable declared with it; a duration as a TIME literal of the same length (or its
    number), anything else as the number (a percentage also as a fraction)."""
    numbers, seconds = _used(_effective(pou))
    missing = [v for v in stated.with_units if not _holds(v, numbers, seconds)]
    return {"ok": not missing, "stated": [str(v) for v in stated.with_units],
            "errors": [{"path": "body", "message": _unused(v, pou)} for v in missing]}


def _holds(v: Value, numbers: set[float], seconds: set[float]) -> bool:
    """Whether code that writes ``numbers`` and ``seconds`` uses ``v``."""
    secs = v.seconds
    return (v.number in numbers or (secs is not None and round(secs, 6) in seconds)
            or (v.unit == "%" and round(v.number / 100, 9) in {round(n, 9) for n in numbers}))


def _unused(v: Value, pou: Mapping[str, Any]) -> str:
    """The finding for a stated value the POU does not use, naming the variables declared
    with it that the body never reads (a setpoint code declared, as a rule)."""
    idle = []
    for var in pou.get("variables") or []:
        if isinstance(var, Mapping) and var.get("initial") is not None:
            numbers, seconds = _used(str(var["initial"]))
            if _holds(v, numbers, seconds):
                idle.append(str(var.get("name")))
    text = f"the request states {v}; the POU does not use it"
    if idle:
        text += f" (the body never reads {' or '.join(idle)}, which holds it)"
    return text


_STEPPED = re.compile(r"(?<![\w.])(\w+)\s*:=\s*\1\s*[-+]\s*1(?![\w.])", re.I)


def blocks_used(stated: Stated, pou: Mapping[str, Any]) -> dict[str, Any]:
    """Each building block the request needs: an instance of one of its FB types is
    declared and called in the body (a counter may also be a variable the body steps by
    one)."""
    body = str(pou.get("body", ""))
    declared: dict[str, list[str]] = {}
    for v in pou.get("variables") or []:
        if isinstance(v, Mapping):
            declared.setdefault(str(v.get("type", "")).upper(), []).append(str(v.get("name")))
    errors = []
    for need in stated.needs:
        types = BLOCKS[need][1]
        names = [n for t in types for n in declared.get(t, [])]
        called = [n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}\s*\(", body, re.I)]
        if need == "counter" and _STEPPED.search(body):
            continue   # a count kept by hand (n := n + 1 on an edge) counts as well
        if not called:
            errors.append({"path": "variables", "message": (
                f"the request needs a {need} ({'/'.join(types)}): "
                + ("declare one and call it in the body" if not names else
                   f"{names[0]} is declared but never called"))})
    return {"ok": not errors, "needs": list(stated.needs), "errors": errors}


def inputs_not_assigned(pou: Mapping[str, Any], assigned: Sequence[str]) -> dict[str, Any]:
    """No VAR_INPUT is written by the POU (``assigned``: the names the body assigns)."""
    inputs = {str(v.get("name", "")).upper(): str(v.get("name"))
              for v in pou.get("variables") or []
              if isinstance(v, Mapping) and v.get("section") == "VAR_INPUT"}
    bad = _unique(inputs[a.upper()] for a in assigned if a.upper() in inputs)
    return {"ok": not bad, "errors": [
        {"path": "body", "message": f"{name} is a VAR_INPUT: the POU reads it, never assigns "
         "it (declare an output or a local for what it computes)"} for name in bad]}


def outputs_written(pou: Mapping[str, Any], written: Sequence[str]) -> dict[str, Any]:
    """Every VAR_OUTPUT is written by the POU, and a FUNCTION's own name (its result)
    (``written``: the names the body assigns or binds an FB's output to): an output the
    body never drives stays at its initial value whatever the inputs do."""
    wrote = {w.upper() for w in written}
    outputs = [str(v.get("name")) for v in pou.get("variables") or []
               if isinstance(v, Mapping) and v.get("section") == "VAR_OUTPUT"]
    if pou.get("pou_type") == "FUNCTION" and pou.get("name"):
        outputs.append(str(pou["name"]))
    idle = _unique(name for name in outputs if name.upper() not in wrote)
    return {"ok": not idle, "errors": [
        {"path": "body", "message": f"{name} is never written: the body assigns it nowhere "
         "(an output the POU does not drive keeps its initial value)"} for name in idle]}


# -- the interface a request states --------------------------------------------------------

_SECTION = re.compile(r"^\s*(VAR_INPUT|VAR_OUTPUT|VAR_IN_OUT|inputs?|outputs?|in/out)\b\s*:?",
                      re.I)
_SECTIONS = {"var_input": "VAR_INPUT", "input": "VAR_INPUT", "inputs": "VAR_INPUT",
             "var_output": "VAR_OUTPUT", "output": "VAR_OUTPUT", "outputs": "VAR_OUTPUT",
             "var_in_out": "VAR_IN_OUT", "in/out": "VAR_IN_OUT"}
_TYPES = ("BOOL|BYTE|WORD|DWORD|SINT|INT|DINT|LINT|USINT|UINT|UDINT|ULINT|REAL|LREAL|TIME|"
          "STRING")
_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
# one declaration: a name, or names in a list as IEC 61131-3 writes them (``bOk1, bOk2 :
# BOOL``), then the type (``: BOOL``, or ``(all BOOL, ...)`` after a list), then an initial
# value where one is given
_TYPE_NAMES = frozenset(_TYPES.split("|"))
_DECL = re.compile(rf"(?<![\w.])((?:{_NAME}\s*,\s*)*{_NAME})"
                   rf"(?:\s*:\s*({_TYPES})|\s*\(\s*all\s+({_TYPES}))\b"
                   r"(?:\s+with\s+initial\s+value\s+(-?\d+(?:\.\d+)?|TRUE|FALSE))?", re.I)


def interface(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """The variables a request's constraints declare, in order (``VAR_INPUT rLevel :
    REAL``, ``inputs: a : BOOL, b : REAL (...)``, ``VAR_OUTPUT q : BOOL``, lists of names
    of one type: ``VAR_INPUT bOk1, bOk2 : BOOL``, ``inputs a, b (all BOOL, ...)``; an
    ``initial`` from ``with initial value 500``): code knows them, so the answer starts with them.
    Names the request repeats are declared once."""
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for c in data.get("constraints") or []:
        m = _SECTION.match(str(c))
        if m is None:
            continue
        section = _SECTIONS[m.group(1).lower()]
        for names, vtype, listed, initial in _DECL.findall(str(c)[m.end():]):
            for name in re.split(r"\s*,\s*", names):
                if name.upper() in seen or name.upper() in _TYPE_NAMES:
                    continue
                seen.add(name.upper())
                v = {"section": section, "name": name, "type": (vtype or listed).upper()}
                if initial:
                    v["initial"] = initial.upper() if initial.isalpha() else initial
                out.append(v)
    return out


# -- the values a request states, declared by code -------------------------------------------

# words that say nothing of what a value is for (a setpoint's name keeps the others)
_FILLER = frozenset(re.findall(r"\w+", """a an the at to of is are be been being when whenever
if than more less for after within by with its it this that these those must should shall will
then while once as in into from until till reaches reach reached exceeds exceed exceeded has
have had any every each per so set do does keeps keep stays stay longer shorter least most up
down between over under about"""))
_CLAUSE = re.compile(r"[,;:()]|\.(?:\s|$)|\b(?:and|or|but|with|while|unless|then)\b", re.I)
_TYPE_PREFIX = {"REAL": "r", "TIME": "t", "INT": "i"}
_COUNTED_UNITS = frozenset(u for u in _UNITS if u.isalpha() and u not in {
    "bar", "mbar", "pa", "kpa", "mpa", "hpa", "psi", "degc", "c", "k", "degf", "a", "ma", "v",
    "mv", "kv", "w", "kw", "mw", "hz", "rpm", "mm", "cm", "m", "km", "l", "ml", "kg", "g",
    "t", "n", "kn", "nm", "ppm", "ph", "lux", "bpm", "db", "ohm", "kohm", "um"})


def time_literal(seconds: float) -> str:
    """A TIME literal of ``seconds``, as an engineer writes it: ``T#500ms``, ``T#30s``,
    ``T#1m30s``, ``T#2h``."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "T#" + ("".join(parts) or "0s")


# letters an IEC 61131-3 name cannot hold, as German writes them without (``Förderband`` ->
# ``Foerderband``); any other accent is dropped (``pompe doseuse à`` -> ``a``)
_SPELLED = str.maketrans({"ä": "ae", "ö": "oe", "ü": "ue", "Ä": "Ae", "Ö": "Oe", "Ü": "Ue",
                          "ß": "ss"})


def ascii_words(text: str) -> str:
    """``text`` in the letters a name may hold: umlauts spelled out, other accents
    dropped, whatever has no ASCII form left out."""
    plain = unicodedata.normalize("NFKD", text.translate(_SPELLED))
    return plain.encode("ascii", "ignore").decode("ascii")


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z]{2,}", ascii_words(text))
            if w.lower() not in _FILLER and not _is_unit(w)]


def _words_near(text: str, at: int, end: int) -> list[str]:
    """The words of the clause that ends where a value is stated (``at``), fillers and
    units left out; when it has none, those that follow the value (``end``)."""
    cuts = [m.end() for m in _CLAUSE.finditer(text, 0, at)]
    before = _words(text[cuts[-1] if cuts else 0:at])[-3:]
    if before:
        return before
    after = _CLAUSE.search(text, end)
    return _words(text[end:after.start() if after else len(text)])[:2]


def setpoints(data: Mapping[str, Any], taken: Iterable[str] = (),
              given: Iterable[float] = (), room: int | None = None) -> list[dict[str, str]]:
    """Each value the request states with a unit, declared as a variable with that value
    (a duration as TIME, a count of things as INT, any other quantity as REAL), named from
    the words the request says it with (``on at 70 %`` → ``rSwitchOn``); ``taken``: names
    it may not be (the stated interface); ``given``: numbers the interface already holds
    as initial values (no setpoint for them, durations aside). Code writes them into the
    answer, so the POU holds the request's numbers, and the body refers to them by name.
    More of them than ``room`` (what the answer's variables have left): none, before any
    is named (the answer could not hold them all)."""
    held = set(given)
    values = [v for v in read(data).with_units if v.seconds is not None or v.number not in held]
    if room is not None and len(values) > room:
        return []
    text = " ".join([str(data.get("description", "")),
                     *(str(c) for c in data.get("constraints") or [])])
    text = _EXAMPLE.sub(" ", text)
    used = {t.upper() for t in [*taken, *RESERVED_NAMES]}
    counts: dict[str, int] = {}   # a name stem -> the next number to try after it
    out: list[dict[str, str]] = []
    found = sorted((_position(text, v), i, v) for i, v in enumerate(values))
    for (at, end), _, v in found:   # in the order the request states them
        secs = v.seconds
        if secs is not None:
            vtype, initial = "TIME", time_literal(secs)
        elif _counted(v.unit) and v.number == int(v.number):
            vtype, initial = "INT", str(int(v.number))
        else:
            vtype, initial = "REAL", _forms(v.number)[-1] if v.number == int(v.number) \
                else _forms(v.number)[0]
        words = _words_near(text, at, end) if at >= 0 else []
        base = "".join(w[:1].upper() + w[1:].lower() for w in words) or "Setpoint"
        name = (_TYPE_PREFIX[vtype] + base)[:40]
        stem, n = name, counts.get(name.upper(), 2)
        while name.upper() in used:
            name, n = f"{stem}{n}", n + 1
        counts[stem.upper()] = n
        used.add(name.upper())
        out.append({"section": "VAR", "name": name, "type": vtype, "initial": initial,
                    "comment": f"stated: {v}"})
    return out


def _counted(unit: str | None) -> bool:
    """Whether a unit counts things (``12 parts``, ``50 boxes``), not a quantity."""
    u = (unit or "").lower()
    return bool(u) and any(w in _COUNTED_UNITS for w in (u, u.removesuffix("s"),
                                                         u.removesuffix("es")))


def _position(text: str, v: Value) -> tuple[int, int]:
    """Where the request states ``v`` (its first mention): start and end, or -1, -1."""
    label = (re.escape(v.label) if v.label
             else rf"{re.escape(v.text)}\s*{re.escape(v.unit or '')}")
    m = re.search(rf"(?<![\w.#]){label}", text)
    return (m.start(), m.end()) if m else (-1, -1)


# -- the POU's type and name where the request leaves them open --------------------------------

# a description that says which kind of POU it wants (a FUNCTION: the model writes it, code
# cannot know its return type)
_KIND_WORDS = ((re.compile(r"\bfunction[ _]blocks?\b|\bFB\b", re.I), "FUNCTION_BLOCK"),
               (re.compile(r"\bprograms?\b", re.I), "PROGRAM"),
               (re.compile(r"\bfunctions?\b", re.I), None))
_NAME_PREFIX = {"FUNCTION_BLOCK": "FB_", "PROGRAM": "P_"}
# where the description's first clause ends (the part that names what the POU is for)
_NAME_CLAUSE = re.compile(r"[,;:()]|\.(?:\s|$)|\b(?:when|whenever|if|while|until|unless|"
                          r"after|before|once|as soon as|with|and|or|but|so that|to|at|above|"
                          r"below|for|that|which|on|every|each)\b", re.I)
# a leading imperative the name leaves out ("Open the vent valve" -> VentValve)
_VERBS = frozenset(re.findall(r"\w+", """open close start stop run switch turn keep hold
control monitor count detect watch measure regulate limit drive fill drain heat cool raise
lower set reset trip enable disable activate deactivate operate toggle make write implement
create build generate provide sequence interlock latch blink flash check signal""".lower()))
_NAME_FILLER = _FILLER | {"off", "on", "pou", "block", "function", "program", "fb", "st"}


def pou_name(data: Mapping[str, Any], pou_type: str = "FUNCTION_BLOCK",
             taken: Iterable[str] = ()) -> str:
    """The name code gives a POU the request does not name: ``FB_`` (``P_`` for a
    PROGRAM) and the words of the description's first clause (up to ``when``, ``if``,
    ``with``, ``and``, a comma ...) that has any once a leading verb, articles, fillers,
    the POU's kind ("a function block that"), numbers and units are left out; at most
    three, each capitalized: "Open the vent valve when the tank pressure exceeds 6.5 bar
    ..." -> ``FB_VentValve``; ``FB_Control`` where no clause has a word left; never a name
    in ``taken`` (a number appended)."""
    words: list[str] = []
    for clause in _NAME_CLAUSE.split(str(data.get("description", ""))):
        words = re.findall(r"[A-Za-z][A-Za-z0-9]*", ascii_words(clause or ""))
        if words and _verb(words[0]):
            words = words[1:]
        words = [w for w in words if w.lower() not in _NAME_FILLER and not _is_unit(w)
                 and w.lower() not in _SECONDS][:3]
        if words:
            break
    stem = (_NAME_PREFIX.get(pou_type, "FB_")
            + ("".join(w[:1].upper() + w[1:] for w in words) or "Control"))[:60]
    used = {t.upper() for t in taken}
    name, n = stem, 2
    while name.upper() in used:
        name, n = f"{stem}{n}", n + 1
    return name


def _verb(word: str) -> bool:
    w = word.lower()
    return w in _VERBS or w.removesuffix("s") in _VERBS or w.removesuffix("es") in _VERBS


def pou(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The POU's type and name as the answer will have them, where code knows them: the
    request's; where it leaves one or both open and states an interface or a value with a
    unit, code's choice, so those are declared too (the type the description names, else a
    FUNCTION_BLOCK; the name ``pou_name``). None where the model chooses: a FUNCTION
    (whose return type the request may not give), or nothing for code to declare."""
    pou_type, name = data.get("pou_type"), data.get("name")
    if isinstance(pou_type, str) and isinstance(name, str):
        return None if pou_type == "FUNCTION" else (pou_type, name)
    stated = interface(data)
    if not stated and not read(data).with_units:
        return None
    if not isinstance(pou_type, str):
        text = str(data.get("description", ""))
        pou_type = next((kind for words, kind in _KIND_WORDS if words.search(text)),
                        "FUNCTION_BLOCK")
    if pou_type is None or pou_type == "FUNCTION":
        return None
    if not isinstance(name, str):
        name = pou_name(data, pou_type, (v["name"] for v in stated))
    return pou_type, name


Declared = tuple[list[dict[str, str]], list[dict[str, str]]]


def declared(data: Mapping[str, Any], room: int | None = None) -> Declared:
    """What code declares of an st_code answer from the request alone: the stated
    interface and each stated value as a setpoint (``setpoints``), in that order in the
    answer — where code knows the POU's type and name (``pou``: the request's, or code's
    choice where it leaves them open) and the POU is not a FUNCTION (whose return type the
    request may not give); else nothing. ``room``: the variables the answer may declare
    (the schema's ``maxItems``): more setpoints than fit beside the interface are none,
    never named only to be left out."""
    fixed = pou(data)
    if fixed is None:
        return [], []
    name = fixed[1]
    stated = interface(data)
    given = {float(v["initial"]) for v in stated
             if re.fullmatch(r"-?\d+(\.\d+)?", v.get("initial", ""))}
    left = None if room is None else max(0, room - len(stated))
    return stated, setpoints(data, [name, *(v["name"] for v in stated)], given, left)
