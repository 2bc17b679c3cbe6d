"""A fault tree for a named system names its components as it is written
(``fault_tree_shape``: while the basic events written so far name fewer of the system's
components than the ``components`` check needs, the next event's description starts with
one none of them names yet). The stages follow the text; the request's grammar, followed
token by token as the runner follows it, refuses events that name none; random walks
through it close only on trees the check passes; the demo model, which names none of them
unshaped, passes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.tasks.fault_tree.analysis import check_components, system_components
from rung.daemon.tasks.fault_tree.shape import fault_tree_shape, naming_pattern
from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.shaping import compact
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.grammar import GrammarError
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from tests.daemon.tasks.walks import walk

FT = load_tasks()["fault_tree"]
SYSTEM = "Pump set P-101: centrifugal pump, suction strainer, motor, contactor and check valve"
REQUEST = {"top_event": "No flow from pump set P-101", "system": SYSTEM}
HEAD = {"top": "G_TOP", "description": "No flow",
        "gates": [{"id": "G_TOP", "type": "OR", "inputs": ["E_A", "G_I", "G_X"],
                   "description": "No flow"},
                  {"id": "G_I", "type": "INHIBIT", "condition": "C_RUN", "inputs": ["E_B"],
                   "description": "Blocked while running"},
                  {"id": "G_X", "type": "OR", "inputs": ["E_C", "E_D"],
                   "description": "No delivery"}]}


def _text(events: list[dict[str, Any]], more: str = "") -> str:
    head = compact(HEAD)[:-1]
    return head + ',"basic_events":[' + ",".join(compact(e) for e in events) + more


def _pattern(stage: dict[str, Any] | None, k: int) -> str | None:
    assert stage is not None
    event = stage["properties"]["basic_events"]["prefixItems"][k]
    return event["properties"]["description"].get("pattern")


def test_the_next_event_names_a_component_none_names_yet() -> None:
    _, restage = fault_tree_shape(FT.output_schema, REQUEST)
    names = [c.name for c in system_components(SYSTEM)]
    assert names == ["centrifugal pump", "suction strainer", "motor", "contactor",
                     "check valve"]
    assert _pattern(restage(_text([], '{"')), 0) == naming_pattern(tuple(names))
    motor = {"id": "E_A", "description": "Motor winding burnt out", "probability": 0.01}
    stage = restage(_text([motor], ',{"'))
    assert _pattern(stage, 0) is None
    assert _pattern(stage, 1) == naming_pattern(
        ("centrifugal pump", "suction strainer", "contactor", "check valve"))
    # the INHIBIT condition is a state: not made to name a component
    blocked = {"id": "E_B", "description": "Suction strainer blocked", "probability": 0.02}
    assert _pattern(restage(_text([motor, blocked], ',{"')), 2) is None
    # three of five named (the check's need): nothing more asked
    run = {"id": "C_RUN", "description": "Pump running", "probability": 0.9}
    contactor = {"id": "E_C", "description": "Contactor contacts welded open",
                 "probability": 0.01}
    stage = restage(_text([motor, blocked, run, contactor], ',{"'))
    assert stage is not None
    assert all("pattern" not in e["properties"]["description"]
               for e in stage["properties"]["basic_events"]["prefixItems"])


def test_a_system_without_a_list_asks_nothing() -> None:
    _, restage = fault_tree_shape(FT.output_schema,
                                  {"top_event": "No flow", "system": "Pump set P-101"})
    assert _pattern(restage(_text([], '{"')), 0) is None


def test_the_pattern_takes_either_case_and_nothing_else() -> None:
    import re
    p = re.compile(naming_pattern(("suction strainer", "check valve")))
    assert p.match("Suction strainer blocked") and p.match("check valve stuck shut")
    assert p.match("Suction strainer") and p.match("Check valve, flap broken")
    assert not p.match("Strainer blocked") and not p.match("Suction strainers")


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


def _written(runner: TaskRunner, text: str) -> str:
    constraint, _, _ = runner._shaped(FT, REQUEST)
    ids = runner.tokenizer.encode(text, add_bos=False)
    for n, tok in enumerate(ids):
        if not constraint.allowed()[tok]:
            return runner.tokenizer.decode(ids[:n])
        try:
            constraint.consume(tok)
        except GrammarError as e:
            raise AssertionError(f"restage broke at {runner.tokenizer.decode(ids[:n + 1])!r}"
                                 ) from e
    return text


def _tree(descriptions: list[str]) -> dict[str, Any]:
    ids = ["E_A", "E_B", "C_RUN", "E_C", "E_D"]
    return {**HEAD, "basic_events": [{"id": i, "description": d, "probability": 0.01}
                                     for i, d in zip(ids, descriptions, strict=True)]}


def test_the_grammar_writes_a_tree_that_names_them(runner: TaskRunner) -> None:
    tree = _tree(["Motor winding burnt out", "Suction strainer blocked", "Pump running",
                  "Check valve stuck shut", "Impeller worn"])
    text = compact(tree)
    assert _written(runner, text) == text
    assert check_components(tree, SYSTEM)["ok"]


def test_the_grammar_refuses_an_event_that_names_none(runner: TaskRunner) -> None:
    tree = _tree(["Motor winding burnt out", "Loss of supply", "Pump running",
                  "Check valve stuck shut", "Impeller worn"])
    text = compact(tree)
    written = _written(runner, text)
    at = text.index("Loss of supply")
    assert at <= len(written) < at + len("Loss"), written[-40:]
    assert not check_components(_tree(["Loss of supply"] * 5), SYSTEM)["ok"]


def test_every_tree_the_grammar_closes_names_enough_components(runner: TaskRunner) -> None:
    """Random walks through the request's grammar, restaged as the runner restages: every
    closed tree passes the components check, and no restage refuses the answer so far."""
    closed = 0
    for seed in range(12):
        constraint = walk(runner, FT, REQUEST, lambda x: any(c in x for c in '"[]{},'),
                          seed, most=3000, lean=0.7)
        if not constraint.accepting:
            continue
        tree = json.loads(runner.tokenizer.decode(constraint.tokens))
        closed += 1
        section = check_components(tree, SYSTEM)
        events = len(tree["basic_events"])
        assert section["ok"] or events < section["required"], section
    assert closed >= 6


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_model_names_the_components(runner: TaskRunner) -> None:
    """The hand-written requests' kind of system: the demo model's trees, unshaped, named
    none of the listed components; under the shape every closed tree passes the check."""
    requests = [REQUEST, {"top_event": "Boiler trips on low water",
                          "system": "Steam boiler B1 with two feed pumps, level transmitter "
                                    "and a low-water cutoff switch"}]
    for request in requests:
        (r,) = runner.run([("fault_tree", request)], SamplingParams(temperature=0.0))
        if r.output is None:
            assert r.error is not None and r.error["code"] == "truncated", r.error
            continue
        assert r.validation["components"]["ok"], r.validation["components"]  # type: ignore[index]
