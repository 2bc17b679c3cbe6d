"""The body reads every setpoint: the grammar rules of a body in which at least one
statement reads one of the setpoints not read yet (``rules``), for ``grammar.body_grammar``.

A setpoint code declared from the request's values (``request.setpoints``) does nothing
unless the body reads it; a body that never reads one fails ``relevance``. The answer's
grammar is narrowed as the body is written (``shape``: asked after every ``;``): while a
setpoint's value is still unused, the body cannot close before a statement reads one of the
unused setpoints — in a condition, an operand, a function's argument, an FB's input, a
FOR bound or a CASE selector, at any depth (``IF`` inside ``IF``); with two or more left,
two top-level statements must (one statement may read several, and the rebuild after its
``;`` then finds none left). Once one is read the grammar is rebuilt over the ones left;
when none is left, or the body is closed, the body grammar is as before.

Every rule here is one of the body grammar's own rules restricted to the texts in which a
setpoint to read appears (the product of the grammar with "contains one of these names"),
with the same bounds on operands, so a body written under it is also a body of the
unrestricted grammar: narrowing, then widening again once every setpoint is read, never
refuses what was written. (A setpoint read only as an array index, inside a string
function or compared as a BOOL is not counted: such a body goes on until it reads one the
counted ways.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Body:
    """What the body grammar declares that a reading rule needs: the setpoints to read by
    class (numbers: ``nfix``'s names; durations: TIME variables), the classes that have
    assignment targets, the standard FB instances' inputs by class (FB type -> member ->
    class) and whether a FOR loop has a counter."""
    numbers: Sequence[str]
    durations: Sequence[str]
    targets: Sequence[str]
    inputs: Mapping[str, Mapping[str, str]]
    counters: bool


def _times(part: str, n: int) -> str:
    """``part`` exactly ``n`` times (nothing for none)."""
    return f"({part}){{{n}}}" if n else ""


def _up_to(part: str, n: int) -> str:
    """``part`` at most ``n`` times (nothing for none)."""
    return f"({part}){{0,{n}}}" if n else ""


def _chain_marked(unit: str, marked: str, op: str, most: int) -> str:
    """``unit (op unit){0,most-1}`` with one ``marked`` unit at least: one alternative per
    position of the first marked one."""
    return " | ".join(" ".join(p for p in (_times(f"{unit} {op}", i), marked,
                                           _up_to(f"{op} {unit}", most - 1 - i)) if p)
                      for i in range(most))


def _list_marked(item: str, marked: str, sep: str = 'sp? "," sp?') -> str:
    """``item (sep item)*`` with one ``marked`` item at least."""
    return f"({item} {sep})* {marked} ({sep} {item})*"


def _lit(text: str) -> str:
    return '"' + text + '"'


def rules(body: Body) -> list[str]:
    """The ``start`` of a body that reads one of ``body``'s setpoints, and the marked
    (``_r``) rules it needs; to be added to the body grammar in place of its ``start``.
    Empty when there is nothing to read."""
    if not (body.numbers or body.durations):
        return []
    # one setpoint left: a statement reads it. More: two statements read one each, so a
    # token that ends a statement and closes the body at once (``;"}``) cannot close it
    # before the rebuild after that statement's ``;`` asks for the setpoints still left
    two = "(stmt gap?)* stmt_r gap? " if len(body.numbers) + len(body.durations) > 1 else ""
    out = [f"start: HEAD gap? {two}block_r TAIL tail",
           "block_r: (stmt gap?)* stmt_r gap? (stmt gap?)*",
           'bop: sp boolop sp | sp? "&" sp?',
           "top: sp? ARITH sp?"]
    natom_r, tatom_r = ['"(" sp? nexpr_r sp? ")"', "nfunc_r"], ['"(" sp? texpr_r sp? ")"',
                                                                "tfunc_r"]
    if body.numbers:
        out.append("nread: " + " | ".join(_lit(n) for n in body.numbers))
        natom_r.insert(0, "nread")
    if body.durations:
        out.append("tread: " + " | ".join(_lit(n) for n in body.durations))
        tatom_r.insert(0, "tread")
    out += [
        # numbers: an operand of a chain of at most six
        "natom_r: " + " | ".join(natom_r),
        'nunary_r: natom_r | "-" sp? natom_r',
        "nexpr_r: " + _chain_marked("nunary", "nunary_r", "nop", 6),
        # the live side: in the operands before or after it, or inside it
        'latom_r: "(" sp? lexpr_r sp? ")" | nfunc_r',
        'lunary_r: latom_r | "-" sp? latom_r',
        "lexpr_r: " + " | ".join([
            "nunary_r nop (nunary nop)? lunary (nop nunary){0,3}",
            "nunary nop nunary_r nop lunary (nop nunary){0,3}",
            "(nunary nop){0,2} lunary_r (nop nunary){0,3}",
            *("(nunary nop){0,2} lunary " + _times("nop nunary", i) + " nop nunary_r "
              + _up_to("nop nunary", 2 - i) for i in range(3))]),
        "nargs_r: " + _list_marked("nexpr", "nexpr_r"),
        "targs_r: " + _list_marked("texpr", "texpr_r"),
        "bargs_r: " + _list_marked("bexpr", "bexpr_r"),
        "anyexpr_r: bexpr_r | nexpr_r | texpr_r",
        "nfunc_r: " + " | ".join([
            'nfname sp? "(" sp? nargs_r sp? ")"', 'minmax sp? "(" sp? nargs_r sp? ")"',
            *_sel("nexpr"),
            '"MUX" sp? "(" sp? nexpr_r (sp? "," sp? nexpr)+ sp? ")"',
            '"MUX" sp? "(" sp? nexpr (sp? "," sp? nexpr)* sp? "," sp? nexpr_r'
            ' (sp? "," sp? nexpr)* sp? ")"',
            'CONV_N sp? "(" sp? anyexpr_r sp? ")"']),
        # durations: an operand of a chain of at most four, a number scaling one
        "tatom_r: " + " | ".join(tatom_r),
        'tunary_r: tatom_r | "-" sp? tatom_r',
        "texpr_r: tunary_r (top (tunary | natom)){0,3} | "
        + " | ".join("tunary " + _times("top (tunary | natom)", i) + " top (tunary_r | natom_r) "
                     + _up_to("top (tunary | natom)", 2 - i) for i in range(3)),
        "tfunc_r: " + " | ".join([
            'minmax sp? "(" sp? targs_r sp? ")"', *_sel("texpr"),
            'tfname sp? "(" sp? texpr_r sp? "," sp? texpr sp? ")"',
            'tfname sp? "(" sp? texpr sp? "," sp? texpr_r sp? ")"',
            'tscale sp? "(" sp? texpr_r sp? "," sp? nexpr sp? ")"',
            'tscale sp? "(" sp? texpr sp? "," sp? nexpr_r sp? ")"',
            'CONV_T sp? "(" sp? anyexpr_r sp? ")"']),
        # conditions
        "compare_r: lexpr_r sp? CMP sp? nexpr | lexpr sp? CMP sp? nexpr_r"
        " | nexpr_r sp? CMP sp? lexpr | nexpr sp? CMP sp? lexpr_r"
        " | texpr_r sp? CMP sp? texpr | texpr sp? CMP sp? texpr_r",
        "bfunc_r: " + " | ".join([
            'bcmp sp? "(" sp? nargs_r sp? ")"', 'blogic sp? "(" sp? bargs_r sp? ")"',
            *_sel("bexpr"), 'CONV_B sp? "(" sp? anyexpr_r sp? ")"']),
        'batom_r: "(" sp? bexpr_r sp? ")" | compare_r | bfunc_r',
        'bunary_r: batom_r | "NOT" sp bunary_r | "NOT" sp? "(" sp? bexpr_r sp? ")"',
        "bexpr_r: " + _chain_marked("bunary", "bunary_r", "bop", 6),
        *_statements(body)]
    return out


def _sel(kind: str) -> list[str]:
    """``SEL(g, a, b)`` of class ``kind`` with the setpoint in one of its three arguments."""
    args = ["bexpr", kind, kind]
    out = []
    for i in range(3):
        marked = [f"{a}_r" if j == i else a for j, a in enumerate(args)]
        out.append('"SEL" sp? "(" sp? ' + ' sp? "," sp? '.join(marked) + ' sp? ")"')
    return out


def _statements(body: Body) -> list[str]:
    """``stmt_r``: a statement that reads a setpoint, in its own expressions or in a
    statement it holds."""
    end_if = '"END_IF" sp? ";"'
    out = [
        "if_r: " + " | ".join([
            f'"IF" sp bexpr_r sp "THEN" gap block elsif* else? {end_if}',
            f'"IF" sp bexpr sp "THEN" gap block_r elsif* else? {end_if}',
            f'"IF" sp bexpr sp "THEN" gap block elsif* elsif_r elsif* else? {end_if}',
            f'"IF" sp bexpr sp "THEN" gap block elsif* else_r {end_if}']),
        'elsif_r: "ELSIF" sp bexpr_r sp "THEN" gap block | "ELSIF" sp bexpr sp "THEN" gap'
        " block_r",
        'else_r: "ELSE" gap block_r',
        "case_r: " + " | ".join([
            '"CASE" sp nexpr_r sp "OF" gap case_item+ else? "END_CASE" sp? ";"',
            '"CASE" sp nexpr sp "OF" gap case_item* case_item_r case_item* else? "END_CASE"'
            ' sp? ";"',
            '"CASE" sp nexpr sp "OF" gap case_item+ else_r "END_CASE" sp? ";"']),
        'case_item_r: case_label (sp? "," sp? case_label)* sp? ":" gap? block_r',
        "while_r: " + " | ".join([
            '"WHILE" sp bexpr_r sp "DO" gap block "END_WHILE" sp? ";"',
            '"WHILE" sp bexpr sp "DO" gap block_r "END_WHILE" sp? ";"']),
        "repeat_r: " + " | ".join([
            '"REPEAT" gap block_r "UNTIL" sp bexpr sp? "END_REPEAT" sp? ";"',
            '"REPEAT" gap block "UNTIL" sp bexpr_r sp? "END_REPEAT" sp? ";"'])]
    statements = ["if_r", "case_r", "while_r", "repeat_r"]
    expr = {"b": "bexpr", "n": "nexpr", "t": "texpr"}
    assigns = [f'{k}target sp? ":=" sp? {e}_r sp? ";"' for k, e in expr.items()
               if k in body.targets]
    if assigns:
        out.append("assign_r: " + " | ".join(assigns))
        statements.append("assign_r")
    if body.counters:
        head = '"FOR" sp counter sp? ":=" sp? '
        parts = ["nexpr", 'sp "TO" sp', "nexpr"]
        fors = []
        for marked in ((0,), (2,)):
            p = [f"{x}_r" if i in marked else x for i, x in enumerate(parts)]
            fors.append(head + " ".join(p) + ' (sp "BY" sp nexpr)? sp "DO" gap block'
                        ' "END_FOR" sp? ";"')
        fors.append(head + 'nexpr sp "TO" sp nexpr sp "BY" sp nexpr_r sp "DO" gap block'
                    ' "END_FOR" sp? ";"')
        fors.append(head + 'nexpr sp "TO" sp nexpr (sp "BY" sp nexpr)? sp "DO" gap block_r'
                    ' "END_FOR" sp? ";"')
        out.append("for_r: " + " | ".join(fors))
        statements.append("for_r")
    calls = []
    for fb, members in sorted(body.inputs.items()):
        key = fb.lower()
        args = [f'{_lit(m)} sp? ":=" sp? {expr[k]}_r' for m, k in members.items() if k in expr]
        if not args:
            continue
        out += [f"arg_{key}_r: " + " | ".join(args),
                f'call_{key}_r: inst_{key} sp? "(" sp? '
                + _list_marked(f"arg_{key}", f"arg_{key}_r") + ' sp? ")"']
        calls.append(f'call_{key}_r sp? ";"')
    statements += calls
    out.append("stmt_r: " + " | ".join(statements))
    return out
