"""Tiny random Hugging Face checkpoints, one per supported architecture, built in code.

Saved with transformers' ``save_pretrained`` plus a real tiny tokenizer, exactly as a user's
checkpoint directory looks. No download anywhere.
"""

from __future__ import annotations

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
}


def build_hf_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    import transformers

    cfg_name, model_name, extra = CASES[arch]
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    if arch == "qwen2":
        add_key_bias_outliers(model)
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


def save_checkpoint(arch: str, path: Path, seed: int = 0,
                    config: dict[str, Any] | None = None, **save_kwargs: Any) -> Any:
    """Build, save (``save_pretrained``) and return the transformers model."""
    model = build_hf_model(arch, seed, **(config or {}))
    model.generation_config.eos_token_id = EOS_ID
    model.save_pretrained(path, **save_kwargs)
    build_tiny_tokenizer(path, vocab_size=VOCAB)
    return model
