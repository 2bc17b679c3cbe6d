"""Parse request messages at the edge into typed requests, and build responses.

A recorded message (``journal.Entry``) becomes either an ``MqttRequest`` (the scheduler's
``Request`` with its journal row, reply address and answer forms) or a ``Failure`` that
already knows where to send its error: nothing raw travels past this module. The reply
address is resolved in this order: MQTT v5 Response Topic, the payload's ``reply_to``,
then ``{base}/res/{client}`` with the payload's ``client`` or, without one, rung's own
client id. The payload forms are the ones in docs/contract.md. A request's ``input`` is checked
against its task's input schema here too (``Task.check_input``: duplicate point names,
control characters in names, a POU named like an ST keyword ...), so that a bad input is
answered ``bad_request`` before it takes a place in the queue.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rung.daemon.mqtt.journal import Entry
from rung.daemon.mqtt.topics import surrogate_path, text_problem, topic_problem
from rung.daemon.request import Answer, Request
from rung.daemon.tasks.task import TaskError

_FIELDS = {"input", "id", "reply_to", "client", "session", "max_tokens", "temperature",
           "seed", "top_p", "top_k", "output_formats"}
# extra forms of an answer a request may ask for, and the validator its task must have
OUTPUT_FORMATS = {"plcopen_xml": "st"}
_MAX_ID = 256
_MAX_MESSAGE = 500


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


def peek(payload: bytes, limit: int | None = None) -> dict[str, Any]:
    """The payload as a JSON object, or {} (too large, not JSON, not an object)."""
    if limit is not None and len(payload) > limit:
        return {}
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):   # also an integer past Python's digit limit
        return {}
    return doc if isinstance(doc, dict) else {}


def claimed_id(payload: bytes, limit: int) -> str | None:
    """The payload's ``id`` when it is a string (for deduplication before parsing)."""
    if len(payload) > limit:
        return None
    value = peek(payload).get("id")
    return value if isinstance(value, str) else None


def reply_address(entry: Entry, base: str, client_id: str, doc: Mapping[str, Any]) -> Address:
    """The best reply address for a message (falls back to the default reply topic when
    the named one is unusable: an error must still reach someone)."""
    pid = doc.get("id")
    rid = (pid if isinstance(pid, str) and text_problem(pid) is None and len(pid) <= _MAX_ID
           else None)
    if rid is None and entry.correlation is not None:
        rid = entry.correlation.decode("utf-8", "replace")[:_MAX_ID]
    if entry.response_topic and _valid_topic(entry.response_topic):
        return Address(entry.response_topic, entry.correlation, rid)
    reply_to = doc.get("reply_to")
    if isinstance(reply_to, str) and _valid_topic(reply_to):
        return Address(reply_to, entry.correlation, rid)
    client = doc.get("client")
    name = client if isinstance(client, str) and topic_problem(client, level=True) is None \
        else client_id
    return Address(f"{base}/res/{name}", entry.correlation, rid)


def _string_problem(key: str, v: str) -> str | None:
    """Why a string field cannot be used (the broker's rules for topics and ids)."""
    if key == "reply_to":
        return topic_problem(v)
    if key == "client":
        return topic_problem(v, level=True)
    if key == "id" and len(v) > _MAX_ID:
        return f"is longer than {_MAX_ID} characters"
    return text_problem(v)   # id, session: echoed in answers, logs and MQTT properties


def _type_error(doc: Mapping[str, Any]) -> str | None:
    """The first field of a request object with a wrong type or value, as a message."""
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        name = unknown[0].encode("utf-8", "backslashreplace").decode("utf-8")
        return f"unknown field {name!r} (known: {', '.join(sorted(_FIELDS))})"
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
    checks: dict[str, tuple[tuple[type, ...], str]] = {
        "id": ((str,), f"a string of at most {_MAX_ID} characters"),
        "reply_to": ((str,), "a topic name without wildcards"),
        "client": ((str,), "a topic level (no '/', '+' or '#')"),
        "session": ((str,), "a string"),
        "max_tokens": ((int,), "an integer >= 1"),
        "temperature": ((int, float), "a number >= 0"),
        "top_p": ((int, float), "a number in (0, 1]"),
        "top_k": ((int,), "an integer >= 0"),
        "seed": ((int,), "an integer"),
    }
    for key, (types, what) in checks.items():
        if key not in doc or (doc[key] is None and key != "reply_to"):
            continue
        if isinstance(doc[key], bool) or not isinstance(doc[key], types):
            return f"'{key}' must be {what}, got {type(doc[key]).__name__}"
        v: Any = doc[key]
        if isinstance(v, str):
            why = _string_problem(key, v)
            if why is not None:
                return f"'{key}' {why}; it must be {what}"
            continue
        bad = ((key == "max_tokens" and v < 1)
               or (key == "temperature" and not 0 <= v <= sys.float_info.max)
               or (key == "top_p" and not (0 < v <= 1))
               or (key == "top_k" and v < 0)
               or (key == "seed" and not 0 <= v < 2**63))
        if bad:
            return f"'{key}' must be {what}, got {v!r}"[:300]
    return None


