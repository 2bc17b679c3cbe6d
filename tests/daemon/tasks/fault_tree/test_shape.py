"""A fault tree's shape as it is written (``daemon/tasks/fault_tree/shape.py``): every gate
under the top, gate and basic-event ids told apart by name, evidence quoting its point's
reading. The validator refuses each of the demo model's wrong answers; the request's
grammar, followed token by token as the runner follows it, cannot write them; and the demo
model, under it, writes none of them."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from rung.daemon.tasks.fault_tree.shape import (
    EVENT_ID,
    GATE_ID,
    REF_ID,
    fault_tree_shape,
    observation_pattern,
)
from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.shaping import compact
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.engines import load_engine
from rung.engines.grammar import GrammarError
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

FT = load_tasks()["fault_tree"]
REQUEST = {"top_event": "Conveyor stops on drive overload",
           "system": "Belt conveyor C3, 7.5 kW drive with gearbox",
           "points": [{"name": "current", "value": 42.5, "unit": "A"},
                      {"name": "belt_speed", "value": 1.2, "unit": "m/s"},
                      {"name": "flow", "value": 80.5, "unit": "m3/h (abs)"},
                      {"name": "drive_on", "value": True},
                      {"name": "spare", "value": None}]}


def _good() -> dict[str, Any]:
    return {"top": "G_TOP", "description": "Conveyor stops on drive overload",
            "gates": [{"id": "G_TOP", "type": "OR", "inputs": ["G_LOAD", "E_GEAR_WEAR"],
                       "description": "Conveyor stops on drive overload"},
                      {"id": "G_LOAD", "type": "OR", "inputs": ["G_OVERFEED_INH", "E_IDLER"],
                       "description": "Excess belt load"},
                      {"id": "G_OVERFEED_INH", "type": "INHIBIT", "condition": "C_PEAK",
                       "inputs": ["E_OVERFEED"], "description": "Overfed at peak load"}],
            "basic_events": [
                {"id": "E_GEAR_WEAR", "description": "Gear teeth worn", "probability": 0.003},
                # (not 2e-06: llguidance writes a bounded number without an exponent)
                {"id": "E_IDLER", "description": "Idlers seized", "failure_rate": 0.0002},
                {"id": "E_OVERFEED", "description": "Conveyor overfed", "probability": 0.01,
                 "evidence": {"point": "current", "observation": "42.5 A, above normal"}},
                {"id": "C_PEAK", "description": "Peak throughput", "probability": 0.09}]}


def _unreachable() -> dict[str, Any]:
    """The demo model's answer: a gate no gate under the top names, a gate reference
    written as a basic event."""
    tree = _good()
    tree["gates"][0:3] = [tree["gates"][0], tree["gates"][2]]
    tree["basic_events"][1] = {"id": "G_LOAD", "description": "Peak throughput",
                               "probability": 0.09}
    return tree


def _event_like_a_gate() -> dict[str, Any]:
    tree = _unreachable()
    del tree["gates"][1]
    del tree["basic_events"][2:]
    return tree


def _misquoted() -> dict[str, Any]:
    tree = _good()
    tree["basic_events"][2]["evidence"]["observation"] = "59.0 A, above normal 36-44"
    return tree


WRONG = {"unreachable gate": (_unreachable, "gates[1]", "'G_OVERFEED_INH' is not reachable"),
         "basic event named like a gate": (_event_like_a_gate, "basic_events[1].id",
                                           "'G_LOAD' is named like a gate"),
         "evidence quoting another value": (_misquoted, "basic_events[2].evidence.observation",
                                            "quotes 59.0, the point reads 42.5")}


def _validate(tree: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    return validate_output(FT.output_schema, FT.kind, tree, REQUEST)


def test_the_good_tree_passes() -> None:
    ok, v = _validate(_good())
    assert ok, v


@pytest.mark.parametrize("case", list(WRONG))
def test_the_validator_refuses_the_wrong_answers(case: str) -> None:
    build, path, words = WRONG[case]
    ok, v = _validate(build())
    assert v["schema"]["ok"], v["schema"]   # the published schema alone lets them through
    assert not ok
    assert any(e["path"] == path and words in e["message"] for e in v["fault_tree"]["errors"]), \
        v["fault_tree"]["errors"]


def test_ids_tell_gates_and_events_apart() -> None:
    """Every id of the published pattern (but "G_" alone) is a gate id or an event id, never
    both, and a gate id exactly when it starts with G_; a reference is either."""
    gate, event = re.compile(GATE_ID["pattern"]), re.compile(EVENT_ID["pattern"])
    ref = re.compile(REF_ID["pattern"])
    published = re.compile(FT.output_schema["$defs"]["id"]["pattern"])
    for name in ("G_TOP", "G_1", "G_" + "X" * 30, "G", "GX", "G1_A", "E_LOAD", "TOP", "a",
                 "Gx_", "C_HOT", "G__", "G_" + "X" * 31, "1A", "E-1", "g_low", "X" * 33):
        is_gate, is_event = bool(gate.match(name)), bool(event.match(name))
        assert not (is_gate and is_event), name
        assert (is_gate or is_event) == bool(published.match(name)) == bool(ref.match(name))
        assert is_gate == (bool(published.match(name)) and name.startswith("G_")), name
    assert published.match("G_") and not ref.match("G_")   # named like a gate, no gate id


def test_observation_pattern_is_the_reading_then_a_note() -> None:
    for reading, good, bad in [
            ("42.5 A", ["42.5 A", "42.5 A, above normal 36-44"],
             ["59.0 A", "42.5 A above", "42.5", "42.5 AA", "x42.5 A", "42.5A"]),
            ("80.5 m3/h (abs)", ["80.5 m3/h (abs)", "80.5 m3/h (abs), low"],
             ["80.5 m3/h abs", "80.5 m3/h (abs"]),
            ("1e-05 bar", ["1e-05 bar"], ["1e-050 bar", "1xe-05 bar"]),
            ("True", ["True", "True, running"], ["False", "true"])]:
        rx = re.compile(observation_pattern(reading))
        assert all(rx.search(t) for t in good), (reading, good)
        assert not any(rx.search(t) for t in bad), (reading, bad)


def test_the_narrowed_schema_is_a_subset_of_the_published_one() -> None:
    narrowed, _ = fault_tree_shape(FT.output_schema, REQUEST)
    jsonschema.Draft202012Validator.check_schema(narrowed)
    jsonschema.validate(_good(), narrowed)
    jsonschema.validate(_good(), FT.output_schema)
    for build, *_ in WRONG.values():
        jsonschema.validate(build(), FT.output_schema)
    for build in (_event_like_a_gate, _misquoted):   # the rest is for the restages
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(build(), narrowed)
    no_description, no_number, both = _good(), _good(), _good()
    del no_description["gates"][1]["description"]
    del no_number["basic_events"][0]["probability"]
    both["basic_events"][0]["failure_rate"] = 1e-6
    for tree in (no_description, no_number, both):   # published: a description may be left
        with pytest.raises(jsonschema.ValidationError):  # out; the validator refuses the rest
            jsonschema.validate(tree, narrowed)
    assert "description" not in FT.output_schema["properties"]["gates"]["items"]["required"]


def test_the_stages_follow_the_open_gate_references() -> None:
    sh = FT.kind.shape(FT.output_schema, REQUEST)
    assert sh.restage is not None and sh.restage_at == '"'
    text = compact(_good())
    gates_at = text.index('"gates":[')

    def gates(upto: str) -> dict[str, Any]:
        stage = sh.restage(text[:text.index(upto) + len(upto)])  # type: ignore[misc]
        assert stage is not None, upto
        return stage["properties"]["gates"]  # type: ignore[no-any-return]

    assert sh.restage('{"top":"G_T') is None                    # the top not written yet
    first = gates('{"top":"G_TOP",')
    assert [k["properties"]["id"] for k in first["prefixItems"][0]["anyOf"]] == [
        {"enum": ["G_TOP"]}] * 4                                  # the first gate is the top
    stage = sh.restage(text[:gates_at + 12])                      # the same stage, as is
    assert stage is not None and stage["properties"]["gates"] is first
    for upto, n, open_refs in (('"E_GEAR_WEAR"],', 1, ["G_LOAD"]),
                               ('"E_IDLER"],', 2, ["G_OVERFEED_INH"])):
        stage = gates(upto)   # the next gate: an open reference, and one gate more at least
        assert stage["prefixItems"][:n] == [{"$ref": "#/$defs/gate"}] * n
        assert [k["properties"]["id"] for k in stage["prefixItems"][n]["anyOf"]] == [
            {"enum": open_refs}] * 4
        assert stage["minItems"] == n + 1 and stage["items"] == {"$ref": "#/$defs/gate"}
    last = gates('"E_OVERFEED"],')
    assert last["items"] is False and last["maxItems"] == 3       # no gate open: they close
    assert sh.restage(text[:text.index('"basic_events"')]) is None   # closed: nothing new
    events = sh.restage(text[:text.index('"basic_events":[') + 17])
    assert events is not None
    assert [i["properties"]["id"] for i in events["properties"]["basic_events"][
        "prefixItems"]] == [{"const": e} for e in ("E_GEAR_WEAR", "E_IDLER", "E_OVERFEED",
                                                   "C_PEAK")]


# ---------------------------------------------------------------------------------------------
# The grammar, followed token by token as the runner follows it


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


def _written(runner: TaskRunner, text: str, tokens: list[int] | None = None) -> str:
    """How much of ``text`` the request's grammar lets the model write (its whole answer
    when it closes there), with the restages applied as the runner applies them."""
    constraint, _, _ = runner._shaped(FT, REQUEST)
    ids = runner.tokenizer.encode(text, add_bos=False) if tokens is None else tokens
    for n, tok in enumerate(ids):
        if not constraint.allowed()[tok]:
            return runner.tokenizer.decode(ids[:n])
        try:
            constraint.consume(tok)
        except GrammarError as e:   # a narrowed grammar that refuses what came before
            raise AssertionError(f"restage broke at {runner.tokenizer.decode(ids[:n + 1])!r}"
                                 ) from e
    return text if constraint.accepting else text + " (open)"


def test_the_grammar_writes_the_good_tree(runner: TaskRunner) -> None:
    text = compact(_good())
    assert _written(runner, text) == text


@pytest.mark.parametrize(("case", "stops_before"), [
    ("unreachable gate", 'OVERFEED_INH"'),   # the second gate can only be G_LOAD
    ("basic event named like a gate", '],"basic_events"'),   # G_LOAD is still open
    ("evidence quoting another value", '59.0 A'),
])
def test_the_grammar_cannot_write_the_wrong_answers(runner: TaskRunner, case: str,
                                                    stops_before: str) -> None:
    text = compact(WRONG[case][0]())
    written = _written(runner, text)
    assert written != text
    assert text.index(stops_before) - 8 <= len(written) <= text.index(stops_before), \
        (written[-40:], stops_before)


def test_a_gate_cannot_close_inputs_gate_and_gates_in_one_token(runner: TaskRunner) -> None:
    """The vocabulary has '"]}],"': after a gate's inputs it would close the gates before
    the code saw those inputs. A gate's description comes first, so it cannot."""
    texts = runner.tokenizer.token_texts()
    closer = texts.index('"]}],"')
    head = '{"top":"G_TOP","description":"d","gates":[{"id":"G_TOP","type":"OR","inputs":' \
           '["E_A","G_B'
    ids = runner.tokenizer.encode(head, add_bos=False) + [closer]
    assert _written(runner, "", ids) == head


