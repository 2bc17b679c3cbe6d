"""The architecture table and config parsing, against transformers' own values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rung.engines.errors import CheckpointError
from rung.export.arch import ARCHITECTURES, FULL, SLIDING, parse_config
from tests.checkpoints import build_hf_model


def _cfg(arch: str) -> dict:
    model = build_hf_model(arch)
    d = model.config.to_dict()
    d["architectures"] = [type(model).__name__]
    return d


@pytest.mark.parametrize("arch,qkv_bias,qk_norm", [
    ("llama", False, False), ("mistral", False, False), ("qwen2", True, False),
    ("qwen3", False, True), ("gemma3", False, True), ("phi3", False, False)])
def test_table_rows(arch: str, qkv_bias: bool, qk_norm: bool) -> None:
    cfg = parse_config(_cfg(arch))
    assert (cfg.qkv_bias, cfg.qk_norm) == (qkv_bias, qk_norm)


def test_every_row_is_tested() -> None:
    assert set(ARCHITECTURES) == {"LlamaForCausalLM", "MistralForCausalLM",
                                  "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                  "Gemma3ForCausalLM", "Phi3ForCausalLM"}


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


def test_mistral_sliding_window_applies_to_every_layer() -> None:
    d = _cfg("mistral")
    d["sliding_window"] = 100
    cfg = parse_config(d)
    assert cfg.sliding_window == 100 and [cfg.window(i) for i in range(2)] == [100, 100]


def test_gemma3_options() -> None:
    model = build_hf_model("gemma3")
    cfg = parse_config(_cfg("gemma3"))
    assert cfg.layer_types == (SLIDING, FULL) and (cfg.window(0), cfg.window(1)) == (8, None)
    assert cfg.activation == "gelu_pytorch_tanh" and cfg.sandwich_norms
    assert cfg.norm_offset == 1.0 and cfg.final_logit_softcap == 30.0
    assert cfg.embed_scale == pytest.approx(float(model.model.embed_tokens.embed_scale))
    assert cfg.attn_scale == model.model.layers[0].self_attn.scaling == 24 ** -0.5
    emb = model.model.rotary_emb
    for kind, theirs in ((FULL, emb.full_attention_inv_freq),
                         (SLIDING, emb.sliding_attention_inv_freq)):
        np.testing.assert_allclose(cfg.layer_rope(kind).inv_freq(cfg.rotary_dim),
                                   theirs.double().numpy(), rtol=1e-6)
    assert cfg.layer_rope(FULL).kind == "linear" and cfg.layer_rope(SLIDING).theta == 1e4


def test_gemma3_transformers4_keys() -> None:
    """A config as transformers 4.x saved Gemma 3: rope_theta, rope_local_base_freq and
    rope_scaling at the top, sliding_window_pattern instead of layer_types."""
    d = _cfg("gemma3")
    for key in ("rope_parameters", "layer_types"):
        d.pop(key)
    d.update(rope_theta=1e5, rope_local_base_freq=1e4, sliding_window_pattern=2,
             rope_scaling={"rope_type": "linear", "factor": 2.0})
    old, new = parse_config(d), parse_config(_cfg("gemma3"))
    assert (old.rope, old.rope_local, old.layer_types) == (
        new.rope, new.rope_local, new.layer_types)


def test_phi3_longrope_and_partial_rotary() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = build_hf_model("phi3")
    cfg = parse_config(_cfg("phi3"))
    assert cfg.rotary_dim == 48 and cfg.rope.kind == "longrope"
    assert cfg.rope.original_max_position == 128 and cfg.window(0) == 24
    emb = model.model.rotary_emb
    assert cfg.rope.attention_factor == pytest.approx(emb.attention_scaling)
    # up to the original context: short factors, as transformers' buffers
    np.testing.assert_allclose(cfg.rope.inv_freq(cfg.rotary_dim, 128),
                               emb.inv_freq.double().numpy(), rtol=1e-6)
    # past it: long factors, as transformers computes them for a longer sequence
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, seq_len=129)
    np.testing.assert_allclose(cfg.rope.inv_freq(cfg.rotary_dim, 129),
                               long.double().numpy(), rtol=1e-6)


def test_phi3_transformers4_keys() -> None:
    """Phi-3 as transformers 4.x saved it: rope_scaling of type "su", the original context
    and partial_rotary_factor at the top."""
    d = _cfg("phi3")
    params = d.pop("rope_parameters")
    d.update(rope_theta=params["rope_theta"], partial_rotary_factor=0.75,
             rope_scaling={"type": "su", "short_factor": params["short_factor"],
                           "long_factor": params["long_factor"]})
    assert parse_config(d).rope == parse_config(_cfg("phi3")).rope


def test_longrope_factors_must_cover_the_rotated_channels() -> None:
    d = _cfg("phi3")
    d["rope_parameters"]["short_factor"] = [1.0] * 5
    with pytest.raises(CheckpointError, match="short_factor must be 24 positive numbers"):
        parse_config(d)


def test_qwen2_window_from_max_window_layers() -> None:
    d = _cfg("qwen2")
    d.pop("layer_types", None)
    d.update(use_sliding_window=True, sliding_window=16, max_window_layers=1)
    cfg = parse_config(d)
    assert (cfg.window(0), cfg.window(1)) == (None, 16)
    d["use_sliding_window"] = False
    assert parse_config(d).window(1) is None
