"""The exported ONNX graph, rewritten for TensorRT's ONNX parser (in memory; weights stay in
the engine directory's data file and are read by the parser from there).

What TensorRT 10 parses differs from what ONNX Runtime runs in three places (onnx-tensorrt's
operator table, docs/operators.md):

- FP8 is a quantized type in TensorRT, reached only through QuantizeLinear and
  DequantizeLinear; ``Cast`` takes FP32/FP16/BF16/INT32/INT64/UINT8/BOOL. The graph already
  divides K and V by their per-token-per-head scale before its cast to FP8, so each such
  ``Cast`` becomes ``Cast`` to float32 + ``QuantizeLinear`` with a constant scale of 1.0 (the
  same bytes: both round to nearest even and saturate), and each cast back a
  ``DequantizeLinear`` with scale 1.0 in the target type. FP8 Q/DQ needs compute capability
  8.9 (the KV decision in trt_build.py).
- The two branches of an ``If`` must name their outputs differently: the FFN-skip branch's
  output gets a suffix. The condition is the scalar bool the parser turns into an
  ``IIfConditional`` (a build-time constant condition would inline one branch).
- The graph is declared at opset 20 when it is 21: the ops rung emits changed at 21 only by
  gaining int4 types (and Q/DQ by block quantization, unused here), and TensorRT 10.0's
  parser takes opsets 9 to 20 (JetPack 6 ships 10.3). ONNX Runtime itself has no opset-20
  ``Shape`` kernel for FP8 inputs, so the CPU comparison runs the rewrite at the graph's
  own opset (``prepare(..., opset=None)``); the declaration is the only difference.

Ops of other domains (``com.microsoft``: MatMulNBits of int8/int4 weights, the fused
graph's attention) have no TensorRT importer: the rewrite refuses them.

The rewritten graph computes exactly what the exported one does; the tests run both with
ONNX Runtime on the CPU and compare every output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from rung.engines.errors import ExportError

TRT_OPSET = 20
FP8 = TensorProto.FLOAT8E4M3FN
_ONE = {TensorProto.FLOAT: "rung_trt_one_f32", TensorProto.FLOAT16: "rung_trt_one_f16"}
_ZERO_FP8 = "rung_trt_zero_fp8"


def prepare(graph_path: Path, opset: int | None = TRT_OPSET) -> onnx.ModelProto:
    """Load ``graph_path`` without its weights and rewrite it for TensorRT, declaring at most
    ``opset`` (None: the graph's own).

    Raises:
        ExportError: the graph holds ops TensorRT cannot import.
    """
    proto = onnx.load(str(graph_path), load_external_data=False)
    foreign = sorted({n.domain for g in graphs(proto.graph) for n in g.node
                      if n.domain not in ("", "ai.onnx")})
    if foreign:
        raise ExportError(f"{graph_path}: TensorRT cannot import ops of {', '.join(foreign)} "
                          "(int8/int4 MatMulNBits weights or the fused attention graph)",
                          "export with --weights fp16 (or fp32) and --graph generic")
    used: set[str] = set()
    fp8 = {v.name for v in [*proto.graph.input, *proto.graph.output]
           if v.type.tensor_type.elem_type == FP8}
    for g in graphs(proto.graph):
        used |= fp8_casts_to_qdq(g, fp8)
    add_constants(proto.graph, used)
    for g in graphs(proto.graph):
        rename_branch_outputs(g)
    for imp in proto.opset_import:
        if opset is not None and imp.domain in ("", "ai.onnx") and imp.version > opset:
            imp.version = opset
    return proto


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph inside it (If branches, Loop bodies), outermost first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graphs(attr.g)
            for sub in attr.graphs:
                yield from graphs(sub)


def fp8_casts_to_qdq(graph: onnx.GraphProto, fp8: set[str]) -> set[str]:
    """Replace casts to and from FP8 in ``graph`` (``fp8``: names known to be FP8, grown in
    place); returns the names of the constants the new nodes read."""
    nodes, used = [], set()
    for n in graph.node:
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        if n.op_type == "Cast" and to == FP8:
            wide = f"{n.output[0]}_rung_f32"
            nodes.append(helper.make_node("Cast", [n.input[0]], [wide], name=f"{n.name}_f32",
                                          to=TensorProto.FLOAT))
            nodes.append(helper.make_node("QuantizeLinear", [wide, _ONE[TensorProto.FLOAT],
                                                             _ZERO_FP8],
                                          list(n.output), name=f"{n.name}_q"))
            used |= {_ONE[TensorProto.FLOAT], _ZERO_FP8}
            fp8.add(n.output[0])
        elif n.op_type == "Cast" and n.input[0] in fp8:
            if to not in _ONE:
                raise ExportError(f"cast from FP8 to type {to} in node {n.name!r} has no "
                                  "TensorRT form")
            nodes.append(helper.make_node("DequantizeLinear", [n.input[0], _ONE[to]],
                                          list(n.output), name=f"{n.name}_dq"))
            used.add(_ONE[to])
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    return used


def add_constants(graph: onnx.GraphProto, names: set[str]) -> None:
    """The scalar initializers the Q/DQ nodes read: 1.0 (float32, float16), FP8 zero."""
    make = {_ONE[TensorProto.FLOAT]: lambda: helper.make_tensor(
                _ONE[TensorProto.FLOAT], TensorProto.FLOAT, [], [1.0]),
            _ONE[TensorProto.FLOAT16]: lambda: helper.make_tensor(
                _ONE[TensorProto.FLOAT16], TensorProto.FLOAT16, [], [1.0]),
            _ZERO_FP8: lambda: helper.make_tensor(_ZERO_FP8, FP8, [], b"\x00", raw=True)}
    graph.initializer.extend(make[name]() for name in sorted(names))


def rename_branch_outputs(graph: onnx.GraphProto) -> None:
    """Give the then-branch of every ``If`` in ``graph`` output names of its own."""
    for node in graph.node:
        if node.op_type != "If":
            continue
        branches = {a.name: a.g for a in node.attribute}
        then, other = branches["then_branch"], branches["else_branch"]
        for out, twin in zip(then.output, other.output, strict=True):
            if out.name == twin.name:
                _rename_output(then, out.name, f"{out.name}_then")


def _rename_output(graph: onnx.GraphProto, old: str, new: str) -> None:
    if not any(old in n.output for n in graph.node):
        # the branch hands an outer tensor through: name it inside the branch
        graph.node.append(helper.make_node("Identity", [old], [new], name=f"{new}_identity"))
    else:
        for n in graph.node:
            n.output[:] = [new if name == old else name for name in n.output]
            n.input[:] = [new if name == old else name for name in n.input]
    for out in graph.output:
        if out.name == old:
            out.name = new
