"""An ST answer's grammars over its own declarations (Lark, for llguidance).

While an ``st_code`` answer writes its ``variables``, each name (from its ``"name":"`` on)
is one no earlier variable took, nor a keyword, a type name or the POU's name
(``names_at``, kept by ``names.NameGuard`` token by token). Once the declarations are
written (the text reaches ``"body":"``; the grammar holds from the ``]`` that closes them:
``head_pou``), the body is generated under a grammar built from them (``body_grammar``),
so two classes of refusal cannot be generated any more:

- syntax: statements are IEC 61131-3 ST as the checker's parser reads it (``IF``/``ELSIF``/
  ``ELSE``/``END_IF;``, ``CASE``, ``FOR``, ``WHILE``, ``REPEAT``, assignments, calls of FB
  instances with named parameters, ``RETURN``/``EXIT``; every statement ends with ``;``,
  comments are closed, parentheses balance);
- names: every identifier is a declared variable, the FUNCTION's own name, a standard or
  conversion function, or a member the declared instance's standard FB type has
  (``tmr.Q``); FB inputs are passed by name (``IN :=``), outputs read (``Q =>``) and never
  assigned; arrays are indexed, FB instances are called, not used as values.
- types: expressions are typed by class (BOOL, number, integer, duration, string): a
  condition, a BOOL target and an FB's BOOL input (``IN``, ``CLK``, ``CU``) take a BOOL
  expression, ``PT`` a duration, a REAL target a number, an INT target, ``PV``, an index,
  a ``FOR`` bound and a ``CASE`` selector an integer expression (what the interpreter
  refused: ``cannot store a REAL in an INT``); BOOLs are compared only for equality,
  ``NOT`` takes no bare comparison (``NOT x > 5`` reads ``(NOT x) > 5``);
  a conversion takes its source's class (``TIME_TO_REAL`` a duration), a string function
  its strings and positions where IEC 61131-3 puts them (``MID(IN, L, P)``).
  A comparison of numbers has a live side (a variable that is not a setpoint, an FB's
  member, a function): two setpoints or a setpoint and a literal compared
  (``rOn >= rOff``) are a constant, never what the request asked. What the execution
  check refused after the fact (``cannot store a REAL in tmr.IN``) cannot be written;
- size: an expression chains at most six operands (four for durations; from two
  parentheses deep, three), a call takes at most eight arguments, and expressions nest at
  most four parentheses or brackets deep (``nesting.leveled``), a string literal holds at most
  80 characters (a STRING's default length), a run of blanks holds at most one line
  break, and at most four of them or comments stand between two statements: a model that
  cannot go on where it wants to runs out of room, not into pages of blanks or calls
  inside calls.

The body is text inside a JSON string, so the grammar speaks JSON-escaped ST: a line break
is the two characters ``\\n``, and no ``"`` or ``\\`` appears except in those escapes (ST
strings use single quotes). The part before the body is a literal (the grammar accepts the
answer from its start: the constraint replays its tokens), the part after it is the
schema's optional ``assumptions`` and the closing brace.

The validators stay the judge: the grammar is a subset of what they accept, not a proof.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rung.daemon.tasks.st.interpreter import type_kind
from rung.daemon.tasks.st.nesting import leveled
from rung.daemon.tasks.st.pou import (
    CONVERSION_TYPES,
    FB_INPUTS,
    FB_OUTPUTS,
    INTEGER_TYPES,
    RESERVED_NAMES,
)

BODY_MARK = '"body":"'
VARIABLES_MARK = '"variables":['
NAME_MARK = '"name":"'
# a member of an object after a point the grammar takes over: key, schema, required
Member = tuple[str, Mapping[str, Any], bool]

# whitespace, JSON-escaped: spaces, \n, \t. Comments (// with its line's end, (* ... *)
# on one line, both bounded, runs of stars too) only between statements: a comment left
# open would let anything
# through to the end of the answer. Separate lexemes: one regex for both would keep "/"
# and "(" open as a comment's start after a space, and the lexer cannot step back there.
# between statements (``gap``) at most one line break and 24 blanks a lexeme, four lexemes:
# room for any layout an engineer writes. Inside a statement (``sp``) a few blanks, or a
# line break with a continuation line's indent; before ``:=`` and ``=>`` (``asp``) the 24
# blanks that align a column. None leaves room for a model that pads where it cannot go
# on (runs of tabs between the operands of one expression)
_BLANKS = r"(?:[ ]|\\t){1,24}"
_BREAK = r"(?:\\r)?\\n(?:[ ]|\\t){0,%d}"
_SPACE = f"/{_BLANKS}|{_BREAK % 24}/"
_INLINE = f"/[ ]{{1,4}}|\\\\t|{_BREAK % 12}/"
_ALIGN = f"/{_BLANKS}|{_BREAK % 12}/"
_COMMENT = (r'/\/\/[^\\"\x00-\x1f]{0,160}\\n'
            r'|\(\*(?:[^*\\"\x00-\x1f]|\*{1,8}[^*)\\"\x00-\x1f]){0,160}\*{1,8}\)/')
# literals are bounded as a PLC bounds them (12 digits hold any DINT; a duration has five
# parts d h m s ms of six digits, a fraction of three; a STRING holds 80 characters by
# default): a model that writes digit after digit (T#10000000000001s, a CASE label of 14
# digits) runs out of room, not out of tokens
_UNIT = r"[0-9]{1,6}(?:\.[0-9]{1,3})?(?:ms|us|ns|MS|US|NS|d|h|m|s|D|H|M|S)"
_DURATION = rf"(?:{_UNIT}){{1,5}}"   # no "_" between units: the checker's parser refuses it
_DIGITS = "[0-9](?:_?[0-9]){0,11}"
_BASED = ("2#[01](?:_?[01]){0,63}|8#[0-7](?:_?[0-7]){0,21}"
          "|16#[0-9A-Fa-f](?:_?[0-9A-Fa-f]){0,15}")
_FIXED = rf"""
%llguidance {{}}
sp: INLINE
asp: ALIGN
gap: (SPACE | COMMENT){{1,4}}
SPACE: {_SPACE}
INLINE: {_INLINE}
ALIGN: {_ALIGN}
COMMENT: {_COMMENT}
INT: /{_DIGITS}/
BASED: /(?:{_BASED})/
REAL: /{_DIGITS}\.{_DIGITS}(?:[eE][+-]?[0-9]+)?/
STRING: /'(?:[^'$\\"\x00-\x1f]|\$[$'LNPRTlnprt]|\$[0-9A-Fa-f]{{2}}){{0,80}}'/
RANGE: /-?[0-9]{{1,12}}\.\.-?[0-9]{{1,12}}/
block: (stmt gap?)*
if_stmt: "IF" sp bexpr sp "THEN" gap block elsif* else? "END_IF" sp? ";"
elsif: "ELSIF" sp bexpr sp "THEN" gap block
else: "ELSE" gap block
case_stmt: "CASE" sp iexpr sp "OF" gap case_item+ else? "END_CASE" sp? ";"
case_item: case_label (sp? "," sp? case_label){{0,15}} sp? ":" gap? block
case_label: INT | "-" INT | RANGE | BASED
while_stmt: "WHILE" sp bexpr sp "DO" gap block "END_WHILE" sp? ";"
repeat_stmt: "REPEAT" gap block "UNTIL" sp bexpr sp? "END_REPEAT" sp? ";"
CMP: /(?:<>|<=|>=|[=<>])/
ARITH: /(?:\*\*|[-+*\/])/
boolop: "AND" | "OR" | "XOR"
bexpr: bunary (sp boolop sp bunary | sp? "&" sp? bunary){{0,5}}
# NOT binds tighter than a comparison: ``NOT x > 5`` is ``(NOT x) > 5``, so what NOT takes
# without parentheses is no comparison
bunary: batom | "NOT" sp bnot | "NOT" sp? "(" sp? bexpr sp? ")"
bnot: bprim | "NOT" sp bnot | "NOT" sp? "(" sp? bexpr sp? ")"
batom: bprim | compare
cmp: lexpr sp? CMP sp? nexpr | nexpr sp? CMP sp? lexpr | texpr sp? CMP sp? texpr
    | sexpr sp? CMP sp? sexpr
