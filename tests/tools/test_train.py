"""Training smoke run: a few steps on a tiny config lower the loss, the gates get trained,
and the result is a checkpoint rung exports with its trained gates."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rung.engines.manifest import load_manifest
from rung.export.exporter import ExportOptions, export
from rung.tools.corpus import generate
from rung.tools.train import TrainConfig, train

pytestmark = pytest.mark.integration


def test_smoke_training_lowers_loss_and_exports(tmp_path: Path) -> None:
    cfg = TrainConfig(samples=24, vocab_size=512, hidden_size=64, intermediate_size=160,
                      num_layers=2, num_heads=4, num_kv_heads=2, max_seq=1024,
                      batch_tokens=8192, lr=3e-3, warmup_steps=3, minutes=2.0,
                      max_steps=12, sparsity=0.05)
    result = train(cfg, generate(24, seed=3), tmp_path / "model", log=io.StringIO())
    losses = [h["loss"] for h in result["history"]]
    assert result["steps"] == 12 and losses[-1] < losses[0] * 0.9, losses
    assert (tmp_path / "model" / "model.safetensors").is_file()
    m = export(tmp_path / "model", tmp_path / "engine",
               ExportOptions(kv="fp32", ffn_skip="trained", max_seq=1024))
    assert m.ffn_gate == {"mode": "trained"} and m.parity is not None and m.parity.passed
    assert load_manifest(tmp_path / "engine").tokenizer.chat_template
