"""A Lark grammar's expressions bounded in how deep they nest: each rule of the expression
system is written once per level (``nexpr``, ``nexpr_d1``, ... ``nexpr_d4``); what a rule
takes inside a ``"("`` or ``"["`` it writes is one level deeper, and at the last level no
alternative that opens one is left; from ``SHORT_FROM`` on, its repetitions are shorter.
``SQRT(ABS(x - (y * 2.0)))`` nests three deep; a model that opens
``ROL(10 - (INT_TO_DINT(ROL(...`` without end has to close at the bound, as it has to end
an expression after six operands.

The expression system is the rules on a cycle with the roots (``bexpr``, ``nexpr``, ...):
what they use and that uses nothing of them (a variable's name, ``number``, ``sp``) is one
rule for all levels, and what uses them from outside (a statement, an assignment's target)
takes them at level 0. An alternative that reaches no end at a level is left out there; a
grammar whose level 0 would lose a rule is handed back as it was (a bound that refused what
the grammar accepts would be a new refusal, not a bound).
"""

from __future__ import annotations

import re
from collections.abc import Collection

MAX_DEPTH = 4   # the corpus nests at most three deep; engineers' ST rarely more
# from this level on, a repetition ``{m,n}`` of the system's rules repeats at most this often
# (an expression inside two parentheses chains three operands, not six)
SHORT_FROM, SHORT = 2, 2
_REPEAT = re.compile(r"\{(\d+),(\d+)\}")

_RULE = re.compile(r"([a-z][a-z0-9_]*)\s*:(.*)", re.S)
_LEXEME = re.compile(r'"(?:[^"\\]|\\.)*"|/(?:[^/\\]|\\.)*/|\{[0-9,]*\}|[A-Za-z_][A-Za-z0-9_]*'
                     r"|\s+|.")
_OPENS, _CLOSES = ('"("', '"["'), ('")"', '"]"')

Alternative = list[str]   # a rule's alternative as lexemes, blanks included


def _rules(text: str) -> tuple[list[str | tuple[str, str]], dict[str, str]]:
    """The grammar's lines, a rule (with its continuation lines) as (name, body), and the
    bodies by name."""
    out: list[str | tuple[str, str]] = []
    bodies: dict[str, str] = {}
    for line in text.split("\n"):
        if line[:1].isspace() and out and isinstance(out[-1], tuple) and line.strip():
            name, body = out[-1]
            out[-1] = (name, f"{body} {line.strip()}")
            bodies[name] = out[-1][1]
            continue
        m = _RULE.fullmatch(line)
        if m:
            out.append((m.group(1), m.group(2).strip()))
            bodies[m.group(1)] = out[-1][1]
        else:
            out.append(line)
    return out, bodies


def _alternatives(body: str) -> list[Alternative]:
    """A rule's body split at its top-level ``|``."""
    alts: list[Alternative] = [[]]
    group = 0
    for lex in _LEXEME.findall(body):
        if lex == "(":
            group += 1
        elif lex == ")":
            group -= 1
        if lex == "|" and group == 0:
            alts.append([])
        else:
            alts[-1].append(lex)
    return alts


def _refs(alts: list[Alternative], rules: Collection[str]) -> set[str]:
    return {lex for alt in alts for lex in alt if lex in rules}


def _cycle(parsed: dict[str, list[Alternative]], roots: Collection[str]) -> set[str]:
    """The rules reachable from ``roots`` that reach back to them."""
    refs = {n: _refs(alts, parsed) for n, alts in parsed.items()}

    def reach(start: Collection[str], edges: dict[str, set[str]]) -> set[str]:
        seen, todo = set(start), list(start)
        while todo:
            for m in edges.get(todo.pop(), ()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    back: dict[str, set[str]] = {}
    for n, ms in refs.items():
        for m in ms:
            back.setdefault(m, set()).add(n)
    roots = [r for r in roots if r in parsed]
    return reach(roots, refs) & reach(roots, back)


def _name(rule: str, level: int) -> str:
    return rule if level == 0 else f"{rule}_d{level}"


def _at(alternatives: list[Alternative], level: int, system: Collection[str],
        depth: int) -> list[Alternative]:
    """A rule's alternatives at ``level``: each name of the system at the level it stands at
    (one deeper inside each bracket the alternative writes), those that would go past
    ``depth`` left out."""
    alts = []
    for alt in alternatives:
        inside, out, dead = 0, [], False
        for lex in alt:
            inside += (lex in _OPENS) - (lex in _CLOSES)
            m = _REPEAT.fullmatch(lex)
            if m and level >= SHORT_FROM:
                low = int(m.group(1))
                lex = f"{{{low},{min(int(m.group(2)), max(low, SHORT))}}}"
            if lex in system:
                at = level + inside
                dead |= at > depth
                lex = _name(lex, at)
            out.append(lex)
        if not dead:
            alts.append(out)
    return alts


def leveled(text: str, roots: Collection[str], depth: int = MAX_DEPTH) -> str:
    """``text`` (a Lark grammar) with the expression system of ``roots`` nesting at most
    ``depth`` parentheses or brackets deep."""
    lines, bodies = _rules(text)
    parsed = {n: _alternatives(b) for n, b in bodies.items()}
    system = _cycle(parsed, roots)
    # (rule, level) -> its alternatives there, each lexeme a name at its level
    table = {(rule, level): _at(parsed[rule], level, system, depth)
             for rule in system for level in range(depth + 1)}
    names = {_name(r, lv): (r, lv) for r, lv in table}
    alive: set[str] = set()
    changed = True
    while changed:   # a rule lives when one of its alternatives uses only living rules
        changed = False
        for n, key in names.items():
            if n not in alive and any(all(x not in names or x in alive for x in a)
                                      for a in table[key]):
                alive.add(n)
                changed = True
    if any(r not in alive for r in system):
        return text

    def living(alts: list[Alternative]) -> list[Alternative]:
        return [a for a in alts if all(x not in names or x in alive for x in a)]

    # what uses the system from outside takes it at level 0, one deeper inside a bracket
    # it writes (an assignment's target ``aLog[...]``)
    users = {rule: living(_at(alts, 0, system, depth)) for rule, alts in parsed.items()
             if rule not in system and _refs(alts, system)}
    emitted: dict[str, str] = {}
    todo = sorted({*system, *(x for alts in users.values() for a in alts for x in a
                              if x in names)})
    while todo:   # the levels a rule at level 0 reaches, each once
        n = todo.pop()
        if n in emitted:
            continue
        alts = living(table[names[n]])
        emitted[n] = " | ".join("".join(a).strip() for a in alts)
        todo += [x for a in alts for x in a if x in names and x not in emitted]
    out = []
    for line in lines:
        if isinstance(line, str):
            out.append(line)
        elif line[0] in system:
            out += [f"{n}: {emitted[n]}" for n in sorted(emitted) if names[n][0] == line[0]]
        elif line[0] in users:
            out.append(f"{line[0]}: " + " | ".join("".join(a).strip() for a in users[line[0]]))
        else:
            out.append(f"{line[0]}: {line[1]}")
    return "\n".join(out)
