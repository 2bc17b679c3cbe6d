"""The shipped adapter (models/smollm2-plant) is one ``rung export --adapter`` takes: found by
its name, it fits the real base, and the manifest records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rung.engines.manifest import sha256_file
from rung.export.adapter import merge, read_adapter
from rung.export.bases import resolve_adapter
from rung.export.checkpoint import load_checkpoint
from tests import real_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SHIPPED = Path(__file__).resolve().parents[2] / "models" / "smollm2-plant"


def test_the_shipped_adapter_is_found_by_name() -> None:
    assert resolve_adapter("smollm2-plant").resolve() == SHIPPED.resolve()
    assert resolve_adapter(SHIPPED) == SHIPPED


def test_the_shipped_adapter_fits_the_real_base(tmp_path: Path) -> None:
    """Merged into the real SmolLM2 (its dequantized GGUF, all 30 layers): every module
    found, every shape right, the record as the manifest keeps it; and it changes the
    weights it targets."""
    import torch

    adapter = read_adapter(SHIPPED)
    cfg = json.loads((SHIPPED / "adapter_config.json").read_text())
    ckpt = load_checkpoint(real_checkpoint.gguf_path(), max_seq=64, workdir=tmp_path)
    before = ckpt.model.model.layers[29].mlp.down_proj.weight.detach().clone()
    record = merge(ckpt.model, adapter)
    assert record == {"name": "smollm2-plant", "rank": cfg["r"], "alpha": cfg["lora_alpha"],
                      "targets": sorted(cfg["target_modules"]), "modules": 30 * 7,
                      "sha256": sha256_file(SHIPPED / "adapter_model.safetensors")}
    after = ckpt.model.model.layers[29].mlp.down_proj.weight
    assert not torch.equal(before, after)
