"""rung's decoder in PyTorch: the reference the ONNX graph is built from and checked against.

Module names follow the Hugging Face layout (``model.layers.{i}.self_attn.q_proj`` ...) so a
checkpoint's state dict loads by name. Deployment structure:

- separate ``q_proj`` / ``k_proj`` / ``v_proj`` (per-projection quantization and bias);
- a precomputed RoPE cos/sin table ``[max_seq, rotary_dim]`` indexed by position, one per
  layer type whose RoPE differs (Gemma 3's sliding layers have their own);
- each FFN has a named place for a skip gate, ``mlp.ffn_gate`` (``None`` = always run);
- RMSNorm eps can be overridden at load.

Family options come from the config (``rung.export.arch``): RMSNorm's ``offset + weight``
scale and four norms per layer (Gemma), scaled embeddings, partial rotary, sliding-window
layers, an attention scale of its own, the FFN activation, final logit soft-capping.

The forward pass is a plain full-sequence causal forward (no cache): exports verify the
cached ONNX graph against it, calibration and training use it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast, overload

import torch
from torch import nn
from torch.nn import functional as F

from rung.export.arch import FULL, SLIDING, ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm scaled by ``weight``, or by ``offset + weight`` (Gemma stores the scale minus
    one: ``offset`` 1.0). ``weight`` keeps the checkpoint's value either way."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))
        self.eps = eps
        self.offset = offset

    def gain(self) -> torch.Tensor:
        """The scale the norm applies [dim] (what a graph writes as its weight)."""
        return self.weight + self.offset if self.offset else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.gain() * xf.to(x.dtype)


def rope_table(cfg: ModelConfig, max_seq: int, layer_type: str = FULL
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of ``layer_type``'s RoPE: [max_seq, rotary_dim] (halves duplicated,
    rotate-half convention; LongRoPE's attention factor applied)."""
    rope = cfg.layer_rope(layer_type)
    inv = torch.tensor(rope.inv_freq(cfg.rotary_dim, max_seq), dtype=torch.float64)
    freqs = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return ((emb.cos() * rope.attention_factor).float(),
            (emb.sin() * rope.attention_factor).float())


@dataclass(frozen=True)
class Frame:
    """What the layers read besides the hidden states, per layer type (FULL, and SLIDING
    where it differs): RoPE cos/sin [B, S, rotary_dim] and the additive attention mask
    [B, 1, S, S]."""

    rope: dict[str, tuple[torch.Tensor, torch.Tensor]]
    mask: dict[str, torch.Tensor]

    def rows(self, n: int) -> Frame:
        """The first ``n`` rows."""
        return Frame({k: (c[:n], s[:n]) for k, (c, s) in self.rope.items()},
                     {k: m[:n] for k, m in self.mask.items()})


FP8_MAX = 448.0
KV_DTYPES = ("float32", "float16", "float8_e4m3fn")


def kv_round_trip(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """What the KV cache gives back for ``x`` [..., D] stored as ``kv_dtype``.

    fp8: one scale per vector (token x KV head), ``amax / 448``, computed from the values.
    """
    if kv_dtype == "float16":
        return x.to(torch.float16).to(x.dtype)
    if kv_dtype == "float8_e4m3fn":
        scale = (x.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(1e-30)
        return (x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale
    return x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``cos.shape[-1]`` channels of ``x`` [..., D]; the rest pass."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat([xr * cos + rotate_half(xr) * sin, xp], dim=-1)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=cfg.o_bias)
        norm = cfg.rms_norm_eps, cfg.norm_offset
        self.q_norm = RMSNorm(d, *norm) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, *norm) if cfg.qk_norm else None
        self.kv_dtype = "float32"  # attention sees K/V as the cache stores them

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        # x: [B, S, H]; cos/sin: [B, S, Dr]; mask: [B, 1, S, S] additive
        b, s, _ = x.shape
        d, c = self.cfg.head_dim, self.cfg
        q = self.q_proj(x).view(b, s, c.num_heads, d)
        k = self.k_proj(x).view(b, s, c.num_kv_heads, d)
        v = self.v_proj(x).view(b, s, c.num_kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, S, 1, Dr]
        q = apply_rope(q, cos, sin)
        k = kv_round_trip(apply_rope(k, cos, sin), self.kv_dtype)
        v = kv_round_trip(v, self.kv_dtype)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D]
        k = k.repeat_interleave(c.kv_groups, dim=1)
        v = v.repeat_interleave(c.kv_groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=c.attn_scale)
        y: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, c.num_heads * d))
        return y


