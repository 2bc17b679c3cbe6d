"""The fused decoder graph: ONNX Runtime's contrib ops where they pay, for fp32/fp16 KV.

The same model as ``rung.export.onnx_graph`` (which stays the generic path: fp8 KV, fp16
weights), written with ONNX Runtime's fused kernels so a decode step runs about a dozen
nodes per layer instead of about fifty:

- ``GroupQueryAttention`` (``com.microsoft``) with rotary embedding inside
  (``do_rotary``), packed QKV, and the KV cache as one shared buffer per layer
  ``[B, Hkv, C, D]`` (head-major) that the kernel appends to in place: the engine binds
  ``past_key_{i}`` and ``present_key_{i}`` to the same memory. Right-padded rows of
  different lengths, rows idle this step and chunked prefill are the kernel's own
  ``query_seqlens`` (valid new tokens per row) and ``seqlens_k`` (tokens in the row's
  cache after the step, minus one).
- ``SkipSimplifiedLayerNormalization`` (``com.microsoft``): residual add + RMSNorm in one
  kernel; ``SimplifiedLayerNormalization`` where there is no residual to add.
- Packed projections: q/k/v as one (``qkv_proj``) and gate/up as one (``gate_up_proj``),
  so int8/int4 weights are one ``MatMulNBits`` each; fp32 weights stay [out, in] under
  ``FusedMatMul(transB=1)`` (``project``).

Qwen3's and Gemma 3's per-head q/k norms run as ``SimplifiedLayerNormalization`` before
the kernel (its CPU kernel does not take ``q_norm_weight``); the kernel's rotary then
follows the norm as in the model. The kernel also takes what other families need: a
sliding window (``local_window_size``), an attention scale of its own (``scale``,
Gemma's ``query_pre_attn_scalar``), partial rotary (a RoPE cache narrower than the head:
``rotary_dim / 2`` must be a multiple of 8, ``fused_refusal``), and a second RoPE cache for
Gemma 3's sliding layers. Gemma's extra norms (attention and FFN outputs normalized before
their residual adds) are ``SimplifiedLayerNormalization`` of their own.

FFN gates (``--ffn-skip``) wrap the FFN in the same ``If`` as the generic graph, with zeros
for a skipped FFN, so that a gate that never skips computes exactly what the ungated graph
does.

Lone tokens (``lone_pad``, int8/int4 weights: ``rung.engines.drafts.PADDED_WEIGHTS``): the
kernel rounds a row that brings one new token otherwise than a row that brings several, so
the engine runs such a row's attention over two positions. The graph takes the input
``attention_positions`` (int64 scalar, at least S) and repeats each layer's last packed
QKV row up to that many rows before the kernel, cutting the kernel's output back to S rows
after it: the second position's attention (and its KV, which the engine drops) costs a few
hundred values a layer, where feeding the token twice ran every weight product over two
rows (what each costs: ``rung.engines.drafts``, ``PADDED_WEIGHTS``).
Rows the kernel is told hold fewer positions (``query_seqlens``) are right-padded as ever.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch
from onnx import TensorProto, helper

from rung.engines.manifest import ATTENTION_POSITIONS, TensorSpec
from rung.export.arch import FULL, ModelConfig
from rung.export.model import RMSNorm, RungForCausalLM
from rung.export.onnx_graph import (
    IR_VERSION,
    KV_ONNX,
    OPSET,
    ROPE_NAMES,
    Builder,
    _np,
    _value_info,
    activation,
    embed,
    gated_ffn,
    lm_logits,
    rope_tables,
    step_specs,
)

MS = "com.microsoft"
# KV dtypes the fused kernel keeps in its cache (fp8 with per-token scales is generic-only)
FUSED_KV = ("float32", "float16")
# packed weight -> the model's linear layers it concatenates (rows, in this order)
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def project(g: Builder, x: str, weight: npt.NDArray[np.float32],
            bias: npt.NDArray[np.float32] | None, name: str, dot: bool) -> str:
    """``x @ weight.T + bias`` for ``weight`` [out, in]. ``dot``: kept as [out, in] and run
    by ``FusedMatMul(transB=1)``, each output a dot product over a contiguous row (fp32 on
    the Qwen2.5-0.5B shape, 2 threads: 23 GB/s of weights read per decode step against 21
    for ``MatMul`` over [in, out]); otherwise ``MatMul`` over [in, out], the form ONNX
    Runtime's int8/int4 quantizer rewrites."""
    if dot:
        y = g.op("FusedMatMul", x, g.init(f"{name}.weight", weight), domain=MS, transB=1,
                 alpha=1.0)
    else:
        y = g.op("MatMul", x, g.init(f"{name}.weight_t", np.ascontiguousarray(weight.T)))
    return y if bias is None else g.op("Add", y, g.init(f"{name}.bias", bias))


