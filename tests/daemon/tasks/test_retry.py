"""The next try of an answer that failed validation (``TaskRunner.retry``): resampled with
the task's own prompt, or prompted with the validator's findings, in either form, with the
answer's computed start after the prompt; a feedback prompt that leaves the answer too
little of the engine's context falls back to resampling for that try."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.request import Request
from rung.daemon.tasks.runner import (
    FEEDBACK_FORMS,
    FEEDBACK_ROOM,
    MAX_FINDINGS,
    Prepared,
    RetryPolicy,
    TaskResult,
    TaskRunner,
    feedback_findings,
)
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration

INPUT = {"asset": "Pump 3", "points": [
    {"name": "oil_temp", "value": 91.0, "unit": "degC", "limits": {"alert": 70, "alarm": 85}},
    {"name": "flow", "value": 12.5, "unit": "m3/h"}]}
ANSWER = {"state": "alarm", "summary": "Oil too hot.", "findings": []}
FINDING = "diagnosis: points[1]: point 'flow_rate' is not in the snapshot"
VALIDATION = {
    "schema": {"ok": True, "errors": []},
    "diagnosis": {"ok": False, "errors": [
        {"path": "points[1]", "message": "point 'flow_rate' is not in the snapshot"}]},
    "relevance": {"ok": False, "advisory": True, "errors": [
        {"path": "body", "message": "the request states 5 s; the POU does not use it"}]}}


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


def _req(task: str) -> Request:
    return Request(task, INPUT, 0.0, 0.0)


def _prepared(runner: TaskRunner, max_tokens: int | None = None) -> Prepared:
    p = runner.prepare("diagnosis", INPUT, SamplingParams(), max_tokens)
    assert isinstance(p, Prepared)
    assert p.prefix, "the diagnosis's computed start is what the retry must keep"
    return p


def _failed(written: int = 40, text: str = json.dumps(ANSWER)) -> TaskResult:
    gen = Generation(prompt_tokens=100, token_ids=[7] * written, text=text,
                     finish_reason="stop", ttft_ms=1.0, decode_tok_s=1.0)
    return TaskResult(_req("diagnosis"), False, "invalid_output", FINDING, ANSWER, VALIDATION,
                      generation=gen, failed_checks=("diagnosis",))


def _prefix_ids(runner: TaskRunner, p: Prepared) -> list[int]:
    prompt = runner.prompt_ids(p.task, p.data)
    assert p.ids[:len(prompt)] == prompt
    return p.ids[len(prompt):]


def test_resample_keeps_the_prompt_and_samples_another_seed(runner: TaskRunner) -> None:
    p = _prepared(runner)
    again = runner.retry(p, RetryPolicy(temperature=0.7), _failed())
    assert again.ids == p.ids and not again.feedback
    assert again.params.temperature == 0.7 and again.params.seed == 1
    assert again.attempt == 2 and again.failed_checks == ("diagnosis",)


@pytest.mark.parametrize("form", FEEDBACK_FORMS)
def test_feedback_prompt_carries_the_findings(runner: TaskRunner, form: str) -> None:
    p = _prepared(runner)
    failed = _failed()
    again = runner.retry(p, RetryPolicy(mode="feedback", form=form), failed)
    assert again.feedback and again.attempt == 2
    text = runner.tokenizer.decode(again.ids)
    assert f"refused: {FINDING}." in text
    assert "does not use it" not in text               # advisory sections are no findings
    system, user = (m["content"].rstrip() for m in p.task.messages(INPUT))
    assert system in text and user in text             # the task's prompt, then the rest
    # the transcript shows the failed answer as the assistant's turn; append does not
    assert (json.dumps(ANSWER) in text) is (form == "transcript")
    # the computed start of the answer follows the new prompt, and the grammar is past it
    prefix = _prefix_ids(runner, p)
    assert again.ids[-len(prefix):] == prefix
    assert again.constraint is not p.constraint
    assert again.params.temperature == 0.7 and again.params.seed == 1   # as resampled


def test_feedback_may_keep_the_requests_sampling(runner: TaskRunner) -> None:
    policy = RetryPolicy(mode="feedback", temperature=0.9, feedback_sampled=False)
    again = runner.retry(_prepared(runner), policy, _failed())
    assert again.feedback and again.params.temperature == 0.0   # greedy stays greedy
    # a try that falls back to resampling is resampled at the retry temperature
    over = runner.retry(_prepared(runner), policy, _failed(written=10_000))
    assert not over.feedback and over.params.temperature == 0.9


@pytest.mark.parametrize("form", FEEDBACK_FORMS)
def test_feedback_that_leaves_too_little_room_is_resampled(runner: TaskRunner,
                                                           form: str) -> None:
    """A feedback try needs room for FEEDBACK_ROOM times the failed answer's length (or
    the request's max_tokens when less): the longest failed answer that leaves it is
    fed back, one token longer is resampled with the task's prompt."""
    p = _prepared(runner)
    max_seq = runner.engine.manifest.dims.max_seq
    prompt = runner.feedback_ids(p.task, p.data, _failed(), form)
    assert prompt is not None
    room = max_seq - len(prompt) - len(_prefix_ids(runner, p))
    longest = math.floor(room / FEEDBACK_ROOM)
    assert longest > 0 and math.ceil(FEEDBACK_ROOM * longest) <= room
    policy = RetryPolicy(mode="feedback", form=form, temperature=0.7)
    fits = runner.retry(p, policy, _failed(longest))
    assert fits.feedback and len(fits.ids) + math.ceil(FEEDBACK_ROOM * longest) <= max_seq
    over = runner.retry(p, policy, _failed(longest + 1))
    assert not over.feedback and over.ids == p.ids and over.params.temperature == 0.7
    # a request that caps its answer below that needs only its cap
    capped = _prepared(runner, max_tokens=room)
    assert runner.retry(capped, policy, _failed(longest + 1)).feedback


