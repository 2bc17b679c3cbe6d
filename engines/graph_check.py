"""The manifest checked against the graph it describes, when an engine loads.

The manifest's dimensions size everything the runtime builds around the graph: the KV
buffers (layers, KV heads, head dim, max_seq, dtype, layout), the grammar masks (vocab size),
the tensors fed and fetched. A manifest that disagrees with its graph (edited by hand, or
copied beside another engine's files: ``manifest.json`` is not among its own checksummed
artifacts) would load and then fail every request or stall on mis-shaped buffers. So the
load compares it with what the graph itself declares and refuses a mismatch, naming the
manifest field, its value and the graph's.

What the graph declares: its inputs and outputs (names, element types, static dims) from
ONNX Runtime, and the shapes of two initializers read from ``model.onnx`` itself: the RoPE
table ``rope_cos`` ``[max_seq, *]`` and the embedding ``embed_tokens.weight`` ``[V, hidden]``
(an int8/int4 engine's ``embed_tokens.weight_Q8``, ``[V, blocks, block]``).
``onnx`` is an export-only dependency, so those shapes come from a small reader of the
protobuf wire format (the graph file holds no weights: they sit in the external data file).
A dimension the graph does not show (symbolic, or an initializer it lacks) is not checked.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rung.engines.errors import EngineError
from rung.engines.manifest import (
    ATTENTION_POSITIONS,
    HEAD_MAJOR,
    KV_LAYOUT,
    Manifest,
    TensorSpec,
)

HINT = "the engine directory is inconsistent: re-export the engine"
ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
             "tensor(float8e4m3fn)": "float8_e4m3fn", "tensor(int64)": "int64",
             "tensor(int32)": "int32", "tensor(bool)": "bool"}
# inputs only one graph form has (besides its KV), by ``kv.layout``
LAYOUT_INPUTS = {KV_LAYOUT: ("position_ids", "past_lengths"),
                 HEAD_MAJOR: ("seqlens_k", "query_seqlens", "total_sequence_length")}
KV_AXES = {KV_LAYOUT: (2, 3), HEAD_MAJOR: (1, 3)}   # (kv heads, head dim) in past_key_{i}
ROPE, EMBED = "rope_cos", "embed_tokens.weight"
EMBED_Q8 = "embed_tokens.weight_Q8"   # an int8/int4 engine's table: [V, blocks, block] codes
SCALE_LAYOUT = "per_token_per_head"   # the one the scale inputs past_key_{i}_scale carry

Dims = tuple[int | str | None, ...]   # a static dim, a symbolic name, or unnamed
_Refuse = Callable[[str, object, str], NoReturn]   # (manifest field, its value, the graph's)


@dataclass(frozen=True)
class GraphSignature:
    """What a graph declares: inputs and outputs as name -> (dtype, dims) in the manifest's
    dtype names, and initializer shapes by name (those the file holds)."""

    inputs: dict[str, tuple[str, Dims]]
    outputs: dict[str, tuple[str, Dims]]
    initializers: dict[str, tuple[int, ...]]


def session_signature(session: Any, graph_file: Path) -> GraphSignature:
    """The signature of an ``onnxruntime.InferenceSession`` over ``graph_file``."""
    def tensors(args: Sequence[Any]) -> dict[str, tuple[str, Dims]]:
        return {a.name: (ORT_TYPES.get(a.type, a.type), tuple(a.shape)) for a in args}
    return GraphSignature(tensors(session.get_inputs()), tensors(session.get_outputs()),
                          initializer_shapes(graph_file))


def check_manifest(m: Manifest, graph: GraphSignature, where: str) -> None:
    """Refuse a manifest that disagrees with ``graph``.

    Raises:
        EngineError: naming the manifest field, its value and the graph's, with the hint to
            re-export the engine.
    """
    def refuse(name: str, value: object, graph_says: str) -> NoReturn:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise EngineError(f"{where}: manifest {name} is {shown}, but {graph_says}", HINT)

    _check_kv(m, graph, where, refuse)
    _check_step(m, graph, refuse)
    for kind, specs, tensors in (("inputs", m.inputs, graph.inputs),
                                 ("outputs", m.outputs, graph.outputs)):
        _check_tensors(kind, specs, tensors, refuse)
    d = m.dims
    logits = graph.outputs.get("logits", ("", ()))[1]
    if logits and isinstance(logits[-1], int) and logits[-1] != d.vocab_size:
        refuse("dims.vocab_size", d.vocab_size, f"the graph's logits have {logits[-1]} "
               f"entries per position (shape {_show(logits)})")
    layers = sum(bool(re.fullmatch(r"past_key_\d+", n)) for n in graph.inputs)
    if layers != d.num_layers:
        refuse("dims.num_layers", d.num_layers, f"the graph has KV inputs for {layers} layers")
    kv_dims = graph.inputs["past_key_0"][1]
    for name, value, axis in zip(("dims.num_kv_heads", "dims.head_dim"),
                                 (d.num_kv_heads, d.head_dim), KV_AXES[m.kv.layout],
                                 strict=True):
        if len(kv_dims) == 4 and isinstance(kv_dims[axis], int) and kv_dims[axis] != value:
            refuse(name, value, f"the graph's past_key_0 has {kv_dims[axis]} (axis {axis} "
                   f"of {_show(kv_dims)})")
    rope, embed = graph.initializers.get(ROPE), graph.initializers.get(EMBED)
    if rope and rope[0] != d.max_seq:
        refuse("dims.max_seq", d.max_seq, f"the graph's RoPE table {ROPE} has {rope[0]} "
               f"positions (shape {list(rope)})")
    if embed and len(embed) == 2 and embed[1] != d.hidden_size:
        refuse("dims.hidden_size", d.hidden_size, f"the graph's {EMBED} has {embed[1]} "
               f"columns (shape {list(embed)})")
    codes = graph.initializers.get(EMBED_Q8)
    if codes and len(codes) == 3 and codes[1] * codes[2] != d.hidden_size:
        refuse("dims.hidden_size", d.hidden_size, f"the graph's {EMBED_Q8} has "
               f"{codes[1] * codes[2]} columns (shape {list(codes)})")


def _check_kv(m: Manifest, graph: GraphSignature, where: str, refuse: _Refuse) -> None:
    """The KV layout, dtype and scales, from the graph's KV inputs."""
    kv = m.kv
    if kv.layout not in LAYOUT_INPUTS:
        refuse("kv.layout", kv.layout, f"this rung reads {' or '.join(LAYOUT_INPUTS)}")
    form = next((layout for layout, names in LAYOUT_INPUTS.items()
                 if all(n in graph.inputs for n in names)), None)
    if form != kv.layout:
        refuse("kv.layout", kv.layout, f"the graph's inputs are those of {form or 'neither'} "
               f"({', '.join(sorted(graph.inputs)[:6])}, ...)")
    if "past_key_0" not in graph.inputs:
        refuse("kv.layout", kv.layout, "the graph has no KV input past_key_0")
    got = graph.inputs["past_key_0"][0]
    if got != kv.dtype:
        raise EngineError(f"{where}: graph KV input is {_ort_name(got)}, manifest says "
                          f"{kv.dtype} (manifest field kv.dtype)", HINT)
    scaled = "past_key_0_scale" in graph.inputs
    if kv.scale_layout != (SCALE_LAYOUT if scaled else None):
        refuse("kv.scale_layout", kv.scale_layout, "the graph "
               f"{'has' if scaled else 'has no'} KV scale inputs (past_key_0_scale)")


