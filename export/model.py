"""rung's decoder in PyTorch: the reference the ONNX graph is built from and checked against.

Module names follow the Hugging Face layout (``model.layers.{i}.self_attn.q_proj`` ...) so a
checkpoint's state dict loads by name. Deployment structure:

- separate ``q_proj`` / ``k_proj`` / ``v_proj`` (per-projection quantization and bias);
- a precomputed RoPE cos/sin table ``[max_seq, head_dim]`` indexed by position;
- each FFN has a named place for a skip gate, ``mlp.ffn_gate`` (``None`` = always run);
- RMSNorm eps can be overridden at load.

The forward pass is a plain full-sequence causal forward (no cache): exports verify the
cached ONNX graph against it, calibration and training use it directly.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rung.export.arch import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_table(cfg: ModelConfig, max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_seq, head_dim] (halves duplicated, rotate-half convention)."""
    inv = torch.tensor(cfg.rope.inv_freq(cfg.head_dim), dtype=torch.float64)
    freqs = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.kv_dtype = "float32"  # attention sees K/V as the cache stores them

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        # x: [B, S, H]; cos/sin: [B, S, D]; mask: [B, 1, S, S] additive
        b, s, _ = x.shape
        d, c = self.cfg.head_dim, self.cfg
        q = self.q_proj(x).view(b, s, c.num_heads, d)
        k = self.k_proj(x).view(b, s, c.num_kv_heads, d)
        v = self.v_proj(x).view(b, s, c.num_kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, S, 1, D]
        q = q * cos + rotate_half(q) * sin
        k = kv_round_trip(k * cos + rotate_half(k) * sin, self.kv_dtype)
        v = kv_round_trip(v, self.kv_dtype)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D]
        k = k.repeat_interleave(c.kv_groups, dim=1)
        v = v.repeat_interleave(c.kv_groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, c.num_heads * d))


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
        return self.proj(h).squeeze(-1)


class FFN(nn.Module):
    """SwiGLU feed-forward with a named place for a skip gate (``ffn_gate``).

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
        self.ffn_gate: FFNGate | None = None
        self.last_skip_prob: torch.Tensor | None = None

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward(self, x: torch.Tensor,
                gate_positions: torch.Tensor | None = None) -> torch.Tensor:
        out = self.dense(x)
        if self.ffn_gate is None or gate_positions is None:
            return out
        z = self.ffn_gate(x)                                            # [B, S]
        if self.training:
            skip = torch.sigmoid(z / self.ffn_gate.temperature) * gate_positions
            self.last_skip_prob = skip
            return out * (1.0 - skip).unsqueeze(-1)
        skip = (z > 0) & gate_positions.bool()
        self.last_skip_prob = skip.float()
        return out * (~skip).unsqueeze(-1).to(out.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = FFN(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, gate_positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x), gate_positions)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


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
        cos, sin = rope_table(cfg, max_seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

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
        pos = torch.arange(s, device=input_ids.device).expand(b, s)
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        allowed = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril()
        allowed = allowed.expand(b, 1, s, s)
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(
            ~allowed, float("-inf"))
        x = self.model.embed_tokens(input_ids)
        return self.forward_from(x, 0, cos, sin, mask, gate_positions)

    def forward_from(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor,
                     mask: torch.Tensor,
                     gate_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Layers ``start..`` and the head on the hidden states ``x`` [B, S, H] that enter
        layer ``start`` (calibration reruns the tail of the model after changing one layer);
        ``cos``/``sin``/``mask`` as ``forward`` builds them."""
        for layer in self.model.layers[start:]:
            x = layer(x, cos, sin, mask, gate_positions)
        return self.lm_head(self.model.norm(x)).float()

    def rope_and_mask(self, b: int, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin [B, S, D] and the additive causal mask [B, 1, S, S] of ``forward``."""
        pos = torch.arange(s).expand(b, s)
        allowed = torch.ones(s, s, dtype=torch.bool).tril().expand(b, 1, s, s)
        mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(
            ~allowed, float("-inf"))
        return self.rope_cos[pos], self.rope_sin[pos], mask
