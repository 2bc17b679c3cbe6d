"""``rung export --adapter``: a peft LoRA adapter merged into the base before export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rung.engines import load_engine
from rung.engines.errors import CheckpointError
from rung.engines.manifest import sha256_file
from rung.engines.tokenizer import Tokenizer
from rung.export.exporter import ExportOptions, export
from tests.checkpoints import build_hf_model, save_checkpoint

PROMPT = "the pump trips when the level drops"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _adapter(model: Any, out: Path, rank: int = 4, **extra: Any) -> Any:
    """A peft LoRA adapter on ``model`` with random, non-zero A and B, saved to ``out``;
    returns the peft model."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    peft_model = get_peft_model(model, LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False,
        **extra))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    peft_model.save_pretrained(str(out))
    return peft_model


def _engine_logits(engine_dir: Path) -> tuple[Any, list[int], np.ndarray]:
    """The engine, the prompt's ids and its logits at every prompt position."""
    engine = load_engine(engine_dir)
    ids = Tokenizer.load(engine_dir, engine.manifest.tokenizer).encode(PROMPT)
    every = np.arange(len(ids), dtype=np.int64)[None]
    logits = engine.forward(engine.new_cache(1), np.array([ids]), np.array([len(ids)]),
                            every)[0]
    return engine, ids, logits


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf-llama")
    save_checkpoint("llama", path)
    return path


def test_merged_export_equals_the_merged_pytorch_model(base: Path, tmp_path: Path) -> None:
    model = build_hf_model("llama")
    peft_model = _adapter(model, tmp_path / "adapter")
    merged = peft_model.merge_and_unload().eval()
    m = export(base, tmp_path / "engine", ExportOptions(kv="fp32", max_seq=128,
                                                        adapter=tmp_path / "adapter"))
    engine, ids, mine = _engine_logits(tmp_path / "engine")
    with torch.no_grad():
        ref = merged(torch.tensor([ids])).logits[0].numpy()
        plain = build_hf_model("llama")(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(mine, ref, atol=1e-4 * max(1.0, np.abs(ref).max()), rtol=0)
    assert np.abs(mine - plain).max() > 1e-2   # the adapter changed the model
    assert m.adapter == {"name": "adapter", "rank": 4, "alpha": 8.0, "targets": sorted(TARGETS),
                         "modules": 7 * 2,
                         "sha256": sha256_file(tmp_path / "adapter/adapter_model.safetensors")}
    assert engine.manifest.adapter == m.adapter


def _edit_config(path: Path, **changes: Any) -> None:
    cfg_path = path / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("adapter")
    _adapter(build_hf_model("llama"), out)
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize("changes, field", [
    ({"r": 8}, "r is 8"),
    ({"target_modules": ["q_proj", "c_attn"]}, "target_modules: 'c_attn'"),
    ({"use_dora": True}, "use_dora"),
    ({"bias": "all"}, "bias"),
    ({"peft_type": "IA3"}, "peft_type"),
    ({"lora_alpha": 0}, "lora_alpha"),
])
def test_an_adapter_that_does_not_fit_is_refused_naming_the_field(
        base: Path, adapter: Path, tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    bad = _copy(adapter, tmp_path / "bad")
    _edit_config(bad, **changes)
    with pytest.raises(CheckpointError, match=field):
        export(base, tmp_path / "engine", ExportOptions(kv="fp32", max_seq=128, adapter=bad))
    assert not (tmp_path / "engine" / "manifest.json").exists()


def test_an_adapter_trained_on_another_base_is_refused(base: Path, tmp_path: Path) -> None:
    other = build_hf_model("llama", intermediate_size=96)
    _adapter(other, tmp_path / "other")
    with pytest.raises(CheckpointError, match="base shape"):
        export(base, tmp_path / "engine", ExportOptions(kv="fp32", max_seq=128,
                                                        adapter=tmp_path / "other"))


def test_a_missing_or_corrupt_adapter_is_refused(base: Path, adapter: Path,
                                                 tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="adapter_config.json"):
        export(base, tmp_path / "e1", ExportOptions(kv="fp32", max_seq=128,
                                                    adapter=tmp_path / "nowhere"))
    bad = _copy(adapter, tmp_path / "cut")
    data = (bad / "adapter_model.safetensors").read_bytes()
    (bad / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="unreadable or truncated"):
        export(base, tmp_path / "e2", ExportOptions(kv="fp32", max_seq=128, adapter=bad))


@pytest.mark.slow
def test_an_adapter_merges_into_a_gguf_base(tmp_path: Path) -> None:
    """The real SmolLM2 GGUF cut to two layers, an adapter trained on its dequantized
    weights: the engine exported from the GGUF with the adapter equals the merged model."""
    from transformers import AutoModelForCausalLM

    from tests import real_checkpoint

    gguf, hf_dir = real_checkpoint.cut_gguf(2), real_checkpoint.cut_hf_dir(2)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    merged = _adapter(model, tmp_path / "adapter").merge_and_unload().eval()
    export(gguf, tmp_path / "engine", ExportOptions(weights="fp32", kv="fp32", max_seq=64,
                                                    adapter=tmp_path / "adapter"))
    engine, ids, mine = _engine_logits(tmp_path / "engine")
    with torch.no_grad():
        ref = merged(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(mine, ref, atol=2e-4 * max(1.0, np.abs(ref).max()), rtol=0)
    assert engine.manifest.adapter is not None and engine.manifest.adapter["modules"] == 14