def _check_step(m: Manifest, graph: GraphSignature, refuse: _Refuse) -> None:
    """The step plan: the graph form the KV layout implies, and whether single-token steps
    are widened (the graph then takes ``attention_positions``)."""
    form = "fused" if m.kv.layout == HEAD_MAJOR else "generic"
    if m.step.graph != form:
        refuse("step.graph", m.step.graph, f"the graph's KV layout {m.kv.layout} is the "
               f"{form} graph's")
    widened = ATTENTION_POSITIONS in graph.inputs
    if widened != (m.step.min_positions == 2):
        refuse("step.min_positions", m.step.min_positions, "the graph "
               f"{'takes' if widened else 'has no'} input {ATTENTION_POSITIONS}")


def _check_tensors(kind: str, specs: Sequence[TensorSpec],
                   tensors: dict[str, tuple[str, Dims]], refuse: _Refuse) -> None:
    """The manifest's list of graph inputs or outputs against the graph's own."""
    listed = [t.name for t in specs]
    for name in listed:
        if name not in tensors:
            refuse(f"{kind} entry", name, f"the graph has no {kind[:-1]} of that name")
    for name in tensors:
        if name not in listed:
            refuse(kind, listed, f"the graph's {kind[:-1]} {name!r} is not among them")
    for t in specs:
        dtype, dims = tensors[t.name]
        if t.dtype != dtype:
            refuse(f"{kind}[{t.name}].dtype", t.dtype, f"the graph's is {dtype}")
        static = [(a, b) for a, b in zip(t.shape, dims, strict=False)
                  if isinstance(a, int) and isinstance(b, int)]
        if len(t.shape) != len(dims) or any(a != b for a, b in static):
            refuse(f"{kind}[{t.name}].shape", t.shape, f"the graph's is {_show(dims)}")


