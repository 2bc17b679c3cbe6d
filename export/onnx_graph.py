"""Write rung's decoder as one ONNX graph that serves prefill (S tokens) and decode (1 token).

The graph is built directly from the PyTorch model's weights, in short functions, one per
block. Its I/O contract is documented in ``rung.engines.manifest``. Attention reads the past
from the engine's buffer (``past_key_i: [P, B, Hkv, D]``) and scores past and new keys
separately, normalizing them together in one softmax: past and new are never concatenated
into one KV tensor, and only the new positions leave the graph. Sliding-window layers
mask keys beyond their window in the same additive mask (``window``), so the engine needs
to know nothing of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from rung.engines.manifest import TensorSpec
from rung.export.arch import FULL, SLIDING
from rung.export.model import FP8_MAX, RMSNorm, RungForCausalLM, rope_table

OPSET = 21
IR_VERSION = 10


@dataclass
class Builder:
    """Accumulates nodes and initializers; every op returns its output name."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    counter: int = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def init(self, name: str, array: npt.NDArray[Any]) -> str:
        self.inits.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def const(self, values: list[int] | list[float] | float | int, dtype: type) -> str:
        return self.init(self.fresh("c"), np.array(values, dtype=dtype))

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        name = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name],
                                           name=self.fresh(f"n_{op_type}"), **attrs))
        return name

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs: Any) -> list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs,
                                           name=self.fresh(f"n_{op_type}"), **attrs))
        return outs


def _np(t: torch.Tensor) -> npt.NDArray[np.float32]:
    return t.detach().to(torch.float32).cpu().numpy()


def linear(g: Builder, x: str, mod: torch.nn.Linear, name: str) -> str:
    # x: [..., in] -> [..., out]; weight stored transposed [in, out] for MatMul
    y = g.op("MatMul", x, g.init(f"{name}.weight_t", _np(mod.weight).T))
    if mod.bias is not None:
        y = g.op("Add", y, g.init(f"{name}.bias", _np(mod.bias)))
    return y


def rms_norm(g: Builder, x: str, norm: RMSNorm, name: str) -> str:
    # Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul: the pattern ONNX Runtime fuses.
    ms = g.op("ReduceMean", g.op("Pow", x, g.const(2.0, np.float32)),
              g.const([-1], np.int64), keepdims=1)
    y = g.op("Div", x, g.op("Sqrt", g.op("Add", ms, g.const(norm.eps, np.float32))))
    return g.op("Mul", y, g.init(f"{name}.weight", _np(norm.gain())))


def rope(g: Builder, x: str, cos: str, sin_signed: str, rot: int, d: int) -> str:
    # x: [B, S, heads, D]; cos/sin: [B, S, 1, rot]; rotate_half with the sign folded into
    # sin; channels past ``rot`` (partial rotary) pass unrotated
    if rot < d:
        xr, xp = g.ops("Split", [x, g.const([rot, d - rot], np.int64)], 2, axis=-1)
        return g.op("Concat", rope(g, xr, cos, sin_signed, rot, rot), xp, axis=-1)
    half = rot // 2
    x1, x2 = g.ops("Split", [x, g.const([half, half], np.int64)], 2, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", g.op("Concat", x2, x1, axis=-1),
                                                 sin_signed))


def activation(g: Builder, x: str, kind: str) -> str:
    """The FFN's gate activation (``arch.ACTIVATIONS``)."""
    if kind == "gelu_pytorch_tanh":
        return g.op("Gelu", x, approximate="tanh")
    return g.op("Mul", x, g.op("Sigmoid", x))                               # silu


def rope_tables(model: RungForCausalLM
                ) -> dict[str, tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
    """Per layer type with a RoPE of its own: its graph initializers' names stem
    (``rope``, ``rope_local``) -> cos, sin [max_seq, rotary_dim]."""
    tables = {kind: rope_table(model.cfg, model.max_seq, kind) for kind in model.cfg.rope_kinds}
    return {kind: (_np(cos), _np(sin)) for kind, (cos, sin) in tables.items()}


ROPE_NAMES = {FULL: "rope", SLIDING: "rope_local"}   # rope_cos / rope_local_cos ...


@dataclass(frozen=True)
class Shared:
    """Per-graph values every layer uses; per layer type where layers differ."""

    cos: dict[str, str]   # layer type -> [B, S, 1, rotary_dim]
    sin: dict[str, str]   # layer type -> [B, S, 1, rotary_dim]
    bias: dict[str, str]  # layer type -> [B, 1, G*S, P+S] additive attention mask
    split_ps: str     # [2] = (P, S), splits the key axis into past and new
    single: str | None  # bool scalar: a one-token decode step of one sequence (gates may skip)

    def rope(self, layer_type: str) -> tuple[str, str]:
        kind = layer_type if layer_type in self.cos else FULL
        return self.cos[kind], self.sin[kind]

    def mask(self, layer_type: str) -> str:
        return self.bias.get(layer_type, self.bias[FULL])


def shared_values(g: Builder, model: RungForCausalLM) -> Shared:
    c = model.cfg
    half = c.rotary_dim // 2
    axis2 = g.const([2], np.int64)
    cos, sin = {}, {}
    for kind, (cos_t, sin_t) in rope_tables(model).items():
        stem = ROPE_NAMES[kind]
        sin_signed = np.concatenate([-sin_t[:, :half], sin_t[:, half:]], axis=-1)
        cos[kind] = g.op("Unsqueeze", g.op("Gather", g.init(f"{stem}_cos", cos_t),
                                           "position_ids"), axis2)
        sin[kind] = g.op("Unsqueeze", g.op("Gather", g.init(f"{stem}_sin", sin_signed),
                                           "position_ids"), axis2)
    zero = g.const(0, np.int64)
    one = g.const(1, np.int64)
    p = g.op("Gather", g.op("Shape", "past_key_0"), zero, axis=0)   # scalar P
    s = g.op("Gather", g.op("Shape", "input_ids"), one, axis=0)     # scalar S
    kpos = g.op("Range", zero, g.op("Add", p, s), one)              # [T]
    is_past = g.op("Less", kpos, p)
    in_past = g.op("Less", kpos, g.op("Unsqueeze", "past_lengths", g.const([1, 2], np.int64)))
    qpos = g.op("Unsqueeze", g.op("Range", zero, s, one), g.const([1], np.int64))  # [S, 1]
    causal = g.op("LessOrEqual", g.op("Sub", kpos, p), qpos)                      # [S, T]
    allowed = {FULL: g.op("Or", g.op("And", is_past, in_past),                    # [B, S, T]
                          g.op("And", g.op("Not", is_past), causal))}
    if c.sliding_window is not None and SLIDING in c.layer_types:
        allowed[SLIDING] = g.op("And", allowed[FULL], window(g, c.sliding_window, kpos, p, s))
    bias = {}
    for kind, ok in allowed.items():
        b = g.op("Where", ok, g.const(0.0, np.float32), g.const(-np.inf, np.float32))
        bias[kind] = g.op("Tile", g.op("Unsqueeze", b, g.const([1], np.int64)),
                          g.const([1, 1, c.kv_groups, 1], np.int64))              # [B,1,G*S,T]
    split_ps = g.op("Concat", g.op("Unsqueeze", p, g.const([0], np.int64)),
                    g.op("Unsqueeze", s, g.const([0], np.int64)), axis=0)
    # gates act only where the engine says this is a decode step (ffn_allow_skip) and the
    # step is one token of one sequence: prefill, suffix prefill and batches never skip
    single = (g.op("And", "ffn_allow_skip",
                   g.op("Equal", g.op("Size", "input_ids"), g.const(1, np.int64)))
              if model.has_ffn_gates else None)
    return Shared(cos, sin, bias, split_ps, single)


def window(g: Builder, size: int, kpos: str, p: str, s: str) -> str:
    """[B, S, T] bool: key within ``size`` positions of the query, itself included. Row b's
    past key j sits at position j, its new key t at past_lengths[b] + t, its query at
    past_lengths[b] + its index."""
    plen = g.op("Unsqueeze", "past_lengths", g.const([1], np.int64))              # [B, 1]
    qabs = g.op("Add", plen, g.op("Range", g.const(0, np.int64), s,
                                  g.const(1, np.int64)))                          # [B, S]
    kabs = g.op("Where", g.op("Less", kpos, p), kpos,
                g.op("Add", plen, g.op("Sub", kpos, p)))                          # [B, T]
    reach = g.op("Add", kabs, g.const(size, np.int64))
    return g.op("Greater", g.op("Unsqueeze", reach, g.const([1], np.int64)),
                g.op("Unsqueeze", qabs, g.const([2], np.int64)))


KV_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
           "float8_e4m3fn": TensorProto.FLOAT8E4M3FN}


