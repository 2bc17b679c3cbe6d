"""``rung export``: HF checkpoint -> our PyTorch model -> ONNX graph -> verified engine dir.

The manifest is written last and only when verification passes (or was skipped on request,
``--no-verify``: the manifest then has no parity record): a directory with a manifest is a
complete engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from rung.engines.errors import ExportError
from rung.engines.manifest import (
    FORMAT_VERSION,
    HEAD_MAJOR,
    KV_LAYOUT,
    MANIFEST_NAME,
    KVSpec,
    Manifest,
    ModelDims,
    sha256_file,
)
from rung.engines.onnx_engine import OnnxEngine
from rung.engines.progress import step
from rung.engines.tokenizer import Tokenizer
from rung.export.checkpoint import Checkpoint, load_checkpoint
from rung.export.ffn_calibrate import calibrate
from rung.export.model import RungForCausalLM
from rung.export.onnx_fused import FUSED_KV, build_fused_graph, fused_io_specs
from rung.export.onnx_graph import OPSET, build_graph, io_specs
from rung.export.quantize import BITS, QuantSpec, quant_spec, quantize_graph, quantized_model
from rung.export.verify import kv_accuracy, verify, weight_accuracy

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
RUNG_VERSION = "0.1.0"


@dataclass(frozen=True)
class ExportOptions:
    weights: str = "fp32"        # fp32 | fp16 | int8 | int4
    block_size: int | None = None  # int8/int4: input channels per scale (default 32)
    lm_head_bits: int | None = None  # int8/int4: the LM head's bits (default 8)
    # fp8 (e4m3, per-token-per-head scales) by default: 0.27x of fp32's memory; on the
    # trained demo model mean KL 1.2e-4 and 99.75 % greedy agreement against fp32 KV, decode
    # cost on CPU 2 % at 128 tokens of context and 13 % at 1024 (docs/benchmarks.md)
    kv: str = "fp8"              # fp32 | fp16 | fp8
    max_seq: int | None = None
    norm_eps: float | None = None
    verify: bool = True
    ffn_skip: str = "off"        # off | calibrate | trained (gates shipped in the checkpoint)
    calib_text: Path | None = None
    quality_budget: float = 0.05  # max mean next-token KL (nats) on held-out text
    # fused (GroupQueryAttention & co., fp32/fp16 KV, fp32/int8/int4 weights) | generic |
    # auto: fused wherever it applies (docs/benchmarks.md, "Fused graph")
    graph: str = "auto"


WEIGHTS = ("fp32", "fp16", *BITS)
FFN_SKIP = ("off", "calibrate", "trained")
GRAPHS = ("auto", "fused", "generic")
KV = {"fp32": "float32", "fp16": "float16", "fp8": "float8_e4m3fn"}


def export(hf_dir: Path, out_dir: Path, opts: ExportOptions) -> Manifest:
    """Export ``hf_dir`` to ``out_dir``; returns the written manifest.

    Raises:
        CheckpointError: the checkpoint cannot be imported.
        ExportError: unsupported option, graph/ORT failure, verification out of tolerance.
    """
    if opts.weights not in WEIGHTS:
        raise ExportError(f"--weights {opts.weights} is not available",
                          f"choose one of {', '.join(WEIGHTS)}")
    spec = (quant_spec(opts.weights, opts.block_size, opts.lm_head_bits)
            if opts.weights in BITS else None)
    for flag, value in (("--block-size", opts.block_size),
                        ("--lm-head-bits", opts.lm_head_bits)):
        if spec is None and value is not None:
            raise ExportError(f"{flag} applies to --weights int8|int4, not {opts.weights}",
                              f"drop {flag} or choose --weights int8|int4")
    if opts.kv not in KV:
        raise ExportError(f"--kv {opts.kv} is not available", f"choose one of {', '.join(KV)}")
    if opts.max_seq is not None and opts.max_seq < 8:
        raise ExportError(f"--max-seq {opts.max_seq} is too small", "give at least 8")
    graph_form(opts)
    if opts.ffn_skip not in FFN_SKIP:
        raise ExportError(f"--ffn-skip {opts.ffn_skip} is not available",
                          f"choose one of {', '.join(FFN_SKIP)}")
    if opts.ffn_skip == "calibrate" and (opts.calib_text is None
                                         or not Path(opts.calib_text).is_file()):
        raise ExportError(f"--ffn-skip calibrate needs --calib-text FILE (got "
                          f"{opts.calib_text})", "give a text file in the model's domain")
    with step(f"loading checkpoint {hf_dir}"):
        ckpt = load_checkpoint(hf_dir, opts.max_seq, opts.norm_eps)
    ckpt.model.set_kv_dtype(KV[opts.kv])
    ffn_gate = prepare_gates(ckpt, opts)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)  # no manifest until verified
    fused = graph_form(opts) == "fused"
    with step(f"writing ONNX graph ({'fused' if fused else 'generic'}, {opts.weights} "
              f"weights, {opts.kv} KV)"):
        reference = write_graph(ckpt, out_dir, opts.weights, spec, fused)
    for name in ckpt.tokenizer.files:
        shutil.copyfile(ckpt.path / name, out_dir / name)
    manifest = dataclasses.replace(
        _manifest(ckpt, out_dir, opts), ffn_gate=ffn_gate,
        quantization=None if spec is None else spec.to_manifest())
    if opts.verify:
        with step("verifying the graph against the PyTorch model"):
            engine = OnnxEngine(out_dir, manifest)
            parity = verify(engine, reference, opts.weights)
        if not parity.passed:
            raise ExportError(
                f"verification failed: max relative logit error {parity.max_rel_logit_diff:.2e}"
                f", greedy agreement {parity.greedy_agreement:.2f}",
                "the graph does not reproduce the model; report it with the checkpoint config")
        accuracy = None
        if opts.kv != "fp32":
            with step(f"measuring the cost of {opts.kv} KV against fp32 KV"):
                accuracy = kv_accuracy(ckpt.model)
        if manifest.quantization is not None:
            with step(f"measuring the cost of {opts.weights} weights against fp32 weights"):
                manifest = dataclasses.replace(manifest, quantization={
                    **manifest.quantization, "accuracy": weight_accuracy(engine, ckpt.model)})
        manifest = dataclasses.replace(manifest, parity=parity, kv=dataclasses.replace(
            manifest.kv, accuracy=accuracy))
    manifest.save(out_dir)
    return manifest


def graph_form(opts: ExportOptions) -> str:
    """``fused`` or ``generic`` for ``opts.graph``.

    Raises:
        ExportError: an unknown form, or ``fused`` where it does not apply.
    """
    if opts.graph not in GRAPHS:
        raise ExportError(f"--graph {opts.graph} is not available",
                          f"choose one of {', '.join(GRAPHS)}")
    fits = KV[opts.kv] in FUSED_KV if opts.kv in KV else False
    fits = fits and opts.weights != "fp16"
    if opts.graph == "fused" and not fits:
        raise ExportError(f"--graph fused takes fp32/fp16 KV with fp32/int8/int4 weights, not "
                          f"{opts.kv} KV with {opts.weights} weights",
                          "use --graph generic (or auto)")
    return "fused" if opts.graph == "fused" or (opts.graph == "auto" and fits) else "generic"


def prepare_gates(ckpt: Checkpoint, opts: ExportOptions) -> dict[str, Any] | None:
    """Strip, fit or keep the FFN gates; the manifest's ``ffn_gate`` record."""
    model = ckpt.model
    if opts.ffn_skip == "off":
        for layer in model.model.layers:
            layer.mlp.ffn_gate = None
        return None
    if opts.ffn_skip == "trained":
        if not model.has_ffn_gates:
            raise ExportError(f"{ckpt.path}: --ffn-skip trained, but the checkpoint has no "
                              "FFN gates", "use --ffn-skip calibrate --calib-text FILE")
        return {"mode": "trained"}
    if opts.calib_text is None:
        raise ExportError("--ffn-skip calibrate needs --calib-text FILE")
    text = Path(opts.calib_text).read_text(encoding="utf-8", errors="replace")
    tok = Tokenizer.load(ckpt.path, ckpt.tokenizer)
    with step(f"calibrating FFN gates on {opts.calib_text} (budget: mean KL "
              f"{opts.quality_budget})"):
        result = calibrate(model, tok.encode(text, add_bos=False), opts.quality_budget)
    return result.to_manifest()


