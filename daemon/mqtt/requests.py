"""Parse MQTT request messages at the edge into typed requests.

A recorded message (``journal.Entry``) becomes either an ``MqttRequest`` (the scheduler's
``Request`` with its journal row, reply address and answer forms) or a ``Failure`` that
already knows where to send its error: nothing raw travels past this module. The topic
names the task; the payload is the request form every adapter reads (``request_form``,
under ``mqtt.max_payload_bytes``), with MQTT's own fields ``reply_to`` and ``client``. The
reply address is resolved in this order: MQTT v5 Response Topic, the payload's
``reply_to``, then ``{base}/res/{client}`` with the payload's ``client`` or, without one,
rung's own client id. The answers themselves are the one envelope (``daemon/envelope.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rung.daemon import request_form as form
from rung.daemon.journal.store import Entry
from rung.daemon.request import Request
from rung.daemon.topics import topic_problem

# the request form's fields, and the two only MQTT reads: where to answer
FIELDS: dict[str, form.Field] = {
    **form.FIELDS,
    "reply_to": form.Field((str,), "a topic name without wildcards", topic_problem,
                           nullable=True),
    "client": form.Field((str,), "a topic level (no '/', '+' or '#')",
                         lambda v: topic_problem(v, level=True)),
}
LIMIT_KEY = "mqtt.max_payload_bytes"


@dataclass(frozen=True)
class Address:
    """Where and how to answer."""

    topic: str
    correlation: bytes | None
    id: str | None


@dataclass(frozen=True)
class MqttRequest:
    """A parsed request message: the ``request`` the scheduler runs, and what the intake
    needs to answer it (its journal row, reply address and extra answer forms)."""

    seq: int
    reply: Address
    request: Request
    output_formats: tuple[str, ...] = ()   # extra forms of the answer (OUTPUT_FORMATS)


@dataclass(frozen=True)
class Failure:
    """A request refused at the edge."""

    seq: int
    task: str | None
    code: str
    message: str
    reply: Address


def _valid_topic(topic: Any) -> bool:
    return isinstance(topic, str) and topic_problem(topic) is None


def claimed_id(payload: bytes, limit: int) -> str | None:
    """The payload's ``id`` when it is a string (for deduplication before parsing)."""
    if len(payload) > limit:
        return None
    value = form.peek(payload).get("id")
    return value if isinstance(value, str) else None


def reply_address(entry: Entry, base: str, client_id: str, doc: Mapping[str, Any]) -> Address:
    """The best reply address for a message (falls back to the default reply topic when
    the named one is unusable: an error must still reach someone)."""
    rid = form.own_id(doc)
    if rid is None and entry.correlation is not None:
        rid = entry.correlation.decode("utf-8", "replace")[:form.MAX_ID]
    if entry.response_topic and _valid_topic(entry.response_topic):
        return Address(entry.response_topic, entry.correlation, rid)
    reply_to = doc.get("reply_to")
    if isinstance(reply_to, str) and _valid_topic(reply_to):
        return Address(reply_to, entry.correlation, rid)
    client = doc.get("client")
    name = client if isinstance(client, str) and topic_problem(client, level=True) is None \
        else client_id
    return Address(f"{base}/res/{name}", entry.correlation, rid)


def parse(entry: Entry, base: str, client_id: str, tasks: Mapping[str, Any],
          max_payload: int, timeout_s: float) -> MqttRequest | Failure:
    """A recorded message as an ``MqttRequest``, or the ``Failure`` to answer it with."""
    task = entry.topic[len(base) + len("/req/"):] if entry.topic.startswith(
        f"{base}/req/") else ""
    deadline = entry.received + timeout_s
    if entry.expires is not None:   # MQTT v5 Message Expiry
        deadline = min(deadline, entry.expires)
    doc = form.decode(entry.payload, max_payload, LIMIT_KEY)
    read = doc if isinstance(doc, form.Refused) else form.read(
        doc, task, tasks, received=entry.received, deadline=deadline,
        ref=f"mqtt request {entry.seq}", fields=FIELDS)
    reply = reply_address(entry, base, client_id, read.doc)
    if isinstance(read, form.Refused):
        return Failure(entry.seq, task or None, read.code, read.message, reply)
    return MqttRequest(entry.seq, reply, read.request, read.output_formats)