nexpr: nunary (sp? ARITH sp? nunary){{0,5}}
nunary: natom | "-" sp? natom
IARITH: /[-+*\/]/
iexpr: iunary (sp? IARITH sp? iunary | sp "MOD" sp iunary){{0,5}}
iunary: iatom | "-" sp? iatom
# the arguments of an extensible function (ADD, MUL, MAX, MIN, GT ...): two to eight
iargs: iexpr (sp? "," sp? iexpr){{1,7}}
rexpr: (nunary nop){{0,2}} runary (nop nunary){{0,3}}
runary: ratom | "-" sp? ratom
rfunc: rfname sp? "(" sp? nexpr sp? ")" | ("ATAN2" | "EXPT") sp? "(" sp? nargs2 sp? ")"
    | "ABS" sp? "(" sp? rexpr sp? ")" | rconv
nop: sp? ARITH sp?
lexpr: (nunary nop){{0,2}} lunary (nop nunary){{0,3}}
lunary: latom | "-" sp? latom
TSUM: /[-+]/
TSCALE: /[*\/]/
texpr: tunary (sp? TSUM sp? tunary | sp? TSCALE sp? natom){{0,3}}
tunary: tatom | "-" sp? tatom
nargs: nexpr (sp? "," sp? nexpr){{1,7}}
targs: texpr (sp? "," sp? texpr){{1,7}}
# a fixed number of arguments, as the function takes them (IEC 61131-3 Tables 22-29)
nargs2: nexpr sp? "," sp? nexpr
nargs3: nexpr sp? "," sp? nexpr sp? "," sp? nexpr
anyexpr: bexpr | nexpr | texpr | sexpr
nfunc: nfname1 sp? "(" sp? nexpr sp? ")" | nfname2 sp? "(" sp? nargs2 sp? ")"
    | ("ADD" | "MUL") sp? "(" sp? nargs sp? ")" | minmax sp? "(" sp? nargs sp? ")"
    | "LIMIT" sp? "(" sp? nargs3 sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? nexpr sp? "," sp? nexpr sp? ")"
    | "MUX" sp? "(" sp? iexpr (sp? "," sp? nexpr){{1,8}} sp? ")"
    | "LEN" sp? "(" sp? sexpr sp? ")" | "FIND" sp? "(" sp? sexpr sp? "," sp? sexpr sp? ")"
    | ("TRUNC" | "ROUND") sp? "(" sp? rexpr sp? ")" | nconv | imod
# MOD and the shifts take integers (IEC 61131-3 Tables 27, 28): in a number expression
# they are an operand whose own operands are integer
imod: iunary (sp "MOD" sp iunary){{1,5}} | ibits sp? "(" sp? iexpr sp? "," sp? iexpr sp? ")"
ibits: "MOD" | "SHL" | "SHR" | "ROL" | "ROR"
nconv: iconv | rconv
ifunc: ifname1 sp? "(" sp? iexpr sp? ")" | ifname2 sp? "(" sp? iexpr sp? "," sp? iexpr sp? ")"
    | ("ADD" | "MUL") sp? "(" sp? iargs sp? ")" | minmax sp? "(" sp? iargs sp? ")"
    | "LIMIT" sp? "(" sp? iexpr sp? "," sp? iexpr sp? "," sp? iexpr sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? iexpr sp? "," sp? iexpr sp? ")"
    | "MUX" sp? "(" sp? iexpr (sp? "," sp? iexpr){{1,8}} sp? ")"
    | "LEN" sp? "(" sp? sexpr sp? ")" | "FIND" sp? "(" sp? sexpr sp? "," sp? sexpr sp? ")"
    | ("TRUNC" | "ROUND") sp? "(" sp? rexpr sp? ")" | iconv
tfunc: minmax sp? "(" sp? targs sp? ")"
    | "LIMIT" sp? "(" sp? texpr sp? "," sp? texpr sp? "," sp? texpr sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? texpr sp? "," sp? texpr sp? ")"
    | tfname sp? "(" sp? texpr sp? "," sp? texpr sp? ")"
    | tscale sp? "(" sp? texpr sp? "," sp? nexpr sp? ")" | tconv
bfunc: bcmp sp? "(" sp? nargs sp? ")" | "NE" sp? "(" sp? nargs2 sp? ")"
    | blogic sp? "(" sp? bexpr (sp? "," sp? bexpr){{1,7}} sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? bexpr sp? "," sp? bexpr sp? ")"
    | bconv
sfunc: sfname1 sp? "(" sp? sexpr sp? "," sp? iexpr sp? ")"
    | sfname2 sp? "(" sp? sexpr sp? "," sp? iexpr sp? "," sp? iexpr sp? ")"
    | "CONCAT" sp? "(" sp? sexpr (sp? "," sp? sexpr){{1,7}} sp? ")"
    | "INSERT" sp? "(" sp? sexpr sp? "," sp? sexpr sp? "," sp? iexpr sp? ")"
    | "REPLACE" sp? "(" sp? sexpr sp? "," sp? sexpr sp? "," sp? iexpr sp? "," sp? iexpr sp? ")"
    | sconv
nfname1: "ABS" | "SQRT" | "LN" | "LOG" | "EXP" | "SIN" | "COS" | "TAN" | "ASIN" | "ACOS"
    | "ATAN" | "MOVE"
nfname2: "ATAN2" | "EXPT" | "SUB" | "DIV"
# the functions whose result is a real number whatever their arguments
rfname: "SQRT" | "LN" | "LOG" | "EXP" | "SIN" | "COS" | "TAN" | "ASIN" | "ACOS" | "ATAN"
minmax: "MAX" | "MIN"
tfname: "ADD_TIME" | "SUB_TIME"
tscale: "MUL_TIME" | "DIV_TIME"
# the functions whose result is an integer where their arguments are (IEC 61131-3 Tables 22-29)
ifname1: "ABS" | "MOVE"
ifname2: "SUB" | "DIV" | ibits
bcmp: "GT" | "GE" | "EQ" | "LE" | "LT"
blogic: "AND" | "OR" | "XOR"
# the string functions by their arguments (IEC 61131-3 Table 29): LEFT(IN, L), MID(IN, L, P)
sfname1: "LEFT" | "RIGHT"
sfname2: "MID" | "DELETE"
"""


def _lit(text: str) -> str:
    return json.dumps(text)


def _alt(names: Sequence[str]) -> str:
    return " | ".join(_lit(n) for n in names)


def _member(key: str, schema: Mapping[str, Any], required: bool) -> str:
    part = f'"," {_lit(json.dumps(key) + ":")} %json{json.dumps(schema)}'
    return f"({part})" + ("" if required else "?")


def resolved(schema: Any, defs: Mapping[str, Any]) -> Any:
    """``schema`` with its ``#/$defs/...`` references replaced by what they name (a part
    of a schema handed to ``%json`` has no root to resolve them against)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return resolved(defs[ref[len("#/$defs/"):]], defs)
        return {k: resolved(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [resolved(v, defs) for v in schema]
    return schema


# the value classes the grammar keeps apart: BOOL, numbers (integers, bit strings, reals),
# durations, strings, from the interpreter's classes (``interpreter.type_kind``); a type it
# does not run (DATE, a user type) is left out
KINDS = ("b", "n", "t", "s")
_KIND_OF = {"bool": "b", "int": "n", "real": "n", "time": "t", "string": "s"}


def typed(type_text: str) -> tuple[str | None, bool]:
    """The value class of a declared type (``KINDS``; None outside them) and whether the
    type is an array of it."""
    kind, array = type_kind(type_text)
    return _KIND_OF.get(kind), array


def kind_of(type_text: str) -> str | None:
    """The value class of a scalar type (None for an array or a type outside ``KINDS``)."""
    kind, array = typed(type_text)
    return None if array else kind


def _fb_class(type_text: str) -> str:
    """The class of a standard FB member's type (BOOL, TIME, an integer: ``_CLASSES``)."""
    kind = kind_of(type_text)
    assert kind is not None, type_text
    return _class(type_text, kind)


# the classes of a conversion's source and result: numbers apart as integers (INT, WORD, ...)
# and reals, since an integer target refuses a REAL (``cannot store a REAL in an INT``)
_CONV_CLASSES = ("b", "i", "r", "t", "s")
_CONV_ARG = {"b": "bexpr", "i": "iexpr", "r": "rexpr", "t": "texpr", "s": "sexpr"}


def _conv_class(type_text: str) -> str | None:
    """A scalar type's class as conversions name it (``_CONV_CLASSES``: a real is "r")."""
    kind = kind_of(type_text)
    return None if kind is None else {"n": "r"}.get(k := _class(type_text, kind), k)


def _types_of(cls: str) -> str:
    return "|".join(sorted((t for t in CONVERSION_TYPES if _conv_class(t) == cls),
                           key=lambda t: (-len(t), t)))


def _conversions() -> list[str]:
    """The rules of the conversion functions (``{cls}conv`` by the class of the result:
    BOOL, integer, real, duration, string), each taking an argument of its source's class:
    ``TIME_TO_REAL`` a duration, ``BOOL_TO_INT`` a BOOL, ``INT_TO_TIME`` an integer,
    ``REAL_TO_INT`` and ``TRUNC_DINT`` a real expression (``rexpr``); only the overloaded
    ``TO_INT`` takes any class. (A conversion that took anything let a model nest
    ``TIME_TO_REAL(5 * TIME_TO_REAL(...))`` until the answer ran out.)"""
    out = []
    for dst in _CONV_CLASSES:
        up, dsts = dst.upper(), _types_of(dst)
        rules = [f"CONV_{up}_ANY: /TO_(?:{dsts})/"]
        calls = [f'CONV_{up}_ANY sp? "(" sp? anyexpr sp? ")"']
        for src in _CONV_CLASSES:
            trunc = f"|(?:(?:REAL|LREAL)_)?TRUNC_(?:{dsts})" if (src, dst) == ("r", "i") else ""
            rules.append(f"CONV_{up}_{src.upper()}: /(?:{_types_of(src)})_TO_(?:{dsts}){trunc}/")
            calls.append(f'CONV_{up}_{src.upper()} sp? "(" sp? {_CONV_ARG[src]} sp? ")"')
        out += [*rules, f"{dst}conv: " + " | ".join(calls)]
    return out


# the scalar types an initial value is written for, by the class of literal each takes
_INITIAL_TYPES = (*sorted(INTEGER_TYPES), "BOOL", "REAL", "LREAL", "TIME", "LTIME", "STRING",
                  "WSTRING")


def _time_pattern(durations: Sequence[str] | None) -> str:
    """The pattern of a TIME literal: with ``durations`` (``request.durations``), only those."""
    if durations is None:
        return rf"(?:T|TIME|LTIME)#-?{_DURATION}"
    return "(?:T|TIME|LTIME)#(?:" + "|".join(
        re.escape(d) for d in sorted(durations, key=len, reverse=True)) + ")"


def _initial_pattern(kind: str, numbers: Sequence[str] | None,
                     durations: Sequence[str] | None = None) -> str | None:
    """The pattern of an initial value of class ``kind`` (``interpreter.type_kind``): the
    literals a variable of that class may start with (with ``numbers``, only those numbers;
    an integer only the whole ones; with ``durations``, only those). None: none can be
    written."""
    if kind == "bool":
        return "^(TRUE|FALSE)$"
    if kind == "time":
        return f"^{_time_pattern(durations)}$"
    if kind == "string":
        return r"^'[^'$\\\"]{0,80}'$"
    if numbers is None:
        real = rf"(\.{_DIGITS})?([eE][+-]?[0-9]+)?" if kind == "real" else ""
        return rf"^(-?{_DIGITS}{real}|{_BASED})$"
    allowed = [n for n in numbers if kind == "real" or n.isdigit()]
    if not allowed:
        return None
    return "^-?(" + "|".join(n.replace(".", r"\.") for n in allowed) + ")$"


def _accepts(type_schema: Any, name: str) -> bool:
    """Whether a (resolved) string schema for a type accepts the type name ``name``."""
    if not isinstance(type_schema, dict):
        return False
    if "const" in type_schema:
        return bool(type_schema["const"] == name)
    if "enum" in type_schema:
        return name in type_schema["enum"]
    pattern = type_schema.get("pattern")
    return type_schema.get("type") == "string" and (
        pattern is None or re.search(pattern, name) is not None)


def typed_item(item: Mapping[str, Any], numbers: Sequence[str] | None = None,
               durations: Sequence[str] | None = None) -> dict[str, Any]:
    """A variable's schema (resolved, with a free-text ``initial``) whose initial value is a
    literal of its declared type: one branch per class of scalar type the item's ``type``
    accepts (BOOL ``TRUE``/``FALSE``, an integer a whole number, a REAL a number, a TIME a
    duration, a STRING a quoted text; with ``numbers`` and ``durations``, only those), and one for
    every other type without an initial value (an FB instance has none). What the
    interpreter refuses after the fact (``iSetpoint : INT := 6.5``) cannot be written."""
    props = dict(item.get("properties") or {})
    type_schema, initial = props.get("type"), props.get("initial") or {}
    groups: dict[str, list[str]] = {}
    for name in _INITIAL_TYPES:
        kind, _ = type_kind(name)
        if kind in ("bool", "int", "real", "time", "string") and _accepts(type_schema, name):
            groups.setdefault(kind, []).append(name)
    branches = []
    for kind, names in groups.items():
        pattern = _initial_pattern(kind, numbers, durations)
        if pattern is not None:
            branches.append({**item, "properties": {
                **props, "type": {"enum": names}, "initial": {**initial, "pattern": pattern}}})
    rest = {k: v for k, v in props.items() if k != "initial"}
    branches.append({**item, "properties": rest})
    return {"anyOf": branches}


def _number_rule(numbers: Sequence[str] | None) -> list[str]:
    """``number``, any numeric literal, and ``inum``, an integer one (absent where the
    request states none and ``SMALL`` is not offered: ``_has_inum``)."""
    if numbers is None:
        return ["number: INT | BASED | REAL", "inum: INT | BASED"]
    rules = [f"NUMBER: {_alt(sorted(numbers, key=len, reverse=True))}", "number: NUMBER"]
    if _has_inum(numbers):
        whole = sorted((n for n in numbers if n.isdigit()), key=len, reverse=True)
        rules += [f"NUMBER_I: {_alt(whole)}", "inum: NUMBER_I"]
    return rules


# the classes a body's expressions are typed by: BOOL, real numbers ("n": a REAL target
# takes any number, so a number expression "nexpr" reads integers too), integers and bit
# strings ("i": an INT target takes only an integer expression), durations, strings
_CLASSES = ("b", "n", "i", "t", "s")
_EXPR = {"b": "bexpr", "n": "nexpr", "i": "iexpr", "t": "texpr", "s": "sexpr"}


def _class(type_text: str, kind: str) -> str:
    return "i" if kind == "n" and type_kind(type_text)[0] == "int" else kind


def body_grammar(head: str, pou: Mapping[str, Any], after: Sequence[Member] = (),
                 numbers: Sequence[str] | None = None,
                 fixed: Collection[str] = (),
                 durations: Sequence[str] | None = None) -> str | None:
    """The Lark grammar for the whole answer: ``head`` (the text up to and including
    ``"body":"``) as written, a body over ``pou``'s declarations, the closing quote, the
    properties the schema puts after the body (``after``: key, schema, required; compact
    JSON, in order) and the brace. None when the declarations cannot carry a grammar (no
    usable name: the validators will say why). A VAR_INPUT is read, never assigned.
    Expressions are typed by class (``_CLASSES``): a condition, an FB's BOOL input and a
    BOOL target take a BOOL expression (a comparison of two numbers or two durations, a
    BOOL variable or member, ``NOT``/``AND``/``OR``), a REAL target a number, an INT target,
    an FB's INT input (``PV``), an array index, a ``FOR`` bound and a ``CASE`` selector an
    integer expression, a TIME target or ``PT`` a duration; a timer's ``IN`` is never a
    REAL. ``numbers``: the only numeric literals the body may write (the request's stated
    values, ``request.literals``); None: any. ``fixed``: variables read, never assigned
    (the setpoints code declared from the request's values). ``durations``: the only TIME
    literals (``request.durations``); None: any."""
    fixed_upper = {f.upper() for f in fixed}
    var: dict[str, list[str]] = {k: [] for k in _CLASSES}        # read as values
    writable: dict[str, list[str]] = {k: [] for k in _CLASSES}   # ... and assigned
    arrays: dict[str, list[str]] = {k: [] for k in _CLASSES}
    consts: dict[str, list[str]] = {"n": [], "i": []}   # the numeric setpoints (``fixed``)
    instances: dict[str, list[str]] = {}   # standard FB type -> its declared instances
    seen: set[str] = set()
    for v in pou.get("variables") or []:
        name, vtype = str(v.get("name", "")), str(v.get("type", ""))
        if not name or name.upper() in seen or name.upper() in RESERVED_NAMES:
            continue   # a duplicate or reserved name is the validator's to report
        seen.add(name.upper())
        fb = vtype.upper()
        if fb in FB_INPUTS:
            instances.setdefault(fb, []).append(name)
            continue
        kind, array = typed(vtype)
        if kind is None:
            continue   # a type the grammar does not type: the body cannot use it
        cls = _class(vtype, kind)
        if array:
            arrays[cls].append(name)
            continue
        if kind == "n" and name.upper() in fixed_upper:
            consts[cls].append(name)   # a setpoint: a value, never compared with a constant
            continue
        var[cls].append(name)
        if v.get("section") != "VAR_INPUT" and name.upper() not in fixed_upper:
            writable[cls].append(name)
    pou_name = str(pou.get("name", ""))
    ret_type = str(pou.get("return_type", ""))
    ret = kind_of(ret_type)
    if (str(pou.get("pou_type", "")).upper() == "FUNCTION" and pou_name.upper() not in seen
            and ret is not None):
        var[_class(ret_type, ret)].append(pou_name)
        writable[_class(ret_type, ret)].append(pou_name)
    values: dict[str, list[str]] = {k: [] for k in _CLASSES}
    targets: dict[str, list[str]] = {k: [] for k in _CLASSES}
    # at least one statement: the schema's non-empty body, and no POU answers with none
    rules = ["start: HEAD gap? stmt gap? block TAIL tail",
             f"HEAD: {_lit(head)}",
             'TAIL: "\\""',
             "tail: " + " ".join(_member(*m) for m in after) + ' "}"',
             *_number_rule(numbers), f"TIME: /{_time_pattern(durations)}/", *_conversions()]
    for k in _CLASSES:
        if var[k]:
            rules.append(f"{k}var: {_alt(var[k])}")
            values[k].append(f"{k}var")
        if writable[k]:
            rules.append(f"{k}w: {_alt(writable[k])}")
            targets[k].append(f"{k}w")
        if arrays[k]:
            rules.append(f"{k}arr: {_alt(arrays[k])}")
            values[k].append(f'{k}arr sp? "[" sp? iexpr sp? "]"')
            targets[k].append(f'{k}arr sp? "[" sp? iexpr sp? "]"')
    calls = []
    for fb, names in sorted(instances.items()):
        key = fb.lower()
        members: dict[str, list[str]] = {k: [] for k in _CLASSES}
        ins: dict[str, list[str]] = {k: [] for k in _CLASSES}
        for m, t in FB_INPUTS[fb].items():
            members[_fb_class(t)].append(m)
            ins[_fb_class(t)].append(m)
        for m, t in FB_OUTPUTS[fb].items():
            members[_fb_class(t)].append(m)
        rules.append(f"inst_{key}: {_alt(names)}")
        for k in _CLASSES:
            if members[k]:
                values[k].append(f'inst_{key} "." ({_alt(members[k])})')
            if ins[k]:
                targets[k].append(f'inst_{key} "." ({_alt(ins[k])})')
        calls.append((key, fb))
    reals = bool(values["n"])
    if reals:
        rules.append(f"rvalue: {' | '.join(values['n'])}")
    if values["i"]:
        values["n"].append("ivalue")   # a number reads integers too
    for k in _CLASSES:
        if values[k]:
            rules.append(f"{k}value: {' | '.join(values[k])}")
        if targets[k]:
            rules.append(f"{k}target: {' | '.join(targets[k])}")
    # where an output goes: its own class, or a REAL where it is an integer (CV => rCount)
    stores = {k: [f"{k}target"] if targets[k] else [] for k in _CLASSES}
    stores["i"] += stores["n"]
    for key, fb in calls:
        args = [f'{_lit(m)} asp? ":=" sp? {_EXPR[_fb_class(t)]}'
                for m, t in FB_INPUTS[fb].items()]
        args += [f'{_lit(m)} asp? "=>" sp? ({" | ".join(stores[_fb_class(t)])})'
                 for m, t in FB_OUTPUTS[fb].items() if stores[_fb_class(t)]]
        rules += [f"arg_{key}: {' | '.join(args)}",
                  f'call_{key}: inst_{key} sp? "(" sp? (arg_{key} (sp? "," sp? arg_{key})*)? '
                  'sp? ")"']
    if not any(values.values()) and not any(consts.values()):
        return None
    if consts["i"]:
        rules.append(f"ifix: {_alt(consts['i'])}")
    if consts["n"]:
        rules.append(f"rfix: {_alt(consts['n'])}")
    if consts["n"] or consts["i"]:
        rules.append("nfix: " + " | ".join(
            (["rfix"] if consts["n"] else []) + (["ifix"] if consts["i"] else [])))
    bval = " | bvalue" if values["b"] else ""
    rules += [
        f'bprim: "TRUE" | "FALSE" | "(" sp? bexpr sp? ")" | bfunc{bval}',
        "compare: cmp" + (' | bvalue sp? ("=" | "<>") sp? (bvalue | "TRUE" | "FALSE")'
                          if values["b"] else ""),
        'natom: number | "(" sp? nexpr sp? ")" | nfunc' + (" | nvalue" if values["n"] else "")
        + (" | nfix" if consts["n"] or consts["i"] else ""),
        'iatom: "(" sp? iexpr sp? ")" | ifunc' + (" | inum" if _has_inum(numbers) else "")
        + (" | ivalue" if values["i"] else "") + (" | ifix" if consts["i"] else ""),
        'latom: "(" sp? lexpr sp? ")" | nfunc | imod' + (" | nvalue" if values["n"] else ""),
        # a real expression: one whose operands include a real (REAL_TO_INT, ROUND take one)
        'ratom: "(" sp? rexpr sp? ")" | rfunc' + "".join(
            f" | {r}" for r, here in (("rvalue", reals), ("rfix", consts["n"])) if here),
        'tatom: TIME | "(" sp? texpr sp? ")" | tfunc' + (" | tvalue" if values["t"] else ""),
        "sexpr: STRING | sfunc" + (" | svalue" if values["s"] else "")]
    statements = ["if_stmt", "case_stmt", "while_stmt", "repeat_stmt",
                  '"RETURN" sp? ";"', '"EXIT" sp? ";"']
    assigns = [f'{k}target asp? ":=" sp? {_EXPR[k]} sp? ";"' for k in _CLASSES if targets[k]]
    if assigns:
        rules.append(f"assign: {' | '.join(assigns)}")
        statements.insert(0, "assign")
    if writable["i"]:
        rules += [f"counter: {_alt(writable['i'])}",
                  'for_stmt: "FOR" sp counter asp? ":=" sp? iexpr sp "TO" sp iexpr '
                  '(sp "BY" sp iexpr)? sp "DO" gap block "END_FOR" sp? ";"']
        statements.append("for_stmt")
    if calls:
        rules.append("call: " + " | ".join(f"call_{key}" for key, _ in calls))
        statements.append('call sp? ";"')
    rules.append(f"stmt: {' | '.join(statements)}")
    return leveled(_FIXED + "\n".join(rules) + "\n", _EXPR.values())


def _has_inum(numbers: Sequence[str] | None) -> bool:
    return numbers is None or any(n.isdigit() for n in numbers)


def naming(text: str) -> tuple[str, list[str]] | None:
    """When ``text`` (an answer so far) is at a variable's name: the head (up to and
    including its ``"name":"``) and the names taken before it (the POU's and every earlier
    variable's); else None."""
    start = text.find(VARIABLES_MARK)
    at = text.rfind(NAME_MARK)
    if (start < 0 or at < start or BODY_MARK in text
            or '"' in text[at + len(NAME_MARK):]):   # the name is written already
        return None
    item = text.rfind("{", start, at)
    try:
        before = json.loads(text[:item].rstrip(",") + "]}")
    except json.JSONDecodeError:
        return None
    if not isinstance(before, dict):
        return None
    taken = [str(before.get("name", ""))] + [
        str(v.get("name", "")) for v in before.get("variables") or [] if isinstance(v, dict)]
    return text[:at + len(NAME_MARK)], taken


def names_at(text: str) -> tuple[str | None, list[str]] | None:
    """When ``text`` (an answer so far) is at a variable's name: what of the name is
    written (None: ``text`` ends at its ``"name":``, the opening quote comes next), and the
    names it may not be: a keyword or type name, the POU's, an earlier variable's (compared
    case-insensitively, as IEC names are); else None."""
    opening = text.endswith(NAME_MARK[:-1])
    found = naming(text + '"' if opening else text)
    if found is None:
        return None
    head, taken = found
    return (None if opening else text[len(head):]), [*RESERVED_NAMES, *taken]


def head_pou(text: str) -> tuple[str, dict[str, Any]] | None:
    """When ``text`` (an answer so far) has closed its declarations: the head (up to and
    including ``"body":"``, as far as written or as the schema's order goes on: the body
    follows the variables) and the POU object it declares; else None. The body's grammar
    holds from the ``]`` that closes the variables, so no token can cross from the
    declarations into the body's text unchecked (``":["`` is one token)."""
    cut = text.find(BODY_MARK)
    if cut < 0:
        close = text.rfind("]")
        rest = text[close + 1:]
        if close < 0 or text.find(VARIABLES_MARK) < 0 or not ("," + BODY_MARK).startswith(rest):
            return None
        text, cut = text[:close + 1] + "," + BODY_MARK, close + 2
    try:
        pou = json.loads(text[:cut] + '"body":""}')
    except json.JSONDecodeError:
        return None
    return (text[:cut + len(BODY_MARK)], pou) if isinstance(pou, dict) else None
