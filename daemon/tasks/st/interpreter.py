"""Run an ``st_code`` answer: an interpreter for the Structured Text the body grammar allows.

The checks in ``pou.py`` tell whether a POU parses and names only what it declares; this module
tells whether it does what was asked, by running it. A POU object (``pou_type``, ``name``,
``variables``, ``body``, and ``return_type`` for a FUNCTION) is rendered and parsed exactly as
the checker does it (``pou.render_pou_with_map``, ``pou._parse``: the same tree-sitter grammar),
the tree is compiled once into Python closures, and each ``Program.scan`` runs one PLC scan
cycle on a simulated clock:

    prog = Program(pou)
    prog.scan({"level": 80.0}, dt_s=0.1)     # -> {"pump_on": True}
    prog.value("onDelay.ET")                  # any variable, or an FB member (seconds)

``run_vectors`` drives a program through timed test vectors and compares its outputs.

What runs (the statements and expressions of ``grammar.body_grammar``, plus a few forms
IEC has that the grammar does not generate):

* statements: ``:=`` (to a variable, an array element, an FB input ``tmr.PT``, a bit
  ``w.3``), ``IF/ELSIF/ELSE``, ``CASE`` (integer labels, lists, ranges, ``ELSE``), ``FOR``
  (``BY``, the bounds evaluated once, the counter wrapping like its type), ``WHILE``,
  ``REPEAT``, ``EXIT``, ``CONTINUE``, ``RETURN``, FB instance calls with inputs by name
  (``tmr(IN := x, PT := T#5s)``; inputs not passed keep their last value) and outputs
  captured (``Q => y``);
* expressions: ``+ - * / MOD **``, unary ``-``/``+``, ``NOT``, ``AND``/``&``, ``OR``,
  ``XOR`` (logical on BOOL, bitwise on integers and bit strings), comparisons, parentheses,
  FB members (``tmr.Q``, ``tmr.ET``, ``ctr.CV``, inputs too), array elements, bits;
  both operands are always evaluated (IEC has no short-circuit ``AND``);
* literals: ``TRUE``/``FALSE``, integers (``1_000``, ``16#FF``, ``2#1010``), reals
  (``1.5``, ``1.5E3``), typed literals (``REAL#1.0``, ``INT#-5``, ``BOOL#1``, ``WORD#16#FF``),
  durations (``T#5s``, ``T#1m30s``, ``TIME#500ms``, ``T#1.5s``, ``LTIME#...``), strings
  (``'a$'b'`` with ``$`` escapes);
* functions: ``ABS SQRT LN LOG EXP SIN COS TAN ASIN ACOS ATAN ATAN2 EXPT``, ``ADD SUB MUL DIV
  MOD MOVE``, ``AND OR XOR NOT``, ``SHL SHR ROL ROR``, ``SEL MAX MIN LIMIT MUX``, ``GT GE EQ
  LE LT NE``, ``TRUNC ROUND``, ``LEN LEFT RIGHT MID CONCAT INSERT DELETE REPLACE FIND``,
  ``ADD_TIME SUB_TIME MUL_TIME DIV_TIME``, and the conversions ``X_TO_Y``, ``TO_Y``,
  ``X_TRUNC_Y``, ``TRUNC_Y`` between BOOL, the integer and bit-string types, REAL, LREAL,
  TIME, LTIME and STRING; positionally or by parameter name (``LIMIT(MN := 0, IN := x,
  MX := 100)``);
* the standard FBs TON, TOF, TP, R_TRIG, F_TRIG, CTU, CTD, CTUD, SR, RS as IEC 61131-3
  (ed. 3, 6.6.3) defines them (see the classes below), timers on the simulated clock.

Types: BOOL; SINT INT DINT LINT USINT UINT UDINT ULINT BYTE WORD DWORD LWORD (a store wraps
two's complement to the type's width, as PLCs do; a constant that does not fit is refused);
REAL and LREAL (both computed in double precision: a REAL is not rounded to 32 bits);
TIME and LTIME (nanoseconds, not wrapped; ``TIME_TO_DINT`` and friends count milliseconds,
``LTIME_TO_LINT`` nanoseconds, as CODESYS and TwinCAT do); STRING[n]/WSTRING (default
length 80, longer values cut); ``ARRAY[lo..hi] OF`` one of those (bounds checked; initial
``[1, 2, 3(0)]``). IEC's type rules are checked when the POU is compiled, as a compiler
would: a condition must be BOOL, TIME does not mix with numbers, a REAL is not stored in an
integer without a conversion; integers widen to REAL and narrow between each other
(wrapping) like CODESYS lets them.

Conversions REAL -> integer round to nearest, ties to even (IEC 60559, IEC 61131-3 Table 22
note b); ``TRUNC`` truncates; ``ROUND(x)`` rounds half away from zero to a DINT (Siemens
SCL's ROUND: IEC has none). Integer ``/`` truncates toward zero, ``MOD`` takes the sign of
the dividend and ``x MOD 0`` is 0 (IEC's definition of MOD); a division by zero (integer or
REAL), an array index out of bounds, ``MUX`` with a selector out of range, a math domain
error, a loop that runs more than ``step_budget`` iterations in one scan (an endless loop)
raise ``StExecError`` with the line and column in the body.

Work: a run is also held to one budget for all its scans (``work_budget``; ``run_vectors``:
``DEFAULT_WORK_BUDGET``), counted in *steps*: each node of the body's syntax tree a statement
evaluates (the statement, its operands and operators; an IF counts all its conditions, a
nested statement counts when it runs), each loop iteration (a WHILE or REPEAT one its
condition's nodes too), one per scan, and one per array element a scan resets or copies in
(VAR_TEMP arrays, a FUNCTION's, array inputs), or the program declares. A statement's cost
here is a few tenths of a microsecond, so a run stops within about a second
(``StExecError``: "... work budget ... spent"), whatever the POU does in each scan: the
check runs in the engine thread, between other requests' decoding steps.

What does not run (``StExecError`` when the POU is built, saying so): DATE, TIME_OF_DAY
and DATE_AND_TIME (variables, literals, the date functions such as ``DAY_OF_WEEK``), BCD
conversions, ``LOWER_BOUND``/``UPPER_BOUND``/``SIZEOF``/``ADR``/``REF``: the answer schema
and the body grammar allow these, but a POU using them cannot be judged by running it here
(none has a behaviour a simulated clock could check without a calendar or memory model).
Beyond the grammar: pointers, user types (structs, enums, user FBs), multi-dimensional
arrays, FB instances in arrays or as inputs, FB initial values, ``VAR_GLOBAL``/
``VAR_EXTERNAL``, recursion.

F_TRIG follows the standard's own body (``Q := NOT CLK AND NOT M; M := NOT CLK``, M FALSE at
start): its first call with CLK FALSE reports an edge. CODESYS and TwinCAT keep edition 1's
F_TRIG, which does not; vectors that start with CLK FALSE should not expect about it there.

Scans: PROGRAM and FUNCTION_BLOCK keep VAR, VAR_OUTPUT and FB instances from scan to scan
(VAR_TEMP starts from its initial value each scan); a FUNCTION has no memory, so all of its
variables restart each scan (IEC). Inputs are held: a scan's inputs not given keep the
value they had. ``scan`` returns the VAR_OUTPUT and VAR_IN_OUT values and, for a FUNCTION,
its result under the POU's name; a TIME is reported in seconds (a float).
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from rung.daemon.tasks.st import pou as st_pou

if TYPE_CHECKING:
    from tree_sitter import Node

__all__ = ["DEFAULT_MAX_SCANS", "DEFAULT_STEP_BUDGET", "DEFAULT_WORK_BUDGET", "Program",
           "StExecError", "run_vectors"]

DEFAULT_STEP_BUDGET = 100_000   # loop iterations one scan may run
# scans one run_vectors may run: room for a PLC test's run-ons (the longest hand-written and
# corpus vectors fit), not for a clock stepped finer than any test needs
DEFAULT_MAX_SCANS = 20_000
# steps (syntax nodes evaluated, loop iterations, scans, array elements) one run_vectors may
# take: counted, not timed, so an answer gets the same verdict on any box, and sized so a
# run holds the engine thread under a second on a small CPU (docs/tasks.md, "Test vectors")
DEFAULT_WORK_BUDGET = 10_000_000
_UNLIMITED = 1 << 62

Fn = Callable[[], Any]
Stmt = Callable[[], None]
Loc = tuple[int, int] | None


class StExecError(Exception):
    """A POU that cannot run, or a scan that failed (division by zero, endless loop, ...).

    ``line`` and ``column`` (1-based) point into the POU's ``body`` as written in the answer,
    when the error has a place there; ``message`` is the text without them.
    """

    def __init__(self, message: str, line: int | None = None,
                 column: int | None = None) -> None:
        self.message = message
        self.line = line
        self.column = column
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(where + message)


def _fail(loc: Loc, message: str) -> StExecError:
    return StExecError(message, *(loc if loc is not None else (None, None)))


# --- types --------------------------------------------------------------------------------------

_INT_BITS: dict[str, tuple[int, bool]] = {
    "SINT": (8, True), "INT": (16, True), "DINT": (32, True), "LINT": (64, True),
    "USINT": (8, False), "UINT": (16, False), "UDINT": (32, False), "ULINT": (64, False),
    "BYTE": (8, False), "WORD": (16, False), "DWORD": (32, False), "LWORD": (64, False)}
_BIT_STRINGS = frozenset({"BYTE", "WORD", "DWORD", "LWORD"})
ANY_INT = "ANY_INT"      # an untyped integer literal
ANY_REAL = "ANY_REAL"    # an untyped real literal
_KIND: dict[str, str] = {
    "BOOL": "bool", ANY_INT: "int", "REAL": "real", "LREAL": "real", ANY_REAL: "real",
    "TIME": "time", "LTIME": "time", "STRING": "string", "WSTRING": "string",
    **{t: "int" for t in _INT_BITS}}
_DEFAULT: dict[str, Any] = {"bool": False, "int": 0, "real": 0.0, "time": 0, "string": ""}
_STRING_LEN = 80
_NS = 1_000_000_000


def _kind(type_: str) -> str:
    return _KIND.get(type_, "other")


def _range(type_: str) -> tuple[int, int]:
    bits, signed = _INT_BITS[type_]
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _wrapper(type_: str) -> Callable[[int], int]:
    """Two's complement wrap to ``type_``'s width (``ANY_INT``: DINT)."""
    bits, signed = _INT_BITS.get(type_, (32, True))
    mask = (1 << bits) - 1
    if signed:
        half = 1 << (bits - 1)
        return lambda v: ((v + half) & mask) - half
    return lambda v: v & mask


def _int_join(a: str, b: str) -> str:
    if a == ANY_INT:
        return b
    if b == ANY_INT:
        return a
    return a if _INT_BITS[a][0] >= _INT_BITS[b][0] else b


def _real_join(a: str, b: str) -> str:
    return "LREAL" if "LREAL" in (a, b) else "REAL"


def _trunc_div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


# --- literals -----------------------------------------------------------------------------------

_TIME_RE = re.compile(r"(?i)^(T|TIME|LT|LTIME)#([+-]?)(.+)$")
_UNIT_RE = re.compile(r"(?i)(\d+(?:\.\d+)?)(ms|us|ns|d|h|m|s)")
_UNIT_NS = {"d": 86_400 * _NS, "h": 3_600 * _NS, "m": 60 * _NS, "s": _NS,
            "ms": 1_000_000, "us": 1_000, "ns": 1}
_INT_RE = re.compile(r"^([+-]?)(?:(2|8|16)#([0-9A-Fa-f_]+)|([0-9][0-9_]*))$")
_REAL_RE = re.compile(r"^[+-]?[0-9][0-9_]*(?:\.[0-9][0-9_]*(?:[eE][+-]?[0-9]+)?"
                      r"|[eE][+-]?[0-9]+)$")
_TYPED_RE = re.compile(r"^([A-Za-z_]\w*)#(.+)$", re.DOTALL)
_STRING_ESC = {"$": "$", "'": "'", '"': '"', "L": "\n", "N": "\n", "P": "\f", "R": "\r",
               "T": "\t"}


def _parse_time(text: str) -> tuple[int, str] | None:
    """A duration literal as (nanoseconds, TIME or LTIME); None when ``text`` is not one."""
    m = _TIME_RE.match(text.strip())
    if m is None:
        return None
    body = m[3].replace("_", "")
    total, at = Fraction(0), 0
    for unit in _UNIT_RE.finditer(body):
        if unit.start() != at:
            break
        total += Fraction(unit[1]) * _UNIT_NS[unit[2].lower()]
        at = unit.end()
    if at == 0 or at != len(body):
        raise StExecError(f"'{text}' is not a duration literal")
    ns = round(total)
    return (-ns if m[2] == "-" else ns), ("LTIME" if m[1].upper() in ("LT", "LTIME")
                                          else "TIME")


def _parse_string(text: str) -> str:
    quote, inner = text[0], text[1:-1]
    out, i = [], 0
    while i < len(inner):
        c = inner[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = inner[i + 1:i + 2]
        if nxt.upper() in _STRING_ESC and nxt:
            out.append(_STRING_ESC[nxt.upper()])
            i += 2
            continue
        width = 2 if quote == "'" else 4
        digits = inner[i + 1:i + 1 + width]
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise StExecError(f"bad '$' escape in the string {text}")
        out.append(chr(int(digits, 16)))
        i += 1 + width
    return "".join(out)


def _format_time(ns: int) -> str:
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    parts = []
    for unit in ("d", "h", "m", "s", "ms", "us", "ns"):
        n, ns = divmod(ns, _UNIT_NS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return f"T#{sign}{''.join(parts) or '0ms'}"


def _literal(text: str) -> tuple[Any, str]:
    """One ST literal (as in a declaration's initial value): (value, type)."""
    text = text.strip()
    upper = text.upper()
    if upper in ("TRUE", "FALSE"):
        return upper == "TRUE", "BOOL"
    if (m := _INT_RE.match(text)) is not None:
        value = int(m[3].replace("_", ""), int(m[2])) if m[2] else int(m[4].replace("_", ""))
        return (-value if m[1] == "-" else value), ANY_INT
    if _REAL_RE.match(text):
        return float(text.replace("_", "")), ANY_REAL
    if len(text) >= 2 and text[0] in "'\"" and text[-1] == text[0]:
        return _parse_string(text), ("STRING" if text[0] == "'" else "WSTRING")
    if (duration := _parse_time(text)) is not None:
        return duration
    if (m := _TYPED_RE.match(text)) is not None:
        target = m[1].upper()
        value, vtype = _literal(m[2])
        return _typed(value, vtype, target, text), target
    raise StExecError(f"'{text}' is not an ST literal the interpreter knows")


def _typed(value: Any, vtype: str, target: str, text: str) -> Any:
    """The value of a typed literal ``TYPE#value``."""
    kind = _kind(target)
    if kind == "bool" and vtype == ANY_INT and value in (0, 1):
        return bool(value)
    if kind == "other":
        raise StExecError(f"'{text}': the type {target} is not supported")
    return _constant(value, vtype, target, f"'{text}'")


def _constant(value: Any, vtype: str, target: str, what: str) -> Any:
    """A constant of type ``vtype`` as a value of ``target``; refused when it does not fit."""
    kind, vkind = _kind(target), _kind(vtype)
    if kind == "int" and vkind == "int":
        lo, hi = _range(target)
        if not lo <= value <= hi:
            raise StExecError(f"{what}: {value} does not fit {target} ({lo}..{hi})")
        return value
    if kind == "real" and vkind in ("int", "real"):
        return float(value)
    if kind == vkind and kind in ("bool", "time", "string"):
        return value
    raise StExecError(f"{what}: {_a(_describe(vtype))} is not {_a(target)}")


def _a(what: str) -> str:
    """``what`` with its indefinite article: "an INT", "a REAL"."""
    return f"{'an' if what[:1].upper() in 'AEIOU' else 'a'} {what}"


def _describe(type_: str) -> str:
    return {ANY_INT: "integer", ANY_REAL: "real number"}.get(type_, type_)


# --- declarations -------------------------------------------------------------------------------

_ARRAY_RE = re.compile(r"^ARRAY\s*\[\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*\]\s*OF\s+(.+)$")
_STRING_TYPE_RE = re.compile(r"^(W?STRING)(?:\s*[\[(]\s*(\d+)\s*[\])])?$")
_SECTIONS = {"VAR_INPUT": "VAR_INPUT", "VAR_OUTPUT": "VAR_OUTPUT", "VAR_IN_OUT": "VAR_IN_OUT",
             "VAR": "VAR", "VAR_TEMP": "VAR_TEMP", "VAR CONSTANT": "VAR",
             "VAR_CONSTANT": "VAR"}
_INPUT_SECTIONS = ("VAR_INPUT", "VAR_IN_OUT")
_OUTPUT_SECTIONS = ("VAR_OUTPUT", "VAR_IN_OUT", "RESULT")


def type_kind(type_text: str) -> tuple[str, bool]:
    """The value class of a declared type as the interpreter runs it (``bool``, ``int``,
    ``real``, ``time``, ``string``; ``other`` where it does not run it) and whether the
    type is an array of it."""
    t = " ".join(type_text.upper().split())
    array = _ARRAY_RE.match(t)
    if array is not None:
        t = array[3].strip()
    if (m := _STRING_TYPE_RE.match(t)) is not None:
        t = m[1]
    return _kind(t), array is not None


@dataclass
class _Decl:
    name: str                        # as declared
    key: str                         # upper case: IEC names are case-insensitive
    section: str                     # VAR_INPUT ... VAR_TEMP; RESULT for a FUNCTION's result
    type: str                        # scalar type, element type of an array, or the FB type
    fb: bool = False
    bounds: tuple[int, int] | None = None
    length: int = _STRING_LEN
    constant: bool = False
    init: Any = None                 # initial value; a list for an array; None for an FB


def _declare(raw: Mapping[str, Any], section: str, constant: bool) -> _Decl:
    name = str(raw.get("name", ""))
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise StExecError(f"variable name {name!r} is not an identifier")
    type_text = " ".join(str(raw.get("type", "")).upper().split())
    decl = _Decl(name, name.upper(), section, type_text, constant=constant)
    if type_text in st_pou.FB_INPUTS:
        decl.fb = True
        if str(raw.get("initial") or "").strip():
            raise StExecError(f"'{name}': initial values of FB instances are not supported")
        if section in ("VAR_INPUT", "VAR_OUTPUT", "VAR_IN_OUT"):
            raise StExecError(f"'{name}': FB instances as {section} are not supported")
        return decl
    if (m := _ARRAY_RE.match(type_text)) is not None:
        decl.bounds = (int(m[1]), int(m[2]))
        if decl.bounds[0] > decl.bounds[1]:
            raise StExecError(f"'{name}': empty array range {m[1]}..{m[2]}")
        type_text = m[3].strip()
    if (m := _STRING_TYPE_RE.match(type_text)) is not None:
        type_text = m[1]
        if m[2]:
            decl.length = int(m[2])
    if _kind(type_text) == "other" or type_text in (ANY_INT, ANY_REAL):
        raise StExecError(f"'{name}': the type {raw.get('type')!r} is not supported "
                          "by the interpreter")
    decl.type = type_text
    initial = str(raw.get("initial") or "").strip()
    what = f"initial value of '{name}'"
    default = _DEFAULT[_kind(type_text)]
    if decl.bounds is None:
        decl.init = default
        if initial:
            decl.init = _fit_string(_constant(*_literal(initial), type_text, what), decl)
    else:
        size = decl.bounds[1] - decl.bounds[0] + 1
        values = _array_initial(initial, type_text, what) if initial else []
        if len(values) > size:
            raise StExecError(f"{what}: {len(values)} values for {size} elements")
        decl.init = [_fit_string(v, decl) for v in values] + [default] * (size - len(values))
    return decl


def _fit_string(value: Any, decl: _Decl) -> Any:
    return value[:decl.length] if isinstance(value, str) else value


_ITEM_RE = re.compile(r"\s*(?:(\d+)\s*\(([^()]*)\)|('(?:[^'$]|\$.)*'|[^,]+))\s*(?:,|$)")


def _array_initial(text: str, type_: str, what: str) -> list[Any]:
    if not (text.startswith("[") and text.endswith("]")):
        raise StExecError(f"{what}: an array's initial value is a list, e.g. [1, 2, 3(0)]")
    inner, out, at = text[1:-1].strip(), [], 0
    while at < len(inner):
        m = _ITEM_RE.match(inner, at)
        if m is None or m.end() == at:
            raise StExecError(f"{what}: cannot read {inner[at:]!r}")
        if m[1]:
            out += [_constant(*_literal(m[2] or ""), type_, what)] * int(m[1])
        else:
            out.append(_constant(*_literal(m[3]), type_, what))
        at = m.end()
    return out


# --- the standard function blocks ---------------------------------------------------------------

class _Clock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0   # nanoseconds since the program started


class _FB:
    """A standard FB instance: inputs and outputs as upper-case attributes."""

    __slots__ = ("clock",)
    TYPE = ""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        for name, type_ in {**st_pou.FB_INPUTS[self.TYPE], **st_pou.FB_OUTPUTS[self.TYPE]}.items():
            setattr(self, name, _DEFAULT[_kind(type_)])

    def call(self) -> None:
        raise NotImplementedError

    def members(self) -> dict[str, Any]:
        return {name: _export(getattr(self, name), type_) for name, type_ in
                {**st_pou.FB_INPUTS[self.TYPE], **st_pou.FB_OUTPUTS[self.TYPE]}.items()}


class _TON(_FB):
    """On-delay: Q rises once IN has been TRUE for PT; ET counts up to PT; IN FALSE resets."""

    __slots__ = ("IN", "PT", "Q", "ET", "_start", "_timing")
    TYPE = "TON"
    IN: bool
    PT: int
    Q: bool
    ET: int

    def reset(self) -> None:
        super().reset()
        self._start, self._timing = 0, False

    def call(self) -> None:
        if not self.IN:
            self.Q, self.ET, self._timing = False, 0, False
            return
        now = self.clock.now
        if not self._timing:
            self._start, self._timing = now, True
        elapsed = now - self._start
        if elapsed >= self.PT:
            self.Q, self.ET = True, max(self.PT, 0)
        else:
            self.Q, self.ET = False, elapsed


class _TOF(_FB):
    """Off-delay: Q follows IN up and stays TRUE for PT after IN falls; ET counts that time
    up to PT and keeps it until IN rises again."""

    __slots__ = ("IN", "PT", "Q", "ET", "_start", "_timing", "_prev")
    TYPE = "TOF"
    IN: bool
    PT: int
    Q: bool
    ET: int

    def reset(self) -> None:
        super().reset()
        self._start, self._timing, self._prev = 0, False, False

    def call(self) -> None:
        if self.IN:
            self.Q, self.ET, self._timing = True, 0, False
        else:
            if self._prev:  # falling edge
                self._start, self._timing = self.clock.now, True
            if self._timing:
                elapsed = self.clock.now - self._start
                if elapsed >= self.PT:
                    self.Q, self.ET, self._timing = False, max(self.PT, 0), False
                else:
                    self.ET = elapsed
        self._prev = self.IN


class _TP(_FB):
    """Pulse: a rising edge of IN (while no pulse runs) makes Q TRUE for exactly PT, whatever
    IN does meanwhile; ET counts the pulse and holds PT until IN is FALSE, then 0."""

    __slots__ = ("IN", "PT", "Q", "ET", "_start", "_pulse", "_prev")
    TYPE = "TP"
    IN: bool
    PT: int
    Q: bool
    ET: int

    def reset(self) -> None:
        super().reset()
        self._start, self._pulse, self._prev = 0, False, False

    def call(self) -> None:
        now = self.clock.now
        if not self._pulse and self.IN and not self._prev:
            self._start, self._pulse = now, True
        if self._pulse:
            elapsed = now - self._start
            if elapsed >= self.PT:
                self.Q, self.ET, self._pulse = False, max(self.PT, 0), False
            else:
                self.Q, self.ET = True, elapsed
        if not self._pulse and not self.IN:
            self.ET = 0
        self._prev = self.IN


class _RTrig(_FB):
    """Rising edge: ``Q := CLK AND NOT M; M := CLK`` (M starts FALSE)."""

    __slots__ = ("CLK", "Q", "_m")
    TYPE = "R_TRIG"
    CLK: bool
    Q: bool

    def reset(self) -> None:
        super().reset()
        self._m = False

    def call(self) -> None:
        self.Q = self.CLK and not self._m
        self._m = self.CLK


class _FTrig(_FB):
    """Falling edge: ``Q := NOT CLK AND NOT M; M := NOT CLK`` (M starts FALSE), IEC 61131-3
    ed. 2 and 3: the first call with CLK FALSE gives Q TRUE (CODESYS's F_TRIG keeps ed. 1,
    which does not)."""

    __slots__ = ("CLK", "Q", "_m")
    TYPE = "F_TRIG"
    CLK: bool
    Q: bool

    def reset(self) -> None:
        super().reset()
        self._m = False

    def call(self) -> None:
        self.Q = not self.CLK and not self._m
        self._m = not self.CLK


_PV_MIN, _PV_MAX = _range("INT")


class _CTU(_FB):
    """Up counter: R sets CV to 0, else a rising edge of CU counts up (to 32767);
    ``Q := CV >= PV``."""

    __slots__ = ("CU", "R", "PV", "Q", "CV", "_m")
    TYPE = "CTU"
    CU: bool
    R: bool
    PV: int
    Q: bool
    CV: int

    def reset(self) -> None:
        super().reset()
        self._m = False

    def call(self) -> None:
        rise, self._m = self.CU and not self._m, self.CU
        if self.R:
            self.CV = 0
        elif rise and self.CV < _PV_MAX:
            self.CV += 1
        self.Q = self.CV >= self.PV


class _CTD(_FB):
    """Down counter: LD loads PV into CV, else a rising edge of CD counts down (to -32768);
    ``Q := CV <= 0``."""

    __slots__ = ("CD", "LD", "PV", "Q", "CV", "_m")
    TYPE = "CTD"
    CD: bool
    LD: bool
    PV: int
    Q: bool
    CV: int

    def reset(self) -> None:
        super().reset()
        self._m = False

    def call(self) -> None:
        rise, self._m = self.CD and not self._m, self.CD
        if self.LD:
            self.CV = self.PV
        elif rise and self.CV > _PV_MIN:
            self.CV -= 1
        self.Q = self.CV <= 0


class _CTUD(_FB):
    """Up/down counter: R (first) sets 0, LD loads PV, else one rising edge of CU or CD
    counts (both at once: nothing); ``QU := CV >= PV``, ``QD := CV <= 0``."""

    __slots__ = ("CU", "CD", "R", "LD", "PV", "QU", "QD", "CV", "_mu", "_md")
    TYPE = "CTUD"
    CU: bool
    CD: bool
    R: bool
    LD: bool
    PV: int
    QU: bool
    QD: bool
    CV: int

    def reset(self) -> None:
        super().reset()
        self._mu = self._md = False

    def call(self) -> None:
        up, self._mu = self.CU and not self._mu, self.CU
        down, self._md = self.CD and not self._md, self.CD
        if self.R:
            self.CV = 0
        elif self.LD:
            self.CV = self.PV
        elif not (up and down):
            if up and self.CV < _PV_MAX:
                self.CV += 1
            elif down and self.CV > _PV_MIN:
                self.CV -= 1
        self.QU = self.CV >= self.PV
        self.QD = self.CV <= 0


class _SR(_FB):
    """Set-dominant latch: ``Q1 := S1 OR (NOT R AND Q1)``."""

    __slots__ = ("S1", "R", "Q1")
    TYPE = "SR"
    S1: bool
    R: bool
    Q1: bool

    def call(self) -> None:
        self.Q1 = self.S1 or (not self.R and self.Q1)


class _RS(_FB):
    """Reset-dominant latch: ``Q1 := NOT R1 AND (S OR Q1)``."""

    __slots__ = ("S", "R1", "Q1")
    TYPE = "RS"
    S: bool
    R1: bool
    Q1: bool

    def call(self) -> None:
        self.Q1 = not self.R1 and (self.S or self.Q1)


_FB_CLASSES: dict[str, type[_FB]] = {cls.TYPE: cls for cls in (
    _TON, _TOF, _TP, _RTrig, _FTrig, _CTU, _CTD, _CTUD, _SR, _RS)}


# --- values in and out --------------------------------------------------------------------------

def _export(value: Any, type_: str) -> Any:
    """An internal value as the caller sees it: a TIME in seconds."""
    if isinstance(value, list):
        return [_export(v, type_) for v in value]
    if _kind(type_) == "time":
        return value / _NS
    return value


def _import(value: Any, decl: _Decl) -> Any:
    """A caller's value for ``decl`` (BOOL: a bool; integers: an int in range; REAL: a
    number; TIME: seconds or a literal such as 'T#5s'; STRING: a str; arrays: a list)."""
    if decl.bounds is not None:
        size = decl.bounds[1] - decl.bounds[0] + 1
        if not isinstance(value, list | tuple) or len(value) != size:
            raise StExecError(f"'{decl.name}' is an array of {size}: give a list of {size}")
        return [_import_scalar(v, decl) for v in value]
    return _import_scalar(value, decl)


def _import_scalar(value: Any, decl: _Decl) -> Any:
    kind, type_ = _kind(decl.type), decl.type
    bad = StExecError(f"'{decl.name}' is {type_}: {value!r} is not {_a(type_)} value")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad
    if isinstance(value, bool):
        raise bad
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise bad
        lo, hi = _range(type_)
        if not lo <= value <= hi:
            raise StExecError(f"'{decl.name}' is {type_}: {value} is out of its range "
                              f"{lo}..{hi}")
        return value
    if kind == "real":
        if not isinstance(value, int | float):
            raise bad
        return float(value)
    if kind == "time":
        if isinstance(value, str):
            parsed = _parse_time(value)
            if parsed is None:
                raise bad
            return parsed[0]
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise bad
        return round(value * _NS)
    if not isinstance(value, str):
        raise bad
    return value[:decl.length]


# --- compiling the body -------------------------------------------------------------------------

class _Exit(Exception):
    pass


class _Continue(Exception):
    pass


class _Return(Exception):
    pass


class _Budget:
    """Loop iterations left in this scan (of ``limit``: an endless loop) and steps left in
    the whole run (``work``, of ``work_limit``)."""

    __slots__ = ("left", "limit", "work", "work_limit")

    def __init__(self, limit: int, work_limit: int | None = None) -> None:
        self.limit = limit
        self.left = limit
        self.work_limit = _UNLIMITED if work_limit is None else work_limit
        self.work = self.work_limit

    @property
    def spent(self) -> int:
        """Steps taken so far."""
        return self.work_limit - self.work

    def exhausted(self, loc: Loc) -> StExecError:
        return _fail(loc, f"the run's work budget of {self.work_limit} steps is spent (a "
                          "step: a syntax node evaluated, a loop iteration, a scan): the "
                          "POU does too much in each scan for these vectors")


def _weight(node: Node) -> int:
    """The steps a statement takes itself: its syntax nodes, those of the statements nested
    in it left out (they count when they run)."""
    n, stack = 1, list(node.named_children)
    while stack:
        c = stack.pop()
        if c.type.endswith("_statement") or c.type in _SKIP:
            continue
        n += 1
        stack.extend(c.named_children)
    return n


_NOCONST: Any = object()


class _E:
    """A compiled expression: its closure, its static type, its value when constant."""

    __slots__ = ("const", "fn", "type")

    def __init__(self, fn: Fn, type_: str, const: Any = _NOCONST) -> None:
        self.fn = fn
        self.type = type_
        self.const = const


def _k(value: Any, type_: str) -> _E:
    return _E(lambda: value, type_, value)


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, ">": operator.gt,
    "<=": operator.le, ">=": operator.ge}
