"""Verified retries in the daemon's engine loop: the real scheduler and task runner on the
shipped demo model, a probe task whose schema admits only an answer that fails the st
check (unshaped: the ST shape would keep the body to declared names). Every try fails, so
the answer reports every attempt, in either retry mode; a feedback retry is prompted with
more than the task's prompt (the findings)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.tasks.runner import RETRY_MODES, Prepared, RetryPolicy, TaskRunner
from rung.daemon.tasks.task import Task
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration

PROBE = Task(
    name="probe", description="a POU whose body uses a name it does not declare",
    system_prompt="Write the POU.", prompt_template="{{ description }}",
    input_schema={"type": "object", "required": ["description"],
                  "properties": {"description": {"type": "string"}}},
    output_schema={
        "type": "object", "additionalProperties": False,
        "required": ["pou_type", "name", "variables", "body"],
        "properties": {
            "pou_type": {"const": "PROGRAM"}, "name": {"const": "P_Probe"},
            "variables": {"type": "array", "minItems": 1, "maxItems": 1, "items": False,
                          "prefixItems": [{
                              "type": "object", "additionalProperties": False,
                              "required": ["section", "name", "type"],
                              "properties": {"section": {"const": "VAR"},
                                             "name": {"const": "x"},
                                             "type": {"const": "INT"}}}]},
            "body": {"const": "y := 1;"}}},
    max_tokens=128, validators=("st",), path=Path("probe.yaml"))
INPUT = {"description": "set y"}


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      {"probe": PROBE}, edge_engine, shaped=False)


def _answer(runner: TaskRunner, policy: RetryPolicy,
            on_start: Callable[[Request], object] | None = None) -> Answer:
    async def body() -> Answer:
        answers: list[Answer] = []
        sched = Scheduler(runner, answers.append, max_pending=4, max_batch=2, retry=policy,
                          on_start=on_start)
        task = sched.start()
        now = time.time()
        sched.submit(Request(task="probe", input=INPUT, received=now, deadline=now + 120,
                             ref="1"))
        while not answers:
            await asyncio.sleep(0.01)
        await sched.stop(5.0)
        task.cancel()
        return answers[0]
    return asyncio.run(asyncio.wait_for(body(), 120))


@pytest.mark.parametrize("mode", RETRY_MODES)
def test_every_try_is_reported_in_either_mode(runner: TaskRunner, mode: str) -> None:
    first = runner.prepare("probe", INPUT, SamplingParams())
    assert isinstance(first, Prepared)
    answer = _answer(runner, RetryPolicy(attempts=3, mode=mode))
    assert not answer.ok and answer.code == "invalid_output", answer
    assert "undeclared identifier 'y'" in answer.message
    assert answer.attempts == 3
    assert answer.failed_checks == ("identifiers",) * 3
    # the last try's prompt: the task's own when resampled, longer with the findings
    if mode == "feedback":
        assert answer.usage["prompt_tokens"] > len(first.ids) + 10, answer.usage
    else:
        assert answer.usage["prompt_tokens"] == len(first.ids), answer.usage


def test_no_retry_starts_after_the_requests_deadline(runner: TaskRunner) -> None:
    """The retry budget is the smaller of ``retries.budget_s`` and what the request's
    deadline leaves: a request whose deadline passes during its first try (an MQTT
    Message Expiry) is answered after that try, not after every try."""
    def deadline_now(req: Request) -> None:   # started in time; the deadline passes now
        object.__setattr__(req, "deadline", time.time())

    answer = _answer(runner, RetryPolicy(attempts=5, budget_s=600), on_start=deadline_now)
    assert not answer.ok and answer.code == "invalid_output"
    assert answer.attempts == 1 and answer.failed_checks == ("identifiers",)
