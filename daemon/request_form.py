"""The request form every adapter reads: a JSON object with the task's ``input`` and the
request's own fields (docs/contract.md), read at the edge into the scheduler's ``Request``
or refused with the code and message its answer carries.

``decode`` takes the raw bytes (size under the adapter's own limit, named by its config key;
UTF-8; JSON; an object); ``read`` takes the object for one task: every field's type and
value, a known task, the ``output_formats`` the task offers, and the task's own input
checks (``Task.check_input``: duplicate point names, a POU named like an ST keyword ...),
so that a bad input is answered ``bad_request`` before it takes a place in the queue. An
adapter adds the fields only it reads (MQTT's ``reply_to`` and ``client``) as ``Field``
rules of its own; where the answer goes stays with the adapter.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rung.daemon.envelope import OUTPUT_FORMATS
from rung.daemon.request import Request
from rung.daemon.tasks.task import TaskError
from rung.daemon.text import surrogate_path, text_problem

MAX_ID = 256


@dataclass(frozen=True)
class Field:
    """One optional field of the form: its JSON types, what it must be (for the message),
    and for a string why a value cannot be used (None: usable)."""

    types: tuple[type, ...]
    what: str
    problem: Callable[[str], str | None] = text_problem   # echoed in answers and logs
    nullable: bool = False   # an explicit null is checked too (not skipped)


def _id_problem(v: str) -> str | None:
    return f"is longer than {MAX_ID} characters" if len(v) > MAX_ID else text_problem(v)


# the fields of every adapter's form, beside ``input`` and ``output_formats``
FIELDS: dict[str, Field] = {
    "id": Field((str,), f"a string of at most {MAX_ID} characters", _id_problem),
    "session": Field((str,), "a string"),
    "max_tokens": Field((int,), "an integer >= 1"),
    "temperature": Field((int, float), "a number >= 0"),
    "top_p": Field((int, float), "a number in (0, 1]"),
    "top_k": Field((int,), "an integer >= 0"),
    "seed": Field((int,), "an integer"),
}


@dataclass(frozen=True)
class Refused:
    """A request refused at the edge: its answer's code and message; ``doc`` the request
    object as far as it was read ({} when it was not one), for the adapter's reply."""

    code: str
    message: str
    doc: Mapping[str, Any]


@dataclass(frozen=True)
class Form:
    """A request read: what the scheduler runs, its own name (``id``) and the extra answer
    forms it asked for."""

    request: Request
    id: str | None
    output_formats: tuple[str, ...]
    doc: Mapping[str, Any]


def peek(payload: bytes, limit: int | None = None) -> dict[str, Any]:
    """The payload as a JSON object, or {} (too large, not JSON, not an object)."""
    if limit is not None and len(payload) > limit:
        return {}
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):   # also an integer past Python's digit limit
        return {}
    return doc if isinstance(doc, dict) else {}


def decode(payload: bytes, limit: int, limit_key: str) -> dict[str, Any] | Refused:
    """The request object in ``payload``, or why there is none (``too_large`` names
    ``limit_key``, the adapter's config key for ``limit``)."""
    if len(payload) > limit:
        return Refused("too_large", f"payload of {len(payload)} bytes exceeds the limit of "
                       f"{limit} ({limit_key})", {})
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        return Refused("bad_json", f"payload is not UTF-8 (byte {e.start})", {})
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:  # also an integer past Python's digit limit
        return Refused("bad_json", f"payload is not JSON ({e})"[:300], {})
    if not isinstance(doc, dict):
        return Refused("bad_request", "payload must be a JSON object, got "
                       f"{type(doc).__name__}", {})
    return doc


def type_error(doc: Mapping[str, Any], fields: Mapping[str, Field]) -> str | None:
    """The first field of a request object with a wrong type or value, as a message."""
    known = {"input", "output_formats", *fields}
    unknown = sorted(set(doc) - known)
    if unknown:
        name = unknown[0].encode("utf-8", "backslashreplace").decode("utf-8")
        return f"unknown field {name!r} (known: {', '.join(sorted(known))})"
    if "input" not in doc:
        return "missing field 'input' (the task's input object)"
    if not isinstance(doc["input"], dict):
        return "'input' must be a JSON object"
    formats = doc.get("output_formats")
    if formats is not None and (not isinstance(formats, list) or any(
            not isinstance(f, str) or f not in OUTPUT_FORMATS for f in formats)):
        return (f"'output_formats' must be a list of {', '.join(sorted(OUTPUT_FORMATS))}, "
                f"got {formats!r}")[:300]
    where = surrogate_path(doc["input"], "input")
    if where is not None:
        return (f"'{where}' holds a lone surrogate (a \\uD800-\\uDFFF escape without its "
                "pair): not text; send the character itself or a valid escape pair")
    for key, rule in fields.items():
        if key not in doc or (doc[key] is None and not rule.nullable):
            continue
        if isinstance(doc[key], bool) or not isinstance(doc[key], rule.types):
            return f"'{key}' must be {rule.what}, got {type(doc[key]).__name__}"
        v: Any = doc[key]
        if isinstance(v, str):
            why = rule.problem(v)
            if why is not None:
                return f"'{key}' {why}; it must be {rule.what}"
            continue
        bad = ((key == "max_tokens" and v < 1)
               or (key == "temperature" and not 0 <= v <= sys.float_info.max)
               or (key == "top_p" and not (0 < v <= 1))
               or (key == "top_k" and v < 0)
               or (key == "seed" and not 0 <= v < 2**63))
        if bad:
            return f"'{key}' must be {rule.what}, got {v!r}"[:300]
    return None


def own_id(doc: Mapping[str, Any]) -> str | None:
    """The request's ``id`` when it is one that can be echoed, else None."""
    pid = doc.get("id")
    return (pid if isinstance(pid, str) and text_problem(pid) is None and len(pid) <= MAX_ID
            else None)


def read(doc: Mapping[str, Any], task: str, tasks: Mapping[str, Any], *, received: float,
         deadline: float, ref: str, fields: Mapping[str, Field] = FIELDS) -> Form | Refused:
    """The request object for ``task`` as a ``Form``, or the ``Refused`` to answer it
    with. ``tasks``: the loaded tasks by name; ``fields``: the adapter's optional fields
    (``FIELDS`` and its own)."""
    problem = type_error(doc, fields)
    if problem is not None:
        return Refused("bad_request", problem, doc)
    if not task or "/" in task or task not in tasks:
        return Refused("unknown_task", f"no task named {task!r} (known: "
                       f"{', '.join(sorted(tasks))})", doc)
    formats = doc.get("output_formats") or []
    for f in formats:
        if OUTPUT_FORMATS[f] not in getattr(tasks[task], "validators", ()):
            return Refused("bad_request", f"'output_formats': {f} is not offered for task "
                           f"{task!r}", doc)
    check_input = getattr(tasks[task], "check_input", None)
    if check_input is not None:
        try:
            check_input(doc["input"])
        except TaskError as e:
            return Refused("bad_request", e.message, doc)
    request = Request(
        task=task, input=doc["input"], received=received, deadline=deadline, ref=ref,
        session=doc.get("session"), max_tokens=doc.get("max_tokens"),
        temperature=float(doc.get("temperature") or 0.0),
        top_p=float(doc.get("top_p") or 1.0), top_k=int(doc.get("top_k") or 0),
        seed=doc.get("seed"))
    return Form(request, own_id(doc), tuple(dict.fromkeys(formats)), doc)
