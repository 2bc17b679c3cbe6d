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
from typing import Any

import pytest

from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.tasks.runner import RETRY_MODES, Prepared, RetryPolicy, TaskRunner
from rung.daemon.tasks.st.interpreter import DEFAULT_WORK_BUDGET
from rung.daemon.tasks.task import Task, TaskError, load_tasks
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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


# -- a heavy answer's check is held to its work budget -------------------------------------

# the answer a capable model writes for a moving average: a FOR loop over 1,000 samples each
# scan; fixed through the task file, so every try writes it and every check runs it
HEAVY = {"pou_type": "FUNCTION_BLOCK", "name": "FB_Average", "variables": [
    {"section": "VAR_INPUT", "name": "x", "type": "REAL"},
    {"section": "VAR_OUTPUT", "name": "avg", "type": "REAL"},
    {"section": "VAR", "name": "buf", "type": "ARRAY[0..999] OF REAL"},
    {"section": "VAR", "name": "i", "type": "INT"},
    {"section": "VAR", "name": "k", "type": "INT"},
    {"section": "VAR", "name": "sum", "type": "REAL"}],
    "body": "buf[k] := x;\nk := (k + 1) MOD 1000;\nsum := 0.0;\nFOR i := 0 TO 999 DO\n"
            "  sum := sum + buf[i];\nEND_FOR;\navg := sum / 1000.0;\n"}


def _heavy_task(path: Path) -> Path:
    """A task file whose output schema admits only ``HEAVY`` (each field a constant), with
    the st_code task's input schema (test vectors included)."""
    import yaml

    from rung.daemon.tasks.task import builtin_tasks_dir

    st = yaml.safe_load((builtin_tasks_dir() / "st_code.yaml").read_text(encoding="utf-8"))
    fixed = {"type": "object", "additionalProperties": False,
             "required": ["pou_type", "name", "variables", "body"],
             "properties": {
                 "pou_type": {"const": HEAVY["pou_type"]}, "name": {"const": HEAVY["name"]},
                 "variables": {"type": "array", "items": False, "minItems": 6,
                               "prefixItems": [{"const": v} for v in HEAVY["variables"]]},
                 "body": {"const": HEAVY["body"]}}}
    task = {"name": "heavy", "description": "a moving average over 1,000 samples",
            "system_prompt": "Write the POU.", "prompt_template": "{{ description }}",
            "max_tokens": 1024, "validators": ["st"], "input_schema": st["input_schema"],
            "output_schema": fixed}
    path.mkdir()
    (path / "heavy.yaml").write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
    return path


def _vectors(seconds: float, scan_s: float = 0.1) -> dict[str, Any]:
    return {"scan_s": scan_s, "steps": [{"t": 0, "set": {"x": 1.0}},
                                        {"t": seconds, "expect": {"avg": 1.0}}]}


class Counting(TaskRunner):
    """The real runner; notes the scheduler's in-flight count while each answer is
    checked."""

    sched: Scheduler | None = None
    inflight_while_checked: list[int]

    def finish(self, prepared: Prepared, gen: Generation) -> Answer:
        if self.sched is not None:
            self.inflight_while_checked.append(self.sched.inflight)
        return super().finish(prepared, gen)


def test_a_heavy_answer_is_checked_within_the_work_budget(edge_engine: Path,
                                                          tmp_path: Path) -> None:
    """100,000 scans are refused at the edge (``bad_request``, the MQTT and OPC UA intake
    call ``check_input``); the longest vectors a test may send (20,000 scans) run each
    try's check to the run's work budget and stop there: ``invalid_output`` with the
    budget as the reason, tried twice, while a second client's request is answered; the
    request counts as in flight while it is checked."""
    engine = load_engine(edge_engine)
    runner = Counting(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(_heavy_task(tmp_path / "tasks")), edge_engine)
    runner.inflight_while_checked = []
    task = runner.tasks["heavy"]
    asked = {"description": "Moving average of x over the last 1000 samples."}
    with pytest.raises(TaskError, match=r"input vectors: .* is 100001 scans, more than "
                                        r"the 20000 a test may run"):
        task.check_input({**asked, "vectors": _vectors(1000.0, 0.01)})
    refused = runner.prepare("heavy", {**asked, "vectors": _vectors(1000.0, 0.01)},
                             SamplingParams())
    assert isinstance(refused, Answer) and refused.code == "bad_request"

    heavy = {**asked, "vectors": _vectors(1999.9)}   # 20,000 scans
    runner.tasks["other"] = load_tasks()["st_code"]

    async def body() -> list[Answer]:
        answers: list[Answer] = []
        sched = Scheduler(runner, answers.append, max_pending=4, max_batch=2,
                          retry=RetryPolicy(attempts=2, budget_s=600))
        runner.sched = sched
        started = sched.start()
        now = time.time()
        sched.submit(Request(task="heavy", input=heavy, received=now, deadline=now + 600,
                             ref="heavy"))
        sched.submit(Request(task="other", input={"description": "Pump P1 runs."},
                             received=now, deadline=now + 600, ref="other", max_tokens=3))
        while len(answers) < 2:
            await asyncio.sleep(0.01)
        await sched.stop(5.0)
        started.cancel()
        return answers

    answers = {a.request.ref: a for a in asyncio.run(asyncio.wait_for(body(), 600))}
    other = answers["other"]
    assert other.code == "truncated" and other.attempts == 1   # served, its 3 tokens
    answer = answers["heavy"]
    assert answer.code == "invalid_output" and answer.attempts == 2, answer
    assert answer.failed_checks == ("behaviour", "behaviour")
    assert answer.validation is not None
    behaviour = answer.validation["behaviour"]
    assert behaviour["steps"] == DEFAULT_WORK_BUDGET
    assert "work budget of 10000000 steps is spent" in behaviour["errors"][0]["message"]
    assert answer.message.startswith("behaviour: at t=1999.9 s (scan 12")
    # every check ran with its request counted in flight
    assert runner.inflight_while_checked and min(runner.inflight_while_checked) >= 1
