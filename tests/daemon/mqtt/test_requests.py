"""Edge parsing of request messages: the error code of each malformed form, the reply
address order, ids, deadlines, the parsed fields, and the response shapes."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from rung.daemon import envelope
from rung.daemon.journal.store import Entry
from rung.daemon.mqtt.requests import (
    Address,
    Failure,
    MqttRequest,
    claimed_id,
    parse,
)

BASE = "v1/site/rung/node1"
CLIENT_ID = "rung-node1"
DEFAULT_REPLY = f"{BASE}/res/{CLIENT_ID}"
TASKS: dict[str, Any] = {"st_code": object(), "fault_tree": object()}
MAX_PAYLOAD = 8192


def _entry(payload: bytes | dict[str, Any], topic: str = f"{BASE}/req/st_code", *,
           response_topic: str | None = None, correlation: bytes | None = None,
           received: float = 1000.0, expires: float | None = None) -> Entry:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return Entry(7, topic, raw, response_topic, correlation, received, expires)


def _parse(entry: Entry, timeout_s: float = 30.0) -> MqttRequest | Failure:
    return parse(entry, BASE, CLIENT_ID, TASKS, MAX_PAYLOAD, timeout_s)


def _ok(**fields: Any) -> dict[str, Any]:
    return {"input": {"spec": "x"}, **fields}


MALFORMED: list[tuple[str, bytes | dict[str, Any], str, str]] = [
    ("too_large", b'{"input": {"s": "' + b"a" * MAX_PAYLOAD + b'"}}', "too_large", ""),
    ("not_utf8", b'{"input": {"s": "\xff\xfe"}}', "bad_json", ""),
    ("not_json", b"input=1", "bad_json", ""),
    ("truncated", b'{"input": {"spec": "x"', "bad_json", ""),
    ("huge_int", b'{"input": {}, "seed": ' + b"9" * 5000 + b"}", "bad_json", ""),
    ("array", b'[{"input": {}}]', "bad_request", ""),
    ("string", b'"hello"', "bad_request", ""),
    ("number", b"42", "bad_request", ""),
    ("null", b"null", "bad_request", ""),
    ("missing_input", {"id": "a"}, "bad_request", "missing field 'input'"),
    ("input_list", {"input": [1, 2]}, "bad_request", "'input' must be a JSON object"),
    ("input_string", {"input": "text"}, "bad_request", "'input' must be a JSON object"),
    ("unknown_field", _ok(priority=1), "bad_request", "unknown field 'priority'"),
    ("id_int", _ok(id=5), "bad_request", "'id'"),
    ("id_too_long", _ok(id="x" * 257), "bad_request", "'id'"),
    ("max_tokens_0", _ok(max_tokens=0), "bad_request", "'max_tokens'"),
    ("max_tokens_str", _ok(max_tokens="5"), "bad_request", "'max_tokens'"),
    ("max_tokens_bool", _ok(max_tokens=True), "bad_request", "'max_tokens'"),
    ("max_tokens_float", _ok(max_tokens=5.0), "bad_request", "'max_tokens'"),
    ("temperature_neg", _ok(temperature=-1), "bad_request", "'temperature'"),
    ("temperature_nan_str", _ok(temperature="NaN"), "bad_request", "'temperature'"),
    ("temperature_nan", b'{"input": {}, "temperature": NaN}', "bad_request", "'temperature'"),
    ("temperature_inf", b'{"input": {}, "temperature": Infinity}', "bad_request",
     "'temperature'"),
    ("temperature_huge_int", b'{"input": {}, "temperature": 1' + b"0" * 400 + b"}",
     "bad_request", "'temperature'"),
    ("top_p_0", _ok(top_p=0), "bad_request", "'top_p'"),
    ("top_p_1.5", _ok(top_p=1.5), "bad_request", "'top_p'"),
    ("top_k_neg", _ok(top_k=-1), "bad_request", "'top_k'"),
    ("seed_neg", _ok(seed=-1), "bad_request", "'seed'"),
    ("seed_2_63", _ok(seed=2**63), "bad_request", "'seed'"),
    ("session_int", _ok(session=3), "bad_request", "'session'"),
    ("reply_to_hash", _ok(reply_to="app/#"), "bad_request", "'reply_to'"),
    ("reply_to_plus", _ok(reply_to="app/+/r"), "bad_request", "'reply_to'"),
    ("reply_to_empty", _ok(reply_to=""), "bad_request", "'reply_to'"),
    ("reply_to_int", _ok(reply_to=5), "bad_request", "'reply_to'"),
    ("reply_to_null", _ok(reply_to=None), "bad_request", "'reply_to'"),
    ("reply_to_surrogate", b'{"input": {}, "reply_to": "a\\ud800"}', "bad_request",
     "'reply_to'"),
    ("client_slash", _ok(client="a/b"), "bad_request", "'client'"),
    ("client_plus", _ok(client="a+"), "bad_request", "'client'"),
]


@pytest.mark.parametrize(("payload", "code", "says"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_payload(payload: bytes | dict[str, Any], code: str, says: str) -> None:
    got = _parse(_entry(payload))
    assert isinstance(got, Failure)
    assert (got.code, got.seq, got.task) == (code, 7, "st_code")
    assert says in got.message
    assert got.reply.topic == DEFAULT_REPLY


@pytest.mark.parametrize("topic", [f"{BASE}/req/unknown", f"{BASE}/req/st_code/extra",
                                   f"{BASE}/req/a/b", f"{BASE}/req/", "other/req/st_code"])
def test_unknown_task(topic: str) -> None:
    got = _parse(_entry(_ok(), topic))
    assert isinstance(got, Failure) and got.code == "unknown_task"
    assert "fault_tree, st_code" in got.message


def test_bad_payload_is_reported_before_unknown_task() -> None:
    got = _parse(_entry(_ok(top_k=-1), f"{BASE}/req/nope"))
    assert isinstance(got, Failure) and got.code == "bad_request" and got.task == "nope"


def test_reply_address_order() -> None:
    full = _ok(reply_to="app/replies", client="plc7")
    v5 = _parse(_entry(full, response_topic="v5/topic", correlation=b"c"))
    assert isinstance(v5, MqttRequest)
    assert v5.reply == Address("v5/topic", b"c", "c")
    payload = _parse(_entry(full))
    assert isinstance(payload, MqttRequest) and payload.reply.topic == "app/replies"
    client = _parse(_entry(_ok(client="plc7")))
    assert isinstance(client, MqttRequest) and client.reply.topic == f"{BASE}/res/plc7"
    own = _parse(_entry(_ok()))
    assert isinstance(own, MqttRequest) and own.reply == Address(DEFAULT_REPLY, None, None)


def test_unusable_response_topic_falls_through() -> None:
    got = _parse(_entry(_ok(reply_to="app/replies"), response_topic="bad/#"))
    assert isinstance(got, MqttRequest) and got.reply.topic == "app/replies"


def test_unusable_reply_to_error_goes_to_the_client_topic() -> None:
    got = _parse(_entry(_ok(reply_to="x/#", client="plc7", id="r1")))
    assert isinstance(got, Failure) and got.code == "bad_request"
    assert got.reply == Address(f"{BASE}/res/plc7", None, "r1")


def test_ids_from_payload_or_correlation() -> None:
    both = _parse(_entry(_ok(id="from-payload"), correlation=b"from-corr"))
    assert isinstance(both, MqttRequest)
    assert both.reply.id == "from-payload" and both.reply.correlation == b"from-corr"
    corr = _parse(_entry(_ok(), correlation=b"corr-\xff"))
    assert isinstance(corr, MqttRequest) and corr.reply.id == "corr-\ufffd"
    failed = _parse(_entry(b"garbage", correlation=b"c9"))
    assert isinstance(failed, Failure) and failed.reply.id == "c9"
    long_corr = _parse(_entry(_ok(), correlation=b"z" * 300))
    assert isinstance(long_corr, MqttRequest) and long_corr.reply.id == "z" * 256


def test_deadline_is_the_earlier_of_timeout_and_expiry() -> None:
    plain = _parse(_entry(_ok(), received=1000.0), timeout_s=30.0)
    assert isinstance(plain, MqttRequest) and plain.request.deadline == 1030.0
    early = _parse(_entry(_ok(), received=1000.0, expires=1010.0), timeout_s=30.0)
    assert isinstance(early, MqttRequest) and early.request.deadline == 1010.0
    late = _parse(_entry(_ok(), received=1000.0, expires=1100.0), timeout_s=30.0)
    assert isinstance(late, MqttRequest) and late.request.deadline == 1030.0


def test_valid_request_fields() -> None:
    got = _parse(_entry(_ok(id="r1", max_tokens=64, temperature=0.7, top_p=0.9, top_k=40,
                            seed=123, session="line-3"), f"{BASE}/req/fault_tree"))
    assert isinstance(got, MqttRequest)
    req = got.request
    assert (got.seq, req.task, req.input, req.received) == (7, "fault_tree", {"spec": "x"},
                                                            1000.0)
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.seed) == (
        64, 0.7, 0.9, 40, 123)
    assert req.session == "line-3" and got.reply.id == "r1" and got.output_formats == ()
    assert req.ref == "mqtt request 7"
    assert isinstance(req.temperature, float) and isinstance(req.top_p, float)


def test_output_formats_stay_with_the_mqtt_request() -> None:
    tasks = {"st_code": SimpleNamespace(validators=("st",))}
    got = parse(_entry(_ok(output_formats=["plcopen_xml", "plcopen_xml"])), BASE, CLIENT_ID,
                tasks, MAX_PAYLOAD, 30.0)
    assert isinstance(got, MqttRequest) and got.output_formats == ("plcopen_xml",)


def test_valid_request_defaults() -> None:
    got = _parse(_entry({"input": {}, "id": None, "seed": None, "temperature": 1}))
    assert isinstance(got, MqttRequest)
    req = got.request
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.seed, req.session) == (
        None, 1.0, 1.0, 0, None, None)
    assert got.reply.id is None


@pytest.mark.parametrize(("payload", "field"), [
    (b'{"input": {}, "id": "a\\ud800"}', "'id' contains a lone surrogate"),
    (b'{"input": {}, "session": "s\\udfff"}', "'session' contains a lone surrogate"),
    (b'{"input": {"description": "Motor \\ud800 start"}}', "'input.description' holds a "
     "lone surrogate"),
    (b'{"input": {"points": [{"name": "a"}, {"name": "\\udc00"}]}}',
     "'input.points[1].name' holds"),
    (b'{"input": {"k\\ud800": 1}}', "holds a lone surrogate"),
    (b'{"input": {}, "id": "a\\u0001b"}', "'id' contains a control character (U+0001)"),
    (b'{"input": {}, "id": "a\\u009fb"}', "'id' contains a control character (U+009F)"),
    (b'{"input": {}, "session": "\\ufdd0"}', "'session' contains a Unicode non-character"),
    (b'{"input": {}, "reply_to": "app/res/a\\u0001b"}', "'reply_to' contains a control"),
    (b'{"input": {}, "reply_to": "app/\\uffffx"}', "'reply_to' contains a Unicode non"),
    (b'{"input": {}, "reply_to": "$SYS/x"}', "'reply_to' starts with '$'"),
    (b'{"input": {}, "reply_to": ""}', "'reply_to' is empty"),
    (b'{"input": {}, "client": "a\\u007fb"}', "'client' contains a control character"),
    (b'{"input": {}, "client": "a/b"}', "'client' contains '/'"),
])
def test_strings_the_broker_or_tokenizer_refuse_are_bad_requests(payload: bytes,
                                                                 field: str) -> None:
    got = _parse(_entry(payload))
    assert isinstance(got, Failure) and got.code == "bad_request", got
    assert field in got.message
    # the error still reaches someone, on a topic the broker takes
    assert got.reply.topic == "v1/site/rung/node1/res/rung-node1"
    assert got.reply.id is None or got.reply.id.isprintable()
    envelope.error_response(got.reply.id, got.task, got.code, got.message).decode("utf-8")


def test_text_with_newlines_and_umlauts_is_fine() -> None:
    got = _parse(_entry('{"input": {"description": "Zeile 1\\nZeile 2\\tgeöffnet"}, '
                        '"id": "Ölpumpe-1"}'.encode()))
    assert isinstance(got, MqttRequest) and got.reply.id == "Ölpumpe-1"


def test_claimed_id() -> None:
    assert claimed_id(b'{"id": "abc", "input": {}}', 100) == "abc"
    assert claimed_id(b'{"id": 5}', 100) is None
    assert claimed_id(b'{"input": {}}', 100) is None
    assert claimed_id(b'{"id": "abc"}', 5) is None                # past the limit: no peek
    assert claimed_id(b'[{"id": "abc"}]', 100) is None
    assert claimed_id(b"\xff\xfe", 100) is None
    assert claimed_id(b'{"id": "abc"', 100) is None
    assert claimed_id(b'{"id": "a", "n": ' + b"9" * 5000 + b"}", 10**6) is None


@pytest.mark.parametrize(("topic", "task_input", "says"), [
    ("st_code", {"description": "Motor", "name": "END_VAR"},
     "task st_code: input name: 'END_VAR' is a keyword in IEC 61131-3"),
    ("st_code", {"description": "Motor", "name": "ton"},
     "input name: 'ton' is a standard function block in IEC 61131-3"),
    ("diagnosis", {"asset": "Pump 3", "points": [{"name": "oil_temp", "value": 91},
                                                 {"name": "oil_temp", "value": 60}]},
     "input points/1/name: 'oil_temp' is already the name of item 0"),
    ("diagnosis", {"asset": "Pump 3", "points": [{"name": "oil\u007ftemp", "value": 91}]},
     "input points/0/name: holds the control character U+007F at position 3"),
    ("fault_tree", {"top_event": "t", "system": "s",
                    "points": [{"name": "p\u0085", "value": 1}]},
     "input points/0/name: holds the control character U+0085 at position 1"),
    ("diagnosis", {"asset": "Pump 3"}, "input (top level): 'points' is a required property"),
])
def test_an_input_its_task_refuses_is_a_bad_request_at_the_edge(
        topic: str, task_input: dict[str, Any], says: str) -> None:
    """The task's own input checks run at the edge: refused before the queue, answered
    bad_request naming the field (and a control character by its code point only)."""
    from rung.daemon.tasks.task import load_tasks

    tasks = load_tasks()
    got = parse(_entry({"input": task_input, "id": "r1"}, f"{BASE}/req/{topic}"), BASE,
                CLIENT_ID, tasks, MAX_PAYLOAD, 30.0)
    assert isinstance(got, Failure) and (got.code, got.task) == ("bad_request", topic), got
    assert says in got.message and got.message.isprintable()
    assert got.reply.id == "r1"
    fine = {**task_input, "name": "Motor_1"} if topic == "st_code" else {
        "asset": "Pump 3", "points": [{"name": "oil_temp", "value": 91}]}
    if topic != "fault_tree":
        ok = parse(_entry({"input": fine}, f"{BASE}/req/{topic}"), BASE, CLIENT_ID, tasks,
                   MAX_PAYLOAD, 30.0)
        assert isinstance(ok, MqttRequest) and ok.request.input == fine