def parse(entry: Entry, base: str, client_id: str, tasks: Mapping[str, Any],
          max_payload: int, timeout_s: float) -> MqttRequest | Failure:
    """A recorded message as an ``MqttRequest``, or the ``Failure`` to answer it with."""
    task = entry.topic[len(base) + len("/req/"):] if entry.topic.startswith(
        f"{base}/req/") else ""

    def fail(code: str, message: str, doc: Mapping[str, Any] | None = None) -> Failure:
        reply = reply_address(entry, base, client_id, doc or {})
        return Failure(entry.seq, task or None, code, message, reply)

    if len(entry.payload) > max_payload:
        return fail("too_large", f"payload of {len(entry.payload)} bytes exceeds the limit "
                    f"of {max_payload} (mqtt.max_payload_bytes)")
    try:
        text = entry.payload.decode("utf-8")
    except UnicodeDecodeError as e:
        return fail("bad_json", f"payload is not UTF-8 (byte {e.start})")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:  # also an integer past Python's digit limit
        return fail("bad_json", f"payload is not JSON ({e})"[:300])
    if not isinstance(doc, dict):
        return fail("bad_request", f"payload must be a JSON object, got {type(doc).__name__}")
    problem = _type_error(doc)
    if problem is not None:
        return fail("bad_request", problem, doc)
    if not task or "/" in task or task not in tasks:
        return fail("unknown_task", f"no task named {task!r} (known: "
                    f"{', '.join(sorted(tasks))})", doc)
    formats = doc.get("output_formats") or []
    for f in formats:
        if OUTPUT_FORMATS[f] not in getattr(tasks[task], "validators", ()):
            return fail("bad_request", f"'output_formats': {f} is not offered for task "
                        f"{task!r}", doc)
    check_input = getattr(tasks[task], "check_input", None)
    if check_input is not None:
        try:
            check_input(doc["input"])
        except TaskError as e:
            return fail("bad_request", e.message, doc)
    deadline = entry.received + timeout_s
    if entry.expires is not None:
        deadline = min(deadline, entry.expires)
    request = Request(
        task=task, input=doc["input"], received=entry.received, deadline=deadline,
        ref=f"mqtt request {entry.seq}", session=doc.get("session"),
        max_tokens=doc.get("max_tokens"), temperature=float(doc.get("temperature") or 0.0),
        top_p=float(doc.get("top_p") or 1.0), top_k=int(doc.get("top_k") or 0),
        seed=doc.get("seed"))
    return MqttRequest(entry.seq, reply_address(entry, base, client_id, doc), request,
                       tuple(dict.fromkeys(formats)))


def error_response(reply: Address, task: str | None, code: str, message: str,
                   extra: Mapping[str, Any] | None = None) -> bytes:
    """The error form; ``extra`` adds fields (``invalid_output``: output and validation)."""
    if len(message) > _MAX_MESSAGE:   # messages may quote the input; keep them readable
        message = message[:_MAX_MESSAGE - 3] + "..."
    return json.dumps({"id": reply.id, "task": task, "ok": False,
                       "error": {"code": code, "message": message}, **(extra or {})},
                      ensure_ascii=False).encode("utf-8", "backslashreplace")


def ok_response(reply: Address, task: str, output: Any, validation: Any,
                usage: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> bytes:
    """The answer form; ``extra`` adds fields (``output_formats``)."""
    return json.dumps({"id": reply.id, "task": task, "ok": True, "output": output,
                       "validation": validation, "usage": dict(usage), **(extra or {})},
                      ensure_ascii=False).encode("utf-8", "backslashreplace")


# what an answer's usage carries on the wire: the core always, the rest where measured
USAGE_CORE = ("prompt_tokens", "completion_tokens", "cached_tokens", "ttft_ms")
# fast decoding: decode steps, draft tokens offered, of them grammar-forced, confirmed;
# receipt to the first token (queue included; ttft_ms is the engine's part)
USAGE_KEYS = (*USAGE_CORE, "steps", "drafted_tokens", "forced_tokens", "accepted_tokens",
              "first_token_ms")


def wire_usage(a: Answer) -> dict[str, Any]:
    """An answer's ``usage`` as every adapter sends it, ``total_ms`` from receipt."""
    usage = {k: a.usage.get(k) for k in USAGE_KEYS if k in a.usage or k in USAGE_CORE}
    usage["total_ms"] = round((time.time() - a.request.received) * 1000, 1)
    return usage


def error_extra(a: Answer, usage: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a failed answer carries beside its error: an answer that failed a
    semantic check comes with its output and validation (the engineer sees why it is not
    trusted); one that reached the model with its usage and tries."""
    extra: dict[str, Any] = ({"output": a.output, "validation": a.validation}
                             if a.code == "invalid_output" else {})
    if a.usage:   # it reached the model (truncated, invalid_output, internal)
        extra["usage"] = dict(usage)
        extra["attempts"] = a.attempts
    return extra
