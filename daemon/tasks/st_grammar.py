"""An ST answer's grammars over its own declarations (Lark, for llguidance).

While an ``st_code`` answer writes its ``variables``, each name (from its ``"name":"`` on)
is one no earlier variable took, nor a keyword, a type name or the POU's name
(``names_at``, kept by ``names.NameGuard`` token by token). Once the declarations are
written (the text reaches ``"body":"``), the body is generated under a grammar built from
them (``body_grammar``), so two classes of refusal cannot be generated any more:

- syntax: statements are IEC 61131-3 ST as the checker's parser reads it (``IF``/``ELSIF``/
  ``ELSE``/``END_IF;``, ``CASE``, ``FOR``, ``WHILE``, ``REPEAT``, assignments, calls of FB
  instances with named parameters, ``RETURN``/``EXIT``; every statement ends with ``;``,
  comments are closed, parentheses balance);
- names: every identifier is a declared variable, the FUNCTION's own name, a standard or
  conversion function, or a member the declared instance's standard FB type has
  (``tmr.Q``); FB inputs are passed by name (``IN :=``), outputs read (``Q =>``) and never
  assigned; arrays are indexed, FB instances are called, not used as values.

The body is text inside a JSON string, so the grammar speaks JSON-escaped ST: a line break
is the two characters ``\\n``, and no ``"`` or ``\\`` appears except in those escapes (ST
strings use single quotes). The part before the body is a literal (the grammar accepts the
answer from its start: the constraint replays its tokens), the part after it is the
schema's optional ``assumptions`` and the closing brace.

The validators stay the judge: the grammar is a subset of what they accept, not a proof.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rung.daemon.tasks.st import (
    CONVERSION_TYPES,
    FB_INPUTS,
    FB_OUTPUTS,
    INTEGER_TYPES,
    RESERVED_NAMES,
    STANDARD_FUNCTIONS,
)

BODY_MARK = '"body":"'
VARIABLES_MARK = '"variables":['
NAME_MARK = '"name":"'
# a member of an object after a point the grammar takes over: key, schema, required
Member = tuple[str, Mapping[str, Any], bool]

# whitespace, JSON-escaped: spaces, \n, \t. Comments (// with its line's end, (* ... *)
# on one line, both bounded) only between statements: a comment left open would let anything
# through to the end of the answer. Separate lexemes: one regex for both would keep "/"
# and "(" open as a comment's start after a space, and the lexer cannot step back there.
_SPACE = r"/(?:[ ]|\\n|\\t|\\r)+/"
_COMMENT = (r'/\/\/[^\\"\x00-\x1f]{0,160}\\n'
            r'|\(\*(?:[^*\\"\x00-\x1f]|\*+[^*)\\"\x00-\x1f]){0,160}\*+\)/')
_UNIT = r"[0-9]+(?:\.[0-9]+)?(?:ms|us|ns|MS|US|NS|d|h|m|s|D|H|M|S)"
_DURATION = rf"(?:{_UNIT})+"   # no "_" between units: the checker's parser refuses it
_DIGITS = "[0-9](?:_?[0-9])*"
_BASED = "2#[01](?:_?[01])*|8#[0-7](?:_?[0-7])*|16#[0-9A-Fa-f](?:_?[0-9A-Fa-f])*"
# a variable's initial value: one ST literal (the JSON schema pattern of ``initial``)
LITERAL_PATTERN = (rf"^(TRUE|FALSE|-?{_DIGITS}(\.{_DIGITS})?([eE][+-]?[0-9]+)?|{_BASED}"
                   rf"|(T|TIME|LTIME)#-?{_DURATION}|'[^'$\\\"]*')$")
_FIXED = rf"""
%llguidance {{}}
sp: SPACE
gap: (SPACE | COMMENT)+
SPACE: {_SPACE}
COMMENT: {_COMMENT}
INT: /{_DIGITS}/
BASED: /(?:{_BASED})/
REAL: /{_DIGITS}\.{_DIGITS}(?:[eE][+-]?[0-9]+)?/
TIME: /(?:T|TIME|LTIME)#-?{_DURATION}/
STRING: /'(?:[^'$\\"\x00-\x1f]|\$[$'LNPRTlnprt]|\$[0-9A-Fa-f]{{2}})*'/
RANGE: /-?[0-9]+\.\.-?[0-9]+/
block: (stmt gap?)*
if_stmt: "IF" sp expr sp "THEN" gap block elsif* else? "END_IF" sp? ";"
elsif: "ELSIF" sp expr sp "THEN" gap block
else: "ELSE" gap block
case_stmt: "CASE" sp expr sp "OF" gap case_item+ else? "END_CASE" sp? ";"
case_item: case_label (sp? "," sp? case_label)* sp? ":" gap? block
case_label: INT | "-" INT | RANGE | BASED
while_stmt: "WHILE" sp expr sp "DO" gap block "END_WHILE" sp? ";"
repeat_stmt: "REPEAT" gap block "UNTIL" sp expr sp? "END_REPEAT" sp? ";"
expr: unary (sp? SYMOP sp? unary | sp WORDOP sp unary)*
SYMOP: /(?:\*\*|[-+*\/&=<>]|<>|<=|>=)/
WORDOP: /(?:AND|OR|XOR|MOD)/
unary: primary | "-" sp? primary | "NOT" sp unary | "NOT" sp? "(" sp? expr sp? ")"
primary: literal | value | "(" sp? expr sp? ")" | function sp? "(" sp? args? sp? ")"
args: expr (sp? "," sp? expr)*
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


