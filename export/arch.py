"""Supported architectures as a table, and the typed model config read from ``config.json``.

Architecture differences live in ``ARCHITECTURES``: one row per Hugging Face class name.
Everything else (dimensions, GQA, tying, RoPE, sliding windows) is read from the config the
same way for all, in both spellings transformers writes: 5.x (``rope_parameters``, per layer
type where layers differ; ``layer_types``) and 4.x (``rope_theta`` + ``rope_scaling``,
``rope_local_base_freq``, ``sliding_window_pattern``).
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
    ``norm_offset``: RMSNorm scales by ``offset + weight`` (Gemma stores the scale minus 1).
    ``scaled_embeddings``: embeddings are multiplied by sqrt(hidden_size) (Gemma).
    ``sandwich_norms``: attention and FFN outputs are normalized before their residual add,
    four norms per layer (Gemma); otherwise ``post_attention_layernorm`` is the FFN's input
    norm.
    ``window_by_default``: a config's ``sliding_window`` applies without
    ``use_sliding_window`` (Qwen2/3 configs say it; Mistral, Phi-3 and Gemma 3 do not).
    ``default_theta`` / ``local_theta``: RoPE bases when the config names none; with
    ``local_theta``, sliding-window layers have RoPE of their own (Gemma 3).
    ``query_pre_attn_scalar``: attention scores scale by ``query_pre_attn_scalar ** -0.5``
    instead of ``head_dim ** -0.5`` (Gemma).
    """

    family: str
    qkv_bias: bool | str
    o_bias: bool | str
    qk_norm: bool
    mlp_bias: bool | str = False
    norm_offset: float = 0.0
    scaled_embeddings: bool = False
    sandwich_norms: bool = False
    window_by_default: bool = False
    default_theta: float = 10000.0
    local_theta: float | None = None
    query_pre_attn_scalar: bool = False


ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec("llama", "attention_bias", "attention_bias", False, "mlp_bias"),
    "MistralForCausalLM": ArchSpec("mistral", False, False, False, window_by_default=True),
    "Qwen2ForCausalLM": ArchSpec("qwen2", True, False, False),
    "Qwen3ForCausalLM": ArchSpec("qwen3", "attention_bias", "attention_bias", True),
    # Gemma 3 text (the 1B model; the larger ones are Gemma3ForConditionalGeneration).
    # transformers' Gemma 3 never applies attn_logit_softcapping (its attention takes no
    # softcap), so neither does rung; final_logit_softcapping is read for every family.
    "Gemma3ForCausalLM": ArchSpec(
        "gemma3", "attention_bias", "attention_bias", True, norm_offset=1.0,
        scaled_embeddings=True, sandwich_norms=True, window_by_default=True,
        default_theta=1_000_000.0, local_theta=10_000.0, query_pre_attn_scalar=True),
    # Phi-3 / Phi-3.5 / Phi-4-mini: q/k/v and gate/up packed in the checkpoint
    # (qkv_proj, gate_up_proj), split on load (export/checkpoint.py); LongRoPE and partial
    # rotary from the config
    "Phi3ForCausalLM": ArchSpec("phi3", False, False, False, window_by_default=True),
}

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ROPE_ALIASES = {"su": "longrope"}  # Phi-3's early configs
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer type names


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # one of SUPPORTED_ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # longrope: per-frequency divisors for sequences up to / beyond original_max_position
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0  # cos and sin are scaled by it (longrope)

    def inv_freq(self, dim: int, max_seq: int | None = None) -> list[float]:
        """Inverse frequencies [dim / 2] for ``dim`` rotated channels, with the configured
        scaling applied.

        longrope: transformers picks the long factors when a forward's sequence is longer
        than ``original_max_position``, else the short ones, for every position of that
        forward. A table built once for an engine of ``max_seq`` positions takes what
        transformers takes for a sequence of ``max_seq`` tokens: short factors when
        ``max_seq <= original_max_position`` (then it matches transformers exactly),
        long ones everywhere otherwise (prompts shorter than the original context then
        see long factors, where transformers would use short ones).
        """
        base = [1.0 / (self.theta ** (2 * i / dim)) for i in range(dim // 2)]
        if self.kind == "linear":
            return [f / self.factor for f in base]
        if self.kind == "llama3":
            return [self._llama3(f) for f in base]
        if self.kind == "longrope":
            long = max_seq is not None and max_seq > self.original_max_position
            factors = self.long_factor if long else self.short_factor
            return [f / e for f, e in zip(base, factors, strict=True)]
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
    # keys a sliding layer's query attends to, itself included (transformers' meaning)
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()   # per layer FULL or SLIDING; () = all FULL
    rope_local: RopeConfig | None = None  # the sliding layers' own RoPE (Gemma 3)
    partial_rotary_factor: float = 1.0  # share of each head's channels RoPE rotates
    activation: str = "silu"            # one of ACTIVATIONS
    attn_scale: float | None = None     # None: head_dim ** -0.5
    final_logit_softcap: float | None = None  # logits -> c * tanh(logits / c)
    embed_scale: float = 1.0
    norm_offset: float = 0.0
    sandwich_norms: bool = False

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s attention window (None: it sees the whole past)."""
        return self.sliding_window if self.layer_type(layer) == SLIDING else None

    def layer_rope(self, layer_type: str) -> RopeConfig:
        return self.rope_local if layer_type == SLIDING and self.rope_local else self.rope

    @property
    def rope_kinds(self) -> tuple[str, ...]:
        """The layer types that have a RoPE table of their own: FULL, and SLIDING where its
        RoPE differs."""
        return (FULL, SLIDING) if self.rope_local is not None else (FULL,)


def _flag(value: bool | str, cfg: dict[str, Any]) -> bool:
    return bool(cfg.get(value, False)) if isinstance(value, str) else value


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"{where}: {key!r} must be a positive integer, got {v!r}",
                              "fix config.json or re-save the checkpoint")
    return v


def _float(cfg: dict[str, Any], key: str, where: str, default: float | None = None
           ) -> float | None:
    v = cfg.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"{where}: {key!r} must be a positive number, got {v!r}",
                              "fix config.json or re-save the checkpoint")
    return float(v)


def _rope_params(cfg: dict[str, Any], spec: ArchSpec) -> tuple[dict[str, Any],
                                                               dict[str, Any] | None]:
    """The RoPE parameters of full-attention layers, and the sliding layers' own (None: the
    same), from either config spelling."""
    params = cfg.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:  # transformers 5, per layer type
        full = dict(params.get(FULL) or {})
        local = params.get(SLIDING)
        return full, (None if local is None else dict(local))
    # transformers 4.x: rope_theta + rope_scaling; 5.x without layer types: rope_parameters
    merged = dict(cfg.get("rope_scaling") or {})
    merged.update(params)
    if spec.local_theta is None and "rope_local_base_freq" not in cfg:
        return merged, None
    return merged, {"rope_type": "default",
                    "rope_theta": cfg.get("rope_local_base_freq", spec.local_theta)}


def _rope(params: dict[str, Any], cfg: dict[str, Any], spec: ArchSpec, rotary_dim: int,
          where: str) -> RopeConfig:
    theta = float(params.get("rope_theta", cfg.get("rope_theta", spec.default_theta)))
    kind = params.get("rope_type", params.get("type", "default"))
    kind = ROPE_ALIASES.get(kind, kind)
    if kind not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(f"{where}: rope scaling type {kind!r} is not supported",
                              f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if kind == "longrope":
        return _longrope(params, cfg, theta, rotary_dim, where)
    return RopeConfig(
        theta=theta, kind=kind, factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)))


def _longrope(params: dict[str, Any], cfg: dict[str, Any], theta: float, rotary_dim: int,
              where: str) -> RopeConfig:
    """LongRoPE (Phi-3 "su"/"longrope") as transformers computes it: per-frequency
    divisors, and cos/sin scaled by ``sqrt(1 + ln(factor) / ln(original))`` where
    ``factor`` is max_position_embeddings over the original context (unless the config
    names ``factor`` or ``attention_factor``)."""
    # Phi-3 keeps the original context at the top level; transformers prefers it there
    original = cfg.get("original_max_position_embeddings",
                       params.get("original_max_position_embeddings"))
    original = int(original or _int(cfg, "max_position_embeddings", where, 4096))
    factors = {}
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if (not isinstance(values, list) or len(values) != rotary_dim // 2
                or not all(isinstance(v, int | float) and v > 0 for v in values)):
            raise CheckpointError(f"{where}: longrope {key} must be {rotary_dim // 2} positive "
                                  f"numbers (one per rotated frequency), got {values!r}",
                                  "fix config.json")
        factors[key] = tuple(float(v) for v in values)
    factor = float(params.get("factor") or _int(cfg, "max_position_embeddings", where, 4096)
                   / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) /
                                                        math.log(original))
    return RopeConfig(theta=theta, kind="longrope", factor=factor,
                      original_max_position=original, short_factor=factors["short_factor"],
                      long_factor=factors["long_factor"], attention_factor=float(attention))


def _layer_types(cfg: dict[str, Any], spec: ArchSpec, layers: int, where: str
                 ) -> tuple[int | None, tuple[str, ...]]:
    """The sliding window (None: none) and each layer's type (FULL / SLIDING), as
    transformers derives them."""
    types = cfg.get("layer_types")
    if types is not None:
        if (not isinstance(types, list) or len(types) != layers
                or not set(types) <= {FULL, SLIDING}):
            raise CheckpointError(f"{where}: layer_types must list {FULL!r} or {SLIDING!r} "
                                  f"for each of the {layers} layers, got {types!r}",
                                  "fix config.json")
    elif "sliding_window_pattern" in cfg or spec.local_theta is not None:
        # Gemma 3 before layer_types: every pattern-th layer is global
        pattern = _int(cfg, "sliding_window_pattern", where, 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    elif "max_window_layers" in cfg:  # Qwen2/3: the layers from max_window_layers on slide
        types = [SLIDING if i >= cfg["max_window_layers"] else FULL for i in range(layers)]
    else:
        types = [SLIDING] * layers
    use = cfg.get("use_sliding_window", spec.window_by_default)
    window = cfg.get("sliding_window") if use else None
    if window is None:  # no window: sliding layers are full ones (their RoPE stays theirs)
        return None, tuple(types) if spec.local_theta is not None else ()
    window = _int(cfg, "sliding_window", where)
    if cfg.get("use_bidirectional_attention"):
        raise CheckpointError(f"{where}: use_bidirectional_attention is set (an encoder, "
                              "not a causal LM)", "export a causal language model")
    return window, tuple(types)


def parse_config(cfg: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """Turn a HF config dict into a ``ModelConfig``.

    Raises:
        CheckpointError: unsupported architecture, activation or RoPE, bad or inconsistent
            sizes.
    """
    archs = cfg.get("architectures") or []
    name = archs[0] if archs else None
    if name not in ARCHITECTURES:
        raise CheckpointError(
            f"{where}: architecture {name!r} is not supported",
            f"supported: {', '.join(ARCHITECTURES)}; convert the model or open an issue")
    spec = ARCHITECTURES[name]
    # Gemma names it hidden_activation; everyone else hidden_act
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{where}: hidden_act {act!r} is not supported",
                              f"supported: {', '.join(ACTIVATIONS)}")
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where, heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = _int(cfg, "num_hidden_layers", where)
    if heads % kv_heads:
        raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}", "fix config.json")
    full_params, local_params = _rope_params(cfg, spec)
    partial = float(full_params.get("partial_rotary_factor",
                                    cfg.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise CheckpointError(f"{where}: RoPE rotates {rotary_dim} of head_dim {head_dim} "
                              f"channels (partial_rotary_factor {partial}); it must be an "
                              "even number, at least 2", "fix config.json")
    window, types = _layer_types(cfg, spec, layers, where)
    rope_local = (None if local_params is None or SLIDING not in types
                  else _rope(local_params, cfg, spec, rotary_dim, where))
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    scalar = (_float(cfg, "query_pre_attn_scalar", where, head_dim)
              if spec.query_pre_attn_scalar else None)
    return ModelConfig(
        architecture=name, family=spec.family,
        vocab_size=_int(cfg, "vocab_size", where), hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", where),
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=_rope(full_params, cfg, spec, rotary_dim, where),
        max_position=_int(cfg, "max_position_embeddings", where, 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=_flag(spec.qkv_bias, cfg), o_bias=_flag(spec.o_bias, cfg),
        mlp_bias=_flag(spec.mlp_bias, cfg), qk_norm=spec.qk_norm,
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids,
        sliding_window=window, layer_types=types, rope_local=rope_local,
        partial_rotary_factor=partial, activation=act,
        attn_scale=None if scalar is None else scalar ** -0.5,
        final_logit_softcap=_float(cfg, "final_logit_softcapping", where),
        embed_scale=hidden ** 0.5 if spec.scaled_embeddings else 1.0,
        norm_offset=spec.norm_offset, sandwich_norms=spec.sandwich_norms,
    )
