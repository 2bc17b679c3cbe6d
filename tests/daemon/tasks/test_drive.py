"""One request driver (daemon/tasks/drive.py) for the daemon and the command line: a
failure in one request of a ``TaskRunner.run`` batch answers that request alone, ``rung
generate --task`` retries as ``rung serve`` does (the config's ``retries``), and the
scheduler and ``TaskRunner.run`` give the same answers to the same requests. A real
random-weight engine (``task_engine``) under ONNX Runtime; nothing timed, answers awaited."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.cli import main
from rung.daemon.request import Answer, Request
from rung.daemon.scheduler import Scheduler
from rung.daemon.tasks import runner as runner_module
from rung.daemon.tasks.runner import Prepared, RetryPolicy, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.errors import brief
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration

# every answer the grammar admits fails the st check (the body names an undeclared 'y')
PROBE = """\
name: probe
description: a POU whose body uses a name it does not declare
system_prompt: Write the POU.
prompt_template: "{{ description }}"
max_tokens: 128
validators: [st]
input_schema:
  type: object
  required: [description]
  properties:
    description: {type: string}
output_schema:
  type: object
  additionalProperties: false
  required: [pou_type, name, variables, body]
  properties:
    pou_type: {const: PROGRAM}
    name: {const: P_Probe}
    variables:
      type: array
      minItems: 1
      maxItems: 1
      items: false
      prefixItems:
        - type: object
          additionalProperties: false
          required: [section, name, type]
          properties:
            section: {const: VAR}
            name: {const: x}
            type: {const: INT}
    body: {const: "y := 1;"}
"""
# short enough that a random model always closes it (tests/daemon/tasks/test_task_runner.py)
LEVEL = """\
name: level
description: classify a level
system_prompt: Classify.
prompt_template: "Level {{ value }}"
max_tokens: 64
validators: []
input_schema:
  type: object
  properties:
    value: {type: number}
output_schema:
  type: object
  additionalProperties: false
  required: [state, level]
  properties:
    state: {enum: [low, ok, high]}
    level: {type: integer, minimum: 0, maximum: 100}
    alarm: {type: boolean}
"""
PROBE_INPUT = {"description": "set y"}


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("drive-tasks")
    (d / "probe.yaml").write_text(PROBE, encoding="utf-8")
    (d / "level.yaml").write_text(LEVEL, encoding="utf-8")
    return d


class Faulty(TaskRunner):
    """The real runner; a level of 13 fails in preparation (as a tokenizer refusing a
    string would), a level of 42 after generation (as a validator bug the runner does not
    catch)."""

    def prepare(self, name: str, data: Any, params: SamplingParams,
                max_tokens: int | None = None) -> Prepared | Answer:
        if data.get("value") == 13:
            raise TypeError("TextInputSequence must be str")
        return super().prepare(name, data, params, max_tokens)

    def finish(self, prepared: Prepared, gen: Generation) -> Answer:
        if prepared.data.get("value") == 42:
            raise KeyError("section")
        return super().finish(prepared, gen)


@pytest.fixture(scope="module")
def runner(task_engine: Path, tasks_dir: Path) -> Faulty:
    engine = load_engine(task_engine)
    return Faulty(engine, Tokenizer.load(task_engine, engine.manifest.tokenizer),
                  load_tasks(tasks_dir), task_engine)


def _levels(*values: int) -> list[tuple[str, Any]]:
    return [("level", {"value": v}) for v in values]


@pytest.mark.slow
def test_one_requests_failure_in_a_batch_answers_it_alone(runner: Faulty) -> None:
    """The command line's path as the daemon's: a request that fails before or after
    generation is answered ``internal`` (told in brief); the rest of the batch is answered
    as each would be alone."""
    params = SamplingParams(temperature=1.0, seed=3)
    answers = runner.run(_levels(1, 13, 2, 42, 3), params, rows=2)
    assert [a.task for a in answers] == ["level"] * 5
    assert [a.request.input["value"] for a in answers] == [1, 13, 2, 42, 3]   # in order
    failed = answers[1], answers[3]
    assert [(a.ok, a.code) for a in failed] == [(False, "internal")] * 2
    assert failed[0].message == brief("the request failed", "TypeError")
    assert failed[0].usage == {} and failed[0].generation is None   # never reached the model
    assert failed[1].message == brief("the request failed", "KeyError")
    assert "section" not in failed[1].message
    assert failed[1].usage["completion_tokens"] > 0   # it did: its usage is told
    alone = [runner.run(_levels(v), params)[0] for v in (1, 2, 3)]
    for a, b in zip(answers[::2], alone, strict=True):
        assert a.ok and b.ok, (a.error, b.error)
        assert a.output == b.output
        assert a.generation is not None and b.generation is not None
        assert a.generation.token_ids == b.generation.token_ids


def _served(runner: TaskRunner, asked: list[tuple[str, Any]], policy: RetryPolicy,
            rows: int) -> list[Answer]:
    """``asked`` through the daemon's scheduler, each answer awaited."""
    async def body() -> list[Answer]:
        sched = Scheduler(runner, lambda _: None, max_pending=len(asked), max_batch=rows,
                          retry=policy)
        now = time.time()
        futures = [sched.submit(Request(task=t, input=d, received=now, deadline=now + 600,
                                        ref=str(i)))
                   for i, (t, d) in enumerate(asked)]
        sched.start()
        try:
            return list(await asyncio.gather(*(f for f in futures if f is not None)))
        finally:
            await sched.stop(5.0)
    return asyncio.run(asyncio.wait_for(body(), 600))


