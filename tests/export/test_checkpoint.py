"""Checkpoint import: what is read, and every failure as a clear CheckpointError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rung.engines.errors import CheckpointError
from rung.export.checkpoint import load_checkpoint


@pytest.fixture
def ckpt(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> Path:
    dst = tmp_path / "hf"
    shutil.copytree(checkpoints["llama"][0], dst)
    return dst


def _edit_config(path: Path, **changes: Any) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_loads_weights_tokenizer_and_generation_config(
        ckpt: Path, checkpoints: dict[str, tuple[Path, Any]]) -> None:
    c = load_checkpoint(ckpt, max_seq=64)
    hf = checkpoints["llama"][1]
    assert c.config.family == "llama" and c.config.rope.kind == "llama3"
    assert torch.equal(c.model.model.layers[1].self_attn.k_proj.weight,
                       hf.model.layers[1].self_attn.k_proj.weight)
    assert c.tokenizer.chat_template and c.tokenizer.eos_token_ids == [1]
    assert c.generation["eos_token_id"] == 1
    assert c.model.max_seq == 64


def test_norm_eps_override(ckpt: Path) -> None:
    c = load_checkpoint(ckpt, norm_eps=1e-3)
    assert c.model.model.norm.eps == 1e-3
    assert c.model.model.layers[0].input_layernorm.eps == 1e-3


def test_unsupported_architecture(ckpt: Path) -> None:
    _edit_config(ckpt, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel.*not supported") as e:
        load_checkpoint(ckpt)
    assert "config.json" in str(e.value) and "LlamaForCausalLM" in str(e.value)


def test_unsupported_rope_type(ckpt: Path) -> None:
    _edit_config(ckpt, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(CheckpointError, match="'yarn' is not supported"):
        load_checkpoint(ckpt)


def test_missing_config(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_checkpoint(ckpt)


def test_corrupt_config(ckpt: Path) -> None:
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt JSON"):
        load_checkpoint(ckpt)


def test_missing_tokenizer(ckpt: Path) -> None:
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json") as e:
        load_checkpoint(ckpt)
    assert e.value.hint


def test_truncated_safetensors(ckpt: Path) -> None:
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unreadable or truncated"):
        load_checkpoint(ckpt)


def test_no_weights(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(ckpt)


def test_shape_mismatch_names_tensor(ckpt: Path) -> None:
    _edit_config(ckpt, intermediate_size=96)
    with pytest.raises(CheckpointError, match=r"gate_proj\.weight.*shape \(128, 64\)"):
        load_checkpoint(ckpt)


def test_untied_head_missing(ckpt: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(ckpt / "model.safetensors")
    del state["lm_head.weight"]
    save_file(state, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match="lm_head.weight") as e:
        load_checkpoint(ckpt)
    assert "tie_word_embeddings" in str(e.value)


def test_missing_shard(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    from tests.checkpoints import save_checkpoint

    save_checkpoint("mistral", tmp_path, max_shard_size="50KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(CheckpointError, match="shard named in model.safetensors.index.json"):
        load_checkpoint(tmp_path)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint(tmp_path / "nope")


def test_phi3_packed_projections_split_on_load(
        checkpoints: dict[str, tuple[Path, Any]]) -> None:
    path, hf = checkpoints["phi3"]
    ours = load_checkpoint(path, max_seq=64).model.model.layers[1]
    theirs = hf.model.layers[1]
    a = ours.self_attn
    assert torch.equal(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                       theirs.self_attn.qkv_proj.weight)
    assert torch.equal(torch.cat([ours.mlp.gate_proj.weight, ours.mlp.up_proj.weight]),
                       theirs.mlp.gate_up_proj.weight)


def test_packed_rows_must_match_the_config(checkpoints: dict[str, tuple[Path, Any]],
                                           tmp_path: Path) -> None:
    shutil.copytree(checkpoints["phi3"][0], tmp_path / "hf")
    _edit_config(tmp_path / "hf", intermediate_size=96)
    with pytest.raises(CheckpointError, match=r"gate_up_proj\.weight' has 256 rows, "
                                              r"config\.json implies 192 \(96 \+ 96\)"):
        load_checkpoint(tmp_path / "hf")


def test_gemma3_norms_scale_by_one_plus_weight(
        checkpoints: dict[str, tuple[Path, Any]]) -> None:
    path, hf = checkpoints["gemma3"]
    model = load_checkpoint(path, max_seq=64).model
    # the checkpoint's value is kept; the norm applies 1 + it
    assert torch.equal(model.model.norm.weight, hf.model.norm.weight)
    assert torch.equal(model.model.norm.gain(), 1.0 + hf.model.norm.weight)
    assert model.model.layers[0].pre_feedforward_layernorm is not None
