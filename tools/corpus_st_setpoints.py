"""A corpus answer in the form rung serves it: the values the request states held by the
setpoints code declares (``daemon/tasks/st/request.py``: ``declared``), read by the body by name.

An archetype writes its POU its own way: a threshold as a literal in the body (``rLevel >
70.0``, ``PT := T#3S``) or as a variable with that initial value. Where rung writes the
request's setpoints into the answer, the sample must read them the same way: such a
variable is renamed to the setpoint (its declaration is the setpoint's), such a literal is
replaced by the setpoint's name. A sample whose POU does not hold a stated value that way
(it writes 70 % as 0.7, or assigns the variable that holds it) cannot be put in that form:
``None``, and the caller draws another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rung.daemon.tasks.st import request as st_request
from rung.daemon.tasks.st.pou import assigned_names, render_pou

# a TIME literal or a number in ST (what a body writes for a stated value)
_LITERAL = re.compile(r"(?<![\w#.])(?:(?:T|TIME|LTIME)#(-?[0-9_.a-zA-Z]+)"
                      r"|(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?))(?![\w#])")


def _seconds(text: str) -> float:
    return round(st_request.time_seconds(text), 6)


def _value(setpoint: Mapping[str, str]) -> float:
    if setpoint["type"] == "TIME":
        return _seconds(setpoint["initial"][2:])
    return float(setpoint["initial"])


def _holds(setpoint: Mapping[str, str], literal: re.Match[str]) -> bool:
    """Whether a literal in the body writes the setpoint's value (a TIME for a TIME)."""
    time, number = literal.group(1), literal.group(2)
    if setpoint["type"] == "TIME":
        return time is not None and _seconds(time) == _value(setpoint)
    return number is not None and float(number) == _value(setpoint)


def _rename(code: str, old: str, new: str) -> str:
    return re.sub(rf"(?<![\w.#]){re.escape(old)}(?!\w)", new, code, flags=re.I)


def _replace_literals(body: str, setpoint: Mapping[str, str]) -> tuple[str, int]:
    """``body`` with each literal of the setpoint's value replaced by its name, outside
    comments; and how many were."""
    out, count, at = [], 0, 0
    for c in [*st_request.COMMENT.finditer(body), None]:
        end = len(body) if c is None else c.start()
        part = body[at:end]
        count += sum(1 for m in _LITERAL.finditer(part) if _holds(setpoint, m))
        out.append(_LITERAL.sub(
            lambda m: setpoint["name"] if _holds(setpoint, m) else m.group(0), part))
        if c is not None:
            out.append(c.group(0))
            at = c.end()
    return "".join(out), count


def in_served_form(data: Mapping[str, Any], output: Mapping[str, Any]
                   ) -> dict[str, Any] | None:
    """``output`` with its variables as rung declares them for ``data`` (the stated
    interface, then the setpoints, then the POU's own) and its body reading the setpoints;
    None where the POU does not hold a stated value in a form that can be renamed."""
    interface, setpoints = st_request.declared(data)
    chosen = st_request.pou(data)   # code's type and name where the request leaves them
    if chosen is not None:
        output = {**output, "pou_type": chosen[0], "name": chosen[1]}
    if not setpoints:
        return dict(output)
    body = str(output["body"])
    assigned = {a.upper() for a in assigned_names(render_pou(output))}
    fixed = {v["name"].upper() for v in interface}
    own = [dict(v) for v in output["variables"] if v["name"].upper() not in fixed]
    for sp in setpoints:
        holder = _holder(own, sp)
        if any(v["name"].upper() == sp["name"].upper() and v is not holder for v in own):
            return None   # the POU's own variable has the name (serving never lets it)
        if holder is not None:
            if holder["name"].upper() in assigned:
                return None
            own.remove(holder)
            body = _rename(body, holder["name"], sp["name"])
            continue
        body, count = _replace_literals(body, sp)
        if count == 0:
            return None
    return {**output, "variables": [*interface, *setpoints, *own], "body": body}


def _holder(own: list[dict[str, Any]], setpoint: Mapping[str, str]) -> dict[str, Any] | None:
    """The POU's own variable declared with the setpoint's type and value, if any."""
    for v in own:
        m = _LITERAL.fullmatch(str(v.get("initial") or ""))
        if m is not None and v["type"] == setpoint["type"] and _holds(setpoint, m):
            return v
    return None
