"""Weight-only quantization of the decoder graph: ``MatMul`` -> ``MatMulNBits`` (int8, int4).

The fp32 graph from ``rung.export.onnx_graph`` is rewritten by ONNX Runtime's own tool,
``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``: every linear
layer's weight becomes blocks of ``block_size`` input channels per output channel, each
block with one float32 scale (symmetric, no zero point), run by the ``com.microsoft``
``MatMulNBits`` contrib op that ONNX Runtime's CPU execution provider implements.

What stays float, and why:

- The embedding table (the ``Gather``): a step reads one row of it per token, so
  quantizing it would save memory but no time, and would need another op
  (``GatherBlockQuantized``).
- The FFN gate probes (``--ffn-skip``): one [hidden, 1] vector per layer whose sign decides
  whether an FFN runs; a rounding step there flips decisions for nothing saved.
- The LM head is quantized, by default at 8 bits (``LM_HEAD_BITS``): the vocabulary
  projection is the largest single weight (151,936 x 896 in Qwen2.5-0.5B, 28 % of the
  model) and the most sensitive one, since its error lands on the logits directly, with no
  norm after it. ``--lm-head-bits 4`` quantizes it like the layers (onnxruntime-genai's
  int4 default): a third less to read per int4 decode step, at a measured cost in the
  manifest's accuracy record. With tied embeddings it gets its own transposed copy, so the
  ``Gather`` keeps the float table.

The quantizer recurses into subgraphs: the FFN weights behind ``--ffn-skip``'s ``If``
branches are quantized like the others.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from rung.engines.errors import ExportError
from rung.export.model import RungForCausalLM
from rung.export.onnx_fused import PACKED

BITS = {"int8": 8, "int4": 4}
# The LM head at 8 bits for both precisions: see the module docstring.
LM_HEAD_BITS = {"int8": 8, "int4": 8}
DEFAULT_BLOCK_SIZE = 32
MIN_BLOCK_SIZE = 16  # MatMulNBits' smallest block
# MatMulNBits' accuracy_level 4: the CPU kernel quantizes the activations to int8 per block
# and runs integer dot products. On the Qwen2.5-0.5B-shaped bench model (2 threads, decode
# at 128 tokens of context) level 4 decodes at 31 (int8) and 42 (int4) tok/s, level 0
# (float activations) at 0.8 and 1.5 tok/s, slower than fp32 weights (12). Level 4 costs
# accuracy: the graph is then no longer bit-exact to its dequantized weights (verify.py's
# int tolerances), and on the trained demo model int8's mean KL against fp32 doubles
# (docs/benchmarks.md, "Quantized weights").
ACCURACY_LEVEL = 4
LM_HEAD_WEIGHT = "lm_head.weight_t"
# Weights left in float (suffixes of initializer names written by onnx_graph.linear)
KEEP_FLOAT = ("ffn_gate.proj.weight_t",)


@dataclass(frozen=True)
class QuantSpec:
    """How an engine's weights were quantized: the manifest's ``quantization`` record."""

    bits: int
    block_size: int
    lm_head_bits: int
    accuracy_level: int
    symmetric: bool = True
    method: str = "MatMulNBits"
    embeddings: str = "fp32"

    def to_manifest(self) -> dict[str, Any]:
        return {"method": self.method, "bits": self.bits, "block_size": self.block_size,
                "symmetric": self.symmetric, "accuracy_level": self.accuracy_level,
                "lm_head_bits": self.lm_head_bits, "embeddings": self.embeddings}


def quant_spec(weights: str, block_size: int | None,
               lm_head_bits: int | None = None) -> QuantSpec:
    """The settings for ``--weights int8|int4 [--block-size N]``.

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
                     accuracy_level=ACCURACY_LEVEL)


def quantize_graph(proto: onnx.ModelProto, spec: QuantSpec) -> onnx.ModelProto:
    """Replace the weight ``MatMul``s of ``proto`` (fp32, from ``build_graph``) by
    ``MatMulNBits``; returns the rewritten model (``proto`` itself is consumed)."""
    quantizer = _quantizer_class()
    head = _head_as_matmul(proto)
    keep = [n.name for g in graphs(proto.graph) for n in g.node
            if n.op_type == "MatMul" and n.input[1].endswith(KEEP_FLOAT)]
    # the quantizer logs every node it skips at INFO; the export's own progress is enough
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        passes = ([(spec.bits, [*keep, head])] if spec.bits != spec.lm_head_bits
                  else []) + [(spec.lm_head_bits, keep)]
        for bits, exclude in passes:
            # pass 1 (int4 only): the layers at 4 bits, the head excluded; pass 2: whatever
            # weight MatMul is left (the head, or everything for int8) at 8 bits
            q = quantizer(proto, bits=bits, block_size=spec.block_size,
                          is_symmetric=spec.symmetric, accuracy_level=spec.accuracy_level,
                          nodes_to_exclude=exclude)
            q.process()
            proto = q.model.model
    finally:
        quiet.setLevel(level)
    weights = {t.name for g in graphs(proto.graph) for t in g.initializer}
    left = [n.input[1] for g in graphs(proto.graph) for n in g.node
            if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights
            and not n.input[1].endswith(KEEP_FLOAT)]
    if left:
        raise ExportError(f"weight {left[0]!r} was not quantized",
                          "report it with the checkpoint config")
    return proto


