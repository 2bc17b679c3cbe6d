"""Weight-only quantization of the decoder graph: ``MatMul`` -> ``MatMulNBits`` (int8, int4).

Every linear layer's weight becomes blocks of ``block_size`` input channels per output
channel, each with one float32 scale and, by default, one integer zero point
(asymmetric), written by ``export/blockquant.py`` (scales searched per block, rounding
weighted by calibration activations) and run by the ``com.microsoft`` ``MatMulNBits``
contrib op that ONNX Runtime's CPU execution provider implements. Bits are chosen per
weight: ``bits_of`` maps a layer (``layers.3.mlp.down_proj``, ``lm_head``) to 4 or 8, so
the most sensitive matrices of an int4 export stay at 8 bits (``export/mixed.py``) and a
GGUF file's Q6_K matrices stay 8-bit where its Q4_K ones are 4-bit. Packed projections
(the fused graph's ``qkv_proj``, ``gate_up_proj``) take the widest of their parts.

The embedding table (the ``Gather``) is stored as 8-bit blocks too (``EMBED_BITS``) and read
by ONNX Runtime's ``GatherBlockQuantized``, which dequantizes only the rows a step looks up.
A step reads one row per token, so this saves no time; it saves the file (the table is as
large as the LM head: 151,936 x 896 on the Qwen2.5-0.5B shape, 545 MB at fp32 of a 932 MB
int4 engine, 136 MB at 8 bits) and with it the load's reading and checking, and it bounds
what a long-running daemon's table can grow to in memory (its rows are paged in from the
file as tokens use them: a quarter of the fp32 bytes). With tied embeddings at an 8-bit head
the table takes the head's own rounding (embedding and head stay one matrix, as trained),
in its own initializer (``_quantize_embedding`` says why). A hidden size no block of 16 or
more divides keeps the float table (``embedding_block``).

What stays float, and why:

- The FFN gate probes (``--ffn-skip``): one [hidden, 1] vector per layer whose sign decides
  whether an FFN runs; a rounding step there flips decisions for nothing saved.
- The LM head is quantized, by default at 8 bits (``LM_HEAD_BITS``): the vocabulary
  projection is the largest single weight (151,936 x 896 in Qwen2.5-0.5B, 28 % of the
  model) and the most sensitive one, since its error lands on the logits directly, with no
  norm after it. ``--lm-head-bits 4`` quantizes it like the layers (onnxruntime-genai's
  int4 default). With tied embeddings it gets its own transposed copy in the graph.

Weights inside ``--ffn-skip``'s ``If`` branches are quantized like the others.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch
from onnx import helper, numpy_helper

from rung.engines.errors import ExportError
from rung.export.blockquant import Blocks, concat, quantize
from rung.export.model import RungForCausalLM
from rung.export.onnx_fused import PACKED

BITS = {"int8": 8, "int4": 4}
# The LM head at 8 bits for both precisions: see the module docstring.
LM_HEAD_BITS = {"int8": 8, "int4": 8}
DEFAULT_BLOCK_SIZE = 32
MIN_BLOCK_SIZE = 16  # MatMulNBits' smallest block
# MatMulNBits' accuracy_level 4: the CPU kernel quantizes the activations to int8 per block
# and runs integer dot products; with float activations (level 0) the kernel dequantizes
# every block and decodes slower than fp32 weights. Level 4 costs accuracy: the graph is
# then no longer bit-exact to its dequantized weights (verify.py's int tolerances).
# Decode rates and KL of both levels: docs/benchmarks/quantization.md, "Quantized weights".
ACCURACY_LEVEL = 4
LM_HEAD_WEIGHT = "lm_head.weight_t"
EMBED = "embed_tokens.weight"   # the float table the graph builders write (onnx_graph.embed)
EMBED_BITS = 8
# Weights left in float (suffixes of initializer names written by onnx_graph.linear)
KEEP_FLOAT = ("ffn_gate.proj.weight_t",)
# quantized weight vs original, Frobenius norm: 4-bit rounding measures 0.07-0.15 on real
# and random weights; a misplaced weight ~1.4
MAX_REL_ERROR = 0.5


@dataclass(frozen=True)
class QuantSpec:
    """How an engine's weights were quantized: the manifest's ``quantization`` record.

    ``bits`` is the precision asked for; ``bits_of`` the layers that differ from it (the
    LM head at ``lm_head_bits`` is not listed), ``block_of`` likewise for block sizes.
    """

    bits: int
    block_size: int
    lm_head_bits: int
    accuracy_level: int
    symmetric: bool = False
    method: str = "MatMulNBits"
    embeddings: str = "int8"
    bits_of: dict[str, int] = field(default_factory=dict)
    block_of: dict[str, int] = field(default_factory=dict)

    def layer_bits(self, name: str) -> int:
        default = self.lm_head_bits if name == "lm_head" else self.bits
        return self.bits_of.get(name, default)

    def layer_block(self, name: str) -> int:
        return self.block_of.get(name, self.block_size)

    def to_manifest(self) -> dict[str, Any]:
        return {"method": self.method, "bits": self.bits, "block_size": self.block_size,
                "symmetric": self.symmetric,
                "scheme": "symmetric" if self.symmetric else "asymmetric",
                "accuracy_level": self.accuracy_level, "lm_head_bits": self.lm_head_bits,
                "embeddings": self.embeddings,
                "layers": dict(sorted(self.bits_of.items())),
                "block_sizes": dict(sorted(self.block_of.items()))}


def quant_spec(weights: str, block_size: int | None, lm_head_bits: int | None = None,
               symmetric: bool = False) -> QuantSpec:
    """The settings for ``--weights int8|int4 [--block-size N] [--lm-head-bits B]``.

    Raises:
        ExportError: a block size that is not a power of two of at least 16.
    """
    size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    if size < MIN_BLOCK_SIZE or size & (size - 1):
        raise ExportError(f"--block-size {size} is not available",
                          f"give a power of two >= {MIN_BLOCK_SIZE} (default "
                          f"{DEFAULT_BLOCK_SIZE})")
    head = LM_HEAD_BITS[weights] if lm_head_bits is None else lm_head_bits
    if head not in BITS.values():
        raise ExportError(f"--lm-head-bits {head} is not available", "give 8 or 4")
    return QuantSpec(bits=BITS[weights], block_size=size, lm_head_bits=head,
                     accuracy_level=ACCURACY_LEVEL, symmetric=symmetric)


def parts_of(stem: str) -> list[str]:
    """The model's linear layers behind a graph weight ``stem`` (a packed projection of the
    fused graph stands for two or three)."""
    parent, _, leaf = stem.rpartition(".")
    return [f"{parent}.{p}" for p in PACKED[leaf]] if leaf in PACKED else [stem]


def quantize_graph(proto: onnx.ModelProto, spec: QuantSpec,
                   importance: dict[str, npt.NDArray[np.float32]] | None = None,
                   cache: dict[tuple[str, int, int], Blocks] | None = None
                   ) -> onnx.ModelProto:
    """Replace the weight ``MatMul``s of ``proto`` (fp32, from ``build_graph`` or
    ``build_fused_graph(dot=False)``) by ``MatMulNBits`` as ``spec`` says; ``importance``:
    per layer, the mean square of its input channels on calibration text (rounding weights);
    ``cache``: weights already rounded ((layer, bits, block) -> blocks, from
    ``export/mixed.py``), used where they exist. Returns ``proto``, rewritten in place."""
    cache = {} if cache is None else cache
    tied = any(n.op_type == "Gemm" and n.input[1] == EMBED for n in proto.graph.node)
    _head_as_matmul(proto)
    head: Blocks | None = None   # the tied LM head's blocks: the embedding's, where 8-bit
    owner = {t.name: g for g in graphs(proto.graph) for t in g.initializer}
    used = [i for g in graphs(proto.graph) for n in g.node for i in n.input]
    dropped: set[str] = set()
    for g in graphs(proto.graph):
        for at, node in enumerate(g.node):
            weight = node.input[1] if node.op_type == "MatMul" else ""
            if weight not in owner or not weight.endswith(".weight_t") or weight.endswith(
                    KEEP_FLOAT):
                continue
            stem = weight.rsplit(".weight_t", 1)[0]
            parts = parts_of(stem)
            bits = max(spec.layer_bits(p) for p in parts)
            block = min(spec.layer_block(p) for p in parts)
            home = owner[weight]
            (table,) = [t for t in home.initializer if t.name == weight]
            w = numpy_helper.to_array(table).T                      # [N, K]
            imp = None if importance is None else importance.get(parts[0])
            keys = [(p, bits, block) for p in parts]
            q = (concat([cache[k] for k in keys]) if all(k in cache for k in keys)
                 else quantize(w, bits, block, spec.symmetric, imp))
            if q.q.shape[0] != w.shape[0]:
                raise ExportError(f"{stem}: cached weights have {q.q.shape[0]} rows, the graph "
                                  f"{w.shape[0]}", "report it with the checkpoint config")
            packed, scales, zero = q.matmulnbits()
            inputs = [node.input[0], f"{weight}_Q{bits}", f"{weight}_scales"]
            if weight == LM_HEAD_WEIGHT and tied:
                head = q
            home.initializer.extend([numpy_helper.from_array(packed, inputs[1]),
                                     numpy_helper.from_array(scales, inputs[2])])
            if zero is not None:
                inputs.append(f"{weight}_zero_points")
                home.initializer.append(numpy_helper.from_array(zero, inputs[3]))
            g.node[at].CopyFrom(helper.make_node(
                "MatMulNBits", inputs, list(node.output), name=node.name,
                domain="com.microsoft", K=w.shape[1], N=w.shape[0], bits=bits,
                block_size=block, accuracy_level=spec.accuracy_level))
            if used.count(weight) == 1:
                dropped.add(weight)
    if spec.embeddings == f"int{EMBED_BITS}":
        _quantize_embedding(proto, spec, head)
    for g in graphs(proto.graph):
        keep = [t for t in g.initializer if t.name not in dropped]
        del g.initializer[:]
        g.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    weights = {t.name for g in graphs(proto.graph) for t in g.initializer}
    left = [n.input[1] for g in graphs(proto.graph) for n in g.node
            if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights
            and not n.input[1].endswith(KEEP_FLOAT)]
    if left:
        raise ExportError(f"weight {left[0]!r} was not quantized",
                          "report it with the checkpoint config")
    return proto


def embedding_block(hidden: int, spec: QuantSpec) -> int | None:
    """The block size of an 8-bit embedding table of ``hidden`` columns: the export's own,
    halved until it divides ``hidden`` (the lookup's rows must be whole blocks); None where
    none of ``MIN_BLOCK_SIZE`` or more does (the table stays float)."""
    block = spec.block_size
    while hidden % block and block > MIN_BLOCK_SIZE:
        block //= 2
    return None if hidden % block else block


def embeddings_of(hidden: int, spec: QuantSpec) -> str:
    """What ``spec`` stores the embedding table as, for a model of ``hidden`` size: the
    manifest's ``quantization.embeddings``."""
    return f"int{EMBED_BITS}" if embedding_block(hidden, spec) else "fp32"


def _quantize_embedding(proto: onnx.ModelProto, spec: QuantSpec,
                        head: Blocks | None) -> None:
    """Replace the embedding ``Gather`` by ``GatherBlockQuantized`` over the table as 8-bit
    blocks: the tied LM head's own blocks (``head``) where they are 8-bit blocks that divide
    the hidden size, else the table quantized here. The data keeps ``MatMulNBits``' layout
    [V, blocks, block], each block one quantization block along the last axis, so scales
    and zero points are [V, blocks, 1] and the lookup's [B, S, blocks, block] is reshaped to
    [B, S, H]. The lookup has its own copy of the data, not the head's initializer: ONNX
    Runtime frees a weight its kernel packed only where no other node reads it, and kept for
    the lookup the head's 136 MB would stay resident beside its packed copy (Qwen2.5-0.5B
    shape: 1.14 against 1.01 GB after a 4 x 300-token prefill), where the lookup's own table
    is paged in row by row as tokens use it."""
    graph = proto.graph
    found = [i for i, n in enumerate(graph.node) if n.op_type == "Gather" and n.input[0] == EMBED]
    if not found:
        return
    (at,) = found
    gather = graph.node[at]
    index = {t.name: i for i, t in enumerate(graph.initializer)}
    table = numpy_helper.to_array(graph.initializer[index[EMBED]])          # [V, H]
    if head is not None and head.bits == EMBED_BITS and table.shape[1] % head.block == 0:
        blocks = head
    else:
        block = embedding_block(table.shape[1], spec)
        if block is None:
            return
        blocks = quantize(table, EMBED_BITS, block, spec.symmetric, None)
    inputs = [f"{EMBED}_Q{EMBED_BITS}", gather.input[1], f"{EMBED}_scales"]
    graph.initializer.extend([
        numpy_helper.from_array(blocks.matmulnbits()[0], inputs[0]),
        numpy_helper.from_array(np.ascontiguousarray(blocks.scale[..., None], np.float32),
                                inputs[2])])
    if blocks.zero is not None:
        inputs.append(f"{EMBED}_zero_points")
        graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(blocks.zero[..., None], np.uint8), inputs[3]))
    graph.initializer.append(numpy_helper.from_array(
        np.array([0, 0, table.shape[1]], np.int64), f"{EMBED}_shape"))
    rows = f"{gather.output[0]}_blocks"
    lookup = helper.make_node("GatherBlockQuantized", inputs, [rows], name=gather.name,
                              domain="com.microsoft", gather_axis=0, quantize_axis=2,
                              block_size=blocks.block, bits=EMBED_BITS)
    flat = helper.make_node("Reshape", [rows, f"{EMBED}_shape"], list(gather.output),
                            name=f"{gather.name}_rows")
    graph.node[at].CopyFrom(lookup)
    graph.node.insert(at + 1, flat)
    if EMBED not in {i for g in graphs(graph) for n in g.node for i in n.input}:
        del graph.initializer[index[EMBED]]