def _conversions() -> str:
    types = "|".join(sorted(CONVERSION_TYPES, key=lambda t: (-len(t), t)))
    return f"/(?:(?:{types})_TO_(?:{types})|TO_(?:{types})|(?:(?:{types})_)?TRUNC_(?:{types}))/"


def _is_array(type_text: str) -> bool:
    return type_text.upper().replace(" ", "").startswith("ARRAY[")


def _is_integer_like(type_text: str) -> bool:
    return type_text.upper() in INTEGER_TYPES


def literal_pattern(numbers: Sequence[str] | None = None) -> str:
    """The JSON schema pattern of a variable's initial value: one ST literal; with
    ``numbers`` (a request's ``st_request.literals``), only those numbers. Durations stay
    free (``T#1m30s`` is written many ways): the check holds them to the request."""
    if numbers is None:
        return LITERAL_PATTERN
    # number texts are digits and ".": only "." needs escaping
    nums = "|".join(n.replace(".", r"\.") for n in numbers)
    return (rf"^(TRUE|FALSE|-?({nums})|(T|TIME|LTIME)#-?{_DURATION}"
            rf"|'[^'$\\\"]*')$")


def _literal_rule(numbers: Sequence[str] | None) -> list[str]:
    if numbers is None:
        return ['literal: INT | BASED | REAL | TIME | STRING | "TRUE" | "FALSE"']
    return [f"NUMBER: {_alt(sorted(numbers, key=len, reverse=True))}",
            'literal: NUMBER | TIME | STRING | "TRUE" | "FALSE"']