def test_a_feedback_retry_after_a_feedback_retry_starts_from_the_task_prompt(
        runner: TaskRunner) -> None:
    """Each feedback prompt shows the last failed try only; a resampled try after a fed
    back one has the task's own prompt again."""
    p = _prepared(runner)
    policy = RetryPolicy(mode="feedback", form="transcript")
    second = runner.retry(p, policy, _failed())
    other = json.dumps({**ANSWER, "summary": "Second try."})
    third = runner.retry(second, policy, _failed(text=other))
    text = runner.tokenizer.decode(third.ids)
    assert third.attempt == 3 and other in text and json.dumps(ANSWER) not in text
    resampled = runner.retry(second, RetryPolicy(), _failed())
    assert resampled.ids == p.ids


def test_findings_are_the_failed_checks_errors() -> None:
    errors: list[dict[str, Any]] = [{"line": i, "column": 2, "message": f"undeclared 'v{i}'"}
                                    for i in range(MAX_FINDINGS + 2)]
    res = TaskResult(_req("st_code"), False, "invalid_output", "identifiers: undeclared 'v0'",
                     {}, {"st_syntax": {"ok": True, "errors": []},
                          "identifiers": {"ok": False,
                                          "errors": [errors[0], *errors]},   # one twice
                          "relevance": {"ok": False, "advisory": True,
                                        "errors": [{"message": "advisory"}]}})
    found = feedback_findings(res).split("; ")
    assert found[0] == "identifiers: line 0, column 2: undeclared 'v0'"
    assert len(found) == MAX_FINDINGS == len(set(found))
    not_json = TaskResult(_req("st_code"), False, "invalid_output", "output is not JSON")
    assert feedback_findings(not_json) == "output is not JSON"


def test_a_policy_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="reprompt"):
        RetryPolicy(mode="reprompt")


def test_an_answer_that_ran_out_of_the_tasks_tokens_is_tried_again(runner: TaskRunner) -> None:
    """A truncated answer is retried when it used the task's whole budget (a loop another
    draw may not repeat), not when the request itself asked for fewer tokens; an answer
    refused for another reason (bad_request, internal) never is."""
    policy = RetryPolicy(attempts=2)
    # room in the context for the task's whole budget (the demo engine's 1,024 positions
    # hold the prompt and at most 1,024 - its length answer tokens: an engine with more)
    full = replace(_prepared(runner), room=2048)
    truncated = TaskResult(_req("diagnosis"), False, "truncated", "max_tokens reached")
    assert policy.allows(full, truncated)
    assert not policy.allows(replace(_prepared(runner, max_tokens=64), room=2048), truncated)
    assert not policy.allows(replace(runner.retry(full, policy, truncated), room=2048),
                             truncated)  # tries spent
    for code in ("internal", "bad_request"):
        other = TaskResult(_req("diagnosis"), False, code, "x")
        assert not policy.allows(full, other)


def test_an_answer_that_ran_out_of_context_is_not_tried_again(runner: TaskRunner) -> None:
    """The rule looks at the room the context leaves, not at ``max_tokens``: a fault tree
    of 60 points whose prompt leaves its answer fewer tokens than the task's budget ran
    out because the context was full, and the same prompt leaves the same room: no retry
    (it would run out the same way). With room for the task's budget, the same answer is
    a loop another draw may not repeat: retried."""
    policy = RetryPolicy(attempts=3)
    points = [{"name": f"sensor_{i:02d}", "value": 20.0 + i, "unit": "degC"}
              for i in range(60)]
    p = runner.prepare("fault_tree", {"system": "Hydraulic press", "top_event": "No pressure",
                                      "points": points}, SamplingParams())
    assert isinstance(p, Prepared) and p.params.max_tokens == p.task.max_tokens
    max_seq = runner.engine.manifest.dims.max_seq
    assert p.room == max_seq - len(p.ids) and 0 < p.room < p.task.max_tokens
    assert p.token_budget == p.room
    gen = Generation(prompt_tokens=len(p.ids), token_ids=[7] * p.room, text='{"top":"G_',
                     finish_reason="length", ttft_ms=1.0, decode_tok_s=1.0)
    truncated = runner.finish(p, gen)
    assert truncated.code == "truncated"
    assert not policy.allows(p, truncated)
    roomy = replace(p, room=p.task.max_tokens)
    assert roomy.token_budget == p.task.max_tokens and policy.allows(roomy, truncated)
    # a retry's room is its own prompt's (a feedback prompt is longer)
    again = runner.retry(roomy, RetryPolicy(mode="feedback"), truncated)
    assert again.room == max_seq - len(again.ids)


def test_a_template_without_a_system_role_keeps_the_whole_transcript() -> None:
    """The system prompt goes to the head of the first user turn; the failed answer and the
    findings turn of a transcript retry stay after it, in order."""
    from types import SimpleNamespace

    from rung.engines.errors import TokenizerError

    class NoSystem:
        def render_chat(self, messages: list[dict[str, str]]) -> str:
            if any(m["role"] == "system" for m in messages):
                raise TokenizerError("this template has no system role")
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    host = SimpleNamespace(tokenizer=NoSystem())
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "F"}]
    assert TaskRunner.render(host, chat) == "user:S\n\nU|assistant:A|user:F"  # type: ignore[arg-type]
    with pytest.raises(TokenizerError):   # only the system role is worked around
        TaskRunner.render(host, [{"role": "user", "content": "U"},  # type: ignore[arg-type]
                                 {"role": "system", "content": "S"}])
