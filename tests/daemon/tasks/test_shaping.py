"""Per-request output shapes: the task schema narrowed by the request, the answer's start
computed by code. Unit checks of each shaper, then the real runner on the demo engine:
what code computes cannot be contradicted, names outside the input cannot be generated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rung.daemon.tasks.diagnosis import snapshot
from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

TASKS = load_tasks()
SNAPSHOT = {"asset": "Hydraulic press 1", "points": [
    {"name": "oil_temp", "value": 86.2, "unit": "degC", "limits": {"alert": 70, "alarm": 85}},
    {"name": "pressure", "value": 95.0, "unit": "bar",
     "limits": {"low_alert": 100, "low_alarm": 80}},
    {"name": "pump_on", "value": True},
    {"name": "vibration", "value": 2.1, "limits": {"alert": 4.5, "alarm": 7.1}}]}


def test_diagnosis_states_are_computed_and_evidence_names_come_from_the_input() -> None:
    task = TASKS["diagnosis"]
    s = task.kind.shape(task.output_schema, SNAPSHOT)
    states = [{"point": "oil_temp", "state": "alarm"}, {"point": "pressure", "state": "alert"},
              {"point": "vibration", "state": "normal"}]   # pump_on: no limits, not decided
    assert snapshot.states(SNAPSHOT) == states
    assert s.prefix == '{"state_detection":' + json.dumps(states, separators=(",", ":")) + ","
    evidence = s.schema["properties"]["health_assessment"]["items"]["properties"]["evidence"]
    # only the points that are not normal, each at most once (diagnosis/test_snapshot.py)
    assert [[c["const"] for c in alt["prefixItems"]] for alt in evidence["anyOf"]] == [
        ["oil_temp"], ["pressure"], ["oil_temp", "pressure"]]
    # a narrowed schema accepts only answers of the published one
    good = {"state_detection": states, "health_assessment": [],
            "prognosis": s.schema["properties"]["prognosis"]["const"],
            "advisory": {"priority": "high", "actions": ["a"],
                         "requires_human_confirmation": True}}
    jsonschema.validate(good, s.schema)
    jsonschema.validate(good, task.output_schema)
    bad = dict(good, state_detection=[{"point": "oil_temp", "state": "normal"}])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, s.schema)
    assert task.output_schema["properties"]["state_detection"]["type"] == "array"  # untouched


def test_fault_tree_evidence_and_st_constants() -> None:
    ft = TASKS["fault_tree"]
    s = ft.kind.shape(ft.output_schema, {"top_event": "t", "system": "s",
                                                "points": [{"name": "p1", "value": 1}]})
    point = s.schema["properties"]["basic_events"]["items"]["properties"]["evidence"]
    # one object per point, its observation starting with the reading (fault_tree/test_shape.py)
    assert [a["properties"]["point"] for a in point["anyOf"]] == [{"const": "p1"}]
    assert s.prefix == ""
    free = ft.kind.shape(ft.output_schema, {"top_event": "t", "system": "s"}).schema
    point = free["properties"]["basic_events"]["items"]["properties"]["evidence"]
    assert point["properties"]["point"] == {"type": "string", "maxLength": 64}
    st = TASKS["st_code"]
    s = st.kind.shape(st.output_schema, {"description": "d", "name": "FB_Pump",
                                                "pou_type": "FUNCTION_BLOCK"})
    assert s.schema["properties"]["name"] == {"const": "FB_Pump"}
    assert s.schema["properties"]["pou_type"] == {"const": "FUNCTION_BLOCK"}


@pytest.fixture(scope="module")
def demo(edge_engine: Path) -> tuple[TaskRunner, TaskRunner]:
    engine = load_engine(edge_engine)
    tok = Tokenizer.load(edge_engine, engine.manifest.tokenizer)
    return (TaskRunner(engine, tok, TASKS, edge_engine),
            TaskRunner(engine, tok, TASKS, edge_engine, shaped=False))


def _answer(runner: TaskRunner, task: str, data: dict[str, Any], **kw: Any) -> Any:
    (r,) = runner.run([(task, data)], SamplingParams(**kw))
    return r


@pytest.mark.slow
def test_the_demo_model_cannot_contradict_the_snapshot(
        demo: tuple[TaskRunner, TaskRunner]) -> None:
    shaped, _ = demo
    r = _answer(shaped, "diagnosis", SNAPSHOT)
    assert r.output is not None, r.error
    assert r.output["state_detection"] == snapshot.states(SNAPSHOT)
    assert json.loads(r.generation.text) == r.output   # the text is the whole answer
    for h in r.output["health_assessment"]:
        assert set(h["evidence"]) <= {p["name"] for p in SNAPSHOT["points"]}
    ok, validation = validate_output(TASKS["diagnosis"].output_schema, TASKS["diagnosis"].kind,
                                     r.output, SNAPSHOT)
    assert validation["diagnosis"]["ok"], validation
    # sampled answers too: 5 seeds, every one agrees with the snapshot
    for seed in range(5):
        s = _answer(shaped, "diagnosis", SNAPSHOT, temperature=1.0, seed=seed)
        if s.output is not None:
            assert s.output["state_detection"] == snapshot.states(SNAPSHOT)


@pytest.mark.slow
def test_an_st_answer_keeps_the_requested_name_and_type(
        demo: tuple[TaskRunner, TaskRunner]) -> None:
    shaped, plain = demo
    data = {"description": "Start the hydraulic pump when the press door is closed.",
            "name": "FB_PressPump", "pou_type": "FUNCTION_BLOCK"}
    for seed in range(3):
        r = _answer(shaped, "st_code", data, temperature=1.0, seed=seed)
        if r.output is not None:
            assert (r.output["name"], r.output["pou_type"]) == ("FB_PressPump",
                                                               "FUNCTION_BLOCK")
    assert shaped.prepare("st_code", data, SamplingParams()).grammar_ms >= 0  # type: ignore


def test_fault_tree_gates_carry_what_their_type_needs() -> None:
    ft = TASKS["fault_tree"]
    s = ft.kind.shape(ft.output_schema, {"top_event": "t", "system": "s"}).schema
    base = {"top": "G_1", "description": "d", "basic_events": [
        {"id": "E1", "description": "e", "probability": 0.1},
        {"id": "E2", "description": "e", "probability": 0.1}]}
    ok = [{"id": "G_1", "type": "OR", "inputs": ["E1", "E2"]},
          {"id": "G_1", "type": "ATLEAST", "k": 1, "inputs": ["E1"]},
          {"id": "G_1", "type": "NOT", "inputs": ["E1"]},
          {"id": "G_1", "type": "INHIBIT", "inputs": ["E1"], "condition": "E2"}]
    bad = [{"id": "G_1", "type": "AND", "inputs": ["E1"]},           # one input
           {"id": "G_1", "type": "ATLEAST", "inputs": ["E1"]},        # no k
           {"id": "G_1", "type": "NOT", "inputs": ["E1", "E2"]},      # two inputs
           {"id": "G_1", "type": "INHIBIT", "inputs": ["E1"]}]        # no condition
    for gate in ok + bad:   # a gate's description is required here (fault_tree/test_shape.py)
        gate["description"] = "g"
    for gate in ok:
        jsonschema.validate({**base, "gates": [gate]}, s)
        jsonschema.validate({**base, "gates": [gate]}, ft.output_schema)
    for gate in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**base, "gates": [gate]}, s)


def test_fault_tree_basic_events_are_what_the_gates_name() -> None:
    ft = TASKS["fault_tree"]
    sh = ft.kind.shape(ft.output_schema, {"top_event": "t", "system": "s"})
    assert sh.restage is not None
    head = ('{"top":"G_1","description":"d","gates":[{"id":"G_1","type":"OR","inputs":'
            '["E_A","G_2"],"description":"g"},{"id":"G_2","type":"INHIBIT","inputs":["E_B"],'
            '"condition":"E_C","description":"g"}],')
    assert sh.restage(head) is None                       # the gates are not closed yet
    narrowed = sh.restage(head + '"basic_events":[{"')   # the token may carry more
    assert narrowed is not None
    events = narrowed["properties"]["basic_events"]
    assert [i["properties"]["id"] for i in events["prefixItems"]] == [
        {"const": "E_A"}, {"const": "E_B"}, {"const": "E_C"}]
    assert events["minItems"] == events["maxItems"] == 3 and events["items"] is False
    full = json.loads(head + '"basic_events":[' + ",".join(
        f'{{"id":"{i}","description":"x","probability":0.1}}' for i in ("E_A", "E_B", "E_C"))
        + "]}")
    jsonschema.validate(full, narrowed)
    dangling = dict(full, basic_events=full["basic_events"][:2])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dangling, narrowed)


@pytest.mark.slow
def test_demo_fault_trees_cannot_dangle(demo: tuple[TaskRunner, TaskRunner]) -> None:
    """Held-out corpus fault trees through the real runner: no answer names an id that is
    neither a gate nor a basic event, and every gate hangs under the top (the published
    schema alone allows both: test_fault_tree_basic_events_are_what_the_gates_name)."""
    from rung.tools.corpus import generate as corpus

    shaped, _ = demo
    samples = [s for s in corpus(30, seed=1000) if s["task"] == "fault_tree"][:6]
    for s in samples:
        r = _answer(shaped, "fault_tree", s["input"])
        errors = (r.validation or {}).get("fault_tree", {}).get("errors", [])
        assert not [e for e in errors if "names no gate or basic event" in e["message"]
                    or "is not reachable from top" in e["message"]], errors
