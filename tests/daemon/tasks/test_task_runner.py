"""Tasks answered by a real (random-weight) engine under llguidance constraints: every
answer is schema-valid JSON or an explicit ``truncated``, never a half object."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.task import Task, load_tasks
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration

INPUTS = {
    "st_code": {"description": "Motor start/stop with interlock", "pou_type": "FUNCTION_BLOCK"},
    "fault_tree": {"top_event": "Press loses pressure", "system": "Hydraulic press",
                   "points": [{"name": "oil_temp", "value": 91.0, "unit": "degC"}]},
    "diagnosis": {"asset": "Pump 3", "points": [
        {"name": "oil_temp", "value": 91.0, "unit": "degC", "limits": {"alert": 70,
                                                                        "alarm": 85}}]},
}


@pytest.fixture(scope="module")
def runner(task_engine: Path) -> TaskRunner:
    engine = load_engine(task_engine)
    tok = Tokenizer.load(task_engine, engine.manifest.tokenizer)
    tasks = dict(load_tasks())
    base = tasks["diagnosis"]
    tasks["level"] = Task(  # a task whose answers are short enough to finish at random
        name="level", description="classify a level", system_prompt="Classify.",
        prompt_template="Level {{ value }}", input_schema={"type": "object", "properties": {
            "value": {"type": "number"}}}, output_schema={
            "type": "object", "additionalProperties": False, "required": ["state", "level"],
            "properties": {"state": {"enum": ["low", "ok", "high"]},
                           "level": {"type": "integer", "minimum": 0, "maximum": 100},
                           "alarm": {"type": "boolean"}}},
        max_tokens=64, validators=(), path=base.path)
    return TaskRunner(engine, tok, tasks, task_engine)


@pytest.mark.slow
@pytest.mark.parametrize("task", list(INPUTS))
def test_builtin_tasks_give_schema_valid_json_or_truncated(runner: TaskRunner,
                                                           task: str) -> None:
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(6)]
    results = runner.run([(task, INPUTS[task])] * 6, params)
    for r in results:
        assert r.generation is not None
        if r.error is not None and r.error["code"] == "truncated":
            assert r.output is None and r.generation.finish_reason == "length"
            continue
        # the JSON closed: it parses and fits the schema, whatever the semantic verdict
        assert json.loads(r.generation.text) == r.output
        assert r.validation is not None and r.validation["schema"]["ok"], r.validation
        assert r.error is None or r.error["code"] == "invalid_output"
        assert r.generation.mask_seconds and len(r.generation.mask_seconds) == len(
            r.generation.token_ids)


def test_short_task_always_completes_valid(runner: TaskRunner) -> None:
    results = runner.run([("level", {"value": 42})] * 20,
                         [SamplingParams(temperature=1.0, seed=s) for s in range(20)])
    assert all(r.ok for r in results), [r.error for r in results]
    assert len({json.dumps(r.output, sort_keys=True) for r in results}) > 1
    for r in results:
        assert r.output is not None and r.output["state"] in ("low", "ok", "high")
        assert 0 <= r.output["level"] <= 100
        assert r.generation is not None and r.generation.text == json.dumps(
            r.output, separators=(",", ":"), ensure_ascii=False)  # compact JSON


def test_truncation_is_an_error_not_a_half_object(runner: TaskRunner) -> None:
    (r,) = runner.run([("diagnosis", INPUTS["diagnosis"])], SamplingParams(seed=1),
                      max_tokens=6)
    assert r.error is not None and r.error["code"] == "truncated"
    assert r.output is None and r.validation is None and not r.ok


def test_request_errors(runner: TaskRunner) -> None:
    results = runner.run([("nope", {}), ("diagnosis", {"asset": "x"}),
                          ("level", {"value": 3})], SamplingParams(seed=0))
    assert [r.error["code"] if r.error else "ok" for r in results] == [
        "unknown_task", "bad_request", "ok"]
    assert "points" in results[1].error["message"]  # type: ignore[index]


def test_task_prompts_warmed_and_pinned_at_start(task_engine: Path) -> None:
    from rung.engines.kv_store import ColdStore
    from rung.engines.prefix_cache import PrefixCache

    engine = load_engine(task_engine)
    tok = Tokenizer.load(task_engine, engine.manifest.tokenizer)
    store = ColdStore(engine.manifest.engine_id, 1 << 26)
    warm = TaskRunner(engine, tok, load_tasks(), task_engine,
                      prefix=PrefixCache(store, engine.manifest.engine_id))
    pinned = warm.warm()
    assert set(pinned) == set(INPUTS) and min(pinned.values()) >= 64
    assert store.stats()["entries_pinned"] >= sum(pinned.values()) // 64 - 1
    cold = TaskRunner(engine, tok, load_tasks(), task_engine)
    params = SamplingParams(temperature=1.0, seed=9)
    (a,) = warm.run([("diagnosis", INPUTS["diagnosis"])], params, max_tokens=40)
    (b,) = cold.run([("diagnosis", INPUTS["diagnosis"])], params, max_tokens=40)
    assert a.generation is not None and b.generation is not None
    assert a.generation.cached_tokens >= 64 and b.generation.cached_tokens == 0
    assert a.generation.token_ids == b.generation.token_ids


def test_json_closing_exactly_at_max_tokens_is_not_truncated(runner: TaskRunner) -> None:
    params = SamplingParams(temperature=1.0, seed=5)
    (free,) = runner.run([("level", {"value": 7})], params)
    assert free.ok and free.generation is not None
    n = len(free.generation.token_ids) - 1          # the answer without its EOS
    (tight,) = runner.run([("level", {"value": 7})], params, max_tokens=n)
    assert tight.generation is not None and tight.generation.finish_reason == "length"
    assert tight.ok and tight.output == free.output
    (short,) = runner.run([("level", {"value": 7})], params, max_tokens=n - 1)
    assert short.error is not None and short.error["code"] == "truncated"


def test_one_bad_request_does_not_sink_the_batch(runner: TaskRunner) -> None:
    good = SamplingParams(seed=1)
    bad = SamplingParams.__new__(SamplingParams)  # bypass validation, as a raw request would
    object.__setattr__(bad, "__dict__", {**good.__dict__, "top_p": 7.0})
    results = runner.run([("level", {"value": 1}), ("level", {"value": 2})], [good, bad])
    assert results[0].ok
    assert results[1].error is not None and results[1].error["code"] == "bad_request"
    assert "top_p" in results[1].error["message"]


FUSED, GENERIC = "head_major_BHSD", "position_major_SBHD"


def _engine(weights: str, gated: bool, layout: str = FUSED) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(ffn_skips=np.zeros(2) if gated else None,
                           manifest=SimpleNamespace(weights=weights,
                                                    kv=SimpleNamespace(layout=layout)))


@pytest.mark.parametrize("decode,weights,gated,layout,fast", [
    ("auto", "fp32", False, FUSED, True),     # exact: drafts checked on the same kernels
    ("auto", "fp16", False, GENERIC, True),
    ("auto", "int4", False, FUSED, True),     # exact: lone tokens run padded to 2 positions
    ("auto", "int8", False, FUSED, True),
    ("auto", "int4", False, GENERIC, False),  # the generic graph rounds by step length
    ("auto", "fp32", True, FUSED, False),     # drafts run gated FFNs unskipped
    ("auto", "int4", True, FUSED, False),
    ("fast", "fp32", False, FUSED, True),
    ("plain", "fp32", False, FUSED, False),
    ("plain", "int4", True, FUSED, False),
])
def test_auto_decoding_is_fast_only_where_it_is_exact(decode: str, weights: str, gated: bool,
                                                      layout: str, fast: bool) -> None:
    from rung.daemon.tasks.runner import fast_decoding

    assert fast_decoding(decode, _engine(weights, gated, layout)) is fast  # type: ignore[arg-type]


@pytest.mark.parametrize("weights,gated,layout,why", [
    ("int4", True, FUSED, "its FFN gates"), ("fp32", True, GENERIC, "its FFN gates"),
    ("int8", False, GENERIC, "its int8 weights on the generic graph")])
def test_fast_is_refused_where_it_would_answer_otherwise(weights: str, gated: bool,
                                                         layout: str, why: str) -> None:
    """docs/contract.md: under greedy decoding plain and fast give the same text; an engine where
    they would not refuses fast, naming the option it came from and why."""
    from rung.daemon.tasks.runner import fast_decoding
    from rung.engines.errors import GenerationError

    with pytest.raises(GenerationError, match=f"--decode fast: .*\\({why}\\)") as e:
        fast_decoding("fast", _engine(weights, gated, layout), "--decode")  # type: ignore[arg-type]
    assert e.value.hint is not None and "auto" in e.value.hint


def test_a_validator_bug_is_logged_with_its_traceback_and_told_in_brief(
        runner: TaskRunner, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from rung.daemon.tasks import runner as runner_module

    def broken(*_: object, **__: object) -> None:
        raise KeyError("parser state dump of some library")

    monkeypatch.setattr(runner_module, "validate_output", broken)
    caplog.set_level(logging.ERROR, "rung.tasks")
    from rung.daemon.tasks.runner import Prepared
    from rung.engines.sequence import Generation

    data = {"asset": "pump", "points": [{"name": "p", "value": 1.0}]}
    prepared = runner.prepare("diagnosis", data, SamplingParams())
    assert isinstance(prepared, Prepared)
    from dataclasses import replace

    prepared = replace(prepared, prefix="")   # the whole answer is the text below
    gen = Generation(prompt_tokens=3, token_ids=[1], text='{"state_detection": []}',
                     ttft_ms=1.0, finish_reason="stop", decode_tok_s=1.0)
    res = runner.finish(prepared, gen)
    assert not res.ok and res.error is not None and res.error["code"] == "internal"
    assert "parser state dump" not in res.error["message"]
    assert "(KeyError)" in res.error["message"]
    (rec,) = [r for r in caplog.records if "failed inside rung" in r.getMessage()]
    assert rec.exc_info is not None