@pytest.mark.slow
def test_every_tree_the_grammar_lets_through_passes_these_checks(runner: TaskRunner) -> None:
    """Random walks through the request's grammar (each token drawn from those it allows,
    restaged as the runner restages), steered to name gates so that trees grow up to the
    schema's 30 gates: every closed answer is a document of the published schema with no
    gate off the top, no dangling reference, no basic event named like a gate, and every
    evidence quoting its reading; no restage ever refuses the answer so far."""
    tok = runner.tokenizer
    texts = tok.token_texts()
    vocab = runner.engine.manifest.dims.vocab_size
    structural = np.array([any(c in x for c in '"[]{},') for x in texts]
                          + [False] * (vocab - len(texts)))
    g, underscore = texts.index("G"), texts.index("_")
    sizes = []
    for walk in range(40):
        rng = random.Random(walk)
        constraint, _, _ = runner._shaped(FT, REQUEST)
        while not constraint.accepting:
            allowed = constraint.allowed()
            tail = tok.decode(constraint.tokens[-3:])
            r = rng.random()
            if tail.endswith(('["', '","')) and allowed[g] and r < 0.6:
                pick = g                       # a reference that may become a gate's
            elif tail.endswith('"G') and allowed[underscore] and r < 0.9:
                pick = underscore
            else:
                ids = np.flatnonzero(allowed)
                marks = ids[structural[ids]]
                pick = int(rng.choice(marks if len(marks) and r < 0.6 else ids))
            constraint.consume(pick)
            assert len(constraint.tokens) < 5000
        tree = json.loads(tok.decode(constraint.tokens))
        ok, v = _validate(tree)
        assert v["schema"]["ok"], v["schema"]
        wrong = [e for e in v["fault_tree"]["errors"] if any(w in e["message"] for w in (
            "not reachable", "named like a gate", "reading", "names no gate"))]
        assert not wrong, wrong
        sizes.append(len(tree["gates"]))
    assert max(sizes) == 30 and len(set(sizes)) > 5, sizes