_LITERAL_NODES = frozenset({"integer_literal", "real_literal", "boolean_literal",
                            "time_literal", "string_literal", "typed_literal"})
_SKIP = frozenset({"comment", "pragma"})

# parameter names for calls by name: fixed lists, or a prefix for extensible ones
_PARAMS: dict[str, tuple[str, ...]] = {
    "LIMIT": ("MN", "IN", "MX"), "SEL": ("G", "IN0", "IN1"), "SHL": ("IN", "N"),
    "SHR": ("IN", "N"), "ROL": ("IN", "N"), "ROR": ("IN", "N"), "LEFT": ("IN", "L"),
    "RIGHT": ("IN", "L"), "MID": ("IN", "L", "P"), "INSERT": ("IN1", "IN2", "P"),
    "DELETE": ("IN", "L", "P"), "REPLACE": ("IN1", "IN2", "L", "P"), "FIND": ("IN1", "IN2"),
    "SUB": ("IN1", "IN2"), "DIV": ("IN1", "IN2"), "MOD": ("IN1", "IN2"),
    "EXPT": ("IN1", "IN2"), "ATAN2": ("Y", "X"), "NE": ("IN1", "IN2"),
    "ADD_TIME": ("IN1", "IN2"), "SUB_TIME": ("IN1", "IN2"), "MUL_TIME": ("IN1", "IN2"),
    "DIV_TIME": ("IN1", "IN2")}