def packed_linear(g: Builder, x: str, mods: list[torch.nn.Linear], name: str,
                  dot: bool) -> str:
    """One projection for several linear layers of the same input: outputs concatenated."""
    weight = np.concatenate([_np(m.weight) for m in mods], axis=0)        # [sum(out), in]
    bias = None
    if any(m.bias is not None for m in mods):
        bias = np.concatenate([_np(m.bias) if m.bias is not None
                               else np.zeros(m.weight.shape[0], np.float32) for m in mods])
    return project(g, x, weight, bias, name, dot)


def linear(g: Builder, x: str, mod: torch.nn.Linear, name: str, dot: bool) -> str:
    return packed_linear(g, x, [mod], name, dot)


def norm(g: Builder, x: str, mod: RMSNorm, name: str) -> str:
    return g.op("SimplifiedLayerNormalization", x, g.init(f"{name}.weight", _np(mod.gain())),
                axis=-1, epsilon=mod.eps, stash_type=1)


def skip_norm(g: Builder, x: str, residual: str, mod: RMSNorm,
              name: str) -> tuple[str, str]:
    """RMSNorm of ``x + residual``; returns (normalized, the sum: the new residual)."""
    out, total = g.fresh("skipnorm"), g.fresh("residual")
    g.nodes.append(helper.make_node(
        "SkipSimplifiedLayerNormalization",
        [x, residual, g.init(f"{name}.weight", _np(mod.gain()))],
        [out, "", "", total], name=g.fresh("n_SkipSimplifiedLayerNormalization"), domain=MS,
        epsilon=mod.eps))
    return out, total


def head_norm(g: Builder, x: str, heads: int, d: int, mod: RMSNorm, name: str) -> str:
    """Per-head RMSNorm of ``x`` [B, S, heads * D] (Qwen3's and Gemma's q_norm / k_norm)."""
    y = g.op("Reshape", x, g.const([0, 0, heads, d], np.int64))
    y = norm(g, y, mod, name)
    return g.op("Reshape", y, g.const([0, 0, heads * d], np.int64))


def attention_rows(g: Builder) -> tuple[str, str]:
    """For a ``lone_pad`` graph: the ``Pad`` amounts that repeat a step's last position up
    to ``attention_positions`` rows (none where S is already as long), and S itself, where
    the kernel's output is cut back."""
    s = g.op("Shape", "input_ids", start=1, end=2)                                # [1]
    wanted = g.op("Reshape", ATTENTION_POSITIONS, g.const([1], np.int64))
    more = g.op("Max", g.op("Sub", wanted, s), g.const([0], np.int64))
    pads = g.op("Concat", g.const([0, 0, 0, 0], np.int64), more, g.const([0], np.int64),
                axis=0)                                                           # [6]
    return pads, s


