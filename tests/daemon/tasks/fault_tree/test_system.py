"""A fault tree names its system: where the request's ``system`` lists components, the
basic events together name enough of them (``fault_tree.check_components``, the
``components`` section: gating, so a generic tree is retried; docs/tasks.md, "Fault trees
for a named system")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.request import Request
from rung.daemon.tasks.fault_tree.analysis import (
    check_components,
    required_components,
    system_components,
)
from rung.daemon.tasks.kinds import KINDS
from rung.daemon.tasks.quality import judge
from rung.daemon.tasks.runner import RetryPolicy, TaskResult, TaskRunner, feedback_findings
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

PUMP = "a centrifugal pump, suction strainer, motor, contactor and check valve"
HANDWRITTEN = Path(__file__).resolve().parents[3] / "data" / "handwritten.json"


def _heads(system: str) -> list[tuple[str, str]]:
    return [(c.name, c.head) for c in system_components(system)]


@pytest.mark.parametrize(("system", "want"), [
    ("Robot palletizer at the end of line 2: gripper with vacuum, safety fence, servo axes",
     [("gripper", "gripper"), ("vacuum", "vacuum"), ("safety fence", "fence"),
      ("servo axes", "axis")]),
    ("Steam boiler B1 with two feed pumps, level transmitter and a low-water cutoff switch",
     [("feed pumps", "pump"), ("level transmitter", "transmitter"),
      ("low-water cutoff switch", "switch")]),
    ("Closed cooling circuit: pump, plate heat exchanger, 3-way valve, flow switch",
     [("pump", "pump"), ("plate heat exchanger", "exchanger"), ("valve", "valve"),
      ("flow switch", "switch")]),
    (PUMP, [("centrifugal pump", "pump"), ("suction strainer", "strainer"),
            ("motor", "motor"), ("contactor", "contactor"), ("check valve", "valve")]),
    # qualifiers, tags, ratings and a parenthesised list
    ("Cooling water pump P-301: check valve on the discharge, discharge pressure switch "
     "PSL-301", [("check valve", "valve"), ("discharge pressure switch", "switch")]),
    ("Lift table LT-3: power unit (motor, gear pump), two cylinders (duty/standby)",
     [("power unit", "unit"), ("motor", "motor"), ("gear pump", "pump"),
      ("cylinders", "cylinder")]),
    ("Diesel set: 24 V starting batteries, injector fed by a booster pump",
     [("starting batteries", "battery"), ("injector", "injector")]),
])
def test_components_are_read_from_the_system(system: str, want: list[tuple[str, str]]) -> None:
    assert _heads(system) == want


@pytest.mark.parametrize("system", [
    "Oil-injected screw compressor K1",
    "Hydraulic power unit of press 1, line 3",      # a designation and a place: no list
    "Screw compressor C-4, 75 kW",
    "Closed cooling loop 3 with dry cooler",        # one component
    "Belt conveyor C3, 7.5 kW drive with gearbox",
])
def test_a_system_without_two_components_is_not_checked(system: str) -> None:
    assert len(system_components(system)) < 2
    section = check_components(_tree("Generic failure", "Another failure"), system)
    assert section["ok"] and section["errors"] == [] and "not checked" in section["note"]


def test_the_share_of_components_required() -> None:
    assert [required_components(n) for n in range(2, 11)] == [2, 2, 2, 3, 3, 4, 4, 4, 4]


def _tree(*descriptions: str, condition: str | None = None) -> dict[str, Any]:
    events: list[dict[str, Any]] = [{"id": f"E_{i}", "description": d, "probability": 0.01}
                                    for i, d in enumerate(descriptions)]
    gates: list[dict[str, Any]] = [{"id": "G_TOP", "type": "OR",
                                    "inputs": [e["id"] for e in events],
                                    "description": "top"}]
    if condition is not None:
        events.append({"id": "C_MAINT", "description": condition, "probability": 0.1})
        gates[0]["inputs"] = ["G_INH", *gates[0]["inputs"][1:]]
        gates.append({"id": "G_INH", "type": "INHIBIT", "condition": "C_MAINT",
                      "inputs": ["E_0"], "description": "while"})
    return {"top": "G_TOP", "description": "No flow", "gates": gates, "basic_events": events}


def _validate(tree: dict[str, Any], system: str = PUMP) -> tuple[bool, dict[str, Any]]:
    task = load_tasks()["fault_tree"]
    return validate_output(task.output_schema, task.kind, tree,
                           {"top_event": "P-301 runs but delivers no cooling water",
                            "system": system})


def test_events_that_name_the_components_pass() -> None:
    ok, v = _validate(_tree("Suction strainers blocked", "Check valve stuck closed",
                            "Motor contactor does not pull in", "Loss of power supply"))
    assert ok, v
    section = v["components"]
    assert section["named"] == ["suction strainer", "motor", "contactor", "check valve"]
    assert section["required"] == 3 and section["unnamed_events"] == ["E_3"]
    assert judge(KINDS["fault_tree"], v).right


def test_generic_events_fail_with_the_events_and_the_components() -> None:
    ok, v = _validate(_tree("Bearing damage", "Impeller blocked", "Pump cavitates",
                            condition="Unit in maintenance mode"))
    assert not ok and v["fault_tree"]["ok"]
    section = v["components"]
    assert not section["ok"] and section["named"] == ["centrifugal pump"]
    message = section["errors"][0]["message"]
    assert message == (
        "the basic events name 1 of the 5 components the system lists (centrifugal pump); "
        "name at least 3 of them in the events' descriptions: centrifugal pump, suction "
        "strainer, motor, contactor, check valve; events that name none: E_0, E_1")
    # the INHIBIT condition is a state, not a failure: not listed to rename
    assert "C_MAINT" not in message
    verdict = judge(KINDS["fault_tree"], v)
    assert verdict.valid and not verdict.right
    assert verdict.reason is not None and verdict.reason.startswith("components: ")
    # what a feedback retry is shown
    res = TaskResult(Request("fault_tree", {}, 0.0, 0.0), False, "invalid_output",
                     verdict.reason, validation=v)
    assert feedback_findings(res) == f"components: basic_events: {message}"


def test_a_shared_head_noun_needs_the_components_other_word() -> None:
    system = "Screw compressor with inlet valve, oil separator, minimum pressure valve"
    vague = check_components(_tree("Valve stuck", "Separator clogged"), system)
    assert not vague["ok"] and vague["named"] == ["oil separator"]
    exact = check_components(_tree("Inlet valve stuck", "Separator clogged"), system)
    assert exact["ok"] and exact["named"] == ["inlet valve", "oil separator"]


def test_a_system_without_components_passes_the_validators() -> None:
    ok, v = _validate(_tree("Bearing damage", "Impeller blocked"),
                      system="Oil-injected screw compressor K1")
    assert ok and v["components"]["ok"] and v["components"]["components"] == []


def test_every_handwritten_system_leaves_a_sensible_answer_possible() -> None:
    """Each hand-written fault-tree request's components are words a tree can name (a
    head noun of letters), and a tree whose events name the required share passes."""
    requests = json.loads(HANDWRITTEN.read_text(encoding="utf-8"))["fault_tree"]
    for r in requests:
        components = system_components(r["system"])
        assert all(c.head.isalpha() and len(c.head) > 1 for c in components), r["system"]
        if len(components) < 2:
            continue
        need = required_components(len(components))
        tree = _tree(*(f"{c.name} fails" for c in components[:need]), "Operator error")
        assert check_components(tree, r["system"])["ok"], r["system"]


# --- the runner retries a tree that names no component ------------------------------------

# every answer the grammar admits is the same generic tree (pump events, no components)
GENERIC = {"top": "G_TOP", "description": "No flow",
           "gates": [{"id": "G_TOP", "type": "OR", "inputs": ["E_BEARING", "E_IMPELLER"]}],
           "basic_events": [{"id": "E_BEARING", "description": "Bearing damage",
                             "probability": 0.01},
                            {"id": "E_IMPELLER", "description": "Impeller blocked",
                             "probability": 0.02}]}
PROBE = f"""\
name: ft_probe
description: a fault tree whose events name none of the system's components
system_prompt: Answer with a fault tree.
prompt_template: "{{{{ top_event }}}} / {{{{ system }}}}"
max_tokens: 700
validators: [fault_tree]
input_schema:
  type: object
  required: [top_event, system]
  properties:
    top_event: {{type: string}}
    system: {{type: string}}
