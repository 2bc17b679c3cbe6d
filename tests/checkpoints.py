"""Tiny random Hugging Face checkpoints, one per supported architecture, built in code.

Saved with transformers' ``save_pretrained`` plus a real tiny tokenizer, exactly as a user's
checkpoint directory looks. No download anywhere.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from tests.engines.tiny_tokenizer import build_tiny_tokenizer

VOCAB = 300
EOS_ID = 1  # <|eos|> in the tiny tokenizer
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    initializer_range=0.2, bos_token_id=0, eos_token_id=EOS_ID, pad_token_id=2)

# architecture -> (config class name, model class name, extra config)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        tie_word_embeddings=False, sliding_window=None, num_key_value_heads=1)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True,
                                                      rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True, head_dim=32)),
    # a sliding (local) layer and a full (global) one, a window shorter than the test
    # prompts, each with its own RoPE (the global one scaled), Gemma's attention scale and
    # final logit soft-capping
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        tie_word_embeddings=True, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
        rope_theta=100000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, final_logit_softcapping=30.0)),
    # Phi-4-mini's partial rotary (0.75 of a 64-wide head), LongRoPE with an original
    # context of the engines' max_seq (short factors, attention factor of a 2x context), a
    # window shorter than the test prompts; twice the others' width at half their weight
    # scale (0.2 leaves int8 kernels' activation rounding over the int+fp8 bound)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        initializer_range=0.1, tie_word_embeddings=False, hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1, partial_rotary_factor=0.75, sliding_window=24,
        original_max_position_embeddings=128,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(24)],
                      "long_factor": [1.0 + 0.5 * i for i in range(24)]})),
}


def build_hf_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    import transformers

    cfg_name, model_name, extra = CASES[arch]
    # a copy: config classes keep and complete the RoPE dicts they are given (Phi-3 writes
    # its original context into rope_scaling), which would leak into the next model
    cfg = getattr(transformers, cfg_name)(**copy.deepcopy({**COMMON, **extra, **overrides}))
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    if arch == "qwen2":
        add_key_bias_outliers(model)
    if arch == "gemma3":  # its norms start at 0 (scale 1 + w): give them something to scale
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(0.0, 0.3)
    return model


def add_key_bias_outliers(model: Any, magnitude: float = 600.0) -> None:
    """Qwen2's trap for FP8 KV, as trained Qwen2 models show it: a large key bias with a few
    outlier channels per KV head beyond e4m3's 448 (queries nearly ignore those channels),
    and small values (V) that fall into e4m3's subnormal range at a fixed scale of 1.0."""
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.k_proj.bias.normal_(0.0, 2.0)
            attn.v_proj.weight.mul_(0.01)
            for h in range(cfg.num_key_value_heads):
                for c, value in ((0, magnitude), (head_dim // 2 + 1, -magnitude / 2)):
                    attn.k_proj.bias[h * head_dim + c] = value
                    for g in range(groups):  # the query heads reading this KV head
                        q_row = (h * groups + g) * head_dim + c
                        attn.q_proj.weight[q_row].mul_(0.01)
                        attn.q_proj.bias[q_row] = 0.0


def final_norm_off(build: Any, factor: float = 1.1) -> Any:
    """``build`` (a graph builder of ``rung.export``) writing the model with its final norm
    weights scaled by ``factor``: a graph that no longer computes the model, the model
    itself left as it was."""
    def broken(model: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            model.model.norm.weight.mul_(factor)
        try:
            return build(model, **kwargs)
        finally:
            with torch.no_grad():
                model.model.norm.weight.div_(factor)
    return broken


def save_checkpoint(arch: str, path: Path, seed: int = 0,
                    config: dict[str, Any] | None = None, **save_kwargs: Any) -> Any:
    """Build, save (``save_pretrained``) and return the transformers model."""
    model = build_hf_model(arch, seed, **(config or {}))
    model.generation_config.eos_token_id = EOS_ID
    model.save_pretrained(path, **save_kwargs)
    build_tiny_tokenizer(path, vocab_size=VOCAB)
    return model