_EXTENSIBLE = frozenset({"ADD", "MUL", "AND", "OR", "XOR", "MAX", "MIN", "GT", "GE", "EQ",
                         "LE", "LT", "CONCAT", "MUX"})
_MATH: dict[str, Callable[[float], float]] = {
    "SQRT": math.sqrt, "LN": math.log, "LOG": math.log10, "EXP": math.exp, "SIN": math.sin,
    "COS": math.cos, "TAN": math.tan, "ASIN": math.asin, "ACOS": math.acos, "ATAN": math.atan}
_UNSUPPORTED_FUNCTIONS = frozenset({"LOWER_BOUND", "UPPER_BOUND", "REF", "SIZEOF", "ADR"})


def _math(f: Callable[..., float], name: str, loc: Loc) -> Callable[..., float]:
    def run(*args: Any) -> float:
        try:
            result = f(*args)
        except (ValueError, OverflowError, ZeroDivisionError) as e:
            shown = ", ".join(repr(a) for a in args)
            raise _fail(loc, f"{name}({shown}): {e}") from None
        if isinstance(result, complex):
            raise _fail(loc, f"{name} of {args!r} has no real result")
        return float(result)
    return run


class _Compiler:
    """Compiles the tree of one POU body into closures over the program's state."""

    def __init__(self, prog: Program, source: bytes, body_start: int) -> None:
        self.prog = prog
        self.pos = st_pou._Positions(source)
        self.source = source
        self.body_start = body_start
        self.loops = 0

    # -- places and names

    def loc(self, node: Node) -> Loc:
        line, column = self.pos.at(node.start_point.row, node.start_point.column)
        return st_pou.to_body_position(line, column, self.body_start)

    def err(self, node: Node, message: str) -> StExecError:
        return _fail(self.loc(node), message)

    def text(self, node: Node | None) -> str:
        if node is None:
            return ""
        return self.source[node.start_byte:node.end_byte].decode("utf-8", errors="replace")

    def decl(self, node: Node) -> _Decl:
        name = self.text(node)
        if name.startswith("%"):
            raise self.err(node, f"direct address '{name}' is not supported")
        found = self.prog._decls.get(name.upper())
        if found is None:
            raise self.err(node, f"undeclared identifier '{name}'")
        return found

    def field(self, node: Node, name: str) -> Node:
        child = node.child_by_field_name(name)
        if child is None:
            raise self.err(node, f"incomplete {node.type.replace('_', ' ')}")
        return child

    @staticmethod
    def named(node: Node) -> list[Node]:
        return [c for c in node.named_children if c.type not in _SKIP]

    @staticmethod
    def fields(node: Node, name: str) -> list[Node]:
        return [c for c in node.children_by_field_name(name) if c.type not in _SKIP]

    # -- statements

    def block(self, nodes: Sequence[Node]) -> tuple[Stmt, int]:
        """The statements in order, and the steps one run of them takes itself
        (``_weight``). Whoever runs a block charges them to the run's work budget: a loop
        each iteration, where the budget is checked, an IF or CASE the branch it takes,
        a scan its body (checked at the scan's start), so a stretch without a loop may go
        past the budget by at most one body's steps."""
        stmts, cost = [], 0
        for n in nodes:
            if n.type in _SKIP or (s := self.stmt(n)) is None:
                continue
            stmts.append(s)
            cost += _weight(n)
        if not stmts:
            return (lambda: None), cost
        if len(stmts) == 1:
            return stmts[0], cost
        if len(stmts) == 2:
            a, b = stmts

            def two() -> None:
                a()
                b()
            return two, cost

        def run() -> None:
            for s in stmts:
                s()
        return run, cost

    def stmt(self, node: Node) -> Stmt | None:
        t = node.type
        if t == "empty_statement":
            return None
        if t == "assignment_statement":
            return self.assignment(node)
        if t == "invocation_statement":
            calls = self.named(node)
            if len(calls) != 1 or calls[0].type != "call_expression":
                raise self.err(node, "unsupported statement")
            return self.fb_call(calls[0])
        if t == "if_statement":
            return self.if_stmt(node)
        if t == "case_statement":
            return self.case_stmt(node)
        if t == "for_statement":
            return self.for_stmt(node)
        if t == "while_statement":
            return self.while_stmt(node)
        if t == "repeat_statement":
            return self.repeat_stmt(node)
        if t in ("exit_statement", "continue_statement"):
            word = "EXIT" if t == "exit_statement" else "CONTINUE"
            if not self.loops:
                raise self.err(node, f"{word} outside a loop")
            signal = _Exit if t == "exit_statement" else _Continue

            def leave() -> None:
                raise signal
            return leave
        if t == "return_statement":
            def ret() -> None:
                raise _Return
            return ret
        raise self.err(node, f"'{_snippet(self.text(node))}' ({t.replace('_', ' ')}) is not "
                             "supported by the interpreter")

    def assignment(self, node: Node) -> Stmt:
        left = self.field(node, "left")
        right = self.expr(self.field(node, "right"))
        if left.type == "identifier":
            d = self.decl(left)
            self.check_writable(left, d)
            if d.bounds is not None:
                raise self.err(left, f"'{d.name}' is an array: assign its elements")
            conv = self.conv(left, d.type, right, f"'{d.name}'", d.length)
            vals, key, fn = self.prog._vals, d.key, right.fn
            if conv is None:
                def assign() -> None:
                    vals[key] = fn()
                return assign
            store = conv

            def assign_conv() -> None:
                vals[key] = store(fn())
            return assign_conv
        setter, type_, length, what = self.target(left)
        conv = self.conv(left, type_, right, what, length)
        fn = right.fn
        if conv is None:
            return lambda: setter(fn())
        return lambda: setter(conv(fn()))

    def check_writable(self, node: Node, d: _Decl) -> None:
        if d.constant:
            raise self.err(node, f"'{d.name}' is a constant: it cannot be assigned")
        if d.fb:
            raise self.err(node, f"'{d.name}' is {_a(d.type)} instance: assign its inputs "
                                 f"({', '.join(st_pou.FB_INPUTS[d.type])}) or call it")

    def target(self, node: Node) -> tuple[Callable[[Any], None], str, int, str]:
        """Where an assignment or an output capture stores: (setter, type, length, name)."""
        vals = self.prog._vals
        if node.type == "identifier":
            d = self.decl(node)
            self.check_writable(node, d)
            if d.bounds is not None:
                raise self.err(node, f"'{d.name}' is an array: assign its elements")
            key = d.key

            def set_var(v: Any) -> None:
                vals[key] = v
            return set_var, d.type, d.length, f"'{d.name}'"
        if node.type == "index_expression":
            d, index, lo, hi = self.indexed(node)
            self.check_writable(node, d)
            arr, name, loc = vals[d.key], d.name, self.loc(node)

            def set_item(v: Any) -> None:
                i = index()
                if not lo <= i <= hi:
                    raise _fail(loc, f"index {i} is outside '{name}' [{lo}..{hi}]")
                arr[i - lo] = v
            return set_item, d.type, d.length, f"'{d.name}[...]'"
        if node.type == "member_access_expression":
            obj = self.field(node, "object")
            member = self.field(node, "member")
            if obj.type != "identifier":
                raise self.err(node, "nested member access is not supported")
            d = self.decl(obj)
            mname = self.text(member)
            if d.fb:
                inputs, outputs = st_pou.FB_INPUTS[d.type], st_pou.FB_OUTPUTS[d.type]
                m = mname.upper()
                if m in outputs:
                    raise self.err(member, f"'{mname}' is an output of {d.type}: it cannot "
                                           "be assigned")
                if m not in inputs:
                    raise self.err(member, f"'{mname}' is not an input of {d.type} "
                                           f"({', '.join(inputs)})")
                fb = self.prog._fbs[d.key]
                return (lambda v: setattr(fb, m, v)), inputs[m], _STRING_LEN, \
                    f"'{d.name}.{mname}'"
            bit = self.bit(member, d)
            self.check_writable(node, d)
            key, wrap = d.key, _wrapper(d.type)

            def set_bit(v: Any) -> None:
                vals[key] = wrap(vals[key] | (1 << bit)) if v else wrap(vals[key] & ~(1 << bit))
            return set_bit, "BOOL", _STRING_LEN, f"'{d.name}.{bit}'"
        raise self.err(node, f"cannot assign to '{_snippet(self.text(node))}'")

    def bit(self, member: Node, d: _Decl) -> int:
        text = self.text(member)
        if not text.isdigit():
            raise self.err(member, f"'{d.name}' is {_a(d.type)}: it has no member '{text}'")
        if _kind(d.type) != "int" or d.bounds is not None:
            raise self.err(member, f"bit access '.{text}' needs an integer variable")
        bit = int(text)
        if bit >= _INT_BITS[d.type][0]:
            raise self.err(member, f"bit {bit} is out of range for {_a(d.type)}")
        return bit

    def conv(self, node: Node, target: str, e: _E, what: str,
             length: int = _STRING_LEN) -> Callable[[Any], Any] | None:
        """What storing ``e`` into a ``target`` does to the value (None: nothing); refuses
        what IEC refuses to convert implicitly."""
        kind, src = _kind(target), _kind(e.type)
        if e.const is not _NOCONST and kind == "int" and src == "int":
            lo, hi = _range(target)
            if not lo <= e.const <= hi:
                raise self.err(node, f"{e.const} does not fit {what}, {_a(target)} "
                                     f"({lo}..{hi})")
        if kind == "int" and src == "int":
            # intermediate results are unbounded: a store wraps to the target's width
            return None if e.const is not _NOCONST else _wrapper(target)
        if kind == "real" and src in ("int", "real"):
            return None if src == "real" else float
        if kind == src and kind in ("bool", "time"):
            return None
        if kind == src == "string":
            return lambda v: v[:length]
        hint = ""
        if kind == "int" and src == "real":
            hint = f": convert it (REAL_TO_{target}, TRUNC)"
        elif kind == "time" or src == "time":
            hint = ": TIME does not mix with numbers (use T#... literals, or TIME_TO_*/*_TO_TIME)"
        raise self.err(node, f"cannot store {_a(_describe(e.type))} in {what}, {_a(target)}{hint}")

    def if_stmt(self, node: Node) -> Stmt:
        budget = self.prog._budget
        arms = [(self.cond(self.field(node, "condition")),
                 *self.block(self.fields(node, "consequence")))]
        otherwise: tuple[Stmt, int] | None = None
        for clause in self.named(node):
            if clause.type == "elsif_clause":
                arms.append((self.cond(self.field(clause, "condition")),
                             *self.block(self.fields(clause, "body"))))
            elif clause.type == "else_clause":
                otherwise = self.block(self.fields(clause, "body"))
        if len(arms) == 1:
            (cond, then, cost), = arms
            if otherwise is None:
                def if_then() -> None:
                    if cond():
                        budget.work -= cost
                        then()
                return if_then
            other, other_cost = otherwise

            def if_else() -> None:
                if cond():
                    budget.work -= cost
                    then()
                else:
                    budget.work -= other_cost
                    other()
            return if_else

        def run() -> None:
            for c, b, n in arms:
                if c():
                    budget.work -= n
                    b()
                    return
            if otherwise is not None:
                budget.work -= otherwise[1]
                otherwise[0]()
        return run

    def cond(self, node: Node) -> Fn:
        e = self.expr(node)
        if e.type != "BOOL":
            raise self.err(node, f"a condition must be BOOL, not {_describe(e.type)}")
        return e.fn

    def case_stmt(self, node: Node) -> Stmt:
        subject = self.expr(self.field(node, "subject"))
        if _kind(subject.type) != "int":
            raise self.err(node, f"CASE needs an integer selector, not {_describe(subject.type)}")
        table: dict[int, tuple[Stmt, int]] = {}
        ranges: list[tuple[int, int, tuple[Stmt, int]]] = []
        otherwise: tuple[Stmt, int] | None = None
        for clause in self.named(node):
            if clause.type == "else_clause":
                otherwise = self.block(self.fields(clause, "body"))
                continue
            if clause.type != "case_clause":
                continue
            body = self.block(self.fields(clause, "body"))
            for value in (c for c in self.named(clause) if c.type == "case_value"):
                for label in self.named(value):
                    if label.type == "subrange":
                        lo = self.case_label(self.field(label, "lower"))
                        hi = self.case_label(self.field(label, "upper"))
                        if any(lo <= k <= hi for k in table) or any(
                                lo <= b and a <= hi for a, b, _ in ranges):
                            raise self.err(label, f"CASE label {lo}..{hi} overlaps another")
                        ranges.append((lo, hi, body))
                    else:
                        k = self.case_label(label)
                        if k in table or any(a <= k <= b for a, b, _ in ranges):
                            raise self.err(label, f"CASE label {k} appears twice")
                        table[k] = body
        fn, budget = subject.fn, self.prog._budget

        def run() -> None:
            v = fn()
            chosen = table.get(v)
            if chosen is None:
                for lo, hi, b in ranges:
                    if lo <= v <= hi:
                        chosen = b
                        break
                else:
                    chosen = otherwise
            if chosen is not None:
                budget.work -= chosen[1]
                chosen[0]()
        return run

    def case_label(self, node: Node) -> int:
        e = self.expr(node)
        if e.const is _NOCONST or _kind(e.type) != "int":
            raise self.err(node, "a CASE label must be an integer constant")
        return int(e.const)

    def loop_body(self, node: Node) -> tuple[Stmt, int]:
        self.loops += 1
        try:
            return self.block(self.fields(node, "body"))
        finally:
            self.loops -= 1

    def over_budget(self, loc: Loc) -> StExecError:
        budget = self.prog._budget
        if budget.work < 0:
            return budget.exhausted(loc)
        return _fail(loc, f"more than {budget.limit} loop iterations in one scan: "
                          "an endless loop?")

    def for_stmt(self, node: Node) -> Stmt:
        control = self.field(node, "control")
        if control.type != "identifier":
            raise self.err(control, "the FOR counter must be a variable")
        d = self.decl(control)
        self.check_writable(control, d)
        if _kind(d.type) != "int" or d.bounds is not None:
            raise self.err(control, f"the FOR counter '{d.name}' must be an integer, not "
                                    f"{d.type}")
        start = self.expr(self.field(node, "start"))
        end = self.expr(self.field(node, "end"))
        step_node = node.child_by_field_name("step")
        step = self.expr(step_node) if step_node is not None else _k(1, ANY_INT)
        for part, e in (("start", start), ("end", end), ("step", step)):
            if _kind(e.type) != "int":
                raise self.err(node, f"the FOR {part} must be an integer, not "
                                     f"{_describe(e.type)}")
        store = self.conv(control, d.type, start, f"'{d.name}'") or (lambda v: v)
        wrap = _wrapper(d.type)
        body, cost = self.loop_body(node)
        cost += 1   # the counter's test and step
        vals, key, budget, loc = self.prog._vals, d.key, self.prog._budget, self.loc(node)
        fs, fe, fst = start.fn, end.fn, step.fn
        over = self.over_budget

        def run() -> None:
            first, last, by = fs(), fe(), fst()
            vals[key] = store(first)
            while True:
                i = vals[key]
                if (i > last) if by >= 0 else (i < last):
                    return
                budget.left -= 1
                budget.work -= cost
                if budget.left < 0 or budget.work < 0:
                    raise over(loc)
                try:
                    body()
                except _Exit:
                    return
                except _Continue:
                    pass
                vals[key] = wrap(vals[key] + by)
        return run

    def while_stmt(self, node: Node) -> Stmt:
        condition = self.field(node, "condition")
        cond = self.cond(condition)
        body, cost = self.loop_body(node)
        budget, loc, over = self.prog._budget, self.loc(node), self.over_budget
        cost += _weight(condition)

        def run() -> None:
            while cond():
                budget.left -= 1
                budget.work -= cost
                if budget.left < 0 or budget.work < 0:
                    raise over(loc)
                try:
                    body()
                except _Exit:
                    return
                except _Continue:
                    pass
        return run

    def repeat_stmt(self, node: Node) -> Stmt:
        body, cost = self.loop_body(node)
        condition = self.field(node, "condition")
        cond = self.cond(condition)
        budget, loc, over = self.prog._budget, self.loc(node), self.over_budget
        cost += _weight(condition)

        def run() -> None:
            while True:
                budget.left -= 1
                budget.work -= cost
                if budget.left < 0 or budget.work < 0:
                    raise over(loc)
                try:
                    body()
                except _Exit:
                    return
                except _Continue:
                    pass
                if cond():
                    return
        return run

    def fb_call(self, node: Node) -> Stmt:
        target = self.field(node, "function")
        if target.type != "identifier":
            raise self.err(node, "only FB instances can be called as a statement")
        name = self.text(target)
        d = self.prog._decls.get(name.upper())
        if d is None or not d.fb:
            if d is None and _is_function_name(name.upper()):
                raise self.err(target, f"'{name}(...)' as a statement: a function's result "
                                       "must be used (assign it)")
            if d is None:
                raise self.err(target, f"undeclared identifier '{name}'")
            raise self.err(target, f"'{name}' is {_a(d.type)}, not an FB instance: it cannot be "
                                   "called")
        fb = self.prog._fbs[d.key]
        inputs, outputs = st_pou.FB_INPUTS[d.type], st_pou.FB_OUTPUTS[d.type]
        ins: list[tuple[str, Fn]] = []
        outs: list[tuple[str, Callable[[Any], None]]] = []
        seen: set[str] = set()
        args = self.field(node, "arguments")
        for arg in self.named(args):
            if arg.type != "named_argument":
                raise self.err(arg, f"'{d.name}' is {_a(d.type)}: pass its inputs by name "
                                    f"({', '.join(inputs)} := ...)")
            pnode = self.field(arg, "name")
            pname, p = self.text(pnode), self.text(pnode).upper()
            if p in seen:
                raise self.err(pnode, f"'{pname}' is passed twice")
            seen.add(p)
            value = self.field(arg, "value")
            if any(c.type == "=>" for c in arg.children):
                if p not in outputs:
                    raise self.err(pnode, f"'{pname}' is not an output of {d.type} "
                                          f"({', '.join(outputs)})")
                setter, type_, length, what = self.target(value)
                conv = self.conv(value, type_, _E(lambda: None, outputs[p]), what, length)
                if conv is not None:
                    setter = _then(conv, setter)
                outs.append((p, setter))
            else:
                if p not in inputs:
                    raise self.err(pnode, f"'{pname}' is not an input of {d.type} "
                                          f"({', '.join(inputs)})")
                e = self.expr(value)
                conv = self.conv(value, inputs[p], e, f"{d.name}.{p}")
                ins.append((p, e.fn if conv is None else _compose(conv, e.fn)))
        call = fb.call
        if not ins and not outs:
            return call

        def run() -> None:
            for attr, fn in ins:
                setattr(fb, attr, fn())
            call()
            for attr, store in outs:
                store(getattr(fb, attr))
        return run

    # -- expressions

    def expr(self, node: Node) -> _E:
        t = node.type
        if t in _LITERAL_NODES:
            text = self.text(node)
            try:
                value, type_ = _literal(text)
            except StExecError as e:
                raise self.err(node, e.message) from None
            return _k(value, type_)
        if t == "identifier":
            d = self.decl(node)
            if d.fb:
                raise self.err(node, f"'{d.name}' is {_a(d.type)} instance: read a member "
                                     f"({', '.join(st_pou.FB_OUTPUTS[d.type])})")
            if d.bounds is not None:
                raise self.err(node, f"'{d.name}' is an array: index it ({d.name}[i])")
            if d.constant:
                return _k(d.init, d.type)
            vals, key = self.prog._vals, d.key
            return _E(lambda: vals[key], d.type)
        if t == "parenthesized_expression":
            inner = self.named(node)
            if len(inner) != 1:
                raise self.err(node, "a parenthesis holds one expression")
            return self.expr(inner[0])
        if t == "binary_expression":
            op = self.field(node, "operator").type.upper()
            left = self.expr(self.field(node, "left"))
            right = self.expr(self.field(node, "right"))
            return self.binary(node, op, left, right)
        if t == "unary_expression":
            op = self.field(node, "operator").type.upper()
            return self.unary(node, op, self.expr(self.field(node, "operand")))
        if t == "member_access_expression":
            return self.member(node)
        if t == "index_expression":
            d, index, lo, hi = self.indexed(node)
            arr, name, loc = self.prog._vals[d.key], d.name, self.loc(node)

            def item() -> Any:
                i = index()
                if not lo <= i <= hi:
                    raise _fail(loc, f"index {i} is outside '{name}' [{lo}..{hi}]")
                return arr[i - lo]
            return _E(item, d.type)
        if t == "call_expression":
            return self.function(node)
        raise self.err(node, f"'{_snippet(self.text(node))}' ({t.replace('_', ' ')}) is not "
                             "supported by the interpreter")

    def indexed(self, node: Node) -> tuple[_Decl, Fn, int, int]:
        obj = self.field(node, "object")
        if obj.type != "identifier":
            raise self.err(node, "only a declared array can be indexed")
        d = self.decl(obj)
        if d.bounds is None:
            raise self.err(obj, f"'{d.name}' is not an array")
        indexes = self.fields(node, "index")
        if len(indexes) != 1:
            raise self.err(node, f"'{d.name}' has one dimension: one index")
        index = self.expr(indexes[0])
        if _kind(index.type) != "int":
            raise self.err(indexes[0], f"an array index must be an integer, not "
                                       f"{_describe(index.type)}")
        lo, hi = d.bounds
        if index.const is not _NOCONST and not lo <= index.const <= hi:
            raise self.err(indexes[0], f"index {index.const} is outside '{d.name}' "
                                       f"[{lo}..{hi}]")
        return d, index.fn, lo, hi

    def member(self, node: Node) -> _E:
        obj = self.field(node, "object")
        member = self.field(node, "member")
        if obj.type != "identifier":
            raise self.err(node, "nested member access is not supported")
        d = self.decl(obj)
        mname = self.text(member)
        if d.fb:
            m = mname.upper()
            types = {**st_pou.FB_INPUTS[d.type], **st_pou.FB_OUTPUTS[d.type]}
            if m not in types:
                raise self.err(member, f"'{mname}' is not a member of {d.type} "
                                       f"({', '.join(types)})")
            fb, get = self.prog._fbs[d.key], operator.attrgetter(m)
            return _E(lambda: get(fb), types[m])
        bit = self.bit(member, d)
        if d.constant:
            return _k(bool((d.init >> bit) & 1), "BOOL")
        vals, key = self.prog._vals, d.key
        return _E(lambda: bool((vals[key] >> bit) & 1), "BOOL")

    def unary(self, node: Node, op: str, e: _E) -> _E:
        kind = _kind(e.type)
        fn = e.fn
        if op == "NOT":
            if kind == "bool":
                out = _E(lambda: not fn(), "BOOL")
            elif kind == "int":
                wrap = _wrapper(e.type)
                out = _E(lambda: wrap(~fn()), e.type)
            else:
                raise self.err(node, f"NOT needs a BOOL or a bit string, not "
                                     f"{_describe(e.type)}")
        elif op in ("-", "+"):
            if kind not in ("int", "real", "time"):
                raise self.err(node, f"unary {op} needs a number, not {_describe(e.type)}")
            out = _E((lambda: -fn()) if op == "-" else fn, e.type)
        else:
            raise self.err(node, f"unary '{op}' is not supported")
        return _fold(out, e)

    def binary(self, node: Node, op: str, a: _E, b: _E) -> _E:
        ka, kb = _kind(a.type), _kind(b.type)
        fa, fb = a.fn, b.fn
        loc = self.loc(node)
        numeric = ka in ("int", "real") and kb in ("int", "real")
        mismatch = self.err(node, f"'{op}' does not apply to {_describe(a.type)} and "
                                  f"{_describe(b.type)}")
        out: _E
        if op in _CMP:
            comparable = numeric or (ka == kb and ka in ("bool", "time", "string"))
            if not comparable:
                raise mismatch
            f = _CMP[op]
            out = _E(lambda: f(fa(), fb()), "BOOL")
        elif op in ("AND", "&", "OR", "XOR"):
            if ka == kb == "bool":
                type_ = "BOOL"
            elif ka == kb == "int":
                type_ = _int_join(a.type, b.type)
            else:
                raise mismatch
            if op in ("AND", "&"):
                out = _E(lambda: fa() & fb(), type_)
            elif op == "OR":
                out = _E(lambda: fa() | fb(), type_)
            else:
                out = _E(lambda: fa() ^ fb(), type_)
        elif op in ("+", "-"):
            if numeric:
                type_ = (_int_join(a.type, b.type) if ka == kb == "int"
                         else _real_join(a.type, b.type))
            elif ka == kb == "time":
                type_ = _time_join(a.type, b.type)
            else:
                raise mismatch
            out = _E((lambda: fa() + fb()) if op == "+" else (lambda: fa() - fb()), type_)
        elif op == "*":
            if numeric:
                type_ = (_int_join(a.type, b.type) if ka == kb == "int"
                         else _real_join(a.type, b.type))
                out = _E(lambda: fa() * fb(), type_)
            elif ka == "time" and kb in ("int", "real"):
                out = _E((lambda: fa() * fb()) if kb == "int"
                         else (lambda: _round_ns(fa() * fb(), loc)), a.type)
            elif kb == "time" and ka in ("int", "real"):
                out = _E((lambda: fa() * fb()) if ka == "int"
                         else (lambda: _round_ns(fa() * fb(), loc)), b.type)
            else:
                raise mismatch
        elif op == "/":
            if ka == kb == "int":
                out = _E(lambda: _idiv(fa(), fb(), loc), _int_join(a.type, b.type))
            elif numeric:
                out = _E(lambda: _fdiv(fa(), fb(), loc), _real_join(a.type, b.type))
            elif ka == "time" and kb == "int":
                out = _E(lambda: _idiv(fa(), fb(), loc), a.type)
            elif ka == "time" and kb == "real":
                out = _E(lambda: _round_ns(_fdiv(fa(), fb(), loc), loc), a.type)
            else:
                raise mismatch
        elif op == "MOD":
            if not ka == kb == "int":
                raise mismatch
            out = _E(lambda: _mod(fa(), fb()), _int_join(a.type, b.type))
        elif op == "**":
            if not numeric:
                raise mismatch
            power = _math(math.pow, "**", loc)
            out = _E(lambda: power(fa(), fb()), _real_join(a.type, b.type))
        else:
            raise self.err(node, f"operator '{op}' is not supported")
        return _fold(out, a, b)

    def function(self, node: Node) -> _E:
        target = self.field(node, "function")
        if target.type != "identifier":
            raise self.err(node, "only standard functions can be called in an expression")
        name = self.text(target)
        key = name.upper()
        d = self.prog._decls.get(key)
        if d is not None:
            if d.section == "RESULT":
                raise self.err(target, "recursion is not supported")
            if d.fb:
                raise self.err(target, f"'{name}' is {_a(d.type)} instance: call it as a "
                                       "statement, then read its outputs (e.g. "
                                       f"{name}.{next(iter(st_pou.FB_OUTPUTS[d.type]))})")
            raise self.err(target, f"'{name}' is {_a(d.type)}: it cannot be called")
        args_node = self.field(node, "arguments")
        args = self.call_args(args_node, key, name)
        if (conversion := _conversion(key)) is not None:
            return self.conversion(node, key, conversion, args)
        return self.standard(node, key, args)

    def call_args(self, args_node: Node, key: str, name: str) -> list[_E]:
        nodes = self.named(args_node)
        named = [n for n in nodes if n.type == "named_argument"]
        if not named:
            return [self.expr(n) for n in nodes]
        if len(named) != len(nodes):
            raise self.err(args_node, f"{name}: pass all arguments by name or none")
        by_name: dict[str, Node] = {}
        for arg in named:
            pnode = self.field(arg, "name")
            if any(c.type == "=>" for c in arg.children):
                raise self.err(pnode, f"{name} has no outputs to capture with '=>'")
            p = self.text(pnode).upper()
            if p in by_name:
                raise self.err(pnode, f"'{self.text(pnode)}' is passed twice")
            by_name[p] = self.field(arg, "value")
        if key in _PARAMS:
            order = list(_PARAMS[key])
        elif key in _EXTENSIBLE:
            head = ["K"] if key == "MUX" else []
            first = 0 if key == "MUX" else 1
            order = head + [f"IN{i}" for i in range(first, first + len(by_name) - len(head))]
        else:
            order = ["IN"]
        unknown = [p for p in by_name if p not in order]
        missing = [p for p in order if p not in by_name]
        if unknown or missing:
            raise self.err(args_node, f"{name} takes {', '.join(order)}"
                           + (f"; unknown {', '.join(unknown)}" if unknown else "")
                           + (f"; missing {', '.join(missing)}" if missing else ""))
        return [self.expr(by_name[p]) for p in order]

    def conversion(self, node: Node, key: str, conversion: tuple[str | None, str, bool],
                   args: list[_E]) -> _E:
        src, dst, trunc = conversion
        if len(args) != 1:
            raise self.err(node, f"{key} takes one argument")
        (e,) = args
        kind = _kind(e.type)
        for t in (src, dst):
            if t is not None and t not in _CONV_TYPES:
                raise self.err(node, f"{key}: conversions to or from {t} are not supported")
        if src is not None and kind != _kind(src) and not (
                e.type == ANY_INT and _kind(src) == "real"):
            raise self.err(node, f"{key} converts {_a(src)}, not {_describe(e.type)}")
        if trunc and kind != "real":
            raise self.err(node, f"{key} truncates a REAL, not {_describe(e.type)}")
        convert = _converter(e.type, dst, trunc, self.loc(node))
        fn = e.fn
        return _fold(_E(lambda: convert(fn()), dst), e)

    def standard(self, node: Node, key: str, args: list[_E]) -> _E:
        loc = self.loc(node)
        n = len(args)
        types = [a.type for a in args]
        kinds = [_kind(t) for t in types]
        fns = [a.fn for a in args]

        def need(count: int | None = None, least: int | None = None) -> None:
            if (count is not None and n != count) or (least is not None and n < least):
                want = f"{count}" if count is not None else f"at least {least}"
                raise self.err(node, f"{key} takes {want} argument"
                                     f"{'' if want == '1' else 's'}, not {n}")

        def numeric(*idx: int) -> None:
            for i in idx:
                if kinds[i] not in ("int", "real"):
                    raise self.err(node, f"{key} needs numbers, not {_describe(types[i])}")

        out: _E
        if key in _UNSUPPORTED_FUNCTIONS or key.startswith(("CONCAT_", "SPLIT_")) \
                or key in ("ADD_TOD_TIME", "ADD_DT_TIME", "SUB_DATE_DATE", "SUB_TOD_TIME",
                           "SUB_TOD_TOD", "SUB_DT_TIME", "SUB_DT_DT", "DAY_OF_WEEK"):
            raise self.err(node, f"{key} is not supported by the interpreter")
        if key == "ABS":
            need(1)
            numeric(0)
            f0 = fns[0]
            out = _E(lambda: abs(f0()), types[0])
        elif key in _MATH:
            need(1)
            numeric(0)
            f0, g = fns[0], _math(_MATH[key], key, loc)
            out = _E(lambda: g(f0()), "LREAL" if types[0] == "LREAL" else "REAL")
        elif key in ("EXPT", "ATAN2"):
            need(2)
            numeric(0, 1)
            f0, f1 = fns
            g = _math(math.pow if key == "EXPT" else math.atan2, key, loc)
            out = _E(lambda: g(f0(), f1()), _real_join(types[0], types[1]))
        elif key in ("ADD", "MUL", "AND", "OR", "XOR"):
            need(least=2)
            op = {"ADD": "+", "MUL": "*"}.get(key, key)
            out = args[0]
            for a in args[1:]:
                out = self.binary(node, op, out, a)
            return out
        elif key in ("SUB", "DIV", "MOD"):
            need(2)
            return self.binary(node, {"SUB": "-", "DIV": "/"}.get(key, key), args[0], args[1])
        elif key == "NOT":
            need(1)
            return self.unary(node, "NOT", args[0])
        elif key == "MOVE":
            need(1)
            return args[0]
        elif key in ("GT", "GE", "EQ", "LE", "LT", "NE"):
            need(2 if key == "NE" else None, least=2)
            op = {"GT": ">", "GE": ">=", "EQ": "=", "LE": "<=", "LT": "<", "NE": "<>"}[key]
            pairs = [self.binary(node, op, args[i], args[i + 1]) for i in range(n - 1)]
            out = pairs[0]
            for p in pairs[1:]:
                out = self.binary(node, "AND", out, p)
            return out
        elif key in ("MAX", "MIN", "LIMIT"):
            need(3 if key == "LIMIT" else None, least=2)
            type_ = self.common(node, key, args)
            if key == "LIMIT":
                f0, f1, f2 = fns
                out = _E(lambda: min(max(f1(), f0()), f2()), type_)
            else:
                pick = max if key == "MAX" else min
                out = _E(lambda: pick([f() for f in fns]), type_)
        elif key == "SEL":
            need(3)
            if kinds[0] != "bool":
                raise self.err(node, f"SEL's G must be BOOL, not {_describe(types[0])}")
            type_ = self.common(node, key, args[1:])
            fg, f0, f1 = fns

            def sel() -> Any:
                g, in0, in1 = fg(), f0(), f1()
                return in1 if g else in0
            out = _E(sel, type_)
        elif key == "MUX":
            need(least=2)
            if kinds[0] != "int":
                raise self.err(node, f"MUX's K must be an integer, not {_describe(types[0])}")
            type_ = self.common(node, key, args[1:])
            fk, choices = fns[0], fns[1:]

            def mux() -> Any:
                k = fk()
                values = [f() for f in choices]
                if not 0 <= k < len(values):
                    raise _fail(loc, f"MUX selector {k} is outside 0..{len(values) - 1}")
                return values[k]
            out = _E(mux, type_)
        elif key in ("SHL", "SHR", "ROL", "ROR"):
            need(2)
            if kinds[0] != "int" or kinds[1] != "int":
                raise self.err(node, f"{key} needs a bit string and an integer")
            out = _E(_shift(key, types[0], fns[0], fns[1]), types[0])
        elif key == "TRUNC":
            return self.conversion(node, key, (None, "DINT", True), args)
        elif key == "ROUND":
            need(1)
            if kinds[0] != "real":
                raise self.err(node, f"ROUND needs a REAL, not {_describe(types[0])}")
            f0, wrap = fns[0], _wrapper("DINT")

            def rnd() -> int:
                v = f0()
                if not math.isfinite(v):
                    raise _fail(loc, f"ROUND({v}): not a finite number")
                return wrap(int(math.copysign(math.floor(abs(v) + 0.5), v)))
            out = _E(rnd, "DINT")
        elif key in ("ADD_TIME", "SUB_TIME"):
            need(2)
            if kinds != ["time", "time"]:
                raise self.err(node, f"{key} needs two TIME values")
            return self.binary(node, "+" if key == "ADD_TIME" else "-", args[0], args[1])
        elif key in ("MUL_TIME", "DIV_TIME"):
            need(2)
            if kinds[0] != "time" or kinds[1] not in ("int", "real"):
                raise self.err(node, f"{key} needs a TIME and a number")
            return self.binary(node, "*" if key == "MUL_TIME" else "/", args[0], args[1])
        elif key in ("LEN", "LEFT", "RIGHT", "MID", "CONCAT", "INSERT", "DELETE", "REPLACE",
                     "FIND"):
            out = self.string_function(node, key, args)
        else:
            raise self.err(node, f"'{key}' is not a standard function the interpreter knows")
        return _fold(out, *args)

    def common(self, node: Node, key: str, args: Sequence[_E]) -> str:
        """The type generic arguments share (MAX, MIN, LIMIT, SEL, MUX)."""
        kinds = {_kind(a.type) for a in args}
        if kinds <= {"int"}:
            type_ = ANY_INT
            for a in args:
                type_ = _int_join(type_, a.type)
            return type_
        if kinds <= {"int", "real"}:
            type_ = "REAL"
            for a in args:
                if _kind(a.type) == "real":
                    type_ = _real_join(type_, a.type)
            return type_
        if len(kinds) == 1 and kinds <= {"bool", "time", "string"}:
            return args[0].type
        raise self.err(node, f"{key}: the arguments mix "
                             f"{', '.join(sorted(_describe(a.type) for a in args))}")

    def string_function(self, node: Node, key: str, args: list[_E]) -> _E:
        shapes = {"LEN": "s", "LEFT": "si", "RIGHT": "si", "MID": "sii", "INSERT": "ssi",
                  "DELETE": "sii", "REPLACE": "ssii", "FIND": "ss"}
        shape = shapes.get(key, "s" * max(len(args), 2))
        if len(args) != len(shape) or (key == "CONCAT" and len(args) < 2):
            raise self.err(node, f"{key} takes {len(shape)} arguments, not {len(args)}")
        for a, want in zip(args, shape, strict=True):
            if _kind(a.type) != ("string" if want == "s" else "int"):
                raise self.err(node, f"{key}: {_describe(a.type)} where "
                                     f"{'a STRING' if want == 's' else 'an integer'} belongs")
        f = [a.fn for a in args]
        if key == "LEN":
            return _E(lambda: len(f[0]()), "INT")
        if key == "FIND":
            return _E(lambda: f[0]().find(f[1]()) + 1, "INT")
        impl: Callable[[], str]
        if key == "LEFT":
            impl = lambda: f[0]()[:max(f[1](), 0)]  # noqa: E731
        elif key == "RIGHT":
            impl = lambda: _right(f[0](), f[1]())  # noqa: E731
        elif key == "MID":
            impl = lambda: _mid(f[0](), f[1](), f[2]())  # noqa: E731
        elif key == "INSERT":
            impl = lambda: _insert(f[0](), f[1](), f[2]())  # noqa: E731
        elif key == "DELETE":
            impl = lambda: _replace(f[0](), "", f[1](), f[2]())  # noqa: E731
        elif key == "REPLACE":
            impl = lambda: _replace(f[0](), f[1](), f[2](), f[3]())  # noqa: E731
        else:
            impl = lambda: "".join(g() for g in f)  # noqa: E731
        return _E(impl, args[0].type)


