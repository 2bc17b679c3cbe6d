"""The shipped demo model: it loads, its default engine decodes fast with the answers plain
decoding gives, and on a fixed small set of held-out instructions it reaches the rates
recorded next to it (models/edge-tiny/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rung.export.checkpoint import load_checkpoint
from rung.tools.eval_model import evaluate

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = Path(__file__).resolve().parents[2] / "models" / "edge-tiny"
MARGIN = 0.2  # six samples per rate: one answer more or less moves it by 1/6


def test_shipped_model_is_small_and_loads() -> None:
    size = sum(f.stat().st_size for f in MODEL.iterdir() if f.is_file())
    assert size < 40 * 2**20
    ckpt = load_checkpoint(MODEL)
    # no FFN gates: one If decision per step would keep the engine from decoding fast
    assert ckpt.config.architecture == "LlamaForCausalLM" and not ckpt.model.has_ffn_gates
    assert ckpt.tokenizer.chat_template and ckpt.tokenizer.eos_token_ids


def test_shipped_model_reaches_its_recorded_rates() -> None:
    recorded = json.loads((MODEL / "eval_small.json").read_text())
    got = evaluate(MODEL, recorded["held_out"], recorded["seed"])
    pairs = [("unconstrained_json_valid",), ("constrained", "schema_valid"),
             ("constrained", "st_syntax_valid"),
             ("constrained", "identifiers_pass"),
             ("constrained", "fault_tree_valid"),
             ("constrained", "diagnosis_valid")]
    for path in pairs:
        want, have = recorded, got
        for key in path:
            want, have = want[key], have[key]
        assert have >= want - MARGIN, (path, have, want)


def test_the_default_engine_decodes_fast_with_plain_answers(tmp_path: Path) -> None:
    """``rung export`` without options gives an engine that ``engine.decode: auto`` decodes
    fast, and its answers to the demo's requests are token for token the plain ones."""
    from rung.daemon.demo.run import _requests
    from rung.daemon.tasks.runner import TaskRunner, fast_decoding
    from rung.daemon.tasks.task import load_tasks
    from rung.engines import load_engine
    from rung.engines.sampler import SamplingParams
    from rung.engines.tokenizer import Tokenizer
    from rung.export.exporter import ExportOptions, export

    export(MODEL, tmp_path / "engine", ExportOptions(verify=False))
    engine = load_engine(tmp_path / "engine")
    assert engine.ffn_skips is None and fast_decoding("auto", engine)
    tok = Tokenizer.load(tmp_path / "engine", engine.manifest.tokenizer)
    runners = [TaskRunner(engine, tok, load_tasks(), tmp_path / "engine", fast=fast)
               for fast in (False, True)]
    requests = [(task, inputs[0]) for task, inputs in _requests().items()]
    plain, fast = ([r.run([req], SamplingParams())[0] for req in requests] for r in runners)
    for (task, _), a, b in zip(requests, plain, fast, strict=True):
        assert a.generation is not None and b.generation is not None
        assert a.generation.token_ids == b.generation.token_ids, task
        assert b.generation.steps < a.generation.steps, task