def _head_as_matmul(proto: onnx.ModelProto) -> str:
    """Turn the LM head's ``Gemm(x, W[V, H], transB=1)`` into ``MatMul(x, W^T)`` on its own
    [H, V] initializer (the quantizer only takes ``MatMul``); returns the node's name."""
    graph = proto.graph
    (at,) = [i for i, n in enumerate(graph.node) if n.op_type == "Gemm"]
    gemm = graph.node[at]
    index = {t.name: i for i, t in enumerate(graph.initializer)}
    if gemm.input[1] not in index:
        raise ExportError("the LM head has no weight initializer", "report it")
    table = graph.initializer[index[gemm.input[1]]]
    weight = np.ascontiguousarray(numpy_helper.to_array(table).T)
    graph.initializer.append(numpy_helper.from_array(weight, LM_HEAD_WEIGHT))
    node = helper.make_node("MatMul", [gemm.input[0], LM_HEAD_WEIGHT], list(gemm.output),
                            name=gemm.name)
    graph.node[at].CopyFrom(node)
    if table.name not in {i for n in graph.node for i in n.input}:
        del graph.initializer[index[table.name]]  # an untied head: its [V, H] original
    return node.name


def graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every subgraph under it (the ``If`` branches)."""
    out = [graph]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                out += graphs(attr.g)
            out += [g for sub in attr.graphs for g in graphs(sub)]
    return out


def dequantized_weights(proto: onnx.ModelProto
                        ) -> Iterator[tuple[str, npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
    """The weights the ``MatMulNBits`` nodes of ``proto`` multiply by: per node the module
    name (``layers.0.self_attn.q_proj``, ``lm_head``), the float32 ``[out, in]`` weight and
    its quantization step per element (one at a time: they are float32 again)."""
    inits = {t.name: t for g in graphs(proto.graph) for t in g.initializer}
    for g in graphs(proto.graph):
        for node in g.node:
            if node.op_type != "MatMulNBits":
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            packed, scales = (numpy_helper.to_array(inits[i]) for i in node.input[1:3])
            zero = (numpy_helper.to_array(inits[node.input[3]])
                    if len(node.input) > 3 and node.input[3] else None)
            n, k, block = attrs["N"], attrs["K"], attrs["block_size"]
            yield (node.input[1].rsplit(".weight_t", 1)[0],
                   dequantize(packed, scales, attrs["bits"], k, n, block, zero),
                   np.repeat(scales.reshape(n, -1), block, axis=1)[:, :k])


def dequantize(packed: npt.NDArray[np.uint8], scales: npt.NDArray[np.float32], bits: int,
               k: int, n: int, block: int, zero: npt.NDArray[np.uint8] | None = None
               ) -> npt.NDArray[np.float32]:
    """``MatMulNBits`` weights -> float32 ``[N, K]``.

    Layout: ``packed`` [N, K/block, block*bits/8] uint8, 4-bit values two to a byte, low
    nibble first; ``scales`` [N, K/block]; ``zero`` uint8 [N * ceil(K/block * bits/8)]
    (4-bit: two to a byte, each row padded to whole bytes), or None: 2^(bits-1).
    """
    q = packed.reshape(n, -1)
    if bits == 4:
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(n, -1)
    blocks = scales.reshape(n, -1).shape[1]
    if zero is None:
        z = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    else:
        zq = zero.reshape(n, -1)
        if bits == 4:
            zq = np.stack([zq & 0x0F, zq >> 4], axis=-1).reshape(n, -1)
        z = zq[:, :blocks].astype(np.float32)
    w = (q[:, :blocks * block].astype(np.float32).reshape(n, blocks, block) - z[..., None])
    return (w * scales.reshape(n, blocks, 1)).reshape(n, -1)[:, :k]


def quantized_model(model: RungForCausalLM, proto: onnx.ModelProto) -> RungForCausalLM:
    """A copy of ``model`` holding the weights of the quantized graph ``proto``: the model
    the graph computes, up to the kernels' own rounding. A tied LM head is untied first:
    the graph's LM head and embedding table are each their own rounding (the same blocks
    where they share them), and an embedding table the graph keeps float stays the
    model's.

    Every quantized weight is checked against the model's own (``_check_rounded``).

    Raises:
        ExportError: a quantized weight is not the model's weight rounded.
    """
    ref = copy.deepcopy(model)
    if ref.cfg.tie_word_embeddings:
        ref.lm_head.weight = torch.nn.Parameter(ref.lm_head.weight.detach().clone())
    with torch.no_grad():
        for name, linear, weight, _ in dequantized_linears(proto, ref):
            _check_rounded(name, linear.weight.numpy(), weight)
            linear.weight.copy_(torch.from_numpy(weight))
        table = dequantized_embedding(proto)
        if table is not None:
            embed = ref.model.embed_tokens
            _check_rounded("embed_tokens", embed.weight.numpy(), table)
            embed.weight = torch.nn.Parameter(torch.from_numpy(table))
    return ref.eval()


def dequantized_embedding(proto: onnx.ModelProto) -> npt.NDArray[np.float32] | None:
    """The embedding table [V, H] the graph's ``GatherBlockQuantized`` looks rows up in,
    as float32; None where the table is float. Its 8-bit data, scales and zero points are
    ``MatMulNBits``' layout with a trailing axis (``_quantize_embedding``)."""
    inits = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type != "GatherBlockQuantized":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs["bits"] != EMBED_BITS:
            raise ExportError(f"the embedding lookup has {attrs['bits']}-bit data, rung "
                              f"writes {EMBED_BITS}", "re-export the engine")
        data, scales = (numpy_helper.to_array(inits[i]) for i in (node.input[0], node.input[2]))
        zero = (numpy_helper.to_array(inits[node.input[3]]).reshape(-1)
                if len(node.input) > 3 and node.input[3] else None)
        n, blocks, block = data.shape
        return dequantize(data, scales.reshape(-1), EMBED_BITS, blocks * block, n, block, zero)
    return None