def body_grammar(head: str, pou: Mapping[str, Any], after: Sequence[Member] = (),
                 numbers: Sequence[str] | None = None,
                 fixed: Collection[str] = ()) -> str | None:
    """The Lark grammar for the whole answer: ``head`` (the text up to and including
    ``"body":"``) as written, a body over ``pou``'s declarations, the closing quote, the
    properties the schema puts after the body (``after``: key, schema, required; compact
    JSON, in order) and the brace. None when the declarations cannot carry a grammar (no
    usable name: the validators will say why). A VAR_INPUT is read, never assigned.
    ``numbers``: the only numeric literals the body may write (the request's stated
    values, ``st_request.literals``); None: any. ``fixed``: variables read, never assigned
    (the setpoints code declared from the request's values)."""
    fixed_upper = {f.upper() for f in fixed}
    plain: list[str] = []      # variables used as values
    writable: list[str] = []   # ... and as assignment targets (not VAR_INPUT)
    arrays: list[str] = []
    integers: list[str] = []   # FOR loop counters
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
        elif _is_array(vtype):
            arrays.append(name)
        else:
            plain.append(name)
            if v.get("section") != "VAR_INPUT" and name.upper() not in fixed_upper:
                writable.append(name)
                if _is_integer_like(vtype):
                    integers.append(name)
    pou_name = str(pou.get("name", ""))
    if str(pou.get("pou_type", "")).upper() == "FUNCTION" and pou_name.upper() not in seen:
        plain.append(pou_name)
        writable.append(pou_name)
    rules = ["start: HEAD gap? block TAIL tail",
             f"HEAD: {_lit(head)}",
             'TAIL: "\\""',
             "tail: " + " ".join(_member(*m) for m in after) + ' "}"',
             f"function: {_alt(sorted(STANDARD_FUNCTIONS))} | CONVERSION",
             f"CONVERSION: {_conversions()}",
             *_literal_rule(numbers),
             ]
    statements = ["assign", "if_stmt", "case_stmt", "while_stmt", "repeat_stmt",
                  '"RETURN" sp? ";"', '"EXIT" sp? ";"']
    if integers:
        rules += [f"counter: {_alt(integers)}",
                  'for_stmt: "FOR" sp counter sp? ":=" sp? expr sp "TO" sp expr '
                  '(sp "BY" sp expr)? sp "DO" gap block "END_FOR" sp? ";"']
        statements.append("for_stmt")
    values = ["variable"] if plain else []
    targets = ["writable"] if writable else []
    if plain:
        rules.append(f"variable: {_alt(plain)}")
    if writable:
        rules.append(f"writable: {_alt(writable)}")
    if arrays:
        rules.append(f"array: {_alt(arrays)}")
        values.append('array sp? "[" sp? expr sp? "]"')
        targets.append('array sp? "[" sp? expr sp? "]"')
    calls = []
    for fb, names in sorted(instances.items()):
        key = fb.lower()
        ins, outs = list(FB_INPUTS[fb]), list(FB_OUTPUTS[fb])
        rules += [f"inst_{key}: {_alt(names)}",
                  f"in_{key}: {_alt(ins)}",
                  f"out_{key}: {_alt(outs)}",
                  f'arg_{key}: in_{key} sp? ":=" sp? expr'
                  + (f' | out_{key} sp? "=>" sp? target' if writable or arrays else ""),
                  f'call_{key}: inst_{key} sp? "(" sp? (arg_{key} (sp? "," sp? arg_{key})*)? '
                  'sp? ")"']
        calls.append(f"call_{key}")
        values.append(f'inst_{key} "." (in_{key} | out_{key})')
        targets.append(f'inst_{key} "." in_{key}')
    if not values:
        return None
    rules.append(f"value: {' | '.join(values)}")
    if targets:
        rules += [f"target: {' | '.join(targets)}",
                  'assign: target sp? ":=" sp? expr sp? ";"']
    else:   # nothing to assign (inputs only): calls and control flow remain
        statements.remove("assign")
    if calls:
        rules.append(f"call: {' | '.join(calls)}")
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
    """When ``text`` (an answer so far) has reached its body: the head (up to and including
    ``"body":"``) and the POU object it declares; else None."""
    cut = text.find(BODY_MARK)
    if cut < 0:
        return None
    try:
        pou = json.loads(text[:cut] + '"body":""}')
    except json.JSONDecodeError:
        return None
    return (text[:cut + len(BODY_MARK)], pou) if isinstance(pou, dict) else None