def kv_store(g: Builder, x: str, kv: str, name: str) -> str:
    """Emit ``x`` [S, B, Hkv, D] as graph output ``name`` in the cache dtype ``kv`` (plus
    ``{name}_scale`` [S, B, Hkv] for fp8); return x as the cache will give it back (float32).
    """
    if kv == "float32":
        return g.op("Identity", x, out=name)
    if kv == "float16":
        return g.op("Cast", g.op("Cast", x, to=TensorProto.FLOAT16, out=name),
                    to=TensorProto.FLOAT)
    # fp8 e4m3: one scale per token and KV head, amax / 448, computed from the values
    amax = g.op("ReduceMax", g.op("Abs", x), g.const([-1], np.int64), keepdims=1)
    scale = g.op("Max", g.op("Div", amax, g.const(FP8_MAX, np.float32)),
                 g.const(1e-30, np.float32))                                 # [S, B, Hkv, 1]
    g.op("Squeeze", scale, g.const([-1], np.int64), out=f"{name}_scale")
    q = g.op("Cast", g.op("Div", x, scale), to=TensorProto.FLOAT8E4M3FN, out=name)
    return g.op("Mul", g.op("Cast", q, to=TensorProto.FLOAT), scale)


def kv_load(g: Builder, name: str, kv: str) -> str:
    """The float32 view of cache input ``name`` [P, B, Hkv, D]."""
    if kv == "float32":
        return name
    x = g.op("Cast", name, to=TensorProto.FLOAT)
    if kv == "float16":
        return x
    return g.op("Mul", x, g.op("Unsqueeze", f"{name}_scale", g.const([-1], np.int64)))


def attention(g: Builder, model: RungForCausalLM, i: int, x: str, sh: Shared) -> str:
    c, layer = model.cfg, model.model.layers[i].self_attn
    kv = layer.kv_dtype
    pre, d, groups = f"layers.{i}.self_attn", c.head_dim, c.kv_groups
    q = g.op("Reshape", linear(g, x, layer.q_proj, f"{pre}.q_proj"),
             g.const([0, 0, c.num_heads, d], np.int64))                     # [B, S, Hq, D]
    k = g.op("Reshape", linear(g, x, layer.k_proj, f"{pre}.k_proj"),
             g.const([0, 0, c.num_kv_heads, d], np.int64))                  # [B, S, Hkv, D]
    v = g.op("Reshape", linear(g, x, layer.v_proj, f"{pre}.v_proj"),
             g.const([0, 0, c.num_kv_heads, d], np.int64))
    if layer.q_norm is not None and layer.k_norm is not None:
        q = rms_norm(g, q, layer.q_norm, f"{pre}.q_norm")
        k = rms_norm(g, k, layer.k_norm, f"{pre}.k_norm")
    kind = c.layer_type(i)
    cos, sin = sh.rope(kind)
    q = rope(g, q, cos, sin, c.rotary_dim, d)
    k = rope(g, k, cos, sin, c.rotary_dim, d)
    # store path: [S, B, Hkv, D] in the cache dtype; attention reads new and past alike,
    # as the cache gives them back
    new_k = kv_store(g, g.op("Transpose", k, perm=[1, 0, 2, 3]), kv, f"new_key_{i}")
    new_v = kv_store(g, g.op("Transpose", v, perm=[1, 0, 2, 3]), kv, f"new_value_{i}")
    # queries grouped by kv head: [B, Hkv, G*S, D], pre-scaled by 1/sqrt(D) (or the
    # family's own scale)
    q = g.op("Reshape", q, g.const([0, 0, c.num_kv_heads, groups, d], np.int64))
    q = g.op("Transpose", q, perm=[0, 2, 3, 1, 4])
    scale = c.attn_scale if c.attn_scale is not None else 1.0 / math.sqrt(d)
    q = g.op("Mul", g.op("Reshape", q, g.const([0, 0, -1, d], np.int64)),
             g.const(scale, np.float32))
    past_k = g.op("Transpose", kv_load(g, f"past_key_{i}", kv), perm=[1, 2, 3, 0])
    past_v = g.op("Transpose", kv_load(g, f"past_value_{i}", kv), perm=[1, 2, 0, 3])
    new_k = g.op("Transpose", new_k, perm=[1, 2, 3, 0])                     # [B, Hkv, D, S]
    new_v = g.op("Transpose", new_v, perm=[1, 2, 0, 3])                     # [B, Hkv, S, D]
    scores = g.op("Concat", g.op("MatMul", q, past_k), g.op("MatMul", q, new_k), axis=3)
    probs = g.op("Softmax", g.op("Add", scores, sh.mask(kind)), axis=-1)   # [B, Hkv, G*S, T]
    p_past, p_new = g.ops("Split", [probs, sh.split_ps], 2, axis=3)
    out = g.op("Add", g.op("MatMul", p_past, past_v), g.op("MatMul", p_new, new_v))
    out = g.op("Reshape", out, g.const([0, 0, groups, -1, d], np.int64))   # [B, Hkv, G, S, D]
    out = g.op("Transpose", out, perm=[0, 3, 1, 2, 4])                      # [B, S, Hkv, G, D]
    out = g.op("Reshape", out, g.const([0, 0, c.num_heads * d], np.int64))
    return linear(g, out, layer.o_proj, f"{pre}.o_proj")


