"""Requests written by hand the way plant engineers write them (tests/data/handwritten.json:
other wording, assets and point names than the corpus generator's), answered by the demo
model as rung serve answers them: every diagnosis passes its checks, and every fault tree
whose system lists no components; a tree for a system that lists its components is held to
naming them (``fault_tree.check_components``), which the shape makes every event it needs
do: such a tree fails that check only when every failure event already names a component
and there are fewer of them than the check requires."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rung.daemon.tasks.fault_tree.analysis import system_components
from rung.daemon.tasks.runner import RetryPolicy, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DATA = Path(__file__).resolve().parents[1] / "data" / "handwritten.json"


@pytest.mark.parametrize("task", ["fault_tree", "diagnosis"])
def test_handwritten_requests_pass(edge_engine: Path, task: str) -> None:
    engine = load_engine(edge_engine)
    runner = TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                        load_tasks(), edge_engine)
    inputs = json.loads(DATA.read_text(encoding="utf-8"))[task]
    assert len(inputs) >= 10
    results = [runner.run([(task, data)], SamplingParams(), retry=RetryPolicy())[0]
               for data in inputs]
    listed = [task == "fault_tree" and len(system_components(str(d.get("system", "")))) >= 2
              for d in inputs]
    failed = [(r.error or {}).get("message") for r, named in zip(results, listed, strict=True)
              if not r.ok and not named]
    assert not failed, failed
    for r, named in zip(results, listed, strict=True):
        if named and not r.ok:   # a tree with fewer failure events than components to name
            failing = [k for k, v in (r.validation or {}).items()
                       if isinstance(v, dict) and not v.get("ok", True)
                       and not v.get("advisory")]
            assert failing == ["components"], (failing, (r.error or {}).get("message"))
            assert r.validation["components"]["unnamed_events"] == [], r.validation  # type: ignore[index]
    assert sum(r.ok for r in results) >= len(results) - 2, [r.error for r in results]