output_schema:
  const: {json.dumps(GENERIC)}
"""


@pytest.fixture(scope="module")
def runner(task_engine: Path, tmp_path_factory: pytest.TempPathFactory) -> TaskRunner:
    d = tmp_path_factory.mktemp("ft-tasks")
    (d / "ft_probe.yaml").write_text(PROBE, encoding="utf-8")
    engine = load_engine(task_engine)
    # unshaped: the probe's grammar is its constant answer, not the fault-tree shape
    return TaskRunner(engine, Tokenizer.load(task_engine, engine.manifest.tokenizer),
                      load_tasks(d), task_engine, shaped=False)


@pytest.mark.integration
def test_the_runner_retries_a_tree_that_names_no_component(runner: TaskRunner) -> None:
    asked = [("ft_probe", {"top_event": "No cooling water", "system": PUMP}),
             ("ft_probe", {"top_event": "No cooling water",
                           "system": "Oil-injected screw compressor K1"})]
    named, unnamed = runner.run(asked, SamplingParams(), retry=RetryPolicy(attempts=2))
    assert (named.ok, named.code, named.attempts, named.failed_checks) == (
        False, "invalid_output", 2, ("components", "components"))
    assert named.output == GENERIC and "events that name none: E_BEARING, E_IMPELLER" in \
        str(named.message)
    assert (unnamed.ok, unnamed.attempts) == (True, 1)   # no components listed: passes