@pytest.mark.slow
def test_the_scheduler_and_run_give_the_same_answers(runner: Faulty) -> None:
    """One driver: the same greedy tokens, the same validation, the same retries."""
    asked = [*_levels(5, 50), ("probe", PROBE_INPUT), *_levels(95),
             ("probe", {"description": "y to one"})]
    policy = RetryPolicy(attempts=2)
    ran = runner.run(asked, SamplingParams(), retry=policy, rows=2)
    served = _served(runner, asked, policy, rows=2)
    assert len(served) == len(ran) == len(asked)
    for a, b in zip(ran, served, strict=True):
        assert (a.task, a.ok, a.code, a.message, a.attempts, a.failed_checks) == (
            b.task, b.ok, b.code, b.message, b.attempts, b.failed_checks)
        assert (a.output, a.validation) == (b.output, b.validation)
        assert a.generation is not None and b.generation is not None
        assert a.generation.token_ids == b.generation.token_ids
        assert a.usage["prompt_tokens"] == b.usage["prompt_tokens"]
        assert "first_token_ms" in a.usage and "first_token_ms" in b.usage
    probes = [a for a in ran if a.task == "probe"]
    assert [(a.code, a.attempts, a.failed_checks) for a in probes] == [
        ("invalid_output", 2, ("identifiers", "identifiers"))] * 2


def _generate(task_engine: Path, tasks_dir: Path, task: str, data: Any,
              *extra: str) -> list[str]:
    return ["generate", str(task_engine), "--task", task, "--tasks", str(tasks_dir),
            "--input", json.dumps(data), *extra]


@pytest.mark.slow
def test_generate_task_retries_as_the_daemon_does(task_engine: Path, tasks_dir: Path,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``rung generate --task`` takes the retry policy of the daemon's config (the default
    one without ``--config``) and says how many tries the answer took."""
    args = _generate(task_engine, tasks_dir, "probe", PROBE_INPUT, "--json")
    assert main(args) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["code"] == "invalid_output" and doc["ok"] is False
    assert doc["attempts"] == RetryPolicy().attempts == 3      # the default retries
    assert doc["failed_checks"] == ["identifiers"] * 3
    cfg = tmp_path / "rung.yaml"
    cfg.write_text("retries:\n  attempts: 2\n", encoding="utf-8")
    assert main([*args, "--config", str(cfg)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["attempts"] == 2 and doc["failed_checks"] == ["identifiers"] * 2
    assert main([*args, "--config", str(cfg), "--set", "retries.attempts=1"]) == 1
    assert json.loads(capsys.readouterr().out)["attempts"] == 1
    # without --json the tries are told on stderr
    assert main(_generate(task_engine, tasks_dir, "probe", PROBE_INPUT, "--config",
                          str(cfg))) == 1
    err = capsys.readouterr().err
    assert "rung: 2 tries (failed: identifiers, identifiers)" in err
    assert "rung: error: invalid_output" in err


def test_generate_task_answers_ok_after_a_failed_try(task_engine: Path, tasks_dir: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer whose first try fails its checks is tried again and answered ok."""
    real = runner_module.validate_output
    tries: list[bool] = []

    def first_fails(schema: Any, kind: Any, output: Any,
                    data: Any) -> tuple[bool, dict[str, Any]]:
        ok, validation = real(schema, kind, output, data)
        tries.append(ok)
        if len(tries) > 1:
            return ok, validation
        return False, {**validation, "level": {"ok": False, "errors": [
            {"path": "level", "message": "not the level the request states"}]}}

    monkeypatch.setattr(runner_module, "validate_output", first_fails)
    assert main(_generate(task_engine, tasks_dir, "level", {"value": 7}, "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and "error" not in doc
    assert doc["attempts"] == 2 and doc["failed_checks"] == ["level"]
    assert tries == [True, True]   # the first try was refused by the injected check


def test_config_sets_the_retries_of_a_task_only(task_engine: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(task_engine), "--prompt", "hi", "--set",
                 "retries.attempts=1"]) == 1
    assert "--config and --set set the retries" in capsys.readouterr().err
