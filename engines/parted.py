"""One decoder graph run as consecutive ONNX Runtime sessions, built in parallel.

Building a session is mostly weight packing (MatMulNBits' packed layouts, packed fp32
matrices), and ONNX Runtime packs on one core: the 0.5B int4 bench engine spends ~580 of
its ~610 ms of session creation there. It releases the GIL while it builds, so two sessions
over two halves of the graph build side by side (0.36-0.39 s against 0.63 s for the whole
graph here, docs/benchmarks/startup.md "Cold start"). A step then runs the parts one after the
other (~2 % of a 0.5B int4 step, see ``_part_options``): the first part's outputs that the
second reads (the residual stream at the cut) are handed over as ONNX Runtime values, and
each part reads and writes the KV buffers of its own layers in place.

The cut is made at load, on the graph as exported (no file written): the node where the
packed weights (the initializers of matmul nodes) are halved, moved a few nodes on to where
the fewest tensors cross. The types of the crossing tensors come from a probe session of
the whole graph with no packing and no optimization (~15 ms). Results are those of the
whole graph bit for bit where ONNX Runtime fuses the same nodes in each part as in the
whole (tests/engines/test_parted.py compares logits and KV).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from rung.engines.onnx_pb import ELEM_TYPES, ModelProto, tensor_value_info

# nodes whose weight initializers ONNX Runtime packs at load
PACKED_OPS = frozenset({"MatMulNBits", "MatMul", "Gemm", "FusedMatMul"})
# where the cut may move past the halving node, to find fewer crossing tensors
CUT_SLACK = 12
# ops whose outputs have the type of their first input: a crossing tensor's type is
# read back through them to a graph input or an initializer (else a probe session tells)
SAME_TYPE_OPS = frozenset({
    "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
    "SkipLayerNormalization", "LayerNormalization", "MatMulNBits", "MatMul", "FusedMatMul",
    "Gemm", "Add", "Sub", "Mul", "Div", "Sigmoid", "QuickGelu", "Softmax", "Reshape",
    "Transpose", "Split", "Concat", "Squeeze", "Unsqueeze", "Slice", "Identity", "Gather",
    "GroupQueryAttention"})
EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


def _bytes(t: Any) -> int:
    for e in t.external_data:
        if e.key == "length":
            return int(e.value)
    return len(t.raw_data)


def reads(node: Any) -> set[str]:
    """The tensors ``node`` reads: its inputs, and the outer-scope names its subgraphs
    (an ``If``'s branches) read."""
    got = {x for x in node.input if x}
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {o for n in sub.node for o in n.output} | {i.name for i in sub.initializer} \
                | {i.name for i in sub.input}
            got |= {x for n in sub.node for x in reads(n)} - inner
    return got


def _crossing(nodes: Sequence[Any], cut: int, made_at: Mapping[str, int]) -> list[str]:
    return sorted({x for n in nodes[cut:] for x in reads(n)
                   if x in made_at and made_at[x] < cut})


def find_cut(graph: Any) -> tuple[int, list[str]] | None:
    """The node index to cut ``graph`` before, and the tensors crossing it; None where the
    graph has no packed weights on both sides."""
    nodes = list(graph.node)
    inits = {i.name: i for i in graph.initializer}
    weights = [sum(_bytes(inits[x]) for x in reads(n) if x in inits)
               if n.op_type in PACKED_OPS else 0 for n in nodes]
    total = sum(weights)
    cut = int(np.searchsorted(np.cumsum(weights) * 2, total)) + 1   # just past the halving node
    made_at = {o: i for i, n in enumerate(nodes) for o in n.output}
    span = range(cut, min(cut + CUT_SLACK, len(nodes)))
    if not total or not span:
        return None
    best = min(span, key=lambda k: len(_crossing(nodes, k, made_at)))
    if not any(weights[:best]) or not any(weights[best:]):
        return None
    return best, _crossing(nodes, best, made_at)


class PartedSession:
    """The subset of ``InferenceSession`` the engine uses, over one or more parts run in
    order; ``carried[i]``: the tensors part i hands to the parts after it."""

    def __init__(self, parts: Sequence[ort.InferenceSession], carried: Sequence[Sequence[str]]):
        self.parts, self.carried = list(parts), [list(c) for c in carried]
        inner = {x for c in self.carried for x in c}
        seen: dict[str, Any] = {}
        for p in self.parts:
            for a in p.get_inputs():
                if a.name not in inner:
                    seen.setdefault(a.name, a)
        self._inputs = list(seen.values())
        self._outputs = [a for p in self.parts for a in p.get_outputs() if a.name not in inner]
        self._part_inputs = [{a.name for a in p.get_inputs()} for p in self.parts]
        self._part_outputs = [[a.name for a in p.get_outputs()] for p in self.parts]
        # per owner of KV buffers (a cache), its bindings: the arrays bound in place, the
        # outputs bound, each part's binding. Held weakly by the owner: a binding holds its
        # arrays, and a dropped cache must not stay alive through the session
        self._bindings: weakref.WeakKeyDictionary[
            object, tuple[list[np.ndarray], tuple[str, ...],
                          list[tuple[ort.IOBinding, int]]]] = weakref.WeakKeyDictionary()

    def get_inputs(self) -> list[Any]:
        return self._inputs

    def get_outputs(self) -> list[Any]:
        return self._outputs

    def get_providers(self) -> list[str]:
        providers: list[str] = self.parts[0].get_providers()
        return providers

    def get_session_options(self) -> ort.SessionOptions:
        return self.parts[0].get_session_options()

    def run(self, output_names: Sequence[str],
            feeds: Mapping[str, np.ndarray | ort.OrtValue]) -> list[np.ndarray]:
        """``InferenceSession.run`` over the parts."""
        if len(self.parts) == 1:
            outs: list[np.ndarray] = self.parts[0].run(list(output_names), dict(feeds))
            return outs
        wanted = set(output_names)
        values: dict[str, Any] = dict(feeds)
        for i, part in enumerate(self.parts):
            names = [n for n in self._part_outputs[i]
                     if n in wanted or n in self.carried[i]]
            outs = part.run(names, {k: v for k, v in values.items()
                                    if k in self._part_inputs[i]})
            values.update(zip(names, outs, strict=True))
        return [values[n] for n in output_names]

    def run_bound(self, inputs: Mapping[str, np.ndarray], kv: Mapping[str, np.ndarray],
                  output_names: Sequence[str], into: Mapping[str, np.ndarray] | None = None,
                  owner: object | None = None) -> dict[str, np.ndarray]:
        """A step with IO binding: ``inputs`` (host arrays) to every part that reads them,
        ``kv`` (``X`` -> the buffer read as ``past_X`` and written in place as
        ``present_X``) to the part that has them; ``into``: outputs written into these
        arrays (of the output's shape and type, C-contiguous; returned as they are), the
        other ``output_names`` allocated by ONNX Runtime; carried tensors stay ONNX Runtime
        values between parts.

        ``owner`` (weakly referenced; the cache the KV buffers belong to): its buffers stay
        bound from one step to the next while they are the same arrays and the same outputs
        are asked for (a small model's step spent ~0.2 ms of its ~1.5 ms wrapping and
        binding them again); without one they are bound for this step only. The bindings
        are the session's own: one step at a time (the daemon runs its engine on one
        thread)."""
        into = into or {}
        ios = self._bound(kv, (*into, "", *output_names), owner)
        carried: dict[str, ort.OrtValue] = {}
        got: dict[str, np.ndarray] = dict(into)
        wanted = set(output_names) - set(into)
        for i, (part, (io, n_in_place)) in enumerate(zip(self.parts, ios, strict=True)):
            has = self._part_inputs[i]
            for name, arr in inputs.items():
                if name in has:
                    io.bind_cpu_input(name, arr)
            for name, value in carried.items():
                if name in has:
                    io.bind_ortvalue_input(name, value)
            # bound again by name each step: an output left holding last step's value would
            # be taken as a buffer to reuse, of last step's shape
            for name, arr in into.items():
                if name in self._part_outputs[i]:
                    io.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
            bound = [n for n in self._part_outputs[i] if n in wanted or n in self.carried[i]]
            for name in bound:
                io.bind_output(name)
            part.run_with_iobinding(io)
            if not bound:
                continue
            outs = io.get_outputs()
            # get_outputs lists the outputs in binding order: in place, into, then the rest
            n_into = sum(name in self._part_outputs[i] for name in into)
            for name, value in zip(bound, outs[n_in_place + n_into:], strict=True):
                if name in self.carried[i]:
                    carried[name] = value
                else:
                    got[name] = value.numpy()
        return got

    def _bound(self, kv: Mapping[str, np.ndarray], outputs: tuple[str, ...],
               owner: object | None) -> list[tuple[ort.IOBinding, int]]:
        """Each part's IO binding with its KV buffers bound in place (and how many): the
        owner's from its last step while ``kv`` holds the same arrays and the same
        ``outputs`` are asked for (an output bound before and not now would still be
        written), else made anew."""
        arrays = list(kv.values())
        if owner is not None and owner in self._bindings:
            held, bound_outputs, ios = self._bindings[owner]
            if bound_outputs == outputs and len(held) == len(arrays) and all(
                    a is b for a, b in zip(held, arrays, strict=True)):
                return ios
        ios = []
        for i, part in enumerate(self.parts):
            io, n = part.io_binding(), 0
            for name, buf in kv.items():
                if f"past_{name}" in self._part_inputs[i]:
                    value = ort.OrtValue.ortvalue_from_numpy(buf)
                    io.bind_ortvalue_input(f"past_{name}", value)
                    io.bind_ortvalue_output(f"present_{name}", value)
                    n += 1
            ios.append((io, n))
        if owner is not None:
            self._bindings[owner] = (arrays, outputs, ios)
        return ios


def load(path: Path, make_options: Callable[[], ort.SessionOptions], providers: list[str],
         parts: int) -> PartedSession:
    """The graph at ``path`` as ``parts`` (1 or 2) sessions built at once; one where the
    graph cannot be cut (no packed weights on one side, a crossing tensor of another type)."""
    if parts > 1:
        graph = ModelProto.FromString(Path(path).read_bytes())
        cut = find_cut(graph.graph)
        types = (_traced(graph.graph, cut[1]) or _probe(graph, cut[1], path, providers)
                 if cut else None)
        if cut is not None and types is not None:
            pieces = _cut(graph, cut[0], cut[1], types)
            with ThreadPoolExecutor(len(pieces), thread_name_prefix="rung-load") as pool:
                sessions = list(pool.map(lambda b: ort.InferenceSession(
                    b, _part_options(make_options(), path), providers=providers), pieces))
            return PartedSession(sessions, [cut[1], []])
    return PartedSession([ort.InferenceSession(str(path), make_options(),
                                               providers=providers)], [[]])


def _part_options(options: ort.SessionOptions, path: Path) -> ort.SessionOptions:
    """A part's options: its weights beside ``path``, and its intra-op threads stop spinning
    when its run ends (the other part runs next: spinning workers would take its cores;
    0.5B int4, one step: 22.2-22.5 ms against 21.7-22.0 for the whole graph, 35 ms if the
    first part's workers spin on)."""
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return _external(options, path)


def _external(options: ort.SessionOptions, path: Path) -> ort.SessionOptions:
    """Options for a graph given as bytes whose weights lie beside ``path``."""
    options.add_session_config_entry(EXTERNAL_FOLDER, str(Path(path).resolve().parent))
    return options


def _traced(graph: Any, names: list[str]) -> dict[str, tuple[int, list[Any] | None]] | None:
    """The element type of each of ``names`` read back through ``SAME_TYPE_OPS`` (rank left
    unknown); None where one cannot be."""
    made = {o: n for n in graph.node                # attention's KV outputs have their own type
            for o in (n.output[:1] if n.op_type == "GroupQueryAttention" else n.output)}
    given = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    given.update((i.name, i.data_type) for i in graph.initializer)
    out: dict[str, tuple[int, list[Any] | None]] = {}
    for name in names:
        x = name
        while x not in given and x in made and made[x].op_type in SAME_TYPE_OPS:
            x = made[x].input[0]
        if given.get(x) not in ELEM_TYPES.values():
            return None
        out[name] = (given[x], None)
    return out


def _probe(model: Any, names: list[str], path: Path,
           providers: list[str]) -> dict[str, tuple[int, list[Any] | None]] | None:
    """ONNX type and shape of each of ``names``, from a session of the whole graph that
    neither packs nor optimizes; None where a type cannot cross a cut."""
    probe = ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(tensor_value_info(x) for x in names)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(probe.SerializeToString(), _external(so, path),
                                   providers=providers)
    found = {a.name: a for a in session.get_outputs()}
    if any(found[x].type not in ELEM_TYPES for x in names):
        return None
    return {x: (ELEM_TYPES[found[x].type], list(found[x].shape)) for x in names}


def _cut(model: Any, at: int, crossing: list[str],
         types: Mapping[str, tuple[int, list[Any] | None]]) -> list[bytes]:
    """The two parts' serialized graphs (weights stay external, by reference)."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}

    def typed(name: str) -> Any:
        elem, shape = types[name]
        return tensor_value_info(name, elem, shape)

    def part(nodes: list[Any], takes: list[str], gives: list[str]) -> bytes:
        used = {x for n in nodes for x in reads(n)}
        made = {o for n in nodes for o in n.output}
        piece = ModelProto()
        piece.CopyFrom(model)
        pg = piece.graph
        del pg.node[:], pg.initializer[:], pg.input[:], pg.output[:]
        pg.node.extend(nodes)
        pg.initializer.extend(inits[x] for x in sorted(used & inits.keys()))
        pg.input.extend([i for i in g.input if i.name in used] + [typed(x) for x in takes])
        pg.output.extend([o for o in g.output if o.name in made] + [typed(x) for x in gives])
        return bytes(piece.SerializeToString())

    return [part(list(g.node[:at]), [], crossing), part(list(g.node[at:]), crossing, [])]
