"""The shipped demo model: it loads, exports with its trained gates, and on a fixed small set
of held-out instructions reaches the rates recorded next to it (models/edge-tiny/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rung.export.checkpoint import load_checkpoint
from rung.tools.eval_model import evaluate

pytestmark = pytest.mark.integration
MODEL = Path(__file__).resolve().parents[2] / "models" / "edge-tiny"
MARGIN = 0.2  # six samples per rate: one answer more or less moves it by 1/6


def test_shipped_model_is_small_and_loads() -> None:
    size = sum(f.stat().st_size for f in MODEL.iterdir() if f.is_file())
    assert size < 40 * 2**20
    ckpt = load_checkpoint(MODEL)
    assert ckpt.config.architecture == "LlamaForCausalLM" and ckpt.model.has_ffn_gates
    assert ckpt.tokenizer.chat_template and ckpt.tokenizer.eos_token_ids


def test_shipped_model_reaches_its_recorded_rates() -> None:
    recorded = json.loads((MODEL / "eval_small.json").read_text())
    got = evaluate(MODEL, recorded["held_out"], recorded["seed"])
    pairs = [("unconstrained_json_valid",), ("constrained_gated", "schema_valid"),
             ("constrained_gated", "st_syntax_valid"),
             ("constrained_gated", "identifiers_pass"),
             ("constrained_gated", "fault_tree_valid"),
             ("constrained_gated", "diagnosis_valid")]
    for path in pairs:
        want, have = recorded, got
        for key in path:
            want, have = want[key], have[key]
        assert have >= want - MARGIN, (path, have, want)


def test_a_plain_export_keeps_the_trained_gates(tmp_path: Path) -> None:
    """``rung export`` without ``--ffn-skip`` keeps the gates a checkpoint was trained with
    (the model expects them); ``off`` still drops them."""
    from rung.daemon.cli import main as cli
    from rung.engines.manifest import load_manifest

    assert cli(["export", str(MODEL), "-o", str(tmp_path / "plain"), "--no-verify"]) == 0
    assert load_manifest(tmp_path / "plain").ffn_gate == {"mode": "trained"}
    assert cli(["export", str(MODEL), "-o", str(tmp_path / "off"), "--no-verify",
                "--ffn-skip", "off"]) == 0
    assert load_manifest(tmp_path / "off").ffn_gate is None