def _quantizer_class() -> Any:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # its import runs logging.basicConfig(level=INFO): undo that on the root logger
    root.handlers[:] = handlers
    root.setLevel(level)
    return MatMulNBitsQuantizer


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


def dequantized_weights(
        proto: onnx.ModelProto) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
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
            n, k, block = attrs["N"], attrs["K"], attrs["block_size"]
            yield (node.input[1].rsplit(".weight_t", 1)[0],
                   dequantize(packed, scales, attrs["bits"], k, n, block),
                   np.repeat(scales.reshape(n, -1), block, axis=1)[:, :k])


def dequantize(packed: np.ndarray, scales: np.ndarray, bits: int, k: int, n: int,
               block: int) -> np.ndarray:
    """Symmetric ``MatMulNBits`` weights (no zero points) -> float32 ``[N, K]``.

    Layout: ``packed`` [N, K/block, block*bits/8] uint8, 4-bit values two to a byte, low
    nibble first; the implicit zero point is 2^(bits-1); ``scales`` [N, K/block].
    """
    q = packed.reshape(n, -1)
    if bits == 4:
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(n, -1)
    blocks = scales.reshape(n, -1).shape[1]
    w = (q[:, :blocks * block].astype(np.float32) - 2 ** (bits - 1)).reshape(n, blocks, block)
    return (w * scales.reshape(n, blocks, 1)).reshape(n, -1)[:, :k]


def quantized_model(model: RungForCausalLM, proto: onnx.ModelProto) -> RungForCausalLM:
    """A copy of ``model`` holding the weights of the quantized graph ``proto``: the model
    the graph computes, up to the kernels' own rounding. A tied LM head is untied first,
    since the graph's embedding table stays float.

    Every quantized weight is checked against the model's own, element by element: round
    to nearest is off by at most half a step, and by one step where the symmetric range
    clips (+2^(b-1) does not exist); anything more is a weight in the wrong place.

    Raises:
        ExportError: a quantized weight is not the model's weight rounded.
    """
    ref = copy.deepcopy(model)
    if ref.cfg.tie_word_embeddings:
        ref.lm_head.weight = torch.nn.Parameter(ref.lm_head.weight.detach().clone())
    with torch.no_grad():
        for name, linear, weight, step in dequantized_linears(proto, ref):
            _check_rounded(name, linear.weight.numpy(), weight, step)
            linear.weight.copy_(torch.from_numpy(weight))
    return ref.eval()


def dequantized_linears(proto: onnx.ModelProto, model: torch.nn.Module
                        ) -> Iterator[tuple[str, torch.nn.Linear, np.ndarray, np.ndarray]]:
    """``dequantized_weights`` matched to the linear layers of ``model`` (ours or a
    transformers model: both have ``.model.layers...`` and ``.lm_head``): per layer its name,
    the module, its dequantized weight and step. The fused graph's packed weights
    (``qkv_proj``, ``gate_up_proj``) are split back into their layers by output rows."""
    for name, weight, step in dequantized_weights(proto):
        parent, _, leaf = name.rpartition(".")
        if leaf in PACKED:
            names = [f"{parent}.{part}" for part in PACKED[leaf]]
            linears = [model.get_submodule(f"model.{n}") for n in names]
            cuts = np.cumsum([m.weight.shape[0] for m in linears])[:-1]
            for n, m, w, st in zip(names, linears, np.split(weight, cuts),
                                   np.split(step, cuts), strict=True):
                yield n, m, np.ascontiguousarray(w), np.ascontiguousarray(st)
        else:
            yield name, model.get_submodule("lm_head" if name == "lm_head"
                                            else f"model.{name}"), weight, step


def _check_rounded(name: str, original: np.ndarray, weight: np.ndarray,
                   step: np.ndarray) -> None:
    off = (float((np.abs(weight - original) / np.maximum(np.abs(step), 1e-30)).max())
           if original.shape == weight.shape else np.inf)
    if off > 1.001:
        raise ExportError(f"the quantized {name} weight is not the model's (off by "
                          f"{off:.3g} steps)", "report it with the checkpoint config")


def count_ops(proto: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type, subgraphs included."""
    counts: dict[str, int] = {}
    for g in graphs(proto.graph):
        for n in g.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts
