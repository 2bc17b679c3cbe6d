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
- types: expressions are typed by class (BOOL, number, duration, string): a condition, a
  BOOL target and an FB's BOOL input (``IN``, ``CLK``, ``CU``) take a BOOL expression,
  ``PT`` a duration, a REAL or INT target a number; BOOLs are compared only for equality;
  a conversion takes its source's class (``TIME_TO_REAL`` a duration), a string function
  its strings and positions where IEC 61131-3 puts them (``MID(IN, L, P)``).
  A comparison of numbers has a live side (a variable that is not a setpoint, an FB's
  member, a function): two setpoints or a setpoint and a literal compared
  (``rOn >= rOff``) are a constant, never what the request asked. What the execution
  check refused after the fact (``cannot store a REAL in tmr.IN``) cannot be written;
- size: an expression chains at most six operands (four for durations), a run of blanks
  holds at most one line break, and at most four of them or comments stand between two
  statements: a model that cannot go on where it wants to runs out of room, not into
  pages of blanks.

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
_UNIT = r"[0-9]+(?:\.[0-9]+)?(?:ms|us|ns|MS|US|NS|d|h|m|s|D|H|M|S)"
_DURATION = rf"(?:{_UNIT})+"   # no "_" between units: the checker's parser refuses it
_DIGITS = "[0-9](?:_?[0-9])*"
_BASED = "2#[01](?:_?[01])*|8#[0-7](?:_?[0-7])*|16#[0-9A-Fa-f](?:_?[0-9A-Fa-f])*"
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
TIME: /(?:T|TIME|LTIME)#-?{_DURATION}/
STRING: /'(?:[^'$\\"\x00-\x1f]|\$[$'LNPRTlnprt]|\$[0-9A-Fa-f]{{2}})*'/
RANGE: /-?[0-9]+\.\.-?[0-9]+/
block: (stmt gap?)*
if_stmt: "IF" sp bexpr sp "THEN" gap block elsif* else? "END_IF" sp? ";"
elsif: "ELSIF" sp bexpr sp "THEN" gap block
else: "ELSE" gap block
case_stmt: "CASE" sp nexpr sp "OF" gap case_item+ else? "END_CASE" sp? ";"
case_item: case_label (sp? "," sp? case_label)* sp? ":" gap? block
case_label: INT | "-" INT | RANGE | BASED
while_stmt: "WHILE" sp bexpr sp "DO" gap block "END_WHILE" sp? ";"
repeat_stmt: "REPEAT" gap block "UNTIL" sp bexpr sp? "END_REPEAT" sp? ";"
CMP: /(?:<>|<=|>=|[=<>])/
ARITH: /(?:\*\*|[-+*\/])/
boolop: "AND" | "OR" | "XOR"
bexpr: bunary (sp boolop sp bunary | sp? "&" sp? bunary){{0,5}}
bunary: batom | "NOT" sp bunary | "NOT" sp? "(" sp? bexpr sp? ")"
compare: lexpr sp? CMP sp? nexpr | nexpr sp? CMP sp? lexpr | texpr sp? CMP sp? texpr
    | sexpr sp? CMP sp? sexpr
nexpr: nunary (sp? ARITH sp? nunary | sp "MOD" sp nunary){{0,5}}
nunary: natom | "-" sp? natom
nop: sp? ARITH sp? | sp "MOD" sp
lexpr: (nunary nop){{0,2}} lunary (nop nunary){{0,3}}
lunary: latom | "-" sp? latom
texpr: tunary (sp? ARITH sp? (tunary | natom)){{0,3}}
tunary: tatom | "-" sp? tatom
nargs: nexpr (sp? "," sp? nexpr)*
targs: texpr (sp? "," sp? texpr)*
anyexpr: bexpr | nexpr | texpr | sexpr
nfunc: nfname sp? "(" sp? nargs sp? ")" | minmax sp? "(" sp? nargs sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? nexpr sp? "," sp? nexpr sp? ")"
    | "MUX" sp? "(" sp? nexpr (sp? "," sp? nexpr)+ sp? ")"
    | "LEN" sp? "(" sp? sexpr sp? ")" | "FIND" sp? "(" sp? sexpr sp? "," sp? sexpr sp? ")"
    | nconv
tfunc: minmax sp? "(" sp? targs sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? texpr sp? "," sp? texpr sp? ")"
    | tfname sp? "(" sp? texpr sp? "," sp? texpr sp? ")"
    | tscale sp? "(" sp? texpr sp? "," sp? nexpr sp? ")" | tconv
bfunc: bcmp sp? "(" sp? nargs sp? ")" | blogic sp? "(" sp? bexpr (sp? "," sp? bexpr)* sp? ")"
    | "SEL" sp? "(" sp? bexpr sp? "," sp? bexpr sp? "," sp? bexpr sp? ")"
    | bconv
sfunc: sfname1 sp? "(" sp? sexpr sp? "," sp? nexpr sp? ")"
    | sfname2 sp? "(" sp? sexpr sp? "," sp? nexpr sp? "," sp? nexpr sp? ")"
    | "CONCAT" sp? "(" sp? sexpr (sp? "," sp? sexpr)+ sp? ")"
    | "INSERT" sp? "(" sp? sexpr sp? "," sp? sexpr sp? "," sp? nexpr sp? ")"
    | "REPLACE" sp? "(" sp? sexpr sp? "," sp? sexpr sp? "," sp? nexpr sp? "," sp? nexpr sp? ")"
    | sconv
nfname: "ABS" | "SQRT" | "LN" | "LOG" | "EXP" | "SIN" | "COS" | "TAN" | "ASIN" | "ACOS"
    | "ATAN" | "ATAN2" | "EXPT" | "ADD" | "SUB" | "MUL" | "DIV" | "MOD" | "MOVE" | "TRUNC"
    | "ROUND" | "SHL" | "SHR" | "ROL" | "ROR"
minmax: "MAX" | "MIN" | "LIMIT"
tfname: "ADD_TIME" | "SUB_TIME"
tscale: "MUL_TIME" | "DIV_TIME"
bcmp: "GT" | "GE" | "EQ" | "LE" | "LT" | "NE"
blogic: "AND" | "OR" | "XOR" | "NOT"
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


def _fb_kind(type_text: str) -> str:
    """The class of a standard FB member's type (BOOL, TIME, INT)."""
    kind = kind_of(type_text)
    assert kind is not None, type_text
    return kind


def _types_of(kind: str) -> str:
    return "|".join(sorted((t for t in CONVERSION_TYPES if kind_of(t) == kind),
                           key=lambda t: (-len(t), t)))


def _conversions(kind: str) -> list[str]:
    """The rules of the conversion functions whose result is of class ``kind``, each
    taking an argument of its source's class: ``TIME_TO_REAL`` a duration,
    ``BOOL_TO_INT`` a BOOL, ``TRUNC`` and ``REAL_TRUNC_INT`` a number; only the overloaded
    ``TO_INT`` takes any class. (A conversion that took anything let a model nest
    ``TIME_TO_REAL(5 * TIME_TO_REAL(...))`` until the answer ran out.)"""
    dst, up = _types_of(kind), kind.upper()
    arg = {"b": "bexpr", "n": "nexpr", "t": "texpr", "s": "sexpr"}
    rules = [f"CONV_{up}_ANY: /TO_(?:{dst})/"]
    calls = [f'CONV_{up}_ANY sp? "(" sp? anyexpr sp? ")"']
    for src in KINDS:
        rules.append(f"CONV_{up}_{src.upper()}: /(?:{_types_of(src)})_TO_(?:{dst})"
                     + (f"|(?:(?:REAL|LREAL)_)?TRUNC_(?:{dst})" if src == kind == "n" else "")
                     + "/")
        calls.append(f'CONV_{up}_{src.upper()} sp? "(" sp? {arg[src]} sp? ")"')
    return [*rules, f"{kind}conv: " + " | ".join(calls)]


def _is_integer_like(type_text: str) -> bool:
    return type_text.upper() in INTEGER_TYPES


# the scalar types an initial value is written for, by the class of literal each takes
_INITIAL_TYPES = (*sorted(INTEGER_TYPES), "BOOL", "REAL", "LREAL", "TIME", "LTIME", "STRING",
                  "WSTRING")


def _initial_pattern(kind: str, numbers: Sequence[str] | None) -> str | None:
    """The pattern of an initial value of class ``kind`` (``interpreter.type_kind``): the
    literals a variable of that class may start with (with ``numbers``, only those numbers;
    an integer only the whole ones). None: none can be written."""
    if kind == "bool":
        return "^(TRUE|FALSE)$"
    if kind == "time":
        return rf"^(T|TIME|LTIME)#-?{_DURATION}$"
    if kind == "string":
        return r"^'[^'$\\\"]*'$"
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


def typed_item(item: Mapping[str, Any], numbers: Sequence[str] | None = None
               ) -> dict[str, Any]:
    """A variable's schema (resolved, with a free-text ``initial``) whose initial value is a
    literal of its declared type: one branch per class of scalar type the item's ``type``
    accepts (BOOL ``TRUE``/``FALSE``, an integer a whole number, a REAL a number, a TIME a
    duration, a STRING a quoted text; with ``numbers``, only those numbers), and one for
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
        pattern = _initial_pattern(kind, numbers)
        if pattern is not None:
            branches.append({**item, "properties": {
                **props, "type": {"enum": names}, "initial": {**initial, "pattern": pattern}}})
    rest = {k: v for k, v in props.items() if k != "initial"}
    branches.append({**item, "properties": rest})
    return {"anyOf": branches}


def _number_rule(numbers: Sequence[str] | None) -> list[str]:
    if numbers is None:
        return ["number: INT | BASED | REAL"]
    return [f"NUMBER: {_alt(sorted(numbers, key=len, reverse=True))}", "number: NUMBER"]


def body_grammar(head: str, pou: Mapping[str, Any], after: Sequence[Member] = (),
                 numbers: Sequence[str] | None = None,
                 fixed: Collection[str] = ()) -> str | None:
    """The Lark grammar for the whole answer: ``head`` (the text up to and including
    ``"body":"``) as written, a body over ``pou``'s declarations, the closing quote, the
    properties the schema puts after the body (``after``: key, schema, required; compact
    JSON, in order) and the brace. None when the declarations cannot carry a grammar (no
    usable name: the validators will say why). A VAR_INPUT is read, never assigned.
    Expressions are typed by class (``KINDS``): a condition, an FB's BOOL input and a BOOL
    target take a BOOL expression (a comparison of two numbers or two durations, a BOOL
    variable or member, ``NOT``/``AND``/``OR``), a REAL or INT target a number, a TIME
    target or ``PT`` a duration; a timer's ``IN`` is never a REAL.
    ``numbers``: the only numeric literals the body may write (the request's stated
    values, ``request.literals``); None: any. ``fixed``: variables read, never assigned
    (the setpoints code declared from the request's values)."""
    fixed_upper = {f.upper() for f in fixed}
    var: dict[str, list[str]] = {k: [] for k in KINDS}        # read as values
    writable: dict[str, list[str]] = {k: [] for k in KINDS}   # ... and assigned
    arrays: dict[str, list[str]] = {k: [] for k in KINDS}
    integers: list[str] = []   # FOR loop counters
    consts: list[str] = []     # the numeric setpoints (``fixed``)
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
        if array:
            arrays[kind].append(name)
            continue
        if kind == "n" and name.upper() in fixed_upper:
            consts.append(name)   # a setpoint: a value, never compared with a constant
            continue
        var[kind].append(name)
        if v.get("section") != "VAR_INPUT" and name.upper() not in fixed_upper:
            writable[kind].append(name)
            if _is_integer_like(vtype):
                integers.append(name)
    pou_name = str(pou.get("name", ""))
    ret = kind_of(str(pou.get("return_type", "")))
    if (str(pou.get("pou_type", "")).upper() == "FUNCTION" and pou_name.upper() not in seen
            and ret is not None):
        var[ret].append(pou_name)
        writable[ret].append(pou_name)
    values: dict[str, list[str]] = {k: [] for k in KINDS}
    targets: dict[str, list[str]] = {k: [] for k in KINDS}
    # at least one statement: the schema's non-empty body, and no POU answers with none
    rules = ["start: HEAD gap? stmt gap? block TAIL tail",
             f"HEAD: {_lit(head)}",
             'TAIL: "\\""',
             "tail: " + " ".join(_member(*m) for m in after) + ' "}"',
             *_number_rule(numbers),
             *(rule for k in KINDS for rule in _conversions(k))]
    if consts:
        rules.append(f"nfix: {_alt(consts)}")
    for k in KINDS:
        if var[k]:
            rules.append(f"{k}var: {_alt(var[k])}")
            values[k].append(f"{k}var")
        if writable[k]:
            rules.append(f"{k}w: {_alt(writable[k])}")
            targets[k].append(f"{k}w")
        if arrays[k]:
            rules.append(f"{k}arr: {_alt(arrays[k])}")
            values[k].append(f'{k}arr sp? "[" sp? nexpr sp? "]"')
            targets[k].append(f'{k}arr sp? "[" sp? nexpr sp? "]"')
    calls = []
    for fb, names in sorted(instances.items()):
        key = fb.lower()
        members: dict[str, list[str]] = {k: [] for k in KINDS}
        ins: dict[str, list[str]] = {k: [] for k in KINDS}
        for m, t in FB_INPUTS[fb].items():
            members[_fb_kind(t)].append(m)
            ins[_fb_kind(t)].append(m)
        for m, t in FB_OUTPUTS[fb].items():
            members[_fb_kind(t)].append(m)
        rules.append(f"inst_{key}: {_alt(names)}")
        for k in KINDS:
            if members[k]:
                values[k].append(f'inst_{key} "." ({_alt(members[k])})')
            if ins[k]:
                targets[k].append(f'inst_{key} "." ({_alt(ins[k])})')
        calls.append((key, fb))
    expr = {"b": "bexpr", "n": "nexpr", "t": "texpr", "s": "sexpr"}
    for k in KINDS:
        if values[k]:
            rules.append(f"{k}value: {' | '.join(values[k])}")
        if targets[k]:
            rules.append(f"{k}target: {' | '.join(targets[k])}")
    for key, fb in calls:
        args = [f'{_lit(m)} asp? ":=" sp? {expr[_fb_kind(t)]}' for m, t in FB_INPUTS[fb].items()]
        args += [f'{_lit(m)} asp? "=>" sp? {_fb_kind(t)}target'
                 for m, t in FB_OUTPUTS[fb].items() if targets[_fb_kind(t)]]
        rules += [f"arg_{key}: {' | '.join(args)}",
                  f'call_{key}: inst_{key} sp? "(" sp? (arg_{key} (sp? "," sp? arg_{key})*)? '
                  'sp? ")"']
    if not any(values.values()) and not consts:
        return None
    bval = " | bvalue" if values["b"] else ""
    rules += [
        f'batom: "TRUE" | "FALSE" | "(" sp? bexpr sp? ")" | compare | bfunc{bval}'
        + (' | bvalue sp? ("=" | "<>") sp? (bvalue | "TRUE" | "FALSE")' if values["b"] else ""),
        'natom: number | "(" sp? nexpr sp? ")" | nfunc' + (" | nvalue" if values["n"] else "")
        + (" | nfix" if consts else ""),
        'latom: "(" sp? lexpr sp? ")" | nfunc' + (" | nvalue" if values["n"] else ""),
        'tatom: TIME | "(" sp? texpr sp? ")" | tfunc' + (" | tvalue" if values["t"] else ""),
        "sexpr: STRING | sfunc" + (" | svalue" if values["s"] else "")]
    statements = ["if_stmt", "case_stmt", "while_stmt", "repeat_stmt",
                  '"RETURN" sp? ";"', '"EXIT" sp? ";"']
    assigns = [f'{k}target asp? ":=" sp? {expr[k]} sp? ";"' for k in KINDS if targets[k]]
    if assigns:
        rules.append(f"assign: {' | '.join(assigns)}")
        statements.insert(0, "assign")
    if integers:
        rules += [f"counter: {_alt(integers)}",
                  'for_stmt: "FOR" sp counter asp? ":=" sp? nexpr sp "TO" sp nexpr '
                  '(sp "BY" sp nexpr)? sp "DO" gap block "END_FOR" sp? ";"']
        statements.append("for_stmt")
    if calls:
        rules.append("call: " + " | ".join(f"call_{key}" for key, _ in calls))
        statements.append('call sp? ";"')
    rules.append(f"stmt: {' | '.join(statements)}")
    return _FIXED + "\n".join(rules) + "\n"


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