class FFNGate(nn.Module):
    """Skip predictor on the FFN input (the normalized hidden state): a linear probe whose
    output ``z`` says "skip" when ``z > 0``. Calibration fits it from text; training learns
    it jointly (soft decision ``sigmoid(z / temperature)`` plus a sparsity term)."""

    def __init__(self, hidden: int, temperature: float = 1.0) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.constant_(self.proj.bias, -4.0)  # starts out "never skip"
        self.temperature = temperature

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # h: [B, S, H] -> z: [B, S]
        z: torch.Tensor = self.proj(h)
        return z.squeeze(-1)


class FFN(nn.Module):
    """Gated feed-forward (SwiGLU, or GeGLU with ``gelu_pytorch_tanh``) with a named place
    for a skip gate (``ffn_gate``).

    With a gate, tokens marked in ``gate_positions`` may skip: in eval mode the FFN output of
    a token whose gate says ``z > 0`` is dropped (the residual passes unchanged), exactly as
    the exported graph's ``If`` does at decode; in training mode the output is scaled by the
    keep probability ``1 - sigmoid(z / T)`` and that probability is kept in
    ``last_skip_prob`` for a sparsity term.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.ffn_gate: FFNGate | None = None
        self.last_skip_prob: torch.Tensor | None = None

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return y

    def forward(self, x: torch.Tensor, gate_positions: torch.Tensor | None = None,
                post: nn.Module | None = None) -> torch.Tensor:
        """``post``: a norm on the output (Gemma's ``post_feedforward_layernorm``), applied
        before a skipped token's output is dropped."""
        out: torch.Tensor = self.dense(x) if post is None else post(self.dense(x))
        if self.ffn_gate is None or gate_positions is None:
            return out
        z: torch.Tensor = self.ffn_gate(x)                              # [B, S]
        if self.training:
            skip = torch.sigmoid(z / self.ffn_gate.temperature) * gate_positions
            self.last_skip_prob = skip
            return out * (1.0 - skip).unsqueeze(-1)
        skip = (z > 0) & gate_positions.bool()
        self.last_skip_prob = skip.float()
        return out * (~skip).unsqueeze(-1).to(out.dtype)


class Block(nn.Module):
    """One decoder layer. Two norms (pre-attention, pre-FFN: ``post_attention_layernorm``)
    or, with ``cfg.sandwich_norms`` (Gemma), four: the attention output is normalized by
    ``post_attention_layernorm`` and the FFN's by ``post_feedforward_layernorm`` before
    their residual adds, and ``pre_feedforward_layernorm`` is the FFN's input norm."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        norm = cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset
        self.layer_type = cfg.layer_type(layer)
        self.input_layernorm = RMSNorm(*norm)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(*norm)
        self.pre_feedforward_layernorm = RMSNorm(*norm) if cfg.sandwich_norms else None
        self.post_feedforward_layernorm = RMSNorm(*norm) if cfg.sandwich_norms else None
        self.mlp = FFN(cfg)

    @property
    def ffn_norm(self) -> RMSNorm:
        """The norm the FFN reads its input from."""
        pre = self.pre_feedforward_layernorm
        return self.post_attention_layernorm if pre is None else pre

    def forward(self, x: torch.Tensor, frame: Frame,
                gate_positions: torch.Tensor | None = None) -> torch.Tensor:
        cos, sin = frame.rope.get(self.layer_type, frame.rope[FULL])
        mask = frame.mask.get(self.layer_type, frame.mask[FULL])
        a = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        if self.pre_feedforward_layernorm is not None:
            a = self.post_attention_layernorm(a)
        x = x + a
        f: torch.Tensor = self.mlp(self.ffn_norm(x), gate_positions,
                                   self.post_feedforward_layernorm)
        return x + f


class BlockList(nn.ModuleList):
    """The decoder layers: an ``nn.ModuleList`` of ``Block``, typed so (``nn.ModuleList``
    gives back a plain ``nn.Module``)."""

    def __init__(self, blocks: Iterable[Block] | None = None) -> None:
        super().__init__(blocks)

    @overload
    def __getitem__(self, idx: slice) -> BlockList: ...

    @overload
    def __getitem__(self, idx: int) -> Block: ...

    def __getitem__(self, idx: int | slice) -> Block | BlockList:
        return cast("Block | BlockList", super().__getitem__(idx))

    def __iter__(self) -> Iterator[Block]:
        return cast(Iterator[Block], super().__iter__())


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = BlockList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)


class RungForCausalLM(nn.Module):
    """The decoder plus LM head; ``lm_head`` shares the embedding when tied."""

    def __init__(self, cfg: ModelConfig, max_seq: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_seq = max_seq
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = {kind: rope_table(cfg, max_seq, kind) for kind in cfg.rope_kinds}

    def set_kv_dtype(self, kv_dtype: str) -> None:
        """Make attention see K/V rounded as a ``kv_dtype`` cache stores them."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}")
        for layer in self.model.layers:
            layer.self_attn.kv_dtype = kv_dtype

    def set_norm_eps(self, eps: float) -> None:
        """Override every RMSNorm's eps (some checkpoints ship a wrong value)."""
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.eps = eps

    def add_ffn_gates(self, temperature: float = 1.0) -> None:
        """Give every layer's FFN a fresh ``ffn_gate`` (starts out "never skip")."""
        for layer in self.model.layers:
            layer.mlp.ffn_gate = FFNGate(self.cfg.hidden_size, temperature)

    @property
    def has_ffn_gates(self) -> bool:
        return all(layer.mlp.ffn_gate is not None for layer in self.model.layers)

    def skip_probs(self) -> list[torch.Tensor]:
        """Per layer, the skip decisions/probabilities [B, S] of the last forward."""
        return [layer.mlp.last_skip_prob for layer in self.model.layers
                if layer.mlp.last_skip_prob is not None]

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                gate_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Full causal forward.

        Args:
            input_ids: [B, S] token ids, right-padded.
            attention_mask: [B, S] 1 for real tokens (optional).
            gate_positions: [B, S] tokens whose FFN the gates may skip (the positions the
                engine decodes one at a time); None = no skipping.
        Returns:
            logits [B, S, V] (float32).
        """
        b, s = input_ids.shape
        if s > self.max_seq:
            raise ValueError(f"sequence of {s} tokens exceeds max_seq {self.max_seq}")
        frame = self.frame(b, s, attention_mask)
        return self.forward_from(self.embed(input_ids), 0, frame, gate_positions)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, S, H] entering the first layer."""
        x: torch.Tensor = self.model.embed_tokens(input_ids)
        if self.cfg.embed_scale != 1.0:  # Gemma: sqrt(hidden), rounded to float32 first
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        return x

    def forward_from(self, x: torch.Tensor, start: int, frame: Frame,
                     gate_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Layers ``start..`` and the head on the hidden states ``x`` [B, S, H] that enter
        layer ``start`` (calibration reruns the tail of the model after changing one layer);
        ``frame`` as ``frame()`` builds it."""
        for layer in self.model.layers[start:]:
            x = layer(x, frame, gate_positions)
        head: torch.Tensor = self.lm_head(self.model.norm(x))
        logits = head.float()
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def frame(self, b: int, s: int, attention_mask: torch.Tensor | None = None) -> Frame:
        """RoPE and additive masks for ``b`` rows of ``s`` tokens from position 0; masked
        keys: the future, beyond a sliding layer's window, padding (``attention_mask`` [B, S]
        0)."""
        pos = torch.arange(s)
        rope = {kind: (cos[pos].expand(b, s, -1), sin[pos].expand(b, s, -1))
                for kind, (cos, sin) in self.rope.items()}
        causal = pos[None, :] <= pos[:, None]                                    # [S, S]
        allowed = {FULL: causal}
        window = self.cfg.sliding_window
        if window is not None and SLIDING in self.cfg.layer_types:
            allowed[SLIDING] = causal & (pos[None, :] > pos[:, None] - window)
        masks = {}
        for kind, ok in allowed.items():
            ok = ok.expand(b, 1, s, s)
            if attention_mask is not None:
                ok = ok & attention_mask.bool()[:, None, None, :]
            masks[kind] = torch.zeros(ok.shape, dtype=torch.float32).masked_fill(
                ~ok, float("-inf"))
        return Frame(rope, masks)
