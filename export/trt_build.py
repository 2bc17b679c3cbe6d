"""``rung export --target trt``: a TensorRT plan built from the exported ONNX graph, on the GPU
that will serve it.

Order: refuse what TensorRT cannot run (int8/int4 ``MatMulNBits`` weights, the fused
graph), ask the GPU for its compute capability and decide the KV dtype (FP8 needs 8.9:
Ada, Hopper, Blackwell, Jetson Thor; Jetson Orin is 8.7; ``--kv auto``, the default, takes
fp8 there and fp16 below, export/defaults.py), export and verify the ONNX engine
as ``--target onnx`` does, then build the plan from it: the graph rewritten for TensorRT's
parser (trt_graph.py), a strongly typed network (precision is the graph's own: fp16 weights
give an fp16 plan; TensorRT 10.12 deprecated the FP16 builder flag and weak typing, 11
removed them), two optimization profiles (``decode``: one new token per row; ``prefill``:
up to a chunk), the plan checked against ONNX Runtime on the CPU and recorded in the
manifest. Without TensorRT or a GPU the ONNX engine is still written, and the error says so.

The decisions and profiles are pure functions, tested everywhere; ``build_plan`` and
``measure_parity`` are untested without a GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rung.engines import AnyEngine, gpu
from rung.engines.errors import EngineError, ExportError
from rung.engines.manifest import (
    FORMAT_VERSION,
    KV_LAYOUT,
    Manifest,
    TensorSpec,
    TrtPlan,
    load_manifest,
    sha256_file,
    xxh3_file,
)
from rung.engines.progress import step
from rung.export.exporter import ExportOptions, export

PLAN_FILE = "model.plan"
PLAN_WEIGHTS = ("fp16", "fp32")       # TensorRT imports neither MatMulNBits nor its layout
FP8_CC = (8, 9)                       # FP8 Q/DQ in TensorRT: Ada, Hopper and newer
KV_FALLBACKS = ("refuse", "fp16")


@dataclass(frozen=True)
class TrtBuildOptions:
    """``max_batch``: most rows of a cache (engine.max_batch must not exceed it);
    ``prefill_chunk``: most new tokens per call (longer prompts run in chunks, the
    activations are sized for it); ``kv_fallback``: on a GPU without FP8, ``refuse`` --kv fp8
    or export ``fp16`` KV instead; ``workspace_mb``: TensorRT's workspace limit (None: its
    default, the GPU's memory)."""

    max_batch: int = 4
    prefill_chunk: int = 256
    kv_fallback: str = "refuse"
    workspace_mb: int | None = None
    device: int = 0


@dataclass(frozen=True)
class KVDecision:
    kv: str       # the --kv the ONNX graph is exported with: fp32 | fp16 | fp8
    reason: str   # recorded in the manifest (TrtPlan.kv_reason)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    cc: tuple[int, int]
    tensorrt_version: str


def decide_kv(requested: str, cc: tuple[int, int], fallback: str = "refuse",
              device: str = "this GPU") -> KVDecision:
    """The KV dtype of a plan for a GPU of compute capability ``cc``.

    Raises:
        ExportError: fp8 asked for on a GPU below 8.9 without ``fallback`` fp16.
    """
    if fallback not in KV_FALLBACKS:
        raise ExportError(f"--trt-kv-fallback {fallback} is not available",
                          f"choose one of {', '.join(KV_FALLBACKS)}")
    have = f"{cc[0]}.{cc[1]}"
    if requested != "fp8":
        return KVDecision(requested, f"--kv {requested} as asked")
    if tuple(cc) >= FP8_CC:
        return KVDecision("fp8", f"{device} (compute capability {have}) runs FP8: fp8 KV")
    if fallback == "fp16":
        return KVDecision("fp16", f"{device} (compute capability {have}) has no FP8, which "
                          "needs 8.9 or newer: fp16 KV (--trt-kv-fallback fp16)")
    raise ExportError(f"--kv fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, "
                      f"Blackwell, Jetson Thor); {device} is {have}",
                      "export with --kv fp16, or add --trt-kv-fallback fp16")


def plan_weights(weights: str) -> str:
    """The weight precision of a plan (``fp16`` or ``fp32``).

    Raises:
        ExportError: int8/int4, which are ONNX Runtime's ``com.microsoft`` MatMulNBits: no
            TensorRT importer exists (TensorRT quantizes weights through Q/DQ nodes instead).
    """
    if weights not in PLAN_WEIGHTS:
        raise ExportError(f"--weights {weights} is not available with --target trt: it is ONNX "
                          "Runtime's MatMulNBits, which TensorRT cannot import",
                          "use --weights fp16 for TensorRT, or serve int8/int4 with "
                          "--target onnx (ONNX Runtime, CPU or CUDA)")
    return weights