@pytest.mark.slow
@pytest.mark.integration
def test_the_demo_model_writes_trees_the_checks_pass(runner: TaskRunner) -> None:
    """The request the demo model answered wrongly, greedy and sampled: every gate under
    the top, no basic event named like a gate, every evidence quoting its reading."""
    readings = {"current": "42.5 A", "belt_speed": "1.2 m/s", "flow": "80.5 m3/h (abs)",
                "drive_on": "True"}
    for seed in range(4):
        (r,) = runner.run([("fault_tree", REQUEST)],
                          SamplingParams(temperature=0.0 if seed == 0 else 1.0, seed=seed))
        if r.output is None:
            assert r.error is not None and r.error["code"] == "truncated", r.error
            continue
        errors = r.validation["fault_tree"]["errors"]  # type: ignore[index]
        assert not [e for e in errors if any(w in e["message"] for w in (
            "not reachable", "named like a gate", "reading"))], errors
        events = r.output["basic_events"]
        assert all(not e["id"].startswith("G_") for e in events)
        assert all(g["id"].startswith("G_") for g in r.output["gates"])
        for e in events:
            if "evidence" in e and e["evidence"]["point"] in readings:
                assert e["evidence"]["observation"].startswith(
                    readings[e["evidence"]["point"]]), e
        assert json.loads(r.generation.text) == r.output  # type: ignore[union-attr]