def _snippet(text: str, limit: int = 40) -> str:
    first = text.strip().split("\n", 1)[0].strip()
    return first if len(first) <= limit else first[:limit - 3] + "..."


def _then(conv: Callable[[Any], Any], setter: Callable[[Any], None]) -> Callable[[Any], None]:
    return lambda v: setter(conv(v))


def _compose(conv: Callable[[Any], Any], fn: Fn) -> Fn:
    return lambda: conv(fn())


def _time_join(a: str, b: str) -> str:
    return "LTIME" if "LTIME" in (a, b) else "TIME"


def _fold(out: _E, *operands: _E) -> _E:
    """``out`` as a constant when all its operands are."""
    if operands and all(o.const is not _NOCONST for o in operands):
        return _k(out.fn(), out.type)
    return out


def _idiv(x: int, y: int, loc: Loc) -> int:
    if y == 0:
        raise _fail(loc, "division by zero")
    return _trunc_div(x, y)


def _fdiv(x: float, y: float, loc: Loc) -> float:
    if y == 0:
        raise _fail(loc, "division by zero")
    return x / y


def _mod(x: int, y: int) -> int:
    return 0 if y == 0 else x - _trunc_div(x, y) * y


def _round_ns(v: float, loc: Loc) -> int:
    if not math.isfinite(v):
        raise _fail(loc, f"{v} is not a duration")
    return round(v)


def _right(s: str, n: int) -> str:
    return s[len(s) - n:] if n > 0 else ""


def _mid(s: str, n: int, p: int) -> str:
    return s[max(p - 1, 0):max(p - 1, 0) + max(n, 0)]


def _insert(s: str, t: str, p: int) -> str:
    p = min(max(p, 0), len(s))
    return s[:p] + t + s[p:]


def _replace(s: str, t: str, n: int, p: int) -> str:
    at = max(p - 1, 0)
    return s[:at] + t + s[at + max(n, 0):]


def _shift(key: str, type_: str, fv: Fn, fn: Fn) -> Fn:
    bits = _INT_BITS.get(type_, (32, True))[0]
    mask, wrap = (1 << bits) - 1, _wrapper(type_)
    if key == "SHL":
        return lambda: wrap((fv() & mask) << max(fn(), 0))
    if key == "SHR":
        return lambda: wrap((fv() & mask) >> max(fn(), 0))
    if key == "ROL":
        def rol() -> int:
            u, k = fv() & mask, fn() % bits
            return wrap(((u << k) | (u >> (bits - k))) & mask)
        return rol

    def ror() -> int:
        u, k = fv() & mask, fn() % bits
        return wrap(((u >> k) | (u << (bits - k))) & mask)
    return ror


def _is_function_name(key: str) -> bool:
    return key in st_pou.STANDARD_FUNCTIONS or _conversion(key) is not None


_CONV_TYPES = frozenset({*_KIND} - {ANY_INT, ANY_REAL})


def _conversion(key: str) -> tuple[str | None, str, bool] | None:
    """(source type or None, target type, truncating) of a conversion function's name."""
    if key == "TRUNC":
        return None
    if (m := re.fullmatch(r"(?:(\w+?)_)?TRUNC_(\w+)", key)) is not None:
        src, dst, trunc = m[1], m[2], True
    elif key.startswith("TO_"):
        src, dst, trunc = None, key[3:], False
    elif "_TO_" in key:
        src, _, dst = key.partition("_TO_")
        trunc = False
    else:
        return None
    if dst not in st_pou.CONVERSION_TYPES or (
            src is not None and src not in st_pou.CONVERSION_TYPES):
        return None
    return src, dst, trunc


def _converter(src: str, dst: str, trunc: bool, loc: Loc) -> Callable[[Any], Any]:
    """The conversion of a ``src`` value to ``dst`` (IEC 61131-3 Table 22)."""
    ks, kd = _kind(src), _kind(dst)
    if ks == "other" or kd == "other":
        raise _fail(loc, f"conversions to or from {dst if kd == 'other' else src} are not "
                         "supported")
    unit = 1 if "LTIME" in (src, dst) else 1_000_000   # TIME counts ms, LTIME ns
    if kd == "bool":
        if ks == "string":
            return lambda v: _from_string(v, "BOOL", loc)
        return bool
    if kd == "int":
        wrap = _wrapper(dst)
        if ks == "real":
            def from_real(v: float) -> int:
                if not math.isfinite(v):
                    raise _fail(loc, f"{v} has no {dst} value")
                return wrap(math.trunc(v) if trunc else round(v))
            return from_real
        if ks == "time":
            return lambda v: wrap(_trunc_div(v, unit))
        if ks == "string":
            return lambda v: wrap(_from_string(v, dst, loc))
        return lambda v: wrap(int(v))
    if kd == "real":
        if ks == "time":
            return lambda v: v / unit
        if ks == "string":
            return lambda v: float(_from_string(v, dst, loc))
        return float
    if kd == "time":
        if ks == "int" or ks == "bool":
            return lambda v: int(v) * unit
        if ks == "real":
            return lambda v: _round_ns(v * unit, loc)
        if ks == "string":
            return lambda v: _from_string(v, dst, loc)
        return lambda v: v
    if ks == "bool":
        return lambda v: "TRUE" if v else "FALSE"
    if ks == "time":
        return _format_time
    if ks == "real":
        return lambda v: repr(float(v))
    return str


def _from_string(text: str, dst: str, loc: Loc) -> Any:
    try:
        value, vtype = _literal(text)
        if _kind(dst) == "bool" and vtype == ANY_INT and value in (0, 1):
            return bool(value)
        if _kind(dst) == "int" and _kind(vtype) == "real":
            raise StExecError("")
        if _kind(dst) == "int" and _kind(vtype) == "int":
            return value
        return _constant(value, vtype, dst, repr(text))
    except StExecError:
        raise _fail(loc, f"the string {text!r} is not {_a(dst)}") from None


# --- the program --------------------------------------------------------------------------------

class Program:
    """One POU object, compiled and ready to scan.

    ``pou``: the st_code answer (``pou_type`` PROGRAM, FUNCTION_BLOCK or FUNCTION, ``name``,
    ``variables`` [{section, name, type, initial?}], ``body``, ``return_type`` for a
    FUNCTION). Raises ``StExecError`` when the POU does not parse (the checker's message),
    uses an undeclared name, breaks IEC's type rules, or needs what the interpreter lacks.
    ``step_budget``: loop iterations one scan may run before it is stopped as endless.
    ``work_budget``: steps the program may take in all its scans (None: no limit; see the
    module's "Work"); ``steps``: those taken.
    """

    def __init__(self, pou: Mapping[str, Any], *,
                 step_budget: int = DEFAULT_STEP_BUDGET,
                 work_budget: int | None = None) -> None:
        if not isinstance(pou, Mapping):
            raise StExecError("the POU must be a JSON object")
        self.pou_type = str(pou.get("pou_type", "")).upper()
        if self.pou_type not in ("PROGRAM", "FUNCTION_BLOCK", "FUNCTION"):
            raise StExecError(f"pou_type {pou.get('pou_type')!r} is not PROGRAM, "
                              "FUNCTION_BLOCK or FUNCTION")
        self.name = str(pou.get("name", ""))
        if not re.fullmatch(r"[A-Za-z_]\w*", self.name):
            raise StExecError(f"POU name {pou.get('name')!r} is not an identifier")
        self._clock = _Clock()
        self._budget = _Budget(step_budget, work_budget)
        self._decls: dict[str, _Decl] = {}
        self._vals: dict[str, Any] = {}
        self._fbs: dict[str, _FB] = {}
        variables = pou.get("variables") or []
        if not isinstance(variables, list):
            raise StExecError("'variables' must be a list")
        for raw in variables:
            if not isinstance(raw, Mapping):
                raise StExecError("each variable must be an object")
            section_text = " ".join(str(raw.get("section", "")).upper().split())
            section = _SECTIONS.get(section_text)
            if section is None:
                raise StExecError(f"variable {raw.get('name')!r}: section {raw.get('section')!r}"
                                  " is not supported")
            constant = section_text != section or bool(raw.get("constant"))
            d = _declare(raw, section, constant)
            if d.constant and d.section != "VAR":
                raise StExecError(f"'{d.name}': only VAR may be CONSTANT")
            if d.key in self._decls:
                raise StExecError(f"duplicate variable '{d.name}'")
            if d.key == self.name.upper():
                raise StExecError(f"variable '{d.name}' has the name of the POU")
            self._decls[d.key] = d
        if self.pou_type == "FUNCTION":
            rtype = str(pou.get("return_type") or "")
            if not rtype:
                raise StExecError("a FUNCTION needs a return_type")
            result = _declare({"name": self.name, "type": rtype}, "RESULT", False)
            if result.fb or result.bounds is not None:
                raise StExecError(f"return type {rtype!r} is not supported")
            self._decls[result.key] = result
        for d in self._decls.values():
            if d.fb:
                self._fbs[d.key] = _FB_CLASSES[d.type](self._clock)
            else:
                self._vals[d.key] = list(d.init) if d.bounds is not None else d.init
        # VAR_TEMP restarts each scan; a FUNCTION keeps nothing from one call to the next
        fresh = [d for d in self._decls.values() if not d.constant and (
            d.section == "VAR_TEMP" or (self.pou_type == "FUNCTION"
                                        and d.section not in _INPUT_SECTIONS))]
        self._fresh_vals = {d.key: d.init for d in fresh if not d.fb and d.bounds is None}
        self._fresh_arrays = [(self._vals[d.key], d.init) for d in fresh if d.bounds is not None]
        self._fresh_fbs = [self._fbs[d.key] for d in fresh if d.fb]
        # a scan is a step, and so is each array element it resets
        self._scan_cost = 1 + sum(len(init) for _, init in self._fresh_arrays)
        self._budget.work -= sum(len(d.init) for d in self._decls.values()
                                 if d.bounds is not None)
        if self._budget.work < 0:
            raise self._budget.exhausted(None)
        self._outputs = [(d.name, d.key, d.type) for d in self._decls.values()
                         if d.section in _OUTPUT_SECTIONS]
        self._body_cost = 0
        self._body = self._compile(pou)
        self._scan_cost += self._body_cost
        self.scans = 0

    def _compile(self, pou: Mapping[str, Any]) -> Stmt:
        text, body_start = st_pou.render_pou_with_map(pou)
        parsed = st_pou._parse(text)
        if parsed is None:
            raise StExecError(st_pou.check_syntax("")["errors"][0]["message"])
        tree, source = parsed
        errors = st_pou._syntax_errors(tree, st_pou._Positions(source))
        if errors:
            first = errors[0]
            at = st_pou.to_body_position(first["line"], first["column"], body_start)
            raise StExecError(f"syntax: {first['message']}", *(at or (None, None)))
        decl = next((c for c in tree.root_node.named_children
                     if c.type.endswith("_declaration")), None)
        if decl is None:
            raise StExecError("the rendered POU has no declaration")
        compiler = _Compiler(self, source, body_start)
        try:
            body, self._body_cost = compiler.block(compiler.fields(decl, "body"))
            return body
        except RecursionError:
            raise StExecError("the body nests too deeply to run") from None

    # -- running

    @property
    def now_s(self) -> float:
        """The simulated clock, in seconds since the program was built."""
        return self._clock.now / _NS

    def scan(self, inputs: Mapping[str, Any] | None = None,
             dt_s: float = 0.0) -> dict[str, Any]:
        """Advance the clock by ``dt_s`` seconds, set ``inputs`` (VAR_INPUT or VAR_IN_OUT
        names, any case; the rest keep their values), run the body once and return the
        outputs (``outputs()``). Raises ``StExecError`` for an unknown input name, a value
        that does not fit its type, or a failed scan."""
        if not isinstance(dt_s, int | float) or not math.isfinite(dt_s) or dt_s < 0:
            raise StExecError(f"dt_s must be a finite number >= 0, not {dt_s!r}")
        self._set_inputs(self.coerce_inputs(inputs or {}))
        self._clock.now += round(dt_s * _NS)
        self._run()
        return self.outputs()

    def coerce_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``inputs`` as internal values by variable key, checked (``StExecError``)."""
        out = {}
        for name, value in inputs.items():
            d = self._decls.get(str(name).upper())
            if d is None:
                raise StExecError(f"'{name}' is not declared in {self.name}")
            if d.section not in _INPUT_SECTIONS:
                raise StExecError(f"'{name}' is {_a(_section_name(d))}, not an input")
            out[d.key] = _import(value, d)
        return out

    def _set_inputs(self, values: Mapping[str, Any]) -> None:
        vals = self._vals
        for key, value in values.items():
            if isinstance(value, list):
                vals[key][:] = value   # in place: the compiled body holds the list
            else:
                vals[key] = value

    def _run(self) -> None:
        if self._fresh_vals:
            self._vals.update(self._fresh_vals)
        for arr, init in self._fresh_arrays:
            arr[:] = init
        for fb in self._fresh_fbs:
            fb.reset()
        budget = self._budget
        budget.left = budget.limit
        budget.work -= self._scan_cost
        if budget.work < 0:
            raise budget.exhausted(None)
        try:
            with contextlib.suppress(_Return):
                self._body()
        except RecursionError:
            raise StExecError("the body nests too deeply to run") from None
        self.scans += 1

    @property
    def steps(self) -> int:
        """The steps the program has taken (its work, as ``work_budget`` counts it)."""
        return self._budget.spent

    def outputs(self) -> dict[str, Any]:
        """VAR_OUTPUT and VAR_IN_OUT values, and a FUNCTION's result under its name (a TIME
        in seconds)."""
        vals = self._vals
        return {name: _export(vals[key], type_) for name, key, type_ in self._outputs}

    def value(self, name: str) -> Any:
        """Any variable's value by name (any case): a scalar, a list for an array, a dict of
        members for an FB instance; ``"tmr.Q"`` for one member. A TIME is in seconds.
        ``KeyError`` for a name the POU does not declare."""
        head, _, member = name.partition(".")
        d = self._decls.get(head.upper())
        if d is None:
            raise KeyError(name)
        if d.fb:
            members = self._fbs[d.key].members()
            if not member:
                return members
            if member.upper() not in members:
                raise KeyError(name)
            return members[member.upper()]
        if member:
            raise KeyError(name)
        return _export(self._vals[d.key], d.type)

    def declaration(self, name: str) -> tuple[str, str] | None:
        """(section, type) of a declared name (any case); a FUNCTION's result has the
        section ``RESULT``; None when undeclared."""
        d = self._decls.get(name.upper())
        return None if d is None else (d.section, d.type)


def _section_name(d: _Decl) -> str:
    if d.section == "RESULT":
        return "function result"
    return "VAR CONSTANT" if d.constant else d.section


# --- test vectors -------------------------------------------------------------------------------

def run_vectors(pou: Mapping[str, Any], vectors: Mapping[str, Any], *,
                step_budget: int = DEFAULT_STEP_BUDGET,
                max_scans: int = DEFAULT_MAX_SCANS,
                work_budget: int = DEFAULT_WORK_BUDGET) -> dict[str, Any]:
    """Run ``pou`` through timed test vectors and compare its outputs.

    ``vectors``: ``{"scan_s": 0.1, "steps": [{"t": 0.0, "set": {"level": 50.0}},
    {"t": 12.0, "expect": {"pump_on": true}}, ...]}``. Scans run at t = 0, scan_s,
    2 scan_s, ... (the first with dt 0). Steps come in time order (t in seconds, >= 0;
    steps at the same t act as one). A ``set`` takes effect at its t (a scan at exactly t
    sees it) and is held until set again; an ``expect`` compares the outputs of the last
    scan at or before its t, after the sets of that t:
    a bool exactly, an integer exactly, a REAL within 1e-6 relative (``{"value": 3.5,
    "tol": 0.01}``: within an absolute tolerance), a TIME given in seconds or as a literal
    (``"T#5s"``), a string exactly. Names are matched case-insensitively. ``set`` takes
    VAR_INPUT/VAR_IN_OUT names, ``expect`` VAR_OUTPUT/VAR_IN_OUT names and a FUNCTION's
    name (its result); any other name is a failure: the answer did not use the interface
    asked for.

    The whole run is held to ``work_budget`` steps (the module's "Work"): a POU that
    takes more fails with an ``error`` that says so.

    Returns ``{"ok", "failures": [{"t", "name", "expected", "got", "message"}], "error",
    "steps"}``: ``error`` is the ``StExecError`` that stopped the run (the POU does not
    build, or a scan failed), with the time; ``steps`` the work it took. Malformed
    ``vectors`` (a test's mistake, not the answer's), and vectors that need more than
    ``max_scans`` scans or ``work_budget`` steps whatever the POU, raise ``ValueError``.
    """
    scan_s, steps = _check_vectors(vectors, max_scans, work_budget)
    failures: list[dict[str, Any]] = []
    result: dict[str, Any] = {"ok": False, "failures": failures, "error": None, "steps": 0}
    try:
        prog = Program(pou, step_budget=step_budget, work_budget=work_budget)
    except StExecError as e:
        result["error"] = f"the POU does not run: {e}"
        return result
    scan_ns = round(scan_s * _NS)
    held: dict[str, Any] = {}
    copied = 0   # array elements the held inputs copy in each scan: steps
    k = 0
    t = 0.0
    budget = prog._budget

    def scan_through(limit_ns: int, inclusive: bool) -> None:
        nonlocal k
        while k * scan_ns < limit_ns or (inclusive and k * scan_ns == limit_ns):
            prog._clock.now = k * scan_ns
            budget.work -= copied
            prog._set_inputs(held)
            prog._run()
            k += 1

    groups: list[list[Mapping[str, Any]]] = []
    for step in steps:   # steps at one time act together: all sets, a scan, all expects
        if groups and round(float(groups[-1][0]["t"]) * _NS) == round(float(step["t"]) * _NS):
            groups[-1].append(step)
        else:
            groups.append([step])
    try:
        for group in groups:
            t = float(group[0]["t"])
            t_ns = round(t * _NS)
            scan_through(t_ns, inclusive=False)
            for name, value in (kv for step in group
                                for kv in (step.get("set") or {}).items()):
                problem = _interface_problem(prog, name, "set")
                if problem is None:
                    try:
                        held.update(prog.coerce_inputs({name: value}))
                    except StExecError as e:
                        problem = str(e)
                    copied = sum(len(v) for v in held.values() if isinstance(v, list))
                if problem is not None:
                    failures.append({"t": t, "name": name, "expected": value, "got": None,
                                     "message": problem})
            scan_through(t_ns, inclusive=True)
            outputs = {key.upper(): v for key, v in prog.outputs().items()}
            for name, expected in (kv for step in group
                                   for kv in (step.get("expect") or {}).items()):
                problem = _interface_problem(prog, name, "expect")
                if problem is not None:
                    failures.append({"t": t, "name": name, "expected": expected, "got": None,
                                     "message": problem})
                    continue
                decl = prog.declaration(name)
                assert decl is not None
                got = outputs[name.upper()]
                message = _mismatch(expected, got, decl[1])
                if message is not None:
                    failures.append({"t": t, "name": name, "expected": expected, "got": got,
                                     "message": message})
        if budget.work < 0:   # the last stretch without a loop went past it
            raise budget.exhausted(None)
    except StExecError as e:
        result["error"] = f"at t={t:g} s (scan {k}, t={k * scan_s:g} s): {e}"
    result["ok"] = not failures and result["error"] is None
    result["steps"] = min(prog.steps, work_budget)
    return result


def _check_vectors(vectors: Mapping[str, Any], max_scans: int,
                   work_budget: int = DEFAULT_WORK_BUDGET
                   ) -> tuple[float, list[Mapping[str, Any]]]:
    if not isinstance(vectors, Mapping):
        raise ValueError("vectors must be an object with 'scan_s' and 'steps'")
    unknown = set(vectors) - {"scan_s", "steps"}
    if unknown:
        raise ValueError(f"vectors: unknown keys {sorted(unknown)}")
    scan_s = vectors.get("scan_s", 0.1)
    if (isinstance(scan_s, bool) or not isinstance(scan_s, int | float)
            or not math.isfinite(scan_s) or round(scan_s * _NS) <= 0):
        raise ValueError(f"vectors: scan_s must be a number > 0, not {scan_s!r}")
    steps = vectors.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ValueError("vectors: 'steps' must be a non-empty list")
    last = 0.0
    for i, step in enumerate(steps):
        if not isinstance(step, Mapping):
            raise ValueError(f"vectors: step {i} is not an object")
        extra = set(step) - {"t", "set", "expect"}
        if extra:
            raise ValueError(f"vectors: step {i} has unknown keys {sorted(extra)}")
        t = step.get("t")
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise ValueError(f"vectors: step {i} needs a time 't' in seconds")
        if t < last:
            raise ValueError(f"vectors: step {i} (t={t}) comes before the step ahead of it")
        last = float(t)
        for part in ("set", "expect"):
            if not isinstance(step.get(part) or {}, Mapping):
                raise ValueError(f"vectors: step {i}: '{part}' must be an object")
        for name, expected in (step.get("expect") or {}).items():
            if expected is None or (isinstance(expected, Mapping) and "value" not in expected):
                raise ValueError(f"vectors: step {i}: expect {name!r} needs a value")
    scans = round(last * _NS) // round(scan_s * _NS) + 1   # at 0, scan_s, ... up to last
    if scans > max_scans:
        raise ValueError(f"vectors: {last:g} s at {scan_s:g} s a scan is {scans} scans, "
                         f"more than the {max_scans} a test may run")
    need = _least_work(steps, scan_s, scans)
    if need > work_budget:
        raise ValueError(f"vectors: {scans} scans copying in the arrays they set take at "
                         f"least {need} steps, more than the run's work budget of "
                         f"{work_budget}")
    return float(scan_s), steps


def _least_work(steps: Sequence[Mapping[str, Any]], scan_s: float, scans: int) -> int:
    """The steps any POU takes through these vectors: a step a scan, and each element of
    an array a ``set`` holds, each scan it is held (by name: a set again replaces it)."""
    held: dict[str, tuple[int, int]] = {}   # name -> (its size, the scan it is set from)
    done, scan_ns = 0, round(scan_s * _NS)
    for step in steps:
        for name, value in (step.get("set") or {}).items():
            key = str(name).upper()
            scan = -(-round(float(step["t"]) * _NS) // scan_ns)   # the first to see it
            if key in held:
                size, since = held.pop(key)
                done += size * max(0, scan - since)
            if isinstance(value, list):
                held[key] = (len(value), scan)
    return scans + done + sum(size * max(0, scans - since) for size, since in held.values())


def _interface_problem(prog: Program, name: str, part: str) -> str | None:
    decl = prog.declaration(name)
    want = "input (VAR_INPUT)" if part == "set" else "output (VAR_OUTPUT)"
    if decl is None:
        return f"'{name}' is not declared by {prog.name}: the POU lacks the {want} asked for"
    sections = _INPUT_SECTIONS if part == "set" else _OUTPUT_SECTIONS
    if decl[0] not in sections:
        d = prog._decls[name.upper()]
        return f"'{name}' is declared as {_section_name(d)}, not as an {want}"
    return None


def _mismatch(expected: Any, got: Any, type_: str) -> str | None:
    """Why ``got`` (an output of ``type_``) is not ``expected``; None when it is."""
    tol: float | None = None
    if isinstance(expected, Mapping):
        tol = expected.get("tol")
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, int | float)):
            return f"tolerance {tol!r} is not a number"
        expected = expected["value"]
    if isinstance(got, list):
        if not isinstance(expected, list) or len(expected) != len(got):
            return f"expected {expected!r}, the output is an array of {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            if (m := _mismatch(e if tol is None else {"value": e, "tol": tol}, g, type_)):
                return f"element {i}: {m}"
        return None
    kind = _kind(type_)
    if kind == "bool" or isinstance(expected, bool):
        if isinstance(expected, bool) and kind == "bool":
            return None if got is expected else f"expected {expected}, got {got}"
        return f"expected {expected!r}, the output is {type_}"
    if kind == "string":
        return None if got == expected else f"expected {expected!r}, got {got!r}"
    if kind == "time" and isinstance(expected, str):
        try:
            parsed = _parse_time(expected)
        except StExecError:
            parsed = None
        if parsed is None:
            return f"{expected!r} is not a TIME literal"
        expected = parsed[0] / _NS
    if not isinstance(expected, int | float):
        return f"expected {expected!r}, the output is {type_}"
    if tol is not None:
        ok = abs(got - expected) <= tol
    elif kind == "real":
        ok = math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12)
    elif kind == "time":
        ok = round(got * _NS) == round(expected * _NS)
    else:
        ok = got == expected
    return None if ok else f"expected {expected}, got {got}"


def check_vectors(vectors: Mapping[str, Any], max_scans: int = DEFAULT_MAX_SCANS,
                  work_budget: int = DEFAULT_WORK_BUDGET) -> None:
    """Refuse malformed test vectors, and vectors no POU could run within ``max_scans``
    scans and ``work_budget`` steps, before any answer is written (a request's
    ``vectors``: ``bad_request`` at the edge); raises ``ValueError`` naming the problem."""
    _check_vectors(vectors, max_scans, work_budget)
