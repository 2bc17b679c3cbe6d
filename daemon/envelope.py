"""The answer envelope: the one JSON form in which every adapter (MQTT, rung's OPC UA
server) answers a request, and the extra forms a request may ask for (``output_formats``).

::

    {"id": ..., "task": ..., "ok": true, "output": {...}, "validation": {...},
     "usage": {...}, "attempts": n, "output_formats": {...}}          an answer
    {"id": ..., "task": ..., "ok": false, "error": {"code": ..., "message": ...},
     "output": ..., "validation": ..., "usage": ..., "attempts": n}   a refusal or failure

``id`` is the request's own name for itself (the adapter says which: the payload's ``id``,
MQTT v5 Correlation Data, the id an OPC UA call was given). Where the answer goes is the
adapter's; what it says is this module's. Below every adapter, above the scheduler's
``Answer`` only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from rung.daemon.plant.plcopen import to_plcopen_xml
from rung.daemon.request import Answer
from rung.engines.errors import RungError

# extra forms of an answer a request may ask for, and the validator its task must have
OUTPUT_FORMATS = {"plcopen_xml": "st"}
MAX_MESSAGE = 500   # an error message may quote the input; kept readable

# what an answer's usage carries: the core always, the rest where measured
USAGE_CORE = ("prompt_tokens", "completion_tokens", "cached_tokens", "ttft_ms")
# fast decoding: decode steps, draft tokens offered, of them grammar-forced, confirmed;
# receipt to the first token (queue included; ttft_ms is the engine's part)
USAGE_KEYS = (*USAGE_CORE, "steps", "drafted_tokens", "forced_tokens", "accepted_tokens",
              "first_token_ms")


def error_response(id: str | None, task: str | None, code: str, message: str,
                   extra: Mapping[str, Any] | None = None) -> bytes:
    """The error form; ``extra`` adds fields (``invalid_output``: output and validation)."""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE - 3] + "..."
    return json.dumps({"id": id, "task": task, "ok": False,
                       "error": {"code": code, "message": message}, **(extra or {})},
                      ensure_ascii=False).encode("utf-8", "backslashreplace")


def ok_response(id: str | None, task: str, output: Any, validation: Any,
                usage: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> bytes:
    """The answer form; ``extra`` adds fields (``attempts``, ``output_formats``)."""
    return json.dumps({"id": id, "task": task, "ok": True, "output": output,
                       "validation": validation, "usage": dict(usage), **(extra or {})},
                      ensure_ascii=False).encode("utf-8", "backslashreplace")


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


def answer_payload(id: str | None, a: Answer, output_formats: tuple[str, ...], edition: int,
                   usage: Mapping[str, Any] | None = None) -> bytes:
    """A scheduler's answer in the envelope: the ok form with its usage, tries and the
    extra forms the request asked for (``output_formats``; ``edition``: ``st.edition``), or
    the error form with what a failed answer carries (``error_extra``). ``usage``: the
    answer's wire usage when the caller has it already."""
    usage = wire_usage(a) if usage is None else usage
    if not a.ok:
        return error_response(id, a.request.task, a.code or "internal", a.message,
                              error_extra(a, usage))
    extra: dict[str, Any] = {"attempts": a.attempts}
    if "plcopen_xml" in output_formats:
        try:
            extra["output_formats"] = {"plcopen_xml": to_plcopen_xml(a.output, edition)}
        except RungError as e:   # the answer stands; the extra form says why it is missing
            extra["output_formats"] = {"plcopen_xml": None, "error": e.message}
    return ok_response(id, a.request.task, a.output, a.validation, usage, extra)
