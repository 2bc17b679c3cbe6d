"""Requests written by hand the way plant engineers write them (tests/data/handwritten.json:
other wording, assets and point names than the corpus generator's), answered by the demo
model as rung serve answers them: every fault tree and diagnosis must pass its checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rung.daemon.tasks.runner import RetryPolicy, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration
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
    failed = [(r.error or {}).get("message") for r in results if not r.ok]
    assert not failed, failed
