"""The answer envelope every adapter answers in (``daemon/envelope.py``): its two forms,
what a failed answer carries, and text that survives the wire. That MQTT and OPC UA answer
one request with the same envelope: tests/daemon/opcua/test_server_calls.py."""

from __future__ import annotations

import json
import time

from rung.daemon.envelope import answer_payload, error_response, ok_response
from rung.daemon.request import Answer, Request


def test_error_response_shape() -> None:
    body = json.loads(error_response("r1", "st_code", "busy", "queue full"))
    assert body == {"id": "r1", "task": "st_code", "ok": False,
                    "error": {"code": "busy", "message": "queue full"}}
    anon = json.loads(error_response(None, None, "bad_json", "m"))
    assert anon["id"] is None and anon["task"] is None


def test_ok_response_shape() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    raw = ok_response("r2", "st_code", {"code": "x := 1;"},
                      {"ok": True}, usage)
    assert json.loads(raw) == {"id": "r2", "task": "st_code", "ok": True,
                               "output": {"code": "x := 1;"}, "validation": {"ok": True},
                               "usage": usage}
    umlaut = ok_response(None, "st_code", "Ventil geöffnet", None, {})
    assert "geöffnet".encode() in umlaut


def test_responses_survive_lone_surrogates() -> None:
    reply = "a\ud800"
    for raw in (error_response(reply, "st_code", "internal", "m"),
                ok_response(reply, "st_code", "\udfff", None, {})):
        raw.decode("utf-8")                               # valid UTF-8 on the wire
        assert json.loads(raw)["id"] == "a\ud800"
    assert json.loads(ok_response(reply, "st_code", "\udfff", None, {}))["output"] == (
        "\udfff")


def test_error_response_extra_fields() -> None:
    reply = "x"
    body = json.loads(error_response(reply, "fault_tree", "invalid_output", "m",
                                     {"output": {"a": 1}, "validation": {"ok": False}}))
    assert body["ok"] is False and body["output"] == {"a": 1}
    assert body["validation"] == {"ok": False}


def test_a_failed_answer_carries_its_output_usage_and_tries() -> None:
    req = Request(task="fault_tree", input={}, received=time.time(), deadline=time.time() + 9)
    failed = Answer(req, False, "invalid_output", "gates not under the top event",
                    output={"top": "x"}, validation={"ok": False},
                    usage={"prompt_tokens": 4, "completion_tokens": 2}, attempts=3)
    body = json.loads(answer_payload("f1", failed, (), 3))
    assert (body["id"], body["ok"], body["error"]["code"], body["attempts"]) == (
        "f1", False, "invalid_output", 3)
    assert body["output"] == {"top": "x"} and body["usage"]["completion_tokens"] == 2
    refused = Answer(req, False, "busy", "queue full")   # never reached the model
    assert set(json.loads(answer_payload(None, refused, (), 3))) == {"id", "task", "ok",
                                                                     "error"}
