"""The architecture table and config parsing, against transformers' own values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rung.engines.errors import CheckpointError
from rung.export.arch import ARCHITECTURES, parse_config
from tests.checkpoints import build_hf_model


def _cfg(arch: str) -> dict:
    model = build_hf_model(arch)
    d = model.config.to_dict()
    d["architectures"] = [type(model).__name__]
    return d


@pytest.mark.parametrize("arch,qkv_bias,qk_norm", [
    ("llama", False, False), ("mistral", False, False), ("qwen2", True, False),
    ("qwen3", False, True)])
def test_table_rows(arch: str, qkv_bias: bool, qk_norm: bool) -> None:
    cfg = parse_config(_cfg(arch))
    assert (cfg.qkv_bias, cfg.qk_norm) == (qkv_bias, qk_norm)


def test_every_row_is_tested() -> None:
    assert set(ARCHITECTURES) == {"LlamaForCausalLM", "MistralForCausalLM",
                                  "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rope_frequencies_match_transformers(arch: str) -> None:
    model = build_hf_model(arch)
    cfg = parse_config(_cfg(arch))
    ours = np.array(cfg.rope.inv_freq(cfg.head_dim))
    theirs = model.model.rotary_emb.inv_freq.to(torch.float64).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_transformers4_style_rope_keys() -> None:
    d = _cfg("llama")
    d.pop("rope_parameters", None)
    d["rope_theta"] = 1234.0
    d["rope_scaling"] = {"type": "linear", "factor": 2.0}
    cfg = parse_config(d)
    assert cfg.rope.theta == 1234.0 and cfg.rope.kind == "linear"
    assert cfg.rope.inv_freq(cfg.head_dim)[0] == pytest.approx(0.5)


def test_gqa_heads_must_divide() -> None:
    d = _cfg("llama")
    d["num_key_value_heads"] = 3
    with pytest.raises(CheckpointError, match="not a multiple"):
        parse_config(d)


def test_bad_size_names_key() -> None:
    d = _cfg("qwen2")
    d["hidden_size"] = "big"
    with pytest.raises(CheckpointError, match="'hidden_size' must be a positive integer"):
        parse_config(d)


def test_non_silu_activation_refused() -> None:
    d = _cfg("mistral")
    d["hidden_act"] = "gelu"
    with pytest.raises(CheckpointError, match="hidden_act 'gelu'"):
        parse_config(d)


def test_mistral_sliding_window_caps_context() -> None:
    d = _cfg("mistral")
    d["sliding_window"] = 100
    assert parse_config(d).sliding_window == 100