def dequantized_linears(proto: onnx.ModelProto, model: torch.nn.Module
                        ) -> Iterator[tuple[str, torch.nn.Linear, npt.NDArray[np.float32],
                                            npt.NDArray[np.float32]]]:
    """``dequantized_weights`` matched to the linear layers of ``model`` (ours or a
    transformers model: both have ``.model.layers...`` and ``.lm_head``): per layer its name,
    the module, its dequantized weight and step. The fused graph's packed weights
    (``qkv_proj``, ``gate_up_proj``) are split back into their layers by output rows."""
    for name, weight, step in dequantized_weights(proto):
        parent, _, leaf = name.rpartition(".")
        if leaf in PACKED:
            names = [f"{parent}.{part}" for part in PACKED[leaf]]
            linears = [_linear(model, f"model.{n}") for n in names]
            cuts = np.cumsum([m.weight.shape[0] for m in linears])[:-1]
            for n, m, w, st in zip(names, linears, np.split(weight, cuts),
                                   np.split(step, cuts), strict=True):
                yield n, m, np.ascontiguousarray(w), np.ascontiguousarray(st)
        else:
            yield name, _linear(model, "lm_head" if name == "lm_head"
                                else f"model.{name}"), weight, step


def _linear(model: torch.nn.Module, path: str) -> torch.nn.Linear:
    found = model.get_submodule(path)
    assert isinstance(found, torch.nn.Linear)
    return found


def _check_rounded(name: str, original: npt.NDArray[np.float32],
                   weight: npt.NDArray[np.float32]) -> None:
    """A weight in the wrong place (rows swapped, blocks shifted, a bad zero point) is as
    far from the original as another matrix: relative error ~1.4. Rounding at 4 bits stays
    near 0.1; single elements may move several steps where importance weighting lets a
    block clip an input channel that carries almost no signal, so the bound is on the
    whole matrix."""
    if original.shape != weight.shape:
        raise ExportError(f"the quantized {name} weight has shape {weight.shape}, the "
                          f"model's {original.shape}", "report it with the checkpoint config")
    rel = float(np.linalg.norm(weight - original) / max(float(np.linalg.norm(original)),
                                                         1e-30))
    if rel > MAX_REL_ERROR:
        raise ExportError(f"the quantized {name} weight is not the model's (relative error "
                          f"{rel:.3g})", "report it with the checkpoint config")


def count_ops(proto: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type, subgraphs included."""
    counts: dict[str, int] = {}
    for g in graphs(proto.graph):
        for n in g.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts
