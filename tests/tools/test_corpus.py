"""The training-corpus generator: determinism, validity of every sample, coverage, sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rung.daemon.tasks.task import Task, load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.tools.corpus import TASKS, describe, generate, main
from rung.tools.corpus_st import ARCHETYPES

MIN_CHARS, MAX_CHARS = 100, 2500


def _dump(samples: list[dict[str, Any]]) -> str:
    return json.dumps(samples, sort_keys=True, ensure_ascii=False)


def _compact(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return load_tasks()


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, Any]]:
    return generate(300, seed=0)


@pytest.fixture(scope="module")
def corpus2() -> list[dict[str, Any]]:
    return generate(90, seed=12345)


# --- determinism ----------------------------------------------------------------------------


def test_same_seed_same_bytes() -> None:
    assert _dump(generate(60, seed=3)) == _dump(generate(60, seed=3))


def test_different_seed_differs() -> None:
    assert _dump(generate(60, seed=3)) != _dump(generate(60, seed=4))


def test_prefix_stable(corpus: list[dict[str, Any]]) -> None:
    assert _dump(generate(45, seed=0)) == _dump(corpus[:45])


def test_tasks_round_robin_and_subset() -> None:
    assert [s["task"] for s in generate(6)] == list(TASKS) * 2
    only = generate(10, seed=1, tasks=["diagnosis"])
    assert {s["task"] for s in only} == {"diagnosis"}
    with pytest.raises(ValueError):
        generate(3, tasks=["haiku"])


# --- validity of every sample ---------------------------------------------------------------


def _problems(sample: dict[str, Any], task: Task) -> list[Any]:
    problems: list[Any] = [e.message for e in jsonschema.Draft202012Validator(
        task.input_schema).iter_errors(sample["input"])]
    ok, validation = validate_output(task.output_schema, task.validators, sample["output"],
                                     sample["input"])
    if not ok:
        problems += [{k: v["errors"]} for k, v in validation.items()
                     if isinstance(v, dict) and not v.get("ok", True)]
    if task.name == "fault_tree" and ok:
        gate_types = {g["type"] for g in sample["output"]["gates"]}
        warnings = validation["fault_tree"]["warnings"]
        # the only accepted warning: a NOT gate makes the tree non-coherent
        if warnings and not ("NOT" in gate_types and len(warnings) == 1
                             and "non-coherent" in warnings[0]["message"]):
            problems.append({"warnings": warnings})
    return problems


@pytest.mark.parametrize("which", ["corpus", "corpus2"])
def test_every_sample_validates(which: str, request: pytest.FixtureRequest,
                                tasks: dict[str, Task]) -> None:
    samples = request.getfixturevalue(which)
    failures = []
    for i, s in enumerate(samples):
        problems = _problems(s, tasks[s["task"]])
        if problems:
            failures.append(f"#{i} {describe(s)}: {str(problems)[:400]}")
    assert not failures, "\n".join(failures[:20])


def test_answer_sizes(corpus: list[dict[str, Any]]) -> None:
    bad = [f"#{i} {describe(s)}" for i, s in enumerate(corpus)
           if not MIN_CHARS <= _compact(s["output"]) <= MAX_CHARS]
    assert not bad, "\n".join(bad[:20])


def test_st_bodies_short(corpus: list[dict[str, Any]]) -> None:
    for s in corpus:
        if s["task"] == "st_code":
            assert 1 <= len(s["output"]["body"].splitlines()) <= 40, describe(s)


# --- semantics beyond the validators --------------------------------------------------------


def test_st_input_agrees_with_output(corpus: list[dict[str, Any]]) -> None:
    for s in corpus:
        if s["task"] != "st_code":
            continue
        data, out = s["input"], s["output"]
        assert data.get("name", out["name"]) == out["name"], describe(s)
        assert data.get("pou_type", out["pou_type"]) == out["pou_type"], describe(s)
        if out["pou_type"] == "FUNCTION":
            assert out.get("return_type"), describe(s)
            assert f"{out['name']} :=" in out["body"], describe(s)


def test_diagnosis_priority_follows_severity(corpus: list[dict[str, Any]]) -> None:
    for s in corpus:
        if s["task"] != "diagnosis":
            continue
        out = s["output"]
        states = {r["state"] for r in out["state_detection"]}
        want = ({"high", "critical"} if "alarm" in states else
                {"medium"} if "alert" in states else {"low"})
        assert out["advisory"]["priority"] in want, describe(s)
        assert out["advisory"]["requires_human_confirmation"] is True
        assessed = out["prognosis"]["status"] == "assessed"
        assert assessed == ("Trend:" in s["input"].get("description", "")), describe(s)
        abnormal = {r["point"] for r in out["state_detection"] if r["state"] != "normal"}
        for h in out["health_assessment"]:
            assert 0.2 <= h["confidence"] <= 0.95, describe(s)
            assert set(h["evidence"]) <= abnormal, describe(s)
        assert bool(out["health_assessment"]) == bool(abnormal), describe(s)


# --- coverage -------------------------------------------------------------------------------


def test_coverage(corpus: list[dict[str, Any]]) -> None:
    st = [s for s in corpus if s["task"] == "st_code"]
    assert {s["kind"] for s in st} == set(ARCHETYPES)
    assert {s["output"]["pou_type"] for s in st} == {"PROGRAM", "FUNCTION_BLOCK", "FUNCTION"}
    gates = {g["type"] for s in corpus if s["task"] == "fault_tree"
             for g in s["output"]["gates"]}
    assert {"AND", "OR", "ATLEAST", "INHIBIT"} <= gates
    states = {r["state"] for s in corpus if s["task"] == "diagnosis"
              for r in s["output"]["state_detection"]}
    assert states == {"normal", "alert", "alarm"}
    prognoses = {s["output"]["prognosis"]["status"] for s in corpus if s["task"] == "diagnosis"}
    assert prognoses == {"assessed", "not_assessed"}


# --- describe and the CLI -------------------------------------------------------------------


def test_describe_one_line(corpus: list[dict[str, Any]]) -> None:
    for s in corpus[:6]:
        line = describe(s)
        assert line.startswith(s["task"]) and "\n" not in line


def test_cli_writes_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "corpus.jsonl"
    assert main(["--n", "7", "--seed", "5", "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines == [json.dumps(s, sort_keys=True, ensure_ascii=False)
                     for s in generate(7, seed=5)]


def test_point_names_unique_per_asset() -> None:
    from rung.tools.corpus_plant import ASSETS, POINTS, SWITCHES

    for asset in ASSETS.values():
        names = [n for k in asset.points for n in POINTS[k].names]
        names += [n for sw in asset.switches for n in SWITCHES[sw][0]]
        assert len(names) == len(set(names)), asset.key