def dim_ranges(max_seq: int, max_batch: int, chunk: int) -> dict[str, dict[str, list[int]]]:
    """Profile name -> the graph's dynamic dims (B rows, S new tokens, K scored positions, P
    past positions) -> [min, opt, max]. Profile order is plan order."""
    return {
        "decode": {"B": [1, 1, max_batch], "S": [1, 1, 1], "K": [1, 1, 1],
                   "P": [1, max(1, max_seq // 2), max_seq]},
        "prefill": {"B": [1, 1, max_batch], "S": [1, chunk, chunk], "K": [1, 1, chunk],
                    "P": [1, 1, max_seq]},
    }


def profile_shapes(inputs: list[TensorSpec], max_seq: int, max_batch: int,
                   chunk: int) -> dict[str, dict[str, list[list[int]]]]:
    """Profile name -> input with a dynamic dim -> [min, opt, max] shapes.

    Raises:
        ExportError: a bad batch or chunk, or an input dim this table does not know.
    """
    if max_batch < 1 or not 1 <= chunk <= max_seq:
        raise ExportError(f"--trt-max-batch {max_batch} / --trt-chunk {chunk} out of range",
                          f"give a batch >= 1 and a chunk in 1..{max_seq} (max_seq)")
    out: dict[str, dict[str, list[list[int]]]] = {}
    for profile, dims in dim_ranges(max_seq, max_batch, chunk).items():
        shapes = {}
        for spec in inputs:
            if all(isinstance(d, int) for d in spec.shape):
                continue  # static (ffn_allow_skip: a scalar)
            unknown = [d for d in spec.shape if isinstance(d, str) and d not in dims]
            if unknown:
                raise ExportError(f"input {spec.name} has dim {unknown[0]!r}, which the "
                                  "TensorRT profiles do not know", "re-export the engine")
            shapes[spec.name] = [[dims[d][i] if isinstance(d, str) else d for d in spec.shape]
                                 for i in range(3)]
        out[profile] = shapes
    return out


def probe(device: int = 0) -> GpuInfo:
    """TensorRT's version and the GPU's name and compute capability.

    Raises:
        ExportError: tensorrt or cuda-python missing, TensorRT older than 10, no GPU.
    """
    try:
        import tensorrt as trt
    except ImportError as e:
        raise ExportError("--target trt needs the tensorrt Python package (TensorRT 10), "
                          "which is not installed", gpu.INSTALL_HINT) from e
    if int(trt.__version__.split(".")[0]) < 10:
        raise ExportError(f"TensorRT {trt.__version__} is too old for rung (10.x needed)",
                          gpu.INSTALL_HINT)
    try:
        name, cc = gpu.device_info(device)
    except EngineError as e:
        raise ExportError(f"--target trt builds on the GPU that will serve: {e.message}",
                          e.hint) from e
    return GpuInfo(name, cc, trt.__version__)


def generic_graph(opts: ExportOptions) -> ExportOptions:
    """The generic graph: TensorRT imports only standard ONNX ops, and the fused graph uses
    ONNX Runtime's ``com.microsoft`` attention (where this exporter has a ``graph``
    option; without one every graph is generic)."""
    form = getattr(opts, "graph", None)
    if form is None:
        return opts
    if form == "fused":
        raise ExportError("--graph fused uses ONNX Runtime's own attention ops, which TensorRT "
                          "cannot import", "drop --graph (or give generic) with --target trt")
    return dataclasses.replace(opts, graph="generic")


def export_trt(hf_dir: Path, out_dir: Path, opts: ExportOptions,
               topts: TrtBuildOptions) -> Manifest:
    """``rung export --target trt``: the ONNX engine, then its TensorRT plan.

    Raises:
        CheckpointError, ExportError: as ``export``; TensorRT or the GPU missing (after the
            ONNX engine is written, which the message says), the plan refused or failing.
    """
    opts = generic_graph(dataclasses.replace(opts, weights=plan_weights(opts.weights or "fp16"),
                                             max_batch=topts.max_batch))
    try:
        info = probe(topts.device)
    except ExportError as e:
        export(hf_dir, out_dir, opts)  # the ONNX engine serves on its own (CPU, ORT CUDA)
        raise ExportError(f"{e.message}; the ONNX engine in {out_dir} is complete and serves "
                          "with engine.backend onnx", e.hint) from e
    if opts.kv == "auto":   # fp8 from 8.9 (the plan reads it in place), else fp16
        manifest = export(hf_dir, out_dir, dataclasses.replace(opts, trt_cc=info.cc))
        return build_plan(Path(out_dir), manifest, topts, info, opts.kv,
                          manifest.kv.reason or "--kv auto")
    decision = decide_kv(opts.kv, info.cc, topts.kv_fallback, info.name)
    manifest = export(hf_dir, out_dir, dataclasses.replace(opts, kv=decision.kv,
                                                           kv_reason=decision.reason))
    return build_plan(Path(out_dir), manifest, topts, info, opts.kv, decision.reason)


def build_plan(engine_dir: Path, manifest: Manifest, topts: TrtBuildOptions, info: GpuInfo,
               kv_requested: str, kv_reason: str) -> Manifest:
    """Build ``model.plan`` from the engine's graph, check it and record it in the manifest.
    Untested without a GPU."""
    if manifest.kv.layout != KV_LAYOUT:
        raise ExportError(f"{engine_dir}: TensorRT needs the generic graph ({KV_LAYOUT} KV), "
                          f"this one is {manifest.kv.layout}", "re-export with --graph generic")
    weights = plan_weights(manifest.weights)
    chunk = min(topts.prefill_chunk, manifest.dims.max_seq)
    shapes = profile_shapes(manifest.inputs, manifest.dims.max_seq, topts.max_batch, chunk)
    with step(f"building the TensorRT {info.tensorrt_version} plan on {info.name} "
              f"({weights} weights, {manifest.kv.dtype} KV, batch <= {topts.max_batch}, "
              f"chunk {chunk})"):
        plan = serialize_plan(engine_dir / manifest.graph_file, shapes, topts.workspace_mb)
    tmp = engine_dir / f"{PLAN_FILE}.tmp"
    tmp.write_bytes(plan)
    tmp.replace(engine_dir / PLAN_FILE)
    record = TrtPlan(
        plan_file=PLAN_FILE, tensorrt_version=info.tensorrt_version,
        compute_capability=f"{info.cc[0]}.{info.cc[1]}", device_name=info.name,
        weights=weights, kv_requested=kv_requested, kv_reason=kv_reason,
        max_batch=topts.max_batch, prefill_chunk=chunk, profiles=shapes)
    manifest = dataclasses.replace(
        manifest, format_version=FORMAT_VERSION, trt=record,
        artifacts={**manifest.artifacts, PLAN_FILE: sha256_file(engine_dir / PLAN_FILE)},
        xxh3={**manifest.xxh3, PLAN_FILE: xxh3_file(engine_dir / PLAN_FILE)})
    manifest.save(engine_dir)
    with step("checking the plan against ONNX Runtime on the CPU"):
        parity = measure_parity(engine_dir)
    manifest = dataclasses.replace(manifest, trt=dataclasses.replace(record, parity=parity))
    manifest.save(engine_dir)
    return manifest


def serialize_plan(graph_path: Path, shapes: dict[str, dict[str, list[list[int]]]],
                   workspace_mb: int | None) -> bytes:
    """TensorRT's serialized plan of the rewritten graph. Untested without a GPU."""
    from rung.engines.trt_engine import import_tensorrt
    from rung.export.trt_graph import prepare

    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    # the path lets the parser find the weights in the engine dir's external data file
    if not parser.parse(prepare(graph_path).SerializeToString(), str(graph_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT's ONNX parser refused {graph_path}: {errors}",
                          "report it with the engine's manifest.json and TensorRT version")
    config = builder.create_builder_config()
    if workspace_mb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    for inputs in shapes.values():
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in inputs.items():
            profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError("TensorRT could not build the plan (its log above says why)",
                          "try a smaller --trt-chunk or --trt-max-batch")
    return bytes(serialized)


def measure_parity(engine_dir: Path, prompt: int = 32, steps: int = 8) -> dict[str, Any]:
    """The plan's logits against ONNX Runtime on the CPU over the same random tokens: one
    prefill (every position scored) and ``steps`` decode steps. Untested without a GPU."""
    from rung.engines.onnx_engine import OnnxEngine
    from rung.engines.trt_engine import TrtEngine

    m = load_manifest(engine_dir)
    prompt = min(prompt, m.dims.max_seq // 2)
    ids = np.random.default_rng(0).integers(0, m.dims.vocab_size, (1, prompt + steps))
    runs = []
    engines: list[AnyEngine] = [OnnxEngine(engine_dir, m), TrtEngine(engine_dir, m)]
    for engine in engines:  # each with its own kind of cache
        cache = engine.new_cache(1)
        logits = [engine.forward(cache, ids[:, :prompt], np.array([prompt]),
                                 np.arange(prompt)[None])[0]]
        for t in range(prompt, prompt + steps):
            logits.append(engine.forward(cache, ids[:, t:t + 1], np.ones(1, np.int64))[0])
        runs.append(np.concatenate(logits))
    ref, got = runs
    diff = float(np.abs(ref - got).max())
    return {"positions": int(len(ref)), "max_abs_logit_diff": diff,
            "max_rel_logit_diff": diff / max(float(np.abs(ref).max()), 1e-9),
            "argmax_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean())}