def ffn(g: Builder, model: RungForCausalLM, i: int, x: str) -> str:
    block = model.model.layers[i]
    mlp, pre = block.mlp, f"layers.{i}.mlp"
    gate = linear(g, x, mlp.gate_proj, f"{pre}.gate_proj")
    up = linear(g, x, mlp.up_proj, f"{pre}.up_proj")
    act = g.op("Mul", activation(g, gate, model.cfg.activation), up)
    out = linear(g, act, mlp.down_proj, f"{pre}.down_proj")
    post = block.post_feedforward_layernorm
    return out if post is None else rms_norm(g, out, post,
                                             f"layers.{i}.post_feedforward_layernorm")


FFN = Callable[[Builder, RungForCausalLM, int, str], str]


def gated_ffn(g: Builder, model: RungForCausalLM, i: int, x: str | None, h: str,
              single: str, ffn_block: FFN = ffn) -> tuple[str, str]:
    """``x + FFN(h)``, behind an ``If`` that skips the FFN when this is a one-token step
    (``single``) and the layer's gate says ``z > 0``; without ``x``, ``FFN(h)`` or zeros
    (the fused graph adds the residual in its next norm). Returns (output, skip flag [1])."""
    gate, pre = model.model.layers[i].mlp.ffn_gate, f"layers.{i}.mlp.ffn_gate"
    if gate is None:
        raise ValueError(f"layer {i} has no ffn_gate")
    z = linear(g, h, gate.proj, f"{pre}.proj")                               # [B, S, 1]
    z = g.op("ReduceMax", z, keepdims=0)                                     # scalar
    skip = g.op("And", single, g.op("Greater", z, g.const(0.0, np.float32)))
    out = g.fresh("ffn_out")
    then_g = Builder(counter=g.counter)
    if x is None:
        then_g.op("ConstantOfShape", then_g.op("Shape", h), out=out)        # float zeros
    else:
        then_g.op("Identity", x, out=out)
    else_g = Builder(counter=then_g.counter)
    if x is None:
        else_g.op("Identity", ffn_block(else_g, model, i, h), out=out)
    else:
        else_g.op("Add", x, ffn_block(else_g, model, i, h), out=out)
    g.counter = else_g.counter
    value = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
    branches = {name: helper.make_graph(b.nodes, f"{name}_{i}", [], [value],
                                        initializer=b.inits)
                for name, b in (("skip", then_g), ("run", else_g))}
    result = g.op("If", skip, then_branch=branches["skip"], else_branch=branches["run"])
    return result, g.op("Unsqueeze", skip, g.const([0], np.int64))


def decoder_layer(g: Builder, model: RungForCausalLM, i: int, x: str, sh: Shared,
                  skips: list[str]) -> str:
    block, pre = model.model.layers[i], f"layers.{i}"
    h = rms_norm(g, x, block.input_layernorm, f"{pre}.input_layernorm")
    a = attention(g, model, i, h, sh)
    if block.pre_feedforward_layernorm is not None:   # Gemma: the output normalized too
        a = rms_norm(g, a, block.post_attention_layernorm, f"{pre}.post_attention_layernorm")
        h_name = f"{pre}.pre_feedforward_layernorm"
    else:
        h_name = f"{pre}.post_attention_layernorm"
    x = g.op("Add", x, a)
    h = rms_norm(g, x, block.ffn_norm, h_name)
    if sh.single is None:
        return g.op("Add", x, ffn(g, model, i, h))
    x, skipped = gated_ffn(g, model, i, x, h, sh.single)
    skips.append(skipped)
    return x


def lm_head(g: Builder, model: RungForCausalLM, x: str) -> str:
    return lm_logits(g, model, x, lambda g, y: rms_norm(g, y, model.model.norm, "norm"))


def embed(g: Builder, model: RungForCausalLM) -> str:
    """Hidden states [B, S, H] of ``input_ids``: the embedding table's rows, times the
    family's embedding scale."""
    x = g.op("Gather", g.init("embed_tokens.weight", _np(model.model.embed_tokens.weight)),
             "input_ids")
    scale = model.cfg.embed_scale
    return x if scale == 1.0 else g.op("Mul", x, g.const(scale, np.float32))


def lm_logits(g: Builder, model: RungForCausalLM, x: str,
              final_norm: Callable[[Builder, str], str]) -> str:
    """Graph output ``logits`` [B, K, V]: the final norm and the LM head at the
    ``logits_index`` positions of ``x`` [B, S, H] only."""
    c = model.cfg
    # pick the scored positions: logits_index [B, K] -> hidden [B, K, H]
    idx_shape = g.op("Shape", "logits_index")
    idx = g.op("Expand", g.op("Unsqueeze", "logits_index", g.const([2], np.int64)),
               g.op("Concat", idx_shape, g.const([c.hidden_size], np.int64), axis=0))
    x = g.op("GatherElements", x, idx, axis=1)
    x = final_norm(g, x)
    head = ("embed_tokens.weight" if c.tie_word_embeddings
            else g.init("lm_head.weight", _np(model.lm_head.weight)))      # [V, H]
    flat = g.op("Reshape", x, g.const([-1, c.hidden_size], np.int64))
    logits = g.op("Gemm", flat, head, transB=1)
    cap = c.final_logit_softcap
    if cap is not None:                                   # cap * tanh(logits / cap)
        logits = g.op("Mul", g.op("Tanh", g.op("Div", logits, g.const(cap, np.float32))),
                      g.const(cap, np.float32))
    return g.op("Reshape", logits, g.op("Concat", idx_shape, g.const([c.vocab_size], np.int64),
                                        axis=0), out="logits")


def step_specs(model: RungForCausalLM, position_inputs: list[TensorSpec]
               ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs every graph form has, around its own position inputs; the KV
    tensors follow."""
    c = model.cfg
    inputs = [TensorSpec("input_ids", "int64", ["B", "S"]), *position_inputs,
              TensorSpec("logits_index", "int64", ["B", "K"])]
    outputs = [TensorSpec("logits", "float32", ["B", "K", c.vocab_size])]
    if model.has_ffn_gates:
        inputs.append(TensorSpec("ffn_allow_skip", "bool", []))
        outputs.append(TensorSpec("ffn_skipped", "bool", [c.num_layers]))
    return inputs, outputs


def io_specs(model: RungForCausalLM) -> tuple[list[TensorSpec], list[TensorSpec]]:
    c = model.cfg
    kv_dtype = model.model.layers[0].self_attn.kv_dtype
    kv: list[str | int] = ["P", "B", c.num_kv_heads, c.head_dim]
    new: list[str | int] = ["S", "B", c.num_kv_heads, c.head_dim]
    inputs, outputs = step_specs(model, [TensorSpec("position_ids", "int64", ["B", "S"]),
                                         TensorSpec("past_lengths", "int64", ["B"])])
    for i in range(c.num_layers):
        for part in ("key", "value"):
            inputs.append(TensorSpec(f"past_{part}_{i}", kv_dtype, list(kv)))
            outputs.append(TensorSpec(f"new_{part}_{i}", kv_dtype, list(new)))
            if kv_dtype == "float8_e4m3fn":
                inputs.append(TensorSpec(f"past_{part}_{i}_scale", "float32", kv[:3]))
                outputs.append(TensorSpec(f"new_{part}_{i}_scale", "float32", new[:3]))
    return inputs, outputs


_ONNX_TYPES = {"int64": TensorProto.INT64, "int32": TensorProto.INT32, "bool": TensorProto.BOOL,
               **KV_ONNX}


def _value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(spec.name, _ONNX_TYPES[spec.dtype], spec.shape)


def build_graph(model: RungForCausalLM) -> onnx.ModelProto:
    """The fp32 decoder graph for ``model`` (weights as initializers)."""
    g = Builder()
    sh = shared_values(g, model)
    x = embed(g, model)                                                     # [B, S, H]
    skips: list[str] = []
    for i in range(model.cfg.num_layers):
        x = decoder_layer(g, model, i, x, sh, skips)
    lm_head(g, model, x)
    if skips:
        g.op("Concat", *skips, axis=0, out="ffn_skipped")                 # [L] bool
    inputs, outputs = io_specs(model)
    graph = helper.make_graph(g.nodes, "rung_decoder", [_value_info(t) for t in inputs],
                              [_value_info(t) for t in outputs], initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="rung")
    proto.ir_version = IR_VERSION
    return proto