def _show(dims: Dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _ort_name(dtype: str) -> str:
    return next((k for k, v in ORT_TYPES.items() if v == dtype), dtype)


# -- the protobuf wire format, just enough for initializer shapes ------------------------
# ModelProto.graph = 7; GraphProto.initializer = 5; TensorProto.dims = 1, .name = 8
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_DIMS, _TENSOR_NAME = 7, 5, 1, 8


def initializer_shapes(graph_file: Path) -> dict[str, tuple[int, ...]]:
    """Initializer name -> shape in an ONNX model file; {} where the file cannot be read
    this way (the checks that need it are then skipped: ONNX Runtime has loaded it)."""
    try:
        with open(graph_file, "rb") as f, mmap.mmap(f.fileno(), 0,
                                                    access=mmap.ACCESS_READ) as buf:
            out: dict[str, tuple[int, ...]] = {}
            for field, start, end in _fields(buf, 0, len(buf)):
                if field != _MODEL_GRAPH or start < 0:
                    continue
                for gfield, gstart, gend in _fields(buf, start, end):
                    if gfield == _GRAPH_INITIALIZER and gstart >= 0:
                        name, dims = _tensor_header(buf, gstart, gend)
                        out[name] = dims
            return out
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return {}


def _tensor_header(buf: Any, start: int, end: int) -> tuple[str, tuple[int, ...]]:
    name, dims = "", []
    for field, fstart, fend in _fields(buf, start, end, varints=True):
        if field == _TENSOR_NAME and fstart >= 0:
            name = bytes(buf[fstart:fend]).decode("utf-8")
        elif field == _TENSOR_DIMS and fstart >= 0:        # packed
            pos = fstart
            while pos < fend:
                value, pos = _varint(buf, pos)
                dims.append(value)
        elif field == _TENSOR_DIMS:                        # one unpacked varint
            dims.append(fend)
    return name, tuple(dims)


def _fields(buf: Any, start: int, end: int,
            varints: bool = False) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in ``buf[start:end]``; with
    ``varints`` also (field number, -1, value) of each varint field. Others are skipped."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            if varints:
                yield field, -1, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise ValueError("truncated field")
            yield field, pos, pos + size
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != end:
        raise ValueError("truncated message")


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