def attention(g: Builder, model: RungForCausalLM, i: int, h: str, dot: bool,
              rows: tuple[str, str] | None = None) -> str:
    c, layer = model.cfg, model.model.layers[i].self_attn
    pre, d = f"layers.{i}.self_attn", c.head_dim
    qkv = packed_linear(g, h, [layer.q_proj, layer.k_proj, layer.v_proj], f"{pre}.qkv_proj",
                        dot)
    if rows is not None:    # [B, S, *] -> [B, attention_positions, *], the last row repeated
        qkv = g.op("Pad", qkv, rows[0], mode="edge")
    if layer.q_norm is not None and layer.k_norm is not None:
        q, k, v = g.ops("Split", [qkv, g.const([c.num_heads * d, c.num_kv_heads * d,
                                                c.num_kv_heads * d], np.int64)], 3, axis=-1)
        q = head_norm(g, q, c.num_heads, d, layer.q_norm, f"{pre}.q_norm")
        k = head_norm(g, k, c.num_kv_heads, d, layer.k_norm, f"{pre}.k_norm")
        qkv_inputs = [q, k, v]
    else:
        qkv_inputs = [qkv, "", ""]
    # the kernel runs in the cache's dtype: with fp16 KV its inputs are cast to fp16 (a few
    # hundred values a token) rather than the cache to fp32 (ONNX Runtime would insert
    # casts of the whole buffer, both ways, every step: cost following the capacity)
    half = layer.kv_dtype == "float16"
    if half:
        qkv_inputs = [g.op("Cast", x, to=TensorProto.FLOAT16) if x else x for x in qkv_inputs]
    out = g.fresh("attn")
    kind = c.layer_type(i)
    stem = ROPE_NAMES[kind if kind in c.rope_kinds else FULL]
    extra: dict[str, Any] = {}
    window = c.window(i)
    if window is not None:
        # ONNX Runtime 1.32's CPU kernel lets a query see local_window_size keys, itself
        # included: transformers' sliding_window (measured; tests/export/test_exporter.py
        # holds both to each other with windows shorter than the sequence)
        extra["local_window_size"] = window
    if c.attn_scale is not None:
        extra["scale"] = c.attn_scale
    g.nodes.append(helper.make_node(
        "GroupQueryAttention",
        [*qkv_inputs, f"past_key_{i}", f"past_value_{i}", "seqlens_k", "total_sequence_length",
         f"{stem}_cos", f"{stem}_sin", "", "", "", "", "", "", "", "query_seqlens"],
        [out, f"present_key_{i}", f"present_value_{i}"], name=g.fresh("n_GQA"), domain=MS,
        num_heads=c.num_heads, kv_num_heads=c.num_kv_heads, do_rotary=1,
        rotary_interleaved=0, **extra))
    if rows is not None:    # the step's own S rows
        out = g.op("Slice", out, g.const([0], np.int64), rows[1], g.const([1], np.int64))
    if half:
        out = g.op("Cast", out, to=TensorProto.FLOAT)
    return linear(g, out, layer.o_proj, f"{pre}.o_proj", dot)


def ffn(g: Builder, model: RungForCausalLM, i: int, h: str, dot: bool) -> str:
    block = model.model.layers[i]
    mlp, pre = block.mlp, f"layers.{i}.mlp"
    width = mlp.gate_proj.weight.shape[0]
    gate_up = packed_linear(g, h, [mlp.gate_proj, mlp.up_proj], f"{pre}.gate_up_proj", dot)
    gate, up = g.ops("Split", [gate_up, g.const([width, width], np.int64)], 2, axis=-1)
    act = g.op("Mul", activation(g, gate, model.cfg.activation), up)
    out = linear(g, act, mlp.down_proj, f"{pre}.down_proj", dot)
    post = block.post_feedforward_layernorm
    return out if post is None else norm(g, out, post, f"layers.{i}.post_feedforward_layernorm")


