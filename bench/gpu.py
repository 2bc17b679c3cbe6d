"""GPU benchmark: TensorRT and ONNX Runtime's CUDA provider on one random-weight checkpoint.

For each configuration (backend, weights, KV dtype, FFN gates forced never/always to skip)
it exports once, loads the engine and measures the time to first token of a prompt (prefill
plus the first logits) and decode tokens per second at batch 1 and batch 4; the ONNX engine
on the CPU is the reference row. A configuration that fails (no FP8 on this GPU, a
TensorRT parser error) is recorded with its error and the run goes on. Writes
``gpu-<preset>.json`` and ``.md`` into ``--out``.

    python bench/gpu.py --preset qwen2.5-0.5b --out "$OUT" [--prompt 128] [--decode 64]

Needs rung[export] (torch makes the checkpoint), tensorrt and cuda-python, and for the
ONNX Runtime CUDA rows onnxruntime-gpu. Written without a GPU at hand: see
bench/gpu_check.sh for how it is meant to run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Config:
    name: str
    backend: str        # onnx | trt
    provider: str       # cpu | cuda (onnx only)
    weights: str
    kv: str
    gates: float | None = None   # forced FFN gate bias: +1e4 always skips, -1e4 never


def configs(cc: tuple[int, int] | None, ort_cuda: bool) -> list[Config]:
    rows = [Config("onnx-cpu fp32/fp16kv", "onnx", "cpu", "fp32", "fp16")]
    if ort_cuda:
        rows += [Config("ort-cuda fp32/fp16kv", "onnx", "cuda", "fp32", "fp16"),
                 Config("ort-cuda fp16/fp16kv", "onnx", "cuda", "fp16", "fp16")]
    if cc is not None:
        rows += [Config("trt fp16/fp16kv", "trt", "cpu", "fp16", "fp16"),
                 Config("trt fp32/fp16kv", "trt", "cpu", "fp32", "fp16"),
                 Config("trt fp16/fp16kv ffn-never", "trt", "cpu", "fp16", "fp16", -1e4),
                 Config("trt fp16/fp16kv ffn-always", "trt", "cpu", "fp16", "fp16", 1e4)]
        if cc >= (8, 9):
            rows += [Config("trt fp32/fp8kv", "trt", "cpu", "fp32", "fp8"),
                     Config("trt fp16/fp8kv", "trt", "cpu", "fp16", "fp8")]
    return rows


def export_config(c: Config, hf: Path, out: Path, max_seq: int) -> Path:
    from rung.export import exporter
    from rung.export.exporter import ExportOptions, export
    from rung.export.trt_build import TrtBuildOptions, export_trt, generic_graph

    if (out / "manifest.json").is_file():
        return out
    real = exporter.prepare_gates
    if c.gates is not None:
        def forced(ckpt: Any, opts: Any) -> dict[str, Any]:
            import torch

            ckpt.model.add_ffn_gates()
            with torch.no_grad():
                for layer in ckpt.model.model.layers:
                    layer.mlp.ffn_gate.proj.bias.fill_(c.gates)
            return {"mode": "forced"}
        exporter.prepare_gates = forced
    try:
        opts = generic_graph(ExportOptions(weights=c.weights, kv=c.kv, max_seq=max_seq,
                                           verify=False))
        if c.backend == "trt":
            export_trt(hf, out, opts, TrtBuildOptions(max_batch=4, prefill_chunk=256))
        else:
            export(hf, out, opts)
    finally:
        exporter.prepare_gates = real
    return out


def measure(engine: Any, vocab: int, prompt: int, decode: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    ids = rng.integers(3, vocab, (1, prompt))
    engine.forward(engine.new_cache(1), ids[:, :16], np.array([16]))      # warm-up
    cache = engine.new_cache(1)
    t0 = time.perf_counter()
    logits = engine.forward(cache, ids, np.array([prompt]))
    ttft = time.perf_counter() - t0
    nxt = logits[:, -1].argmax(-1)[:, None]
    t0 = time.perf_counter()
    for _ in range(decode):
        nxt = engine.forward(cache, nxt, np.ones(1, np.int64), allow_skip=True)[:, -1]
        nxt = nxt.argmax(-1)[:, None]
    decode_s = time.perf_counter() - t0
    batch = engine.new_cache(4)
    engine.forward(batch, np.repeat(ids, 4, axis=0), np.full(4, prompt))
    toks = rng.integers(3, vocab, (4, 1))
    t0 = time.perf_counter()
    for _ in range(decode):
        engine.forward(batch, toks, np.ones(4, np.int64))
    batch_s = time.perf_counter() - t0
    out = {"ttft_ms": ttft * 1000, "decode_tok_s": decode / decode_s,
           "batch4_tok_s": 4 * decode / batch_s}
    if engine.ffn_skips is not None and engine.ffn_steps:
        out["ffn_skip_ratio"] = float(engine.ffn_skips.sum() / (engine.ffn_steps
                                                                  * len(engine.ffn_skips)))
    return out


def run(c: Config, hf: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from rung.engines import engine_options, load_engine

    row: dict[str, Any] = {"config": c.name, **c.__dict__}
    try:
        t0 = time.perf_counter()
        d = export_config(c, hf, work / c.name.replace(" ", "_").replace("/", "-"),
                          args.max_seq)
        row["export_s"] = time.perf_counter() - t0
        engine = load_engine(d, c.backend, engine_options(
            c.backend, c.provider if c.backend == "onnx" else None))
        row["kv_bytes_per_token"] = engine.new_cache(1).bytes_per_token
        if engine.manifest.trt is not None:
            row["trt"] = {k: getattr(engine.manifest.trt, k) for k in (
                "tensorrt_version", "device_name", "compute_capability", "kv_reason",
                "parity")}
        row.update(measure(engine, engine.manifest.dims.vocab_size, args.prompt, args.decode))
    except Exception as e:  # one failing configuration must not stop the others
        row["error"] = f"{type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc(limit=6)
    print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
    return row


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# GPU benchmark: {record['preset']} on {record['gpu']}", "",
             f"prompt {record['prompt']} tokens, {record['decode']} decode steps; "
             f"{record['platform']}", "",
             "| config | TTFT ms | decode tok/s | batch 4 tok/s | KV B/token | FFN skip | note |",
             "|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        def f(key: str, fmt: str = "{:.1f}", row: dict[str, Any] = r) -> str:
            return fmt.format(row[key]) if key in row else ""
        note = r.get("error", "")[:80] or (r.get("trt") or {}).get("kv_reason", "")
        lines.append(f"| {r['config']} | {f('ttft_ms')} | {f('decode_tok_s')} | "
                     f"{f('batch4_tok_s')} | {f('kv_bytes_per_token', '{}')} | "
                     f"{f('ffn_skip_ratio', '{:.2f}')} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, help="where checkpoints and engines go (default: "
                   "--out/work)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--only", help="comma-separated config names to run (default: all)")
    args = p.parse_args(argv)
    import onnxruntime as ort

    from rung.engines import gpu
    from rung.export.presets import make_random_checkpoint

    try:
        name, cc = gpu.device_info(0)
    except Exception as e:  # no GPU: the CPU row alone still says something
        name, cc = f"no GPU ({e})", None
    work = args.work or args.out / "work"
    hf = work / f"hf-{args.preset}"
    if not (hf / "config.json").is_file():
        make_random_checkpoint(args.preset, hf)
    ort_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    chosen = [c for c in configs(cc, ort_cuda)
              if not args.only or c.name in args.only.split(",")]
    record: dict[str, Any] = {
        "preset": args.preset, "gpu": name, "compute_capability": cc, "prompt": args.prompt,
        "decode": args.decode, "platform": platform.platform(), "argv": sys.orig_argv,
        "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gpu-{args.preset}"
    for c in chosen:  # written after every row: a run cut short keeps what it measured
        record["rows"].append(run(c, hf, work, args))
        Path(f"{stem}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        Path(f"{stem}.md").write_text(markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