def write_graph(ckpt: Checkpoint, out_dir: Path, weights: str,
                spec: QuantSpec | None = None, fused: bool = False) -> RungForCausalLM:
    """Write ``model.onnx`` (+ data) for ``weights``, fused or generic; returns the PyTorch
    model the graph computes, the reference of the parity check: the checkpoint's own, or
    with int8/int4 weights a copy holding the dequantized weights (read before saving moves
    them out)."""
    proto = (build_fused_graph(ckpt.model, dot=spec is None) if fused
             else build_graph(ckpt.model))
    reference = ckpt.model
    if spec is not None:
        proto = quantize_graph(proto, spec)
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
    except (OSError, ValueError) as e:
        raise ExportError(f"{out_dir}: cannot write the graph ({e})",
                          "check disk space and permissions") from e
    return reference


def _manifest(ckpt: Checkpoint, out_dir: Path, opts: ExportOptions) -> Manifest:
    c, model = ckpt.config, ckpt.model
    fused = graph_form(opts) == "fused"
    inputs, outputs = fused_io_specs(model) if fused else io_specs(model)
    files = [GRAPH_FILE, DATA_FILE, *ckpt.tokenizer.files]
    artifacts = {f: sha256_file(out_dir / f) for f in files}
    kv = KVSpec(dtype=KV[opts.kv], layout=HEAD_MAJOR if fused else KV_LAYOUT,
                scale_layout="per_token_per_head" if opts.kv == "fp8" else None)
    engine_id = hashlib.sha256(
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
        weights=opts.weights, kv=kv, tokenizer=ckpt.tokenizer, generation=ckpt.generation,
        parity=None, artifacts=artifacts)
