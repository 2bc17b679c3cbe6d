"""Training smoke runs: a few steps on a tiny config lower the loss, the gates get trained
(``--gates``) and the result is a checkpoint rung exports with its trained gates; a run
continued from that checkpoint without gates starts where it left off and exports plain."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rung.engines.manifest import load_manifest
from rung.export.exporter import ExportOptions, export
from rung.tools.corpus import generate
from rung.tools.train import TrainConfig, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smoke_training_lowers_loss_and_exports(tmp_path: Path) -> None:
    cfg = TrainConfig(samples=24, vocab_size=512, hidden_size=64, intermediate_size=160,
                      num_layers=2, num_heads=4, num_kv_heads=2, max_seq=1024,
                      batch_tokens=8192, lr=1e-2, warmup_steps=3, minutes=60.0,
                      max_steps=12, sparsity=0.05, gates=True)
    result = train(cfg, generate(24, seed=3), tmp_path / "model", log=io.StringIO())
    losses = [h["loss"] for h in result["history"]]
    assert result["steps"] == 12 and losses[-1] < losses[0] * 0.9, losses
    assert (tmp_path / "model" / "model.safetensors").is_file()
    m = export(tmp_path / "model", tmp_path / "engine",
               ExportOptions(kv="fp32", ffn_skip="trained", max_seq=1024))
    assert m.ffn_gate == {"mode": "trained"} and m.parity is not None and m.parity.passed
    assert load_manifest(tmp_path / "engine").tokenizer.chat_template
    # a plain export measures the trained gates and records its choice (kept or dropped:
    # tests/export/test_defaults.py); --ffn-skip off drops them
    plain = export(tmp_path / "model", tmp_path / "plain",
                   ExportOptions(max_seq=1024, verify=False))
    assert plain.ffn_skip is not None and plain.ffn_skip["requested"] == "auto"
    off = export(tmp_path / "model", tmp_path / "off",
                 ExportOptions(max_seq=1024, verify=False, ffn_skip="off"))
    assert off.ffn_gate is None


def test_continued_training_starts_warm_and_drops_the_gates(tmp_path: Path) -> None:
    small = {"samples": 24, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 160,
             "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "max_seq": 1024,
             "batch_tokens": 8192, "warmup_steps": 3, "minutes": 60.0}
    first = train(TrainConfig(**small, max_steps=12, gates=True), generate(24, seed=3),
                  tmp_path / "first", log=io.StringIO())
    again = train(TrainConfig(**small, max_steps=3, init=str(tmp_path / "first")),
                  generate(24, seed=4), tmp_path / "again", log=io.StringIO())
    # warm: its first step keeps at least half of what the first run learned
    f0, f1 = first["history"][0]["loss"], first["history"][-1]["loss"]
    assert again["history"][0]["loss"] < f0 - 0.5 * (f0 - f1), (f0, f1, again["history"][0])
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == \
        (tmp_path / "first" / "tokenizer.json").read_bytes()
    m = export(tmp_path / "again", tmp_path / "engine", ExportOptions(max_seq=1024))
    assert m.ffn_gate is None
