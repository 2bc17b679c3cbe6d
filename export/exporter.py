"""``rung export``: HF checkpoint or GGUF file -> our PyTorch model -> ONNX graph -> verified
engine dir.

The manifest is written last and only when verification passes (or was skipped on request,
``--no-verify``: the manifest then has no parity record): a directory with a manifest is a
complete engine. Verification has two parts, both on real text (``export/prompts.py``):
the graph against the PyTorch model it was built from (``export/verify.py``), and what the
lossy choices (int8/int4 weights, fp16/fp8 KV) cost against the fp32 model, refused above
``--quality-budget`` (mean next-token KL, nats) with the numbers and what to try.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx

from rung.engines.drafts import pads_steps
from rung.engines.errors import ExportError
from rung.engines.manifest import (
    FORMAT_VERSION,
    HEAD_MAJOR,
    KV_LAYOUT,
    MANIFEST_NAME,
    KVSpec,
    Manifest,
    ModelDims,
    StepPlan,
    artifact_digests,
)
from rung.engines.onnx_engine import OnnxEngine
from rung.engines.progress import step
from rung.engines.tokenizer import Tokenizer
from rung.export.adapter import merge, read_adapter
from rung.export.arch import ModelConfig
from rung.export.blockquant import Blocks
from rung.export.checkpoint import Checkpoint, load_checkpoint
from rung.export.defaults import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MEMORY_BUDGET_MB,
    CacheShape,
    KVChoice,
    auto_gates,
    choose_kv,
    fast_without_gates,
    flagged,
    ungated_cost,
    weight_bytes,
)
from rung.export.ffn_calibrate import calibrate
from rung.export.gguf import GGML_TYPES
from rung.export.mixed import LAYER_UNITS, choose, importance
from rung.export.model import RungForCausalLM
from rung.export.onnx_fused import FUSED_KV, build_fused_graph, fused_io_specs, fused_refusal
from rung.export.onnx_graph import OPSET, build_graph, io_specs
from rung.export.prompts import CALIBRATION, HELD_OUT, text_rows, text_stream
from rung.export.quantize import (
    BITS,
    QuantSpec,
    embeddings_of,
    quant_spec,
    quantize_graph,
    quantized_model,
)
from rung.export.verify import kv_accuracy, verify, weight_accuracy

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
RUNG_VERSION = "0.1.0"


@dataclass(frozen=True)
class ExportOptions:
    # fp32 | fp16 | int8 | int4; None: fp32 for a HF directory, a GGUF file's own precision
    # (a 4-bit GGUF becomes a 4-bit engine, its 6- and 8-bit matrices 8-bit ones)
    weights: str | None = None
    block_size: int | None = None  # int8/int4: input channels per scale (default 32)
    lm_head_bits: int | None = None  # int8/int4: the LM head's bits (default 8)
    # auto | fp32 | fp16 | fp8 (e4m3, per-token-per-head scales). auto (export/defaults.py):
    # fp8 where the target reads it in a fused attention (TensorRT on compute capability
    # 8.9+) or where the engine would not fit ``memory_budget_mb`` with an fp16 cache of
    # max_seq x ``max_batch`` tokens; fp16 (the fused graph) elsewhere: on the CPU fp8 runs
    # the generic graph, 1.9x slower on the demo model's requests and its answers drifting
    # from fp32 KV's (docs/benchmarks/ffn-and-defaults.md, "Defaults measured")
    kv: str = "auto"
    max_seq: int | None = None
    norm_eps: float | None = None
    verify: bool = True
    # auto | off | calibrate | trained (gates shipped in the checkpoint, required). auto
    # (``auto_gates``): none added; a checkpoint's trained gates dropped where fast decoding
    # then applies (float weights, or int8/int4 on the fused graph) and the model without
    # them stays within ``quality_budget`` of the gated one on held-out text, else kept
    ffn_skip: str = "auto"
    calib_text: Path | None = None
    # max mean next-token KL (nats) on held-out real text: of the FFN gates against the
    # unskipped model, and of the int8/int4 weights and of fp16/fp8 KV against fp32
    quality_budget: float = 0.05
    symmetric: bool = False      # int8/int4: no zero points (the grid centred on 0)
    # fused (GroupQueryAttention & co., fp32/fp16 KV, fp32/int8/int4 weights) | generic |
    # auto: fused wherever it applies (docs/benchmarks/peers.md, "Fused graph")
    graph: str = "auto"
    # --kv auto's sizing: the rows decoded together (an export-time assumption; the
    # daemon's engine.max_batch) and the engine's peak memory it must fit, in MiB
    max_batch: int = DEFAULT_MAX_BATCH
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB
    # set by --target trt: the GPU's compute capability (--kv auto takes fp8 from 8.9), and
    # why an explicit --kv changed (--trt-kv-fallback fp16 on a GPU without FP8)
    trt_cc: tuple[int, int] | None = None
    kv_reason: str | None = None
    # a peft LoRA adapter folder merged into the checkpoint before export (export/adapter.py)
    adapter: Path | None = None


WEIGHTS = ("fp32", "fp16", *BITS)
# int4 mixed precision aims at this share of the budget on the calibration text: the
# engine's own measurement on held-out text (int8 activations included) must still fit. On
# SmolLM2-135M the two landed within 2 % of each other (0.6: 0.0297 / 0.0297, 71 groups at
# 8 bits, 7.1 bits per weight; 0.8: 0.0396 / 0.0388, 56 groups, 6.6 bits per weight)
SELECT_MARGIN = 0.8
TEXT_ROWS, TEXT_LENGTH = 12, 64  # real text: rows x tokens, teacher-forced
FFN_SKIP = ("auto", "off", "calibrate", "trained")
GRAPHS = ("auto", "fused", "generic")
KV = {"fp32": "float32", "fp16": "float16", "fp8": "float8_e4m3fn"}
KV_OPTIONS = ("auto", *KV)


def export(hf_dir: Path, out_dir: Path, opts: ExportOptions) -> Manifest:
    """Export ``hf_dir`` (a Hugging Face directory or a ``.gguf`` file) to ``out_dir``;
    returns the written manifest.

    Raises:
        CheckpointError: the checkpoint cannot be imported.
        ExportError: unsupported option, graph/ORT failure, verification out of tolerance,
            a lossy choice over the quality budget.
    """
    if opts.weights is not None and opts.weights not in WEIGHTS:
        raise ExportError(f"--weights {opts.weights} is not available",
                          f"choose one of {', '.join(WEIGHTS)}")
    if opts.weights in BITS:
        quant_spec(opts.weights, opts.block_size, opts.lm_head_bits)  # option errors first
    elif opts.weights is not None:
        for flag, value in (("--block-size", opts.block_size),
                            ("--lm-head-bits", opts.lm_head_bits)):
            if value is not None:
                raise ExportError(f"{flag} applies to --weights int8|int4, not "
                                  f"{opts.weights}", f"drop {flag} or choose --weights int8|int4")
    if opts.kv not in KV_OPTIONS:
        raise ExportError(f"--kv {opts.kv} is not available",
                          f"choose one of {', '.join(KV_OPTIONS)}")
    if opts.max_batch < 1:
        raise ExportError(f"--max-batch {opts.max_batch} is too small", "give at least 1")
    if opts.memory_budget_mb < 1:
        raise ExportError(f"--memory-budget-mb {opts.memory_budget_mb} must be positive",
                          "give the engine's memory in MiB, e.g. 4096")
    if opts.max_seq is not None and opts.max_seq < 8:
        raise ExportError(f"--max-seq {opts.max_seq} is too small", "give at least 8")
    if opts.quality_budget <= 0:
        raise ExportError(f"--quality-budget {opts.quality_budget} must be positive",
                          "give a mean KL in nats, e.g. 0.05")
    graph_form(opts)
    if opts.ffn_skip not in FFN_SKIP:
        raise ExportError(f"--ffn-skip {opts.ffn_skip} is not available",
                          f"choose one of {', '.join(FFN_SKIP)}")
    if opts.ffn_skip == "calibrate" and (opts.calib_text is None
                                         or not Path(opts.calib_text).is_file()):
        raise ExportError(f"--ffn-skip calibrate needs --calib-text FILE (got "
                          f"{opts.calib_text})", "give a text file in the model's domain")
    with tempfile.TemporaryDirectory(prefix="rung-export-") as side:
        with step(f"loading checkpoint {hf_dir}"):
            ckpt = load_checkpoint(hf_dir, opts.max_seq, opts.norm_eps, workdir=Path(side))
        adapter = None
        if opts.adapter is not None:
            with step(f"merging the LoRA adapter {opts.adapter}"):
                adapter = merge(ckpt.model, read_adapter(Path(opts.adapter)))
        return _export(ckpt, Path(out_dir), opts, adapter)


def _export(ckpt: Checkpoint, out_dir: Path, opts: ExportOptions,
            adapter: dict[str, Any] | None = None) -> Manifest:
    weights = opts.weights or source_weights(ckpt)
    opts = dataclasses.replace(opts, weights=weights)
    spec = plan(ckpt, opts)
    kv = kv_dtype(ckpt, opts, spec)
    # the graph form resolved once: the source's precision or the model may rule fused out
    opts = dataclasses.replace(opts, kv=kv.kv, graph=graph_form(
        dataclasses.replace(opts, kv=kv.kv), ckpt.config))
    ckpt.model.set_kv_dtype(KV[opts.kv])
    tok = Tokenizer.load(ckpt.path, ckpt.tokenizer)
    calib, held = real_text(ckpt, tok, opts)
    ffn_gate, ffn_skip = prepare_gates(ckpt, opts, held)
    plan_ = step_plan(opts.graph, weights, ckpt.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)  # no manifest until verified
    imp: dict[str, npt.NDArray[np.float32]] | None = None
    cache: dict[tuple[str, int, int], Blocks] = {}
    mixed = None
    if spec is not None:
        with step("measuring input channel importance on calibration text"):
            imp = importance(ckpt.model, calib)
        if any(spec.layer_bits(p) < 8 for p in _linears(ckpt.model)):
            with step(f"choosing the weights kept at 8 bits (budget: mean KL "
                      f"{opts.quality_budget})"):
                bits, mixed = choose(
                    ckpt.model, calib, spec.layer_bits, spec.layer_block, spec.symmetric, imp,
                    opts.quality_budget * SELECT_MARGIN, spec.lm_head_bits < 8, cache)
            spec = dataclasses.replace(spec, bits_of={**spec.bits_of, **bits})
    with step(f"writing ONNX graph ({plan_.graph}, {weights} weights, {opts.kv} KV)"):
        reference = write_graph(ckpt, out_dir, weights, spec, plan_, imp, cache)
    for name in ckpt.tokenizer.files:
        shutil.copyfile(ckpt.path / name, out_dir / name)
    quantization = None if spec is None else {
        **spec.to_manifest(), "budget_mean_kl": opts.quality_budget,
        "mixed": None if mixed is None else mixed.to_manifest(),
        "source": None if ckpt.storage is None else {
            "format": "gguf", "types": dict(Counter(ckpt.storage.values()))}}
    manifest = _manifest(ckpt, out_dir, opts, plan_)
    manifest = dataclasses.replace(
        manifest, ffn_gate=ffn_gate, ffn_skip=ffn_skip, quantization=quantization,
        adapter=adapter,
        kv=dataclasses.replace(manifest.kv, chosen_by=kv.chosen_by, reason=kv.reason))
    if opts.verify:
        manifest = _verify(ckpt, out_dir, opts, manifest, reference, held, tok)
    manifest.save(out_dir)
    return manifest


def _verify(ckpt: Checkpoint, out_dir: Path, opts: ExportOptions, manifest: Manifest,
            reference: RungForCausalLM, held: npt.NDArray[np.int64], tok: Tokenizer) -> Manifest:
    """The graph against its reference, then the cost of each lossy choice against fp32,
    both on held-out real text; raises ``ExportError`` when either is out of bounds."""
    weights = str(opts.weights)
    with step("verifying the graph against the PyTorch model"):
        engine = OnnxEngine(out_dir, manifest)
        stream = text_stream(lambda t: tok.encode(t, add_bos=False), HELD_OUT,
                             ckpt.config.vocab_size)
        parity = verify(engine, reference, weights, stream)
    if not parity.passed:
        rel = ("" if parity.tolerance_rel is None else
               f"max relative logit error {parity.max_rel_logit_diff:.2e} (bound "
               f"{parity.tolerance_rel:.0e}), ")
        raise ExportError(
            f"verification failed: {rel}mean KL {parity.mean_kl:.2e} (bound "
            f"{parity.max_mean_kl:.0e}), greedy agreement {parity.greedy_agreement:.2f} "
            f"(bound {parity.min_greedy_agreement:.2f})",
            "the graph does not reproduce the model; report it with the checkpoint config")
    budget = opts.quality_budget
    accuracy = None
    if opts.kv != "fp32":
        with step(f"measuring the cost of {opts.kv} KV against fp32 KV on real text"):
            accuracy = kv_accuracy(ckpt.model, held)
        if accuracy["mean_kl"] > budget:
            raise ExportError(
                f"{opts.kv} KV costs mean KL {accuracy['mean_kl']:.3g} against fp32 KV on "
                f"held-out text (greedy agreement {accuracy['greedy_agreement']:.2f}), over "
                f"the budget {budget}", "use --kv fp16 or raise --quality-budget"
                + (" (--kv auto chose fp8 to fit --memory-budget-mb)"
                   if manifest.kv.chosen_by == "auto" else ""))
    quant = manifest.quantization
    if quant is not None:
        with step(f"measuring the cost of {weights} weights against fp32 weights on real "
                  "text"):
            cost = weight_accuracy(engine, ckpt.model, held)
        quant = {**quant, "accuracy": cost}
        if cost["mean_kl"] > budget:
            kept = len((quant.get("mixed") or {}).get("promoted", []))
            raise ExportError(
                f"{weights} weights cost mean KL {cost['mean_kl']:.3g} against fp32 weights "
                f"on held-out text (greedy agreement {cost['greedy_agreement']:.2f}; {kept} "
                f"weight groups kept at 8 bits), over the budget {budget}",
                "try --block-size 16, --weights int8, or a larger --quality-budget")
    return dataclasses.replace(manifest, parity=parity, quantization=quant,
                               kv=dataclasses.replace(manifest.kv, accuracy=accuracy))


def source_weights(ckpt: Checkpoint) -> str:
    """The engine precision a checkpoint's own storage suggests: fp32 for a HF directory
    and a GGUF with float layers; int4 where a GGUF has any layer matrix under 5 bits, else
    int8. The LM head (often a quantized tied embedding) follows along."""
    if ckpt.storage is None:
        return "fp32"
    bits = {GGML_TYPES[t].bits for n, t in ckpt.storage.items() if n != "lm_head"} - {None}
    return "fp32" if not bits else "int4" if 4 in bits else "int8"


def plan(ckpt: Checkpoint, opts: ExportOptions) -> QuantSpec | None:
    """The quantization plan for ``opts.weights``; for a GGUF file exported at its own
    precision, each matrix at the bits and block its GGML type becomes (the widest in each
    group the fused graph packs into one node). The embedding table is 8-bit where its rows
    are whole blocks (``embeddings_of``)."""
    weights = str(opts.weights)
    if weights not in BITS:
        return None
    spec = quant_spec(weights, opts.block_size, opts.lm_head_bits, opts.symmetric)
    spec = dataclasses.replace(spec, embeddings=embeddings_of(ckpt.config.hidden_size, spec))
    if ckpt.storage is None or opts.weights != source_weights(ckpt) or (
            opts.lm_head_bits is not None):
        return spec
    kinds = {name: GGML_TYPES[t] for name, t in ckpt.storage.items()}
    bits = {name: k.bits or 8 for name, k in kinds.items()}
    for i in range(ckpt.config.num_layers):
        for parts in LAYER_UNITS.values():
            names = [f"layers.{i}.{p}" for p in parts]
            widest = max(bits.get(n, spec.bits) for n in names)
            bits.update(dict.fromkeys(names, widest))
    head = bits.pop("lm_head", spec.lm_head_bits)
    blocks = {n: k.block for n, k in kinds.items()
              if k.bits is not None and k.block != spec.block_size}
    return dataclasses.replace(spec, lm_head_bits=head,
                               bits_of={n: b for n, b in bits.items() if b != spec.bits},
                               block_of=blocks)


def real_text(ckpt: Checkpoint, tok: Tokenizer, opts: ExportOptions
              ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Calibration and held-out rows [n, L] of real text: ``export/prompts.py``'s two sets;
    ``--calib-text`` replaces the calibration set."""
    length = min(TEXT_LENGTH, ckpt.model.max_seq)
    vocab = ckpt.config.vocab_size

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_bos=False)

    texts = list(CALIBRATION)
    if opts.calib_text is not None:
        texts = [Path(opts.calib_text).read_text(encoding="utf-8", errors="replace")]
    calib = text_rows(text_stream(encode, texts, vocab), length, TEXT_ROWS)
    held = text_rows(text_stream(encode, HELD_OUT, vocab), length, TEXT_ROWS)
    return calib, held


def _linears(model: RungForCausalLM) -> list[str]:
    names = [f"layers.{i}.{p}" for i in range(len(model.model.layers))
             for parts in LAYER_UNITS.values() for p in parts]
    return [*names, "lm_head"]


def graph_form(opts: ExportOptions, cfg: ModelConfig | None = None) -> str:
    """``fused`` or ``generic`` for ``opts.graph`` (and the model ``cfg``, where known).

    Raises:
        ExportError: an unknown form, or ``fused`` where it does not apply.
    """
    if opts.graph not in GRAPHS:
        raise ExportError(f"--graph {opts.graph} is not available",
                          f"choose one of {', '.join(GRAPHS)}")
    # --kv auto (not yet resolved) takes fp16 wherever the fused graph is asked for
    fits = opts.kv == "auto" or (opts.kv in KV and KV[opts.kv] in FUSED_KV)
    fits = fits and opts.weights != "fp16"
    if opts.graph == "fused" and not fits:
        raise ExportError(f"--graph fused takes fp32/fp16 KV with fp32/int8/int4 weights, not "
                          f"{opts.kv} KV with {opts.weights} weights",
                          "use --graph generic (or auto)")
    refusal = None if cfg is None else fused_refusal(cfg)
    if refusal is not None:
        if opts.graph == "fused":
            raise ExportError(f"--graph fused does not fit this model: {refusal}",
                              "use --graph generic (or auto)")
        fits = False
    return "fused" if opts.graph == "fused" or (opts.graph == "auto" and fits) else "generic"


def prepare_gates(ckpt: Checkpoint, opts: ExportOptions, held: npt.NDArray[np.int64] | None = None
                  ) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """Strip, fit or keep the FFN gates: the manifest's ``ffn_gate`` record (None without
    gates) and ``ffn_skip``, the option resolved (``requested``, ``mode``, ``reason``).
    ``held``: held-out rows of real text, on which ``auto`` measures what dropping a
    checkpoint's trained gates would cost."""
    model = ckpt.model
    mode, reason = opts.ffn_skip, f"--ffn-skip {opts.ffn_skip} as asked"
    if mode == "auto":
        fused = opts.graph == "fused"   # resolved by the caller
        cost = None
        if model.has_ffn_gates and fast_without_gates(str(opts.weights), fused) \
                and held is not None:
            with step("measuring what dropping the trained FFN gates costs on real text"):
                cost = ungated_cost(model, held)
        mode, reason = auto_gates(model.has_ffn_gates, str(opts.weights), fused, cost,
                                  opts.quality_budget)
    record = {"requested": opts.ffn_skip, "mode": mode, "reason": reason}
    if mode == "off":
        for layer in model.model.layers:
            layer.mlp.ffn_gate = None
        return None, record
    if mode == "trained":
        if not model.has_ffn_gates:
            raise ExportError(f"{ckpt.path}: --ffn-skip trained, but the checkpoint has no "
                              "FFN gates", "use --ffn-skip calibrate --calib-text FILE")
        return {"mode": "trained"}, record
    if opts.calib_text is None:
        raise ExportError("--ffn-skip calibrate needs --calib-text FILE")
    text = Path(opts.calib_text).read_text(encoding="utf-8", errors="replace")
    tok = Tokenizer.load(ckpt.path, ckpt.tokenizer)
    with step(f"calibrating FFN gates on {opts.calib_text} (budget: mean KL "
              f"{opts.quality_budget})"):
        result = calibrate(model, tok.encode(text, add_bos=False), opts.quality_budget)
    return result.to_manifest(), record


def kv_dtype(ckpt: Checkpoint, opts: ExportOptions, spec: QuantSpec | None) -> KVChoice:
    """The KV dtype: ``--kv`` as given, or ``auto``'s choice (export/defaults.py).

    Raises:
        ExportError: ``--graph fused`` where the memory budget needs fp8 KV.
    """
    if opts.kv != "auto":
        return flagged(opts.kv, opts.kv_reason)
    c = ckpt.config
    shape = CacheShape(c.num_layers, c.num_kv_heads, c.head_dim, ckpt.model.max_seq)
    fused = graph_form(dataclasses.replace(opts, kv="fp16"), c) == "fused"
    choice = choose_kv(weight_bytes(ckpt.model, str(opts.weights), spec), str(opts.weights),
                       shape, max_batch=opts.max_batch,
                       memory_budget_mb=opts.memory_budget_mb, trt_cc=opts.trt_cc,
                       fused_fp16=fused)
    if choice.kv == "fp8" and opts.graph == "fused" and opts.trt_cc is None:
        raise ExportError(f"--graph fused takes fp32/fp16 KV, but --kv auto needs fp8: "
                          f"{choice.reason}", "give --kv fp16, or raise --memory-budget-mb")
    return choice


def step_plan(graph: str, weights: str, model: RungForCausalLM) -> StepPlan:
    """The manifest's step plan for the resolved graph form, weights and the model's FFN
    gates (as kept): lone tokens run over two positions where ``drafts.pads_steps`` says,
    the graph repeating the position itself (its input ``attention_positions``)."""
    layout = HEAD_MAJOR if graph == "fused" else KV_LAYOUT
    return StepPlan(graph, 2 if pads_steps(weights, model.has_ffn_gates, layout) else 1)


def write_graph(ckpt: Checkpoint, out_dir: Path, weights: str,
                spec: QuantSpec | None, plan: StepPlan,
                imp: dict[str, npt.NDArray[np.float32]] | None = None,
                cache: dict[tuple[str, int, int], Blocks] | None = None) -> RungForCausalLM:
    """Write ``model.onnx`` (+ data) for ``weights``, fused or generic; returns the PyTorch
    model the graph computes, the reference of the parity check: the checkpoint's own, or
    with int8/int4 weights a copy holding the dequantized weights (read before saving moves
    them out)."""
    proto = (build_fused_graph(ckpt.model, dot=spec is None, lone_pad=plan.min_positions > 1)
             if plan.graph == "fused" else build_graph(ckpt.model))
    reference = ckpt.model
    if spec is not None:
        proto = quantize_graph(proto, spec, imp, cache)
        reference = quantized_model(ckpt.model, proto)
    elif weights == "fp16":
        from onnxruntime.transformers.float16 import (
            DEFAULT_OP_BLOCK_LIST,
            convert_float_to_float16,
        )
        # Min/Max run in fp16 like their neighbours: blocked (kept fp32) without shape
        # inference, the fp8 scale's Max(amax / 448, floor) would meet an fp16 input
        blocked = [op for op in DEFAULT_OP_BLOCK_LIST if op not in ("Min", "Max")]
        proto = convert_float_to_float16(proto, keep_io_types=True, disable_shape_infer=True,
                                         op_block_list=blocked)
    (out_dir / DATA_FILE).unlink(missing_ok=True)  # onnx appends to an existing data file
    try:
        onnx.save_model(proto, str(out_dir / GRAPH_FILE), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=DATA_FILE, size_threshold=1024)
        (out_dir / DATA_FILE).touch()  # none written where no tensor reaches the threshold
    except (OSError, ValueError) as e:
        raise ExportError(f"{out_dir}: cannot write the graph ({e})",
                          "check disk space and permissions") from e
    return reference


def _manifest(ckpt: Checkpoint, out_dir: Path, opts: ExportOptions,
              plan: StepPlan) -> Manifest:
    c, model = ckpt.config, ckpt.model
    fused = plan.graph == "fused"
    inputs, outputs = (fused_io_specs(model, plan.min_positions > 1) if fused
                       else io_specs(model))
    files = [GRAPH_FILE, DATA_FILE, *ckpt.tokenizer.files]
    artifacts, fast = artifact_digests(out_dir, files)
    kv = KVSpec(dtype=KV[opts.kv], layout=HEAD_MAJOR if fused else KV_LAYOUT,
                scale_layout="per_token_per_head" if opts.kv == "fp8" else None)
    engine_id = hashlib.sha256(   # the cache's layout, not why it was chosen
        f"{FORMAT_VERSION}|{artifacts[GRAPH_FILE]}|{artifacts[DATA_FILE]}|{kv}".encode()
    ).hexdigest()[:16]
    dims = ModelDims(
        hf_architecture=c.architecture, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        num_layers=c.num_layers, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim, intermediate_size=c.intermediate_size, max_seq=model.max_seq,
        rope_theta=c.rope.theta, rms_norm_eps=model.model.norm.eps,
        tie_word_embeddings=c.tie_word_embeddings)
    return Manifest(
        format_version=FORMAT_VERSION, engine_id=engine_id,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rung_version=RUNG_VERSION,
        dims=dims, graph_file=GRAPH_FILE, opset=OPSET, inputs=inputs, outputs=outputs,
        weights=str(opts.weights), kv=kv, tokenizer=ckpt.tokenizer, generation=ckpt.generation,
        parity=None, artifacts=artifacts, step=plan, xxh3=fast)
