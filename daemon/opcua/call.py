"""A method call of rung's OPC UA server read into a request: the server's own entry.

The argument is the task's input object as JSON, or the whole request form
(``{"input": {...}, "max_tokens": ..., "id": ...}``, ``daemon/request_form.py``), held to
``opcua_server.max_request_bytes``. The method names the task. A call is journaled as its
canonical form (the input wrapped, an ``id`` assigned when the journal keeps answers and it
has none, keys sorted), so that the same call repeated is the same row; its journal address
is ``opcua:{task}``. ``reply_to`` and ``client`` (MQTT's reply fields) are accepted and not
used: a call is answered to its caller.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncua import ua

from rung.daemon import request_form as form
from rung.daemon.journal.store import OPCUA_PREFIX, Entry

LIMIT_KEY = "opcua_server.max_request_bytes"
FIELDS: dict[str, form.Field] = {
    **form.FIELDS,
    "reply_to": form.Field((str,), "a string (a call is answered to its caller)",
                           nullable=True),
    "client": form.Field((str,), "a string (a call is answered to its caller)"),
}
# the canonical form (an id added, the input wrapped) may be this much longer than the text
# the client sent, which alone is held to the limit
_CANONICAL_ROOM = 1024


@dataclass(frozen=True)
class Call:
    """A call read: the request form, and the canonical payload it is journaled as."""

    task: str
    payload: bytes
    form: form.Form

    @property
    def address(self) -> str:
        return address(self.task)


def address(task: str) -> str:
    """A call's journal address."""
    return OPCUA_PREFIX + task


def task_of(row: Entry) -> str:
    """The task a journaled call named (the address's last part: rows of an earlier rung
    wrote ``opcua:{base}/req/{task}``)."""
    return row.topic[len(OPCUA_PREFIX):].rpartition("/")[2]


def argument_text(argument: Any) -> str | form.Refused:
    """A call's argument as text, or why it is not one (the type that was expected and
    the one it was)."""
    want = "request: expected a String (the request as JSON), got "
    if isinstance(argument, ua.Variant):
        kind = argument.VariantType.name
        if argument.is_array:
            return form.Refused("bad_request", f"{want}an array of {kind}", {})
        if argument.VariantType != ua.VariantType.String:
            return form.Refused("bad_request", f"{want}{kind}", {})
        argument = argument.Value
    if not isinstance(argument, str):
        return form.Refused("bad_request", want + (
            "a null String" if argument is None else type(argument).__name__), {})
    return argument


def canonical(text: str, limit: int, assign_id: bool) -> bytes | form.Refused:
    """The call's request form as canonical JSON bytes (the input wrapped, an id assigned
    with ``assign_id`` when it has none); text that is not an object is kept as it came,
    for ``read`` to refuse."""
    payload = text.encode("utf-8", "surrogatepass")
    if len(payload) > limit:
        return form.Refused("too_large", f"request of {len(payload)} bytes exceeds the "
                            f"limit of {limit} ({LIMIT_KEY})", {})
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return payload
    if not isinstance(doc, dict):
        return payload
    if "input" not in doc:   # the input object alone
        doc = {"input": doc}
    if assign_id and doc.get("id") is None:
        doc["id"] = f"opcua-{uuid.uuid4().hex}"
    return json.dumps(doc, ensure_ascii=False, sort_keys=True,
                      separators=(",", ":")).encode("utf-8", "surrogatepass")


def read(task: str, payload: bytes, tasks: Mapping[str, Any], *, limit: int,
         received: float, deadline: float, seq: int) -> Call | form.Refused:
    """A call's canonical payload for ``task`` as a ``Call``, or why it is refused."""
    doc = form.decode(payload, limit + _CANONICAL_ROOM, LIMIT_KEY)
    if isinstance(doc, form.Refused):
        return doc
    read = form.read(doc, task, tasks, received=received, deadline=deadline,
                     ref=f"opcua call {seq}", fields=FIELDS)
    return read if isinstance(read, form.Refused) else Call(task, payload, read)


def claimed_id(payload: bytes, limit: int) -> str | None:
    """The canonical payload's ``id`` (for deduplication)."""
    value = form.peek(payload, limit + _CANONICAL_ROOM).get("id")
    return value if isinstance(value, str) else None
