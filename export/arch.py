"""Supported architectures as a table, and the typed model config read from ``config.json``.

Architecture differences live in ``ARCHITECTURES``: one row per Hugging Face class name.
Everything else (dimensions, GQA, tying, RoPE) is read from the config the same way for all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rung.engines.errors import CheckpointError


@dataclass(frozen=True)
class ArchSpec:
    """What distinguishes one decoder family from another.

    ``qkv_bias`` / ``o_bias``: a fixed answer, or the config key that holds it.
    """

    family: str
    qkv_bias: bool | str
    o_bias: bool | str
    qk_norm: bool
    mlp_bias: bool | str = False


ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec("llama", "attention_bias", "attention_bias", False, "mlp_bias"),
    "MistralForCausalLM": ArchSpec("mistral", False, False, False),
    "Qwen2ForCausalLM": ArchSpec("qwen2", True, False, False),
    "Qwen3ForCausalLM": ArchSpec("qwen3", "attention_bias", "attention_bias", True),
}

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # one of SUPPORTED_ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def inv_freq(self, head_dim: int) -> list[float]:
        """Inverse frequencies [head_dim / 2], with the configured scaling applied."""
        base = [1.0 / (self.theta ** (2 * i / head_dim)) for i in range(head_dim // 2)]
        if self.kind == "linear":
            return [f / self.factor for f in base]
        if self.kind == "llama3":
            return [self._llama3(f) for f in base]
        return base

    def _llama3(self, freq: float) -> float:
        low_wavelen = self.original_max_position / self.low_freq_factor
        high_wavelen = self.original_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            return freq
        if wavelen > low_wavelen:
            return freq / self.factor
        smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        return (1 - smooth) * freq / self.factor + smooth * freq


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's dimensions and options, parsed from a HF ``config.json``."""

    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # attention window; the export caps max_seq to it

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def _flag(value: bool | str, cfg: dict[str, Any]) -> bool:
    return bool(cfg.get(value, False)) if isinstance(value, str) else value


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"{where}: {key!r} must be a positive integer, got {v!r}",
                              "fix config.json or re-save the checkpoint")
    return v


def _rope(cfg: dict[str, Any], where: str) -> RopeConfig:
    # transformers 5 writes `rope_parameters` (theta inside); 4.x writes rope_theta + rope_scaling.
    params = dict(cfg.get("rope_scaling") or {})
    params.update(cfg.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(f"{where}: rope scaling type {kind!r} is not supported",
                              f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    return RopeConfig(
        theta=theta, kind=kind, factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)))


def parse_config(cfg: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """Turn a HF config dict into a ``ModelConfig``.

    Raises:
        CheckpointError: unsupported architecture or activation, bad or inconsistent sizes.
    """
    archs = cfg.get("architectures") or []
    name = archs[0] if archs else None
    if name not in ARCHITECTURES:
        raise CheckpointError(
            f"{where}: architecture {name!r} is not supported",
            f"supported: {', '.join(ARCHITECTURES)}; convert the model or open an issue")
    spec = ARCHITECTURES[name]
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: hidden_act {act!r} is not supported", "only silu")
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where, heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    if heads % kv_heads:
        raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}", "fix config.json")
    if head_dim % 2:
        raise CheckpointError(f"{where}: head_dim {head_dim} must be even for RoPE",
                              "fix config.json")
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    return ModelConfig(
        architecture=name, family=spec.family,
        vocab_size=_int(cfg, "vocab_size", where), hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", where),
        num_layers=_int(cfg, "num_hidden_layers", where),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=_rope(cfg, where),
        max_position=_int(cfg, "max_position_embeddings", where, 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=_flag(spec.qkv_bias, cfg), o_bias=_flag(spec.o_bias, cfg),
        mlp_bias=_flag(spec.mlp_bias, cfg), qk_norm=spec.qk_norm,
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids,
        sliding_window=(cfg.get("sliding_window")
                        if cfg.get("use_sliding_window", spec.family == "mistral") else None),
    )