def fused_refusal(cfg: ModelConfig) -> str | None:
    """Why the fused graph cannot run ``cfg`` (None: it can). The kernel's rotary takes a
    cos/sin cache of ``rotary_dim / 2`` columns, a multiple of 8 (ONNX Runtime 1.32)."""
    if (cfg.rotary_dim // 2) % 8:
        return (f"GroupQueryAttention's rotary needs rotary_dim / 2 to be a multiple of 8; "
                f"this model rotates {cfg.rotary_dim} channels")
    return None


def build_fused_graph(model: RungForCausalLM, dot: bool = True,
                      lone_pad: bool = False) -> onnx.ModelProto:
    """The fused fp32 decoder graph for ``model``; its KV dtype must be in ``FUSED_KV``.
    ``dot``: weights as [out, in] for ``FusedMatMul`` (fp32 serving); False: ``MatMul``
    over [in, out], for the int8/int4 quantizer. ``lone_pad``: the attention runs over
    ``attention_positions`` rows (the module's docstring)."""
    c, layers = model.cfg, model.model.layers
    kv = layers[0].self_attn.kv_dtype
    if kv not in FUSED_KV:
        raise ValueError(f"the fused graph keeps {', '.join(FUSED_KV)} KV, not {kv}")
    refusal = fused_refusal(c)
    if refusal is not None:
        raise ValueError(refusal)
    g = Builder()
    half = c.rotary_dim // 2
    table = np.float16 if kv == "float16" else np.float32    # the kernel's dtype
    for kind, (cos_t, sin_t) in rope_tables(model).items():   # [max_seq, rotary_dim / 2]
        g.init(f"{ROPE_NAMES[kind]}_cos", cos_t[:, :half].astype(table))
        g.init(f"{ROPE_NAMES[kind]}_sin", sin_t[:, :half].astype(table))
    single = (g.op("And", "ffn_allow_skip",
                   g.op("Equal", g.op("Size", "input_ids"), g.const(1, np.int64)))
              if model.has_ffn_gates else None)
    rows = attention_rows(g) if lone_pad else None
    x = embed(g, model)                                                     # [B, S, H]
    pending: str | None = None   # the last FFN's output, added to x by the next norm
    skips: list[str] = []
    for i, block in enumerate(layers):
        pre = f"layers.{i}"
        if pending is None:
            h = norm(g, x, block.input_layernorm, f"{pre}.input_layernorm")
        else:
            h, x = skip_norm(g, pending, x, block.input_layernorm, f"{pre}.input_layernorm")
        a = attention(g, model, i, h, dot, rows)
        if block.pre_feedforward_layernorm is not None:   # Gemma: the output normalized too
            a = norm(g, a, block.post_attention_layernorm, f"{pre}.post_attention_layernorm")
            h, x = skip_norm(g, a, x, block.pre_feedforward_layernorm,
                             f"{pre}.pre_feedforward_layernorm")
        else:
            h, x = skip_norm(g, a, x, block.post_attention_layernorm,
                             f"{pre}.post_attention_layernorm")
        if single is None:
            pending = ffn(g, model, i, h, dot)
        else:
            pending, skipped = gated_ffn(g, model, i, None, h, single,
                                         lambda g, model, i, h: ffn(g, model, i, h, dot))
            skips.append(skipped)
    if pending is None:
        raise ValueError("the model has no layers")
    x = g.op("Add", x, pending)
    lm_logits(g, model, x, lambda g, y: norm(g, y, model.model.norm, "norm"))
    if skips:
        g.op("Concat", *skips, axis=0, out="ffn_skipped")                 # [L] bool
    inputs, outputs = fused_io_specs(model, lone_pad)
    graph = helper.make_graph(g.nodes, "rung_decoder_fused", [_value_info(t) for t in inputs],
                              [_value_info(t) for t in outputs], initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS, 1)],
                              producer_name="rung")
    proto.ir_version = IR_VERSION
    return proto


def fused_io_specs(model: RungForCausalLM, lone_pad: bool = False
                   ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    c = model.cfg
    kv_dtype = model.model.layers[0].self_attn.kv_dtype
    if kv_dtype not in KV_ONNX:
        raise ValueError(f"unknown KV dtype {kv_dtype}")
    cache: list[str | int] = ["B", c.num_kv_heads, "C", c.head_dim]
    inputs, outputs = step_specs(model, [TensorSpec("seqlens_k", "int32", ["B"]),
                                         TensorSpec("query_seqlens", "int32", ["B"]),
                                         TensorSpec("total_sequence_length", "int32", [])])
    if lone_pad:
        inputs.append(TensorSpec(ATTENTION_POSITIONS, "int64", []))
    for i in range(c.num_layers):
        for part in ("key", "value"):
            inputs.append(TensorSpec(f"past_{part}_{i}", kv_dtype, list(cache)))
            outputs.append(TensorSpec(f"present_{part}_{i}", kv_dtype, list(cache)))
    return inputs, outputs

