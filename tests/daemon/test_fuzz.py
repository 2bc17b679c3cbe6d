"""Fuzzing the whole request path in process: arbitrary payloads and reply fields through
parse -> prepare -> one decode step on the real demo engine -> validation -> the answer
rung would publish and the line it would log. Whatever comes in, the outcome is an answer
with a contract error code (never an exception), on a topic the broker accepts, as valid
UTF-8 JSON, logged as one valid JSON line."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rung.daemon import envelope
from rung.daemon.journal.store import Entry
from rung.daemon.logs import JsonFormatter
from rung.daemon.mqtt import requests as rq
from rung.daemon.tasks.runner import TaskResult, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.daemon.topics import topic_problem
from rung.engines import load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

BASE = "v1/fuzz/rung/node1"
CODES = {"bad_json", "bad_request", "unknown_task", "too_large", "too_long", "truncated",
         "invalid_output", "internal"}

# any code point, with the ones brokers and tokenizers refuse drawn often
nasty = st.sampled_from(["\ud800", "\udfff", "\udc00", "\x00", "\x01", "\x1f", "\x7f",
                         "\x9f", "\ufdd0", "\ufffe", "\U0010ffff", "+", "#", "/", "$"])
anychar = st.one_of(st.characters(codec=None, exclude_categories=()), nasty)
text = st.lists(anychar, max_size=40).map("".join)
names = st.sampled_from(["description", "name", "pou_type", "points", "asset", "constraints",
                         "gates", "top", "x"])
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                      st.floats(allow_nan=False), text)
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(names, text), inner, max_size=4)),
    max_leaves=12)
task_input = st.one_of(
    st.fixed_dictionaries({"description": st.lists(anychar, min_size=1, max_size=60).map("".join)},
                          optional={"name": st.sampled_from(["P_X", "FB_1", "bad name"]),
                                    "pou_type": st.sampled_from(["PROGRAM", "FUNCTION"])}),
    st.dictionaries(st.one_of(names, text), json_value, max_size=4))
hostile = st.fixed_dictionaries({}, optional={
    "input": task_input, "id": st.one_of(text, st.integers()), "reply_to": text,
    "client": text, "session": text, "max_tokens": st.integers(-2, 5000),
    "temperature": st.one_of(st.floats(allow_nan=False), st.sampled_from([5e-324, 1e308])),
    "top_p": st.floats(allow_nan=False), "top_k": st.integers(-1, 10**12),
    "seed": st.integers(-1, 2**64), "extra": json_value})
# well-formed requests with hostile strings and extreme sampling: these reach the model
printable = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                    min_size=1, max_size=60)
plausible = st.fixed_dictionaries({"input": st.fixed_dictionaries(
    {"description": st.one_of(printable, st.lists(anychar, min_size=1, max_size=60).map("".join))},
    optional={"name": st.sampled_from(["P_X", "FB_1", "bad name"]),
              "pou_type": st.sampled_from(["PROGRAM", "FUNCTION"])})}, optional={
    "id": st.one_of(printable, text), "session": printable,
    "reply_to": st.one_of(st.just("app/replies"), printable, text),
    "client": st.one_of(printable, text), "max_tokens": st.integers(1, 8),
    "temperature": st.one_of(st.sampled_from([0.0, 5e-324, 1e-300, 0.7, 1e308,
                                              1.7976931348623157e308]),
                             st.floats(0, 1e308)),
    "top_p": st.one_of(st.sampled_from([1.0, 1e-300, 5e-324, 0.5]), st.floats(1e-300, 1.0)),
    "top_k": st.sampled_from([0, 1, 3, 10**9]), "seed": st.integers(0, 2**63 - 1)})
fields = st.one_of(plausible, plausible, plausible, hostile)
payloads = st.one_of(
    fields.map(lambda d: json.dumps(d).encode()),                  # surrogates as escapes
    fields.map(lambda d: json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=200))
tasks_in_topic = st.sampled_from(["st_code"] * 6 + ["diagnosis", "fault_tree", "nope", "a/b", ""])


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    tok = Tokenizer.load(edge_engine, engine.manifest.tokenizer)
    return TaskRunner(engine, tok, load_tasks(), edge_engine)


def _answer_bytes(runner: TaskRunner, entry: Entry) -> tuple[rq.Address, bytes, str | None]:
    """What the daemon publishes for one message, going through one decode step."""
    parsed = rq.parse(entry, BASE, "rung-fuzz", runner.tasks, 4096, 60.0)
    if isinstance(parsed, rq.Failure):
        event(f"refused at parse: {parsed.code}")
        assert parsed.code in CODES
        return parsed.reply, envelope.error_response(parsed.reply.id, parsed.task, parsed.code,
                                               parsed.message), None
    reply, req = parsed.reply, parsed.request
    from rung.engines.sampler import SamplingParams

    params = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                            seed=req.seed)
    prepared = runner.prepare(req.task, req.input, params, req.max_tokens)
    if not isinstance(prepared, TaskResult):
        prepared.params = replace(prepared.params, max_tokens=1)   # one step, then finish
        decoder = BatchDecoder(runner.engine, runner.tokenizer, 1)
        decoder.add("row", prepared.ids, prepared.params, prepared.constraint)
        [(_, gen)] = decoder.run(max_steps=64)
        prepared = runner.finish(prepared, gen)
        event("decoded")
    else:
        event(f"refused at prepare: {prepared.error and prepared.error['code']}")
    res = prepared
    if res.ok:
        return reply, envelope.ok_response(reply.id, req.task, res.output, res.validation,
                                     {}), req.session
    assert res.error is not None and res.error["code"] in CODES, res.error
    return reply, envelope.error_response(reply.id, req.task, res.error["code"],
                                    res.error["message"]), req.session


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=payloads, task=tasks_in_topic, response_topic=st.one_of(st.none(), text),
       correlation=st.one_of(st.none(), st.binary(max_size=40)))
def test_any_message_gets_a_publishable_answer(runner: TaskRunner, payload: bytes, task: str,
                                               response_topic: str | None,
                                               correlation: bytes | None) -> None:
    entry = Entry(1, f"{BASE}/req/{task}", payload, response_topic, correlation, 0.0, None)
    reply, body, session = _answer_bytes(runner, entry)
    assert topic_problem(reply.topic) is None, reply.topic
    doc = json.loads(body.decode("utf-8"))
    assert doc["ok"] in (True, False) and doc["id"] == reply.id
    record = logging.LogRecord("rung.serve", logging.INFO, __file__, 0, "answered", None, None)
    fields: dict[str, Any] = {"id": reply.id, "session": session, "topic": reply.topic}
    record.rung_fields = fields
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.emit(record)
    line = stream.getvalue()
    line.encode("utf-8")                      # what stdout has to carry
    assert json.loads(line)["msg"] == "answered"
