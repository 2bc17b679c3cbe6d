"""The training-corpus generator: determinism, validity of every sample, coverage, sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rung.daemon.tasks.diagnosis import snapshot
from rung.daemon.tasks.fault_tree.analysis import GATE_PREFIX
from rung.daemon.tasks.shaping import Shape, compact
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
    ok, validation = validate_output(task.output_schema, task.kind, sample["output"],
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


def _diagnoses(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in samples if s["task"] == "diagnosis"]


def test_diagnosis_is_what_code_knows(corpus: list[dict[str, Any]]) -> None:
    """States, prognosis and the priorities allowed as ``daemon/tasks/diagnosis/snapshot.py``
    computes them; evidence from abnormal points only, in snapshot order."""
    for s in _diagnoses(corpus):
        data, out = s["input"], s["output"]
        known = snapshot.facts(data)
        assert out["state_detection"] == known.states, describe(s)
        prognosis = {k: v for k, v in out["prognosis"].items() if k != "note"}
        assert prognosis == known.prognosis, describe(s)
        assert ("note" in out["prognosis"]) == (prognosis["status"] == "assessed"), describe(s)
        priority = out["advisory"]["priority"]
        assert priority in snapshot.priorities(known, snapshot.builtin_floor()), describe(s)
        want = ({"high", "critical"} if known.worst == "alarm" else
                {"medium", "high"} if known.worst == "alert" or known.faults_possible
                else {"low"})
        assert priority in want, describe(s)
        assert out["advisory"]["requires_human_confirmation"] is True
        assert bool(out["health_assessment"]) == known.faults_possible, describe(s)
        order = [p["name"] for p in data["points"]]
        for h in out["health_assessment"]:
            assert 0.2 <= h["confidence"] <= 0.95, describe(s)
            assert set(h["evidence"]) <= set(known.citable), describe(s)
            assert h["evidence"] == sorted(h["evidence"], key=order.index), describe(s)


def test_diagnosis_histories(corpus: list[dict[str, Any]]) -> None:
    """A history is 10-60 increasing samples ending at the snapshot's reading; a prognosis
    is assessed only from one."""
    with_history = 0
    for s in _diagnoses(corpus):
        points = s["input"]["points"]
        for p in points:
            if "history" not in p:
                continue
            t = [x[0] for x in p["history"]]
            assert 10 <= len(t) <= 60, describe(s)
            assert all(b > a for a, b in zip(t, t[1:], strict=False)), describe(s)
            assert p["history"][-1][1] == p["value"], describe(s)
            assert not isinstance(p["value"], bool), describe(s)
        has = any("history" in p for p in points)
        with_history += has
        if not has:
            assert s["output"]["prognosis"] == {"status": "not_assessed",
                                                "reason": snapshot.NO_HISTORY}, describe(s)
    assert 0.3 <= with_history / len(_diagnoses(corpus)) <= 0.7


def test_diagnosis_fault_flags(corpus: list[dict[str, Any]]) -> None:
    """A switch cited as evidence is a declared fault flag, set."""
    for s in _diagnoses(corpus):
        points = {p["name"]: p for p in s["input"]["points"]}
        for h in s["output"]["health_assessment"]:
            for name in h["evidence"]:
                p = points[name]
                if isinstance(p["value"], bool):
                    flags = {k: v for k, v in p.get("limits", {}).items() if v is p["value"]}
                    assert flags and set(flags) <= {"alert", "alarm"}, describe(s)


def test_fault_tree_top_down(corpus: list[dict[str, Any]]) -> None:
    """Gates ``G_...`` from the top down, basic events never so, in the order named."""
    for s in corpus:
        if s["task"] != "fault_tree":
            continue
        out = s["output"]
        gates = [g["id"] for g in out["gates"]]
        assert gates[0] == out["top"], describe(s)
        assert all(g.startswith(GATE_PREFIX) for g in gates), describe(s)
        assert not any(e["id"].startswith(GATE_PREFIX) for e in out["basic_events"])
        for i, g in enumerate(out["gates"][1:], 1):
            assert any(g["id"] in p["inputs"] for p in out["gates"][:i]), describe(s)


def _stages(sh: Shape, text: str) -> list[Any]:
    """The schemas the grammar follows while ``text`` is written (restaged as the runner
    does, after each character ``restage_at``)."""
    schemas = [sh.schema]
    if sh.restage is not None:
        for i, ch in enumerate(text):
            if ch in sh.restage_at:
                new = sh.restage(text[:i + 1])
                if new is not None and new is not schemas[-1]:
                    schemas.append(new)
    return schemas


@pytest.mark.parametrize("which", ["corpus", "corpus2"])
@pytest.mark.slow
def test_answers_fit_their_shapes(which: str, request: pytest.FixtureRequest,
                                  tasks: dict[str, Task]) -> None:
    """A diagnosis or fault-tree answer is one the request's narrowed grammar writes: it
    starts with the prefix code computes and fits every stage's schema."""
    failures = []
    for i, s in enumerate(request.getfixturevalue(which)):
        if s["task"] == "st_code":   # its stages are grammars (tests/daemon/tasks)
            continue
        task = tasks[s["task"]]
        sh = task.kind.shape(task.output_schema, s["input"])
        text = compact(s["output"])
        if not text.startswith(sh.prefix):
            failures.append(f"#{i} {describe(s)}: does not start with {sh.prefix[:200]}")
            continue
        for n, schema in enumerate(_stages(sh, text)):
            errors = [e.message[:200] for e in
                      jsonschema.Draft202012Validator(schema).iter_errors(s["output"])]
            if errors:
                failures.append(f"#{i} {describe(s)}: stage {n}: {errors[:2]}")
                break
    assert not failures, "\n".join(failures[:20])


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
    prognoses = {(any("history" in p for p in s["input"]["points"]),
                  s["output"]["prognosis"]["status"],
                  s["output"]["prognosis"].get("remaining_useful_life_h") == 0)
                 for s in _diagnoses(corpus)}
    # without history; with one: a remaining life, none left (in alarm), no trend
    assert {(False, "not_assessed", False), (True, "assessed", False),
            (True, "assessed", True), (True, "not_assessed", False)} <= prognoses
    flags = {p["value"] for s in _diagnoses(corpus) for p in s["input"]["points"]
             if isinstance(p["value"], bool) and p.get("limits")}
    assert flags == {True, False}


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
