"""FFN skipping on a trained model: decode speed with and without skipping, in one run.

    .venv/bin/python bench/ffn_model.py [models/edge-tiny] [--budgets 0.05,0.2]

Exports the model with its trained gates, with ``--ffn-skip off``, and with gates
re-calibrated (``--ffn-skip calibrate``) at each budget on held-out corpus text; then times
batch-1 greedy decode (the shape where gates act) on the same prompts, median of 3, and
reports the skip ratio per layer. Quality of each export against the ungated one is the
calibration's held-out record (trained gates: see the model card's evaluation).
Writes ``bench/results/<date>-ffn-model.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import report

from rung.engines import load_engine
from rung.engines.onnx_engine import EngineOptions
from rung.engines.progress import set_enabled
from rung.export.exporter import ExportOptions, export

RESULTS = Path(__file__).resolve().parent / "results"


def calib_text(path: Path) -> Path:
    from rung.daemon.tasks.task import load_tasks
    from rung.tools.corpus import generate
    from rung.tools.train import chat_text

    tasks = load_tasks()
    path.write_text("\n".join(chat_text(tasks[s["task"]], s["input"], s["output"])
                              for s in generate(300, seed=2024)), encoding="utf-8")
    return path


def decode_speed(engine_dir: Path, steps: int, reps: int, threads: int) -> dict[str, Any]:
    engine = load_engine(engine_dir, "onnx", EngineOptions(threads=threads))
    prompt = np.random.default_rng(0).integers(5, engine.manifest.dims.vocab_size, 64)
    times = []
    for _ in range(reps):
        cache = engine.new_cache(1, 64 + steps + 1)
        logits = engine.forward(cache, prompt[None], np.array([64]))
        t0 = time.perf_counter()
        for _ in range(steps):
            nxt = logits[:, -1].argmax(-1)[:, None]
            logits = engine.forward(cache, nxt, np.ones(1, np.int64), allow_skip=True)
        times.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"decode_tok_s": steps / float(np.median(times))}
    if engine.ffn_skips is not None and engine.ffn_steps:
        out["ffn_skip_ratio"] = float(engine.ffn_skips.sum()
                                      / (engine.ffn_steps * len(engine.ffn_skips)))
        out["per_layer"] = (engine.ffn_skips / engine.ffn_steps).round(3).tolist()
    gate = engine.manifest.ffn_gate or {}
    if gate.get("mode") == "calibrate":
        out["held_out_quality"] = gate["quality"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, nargs="?",
                   default=Path(__file__).resolve().parent.parent / "models" / "edge-tiny")
    p.add_argument("--budgets", default="0.05,0.2")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    set_enabled(False)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        text = calib_text(Path(tmp) / "calib.txt")
        variants = {"off": ExportOptions(ffn_skip="off"),
                    "trained": ExportOptions(ffn_skip="trained")}
        for b in args.budgets.split(","):
            variants[f"calibrated {b}"] = ExportOptions(
                ffn_skip="calibrate", calib_text=text, quality_budget=float(b))
        for name, opts in variants.items():
            out = Path(tmp) / name.replace(" ", "-")
            export(args.model, out, opts)
            rows[name] = decode_speed(out, args.steps, args.reps, args.threads)
            print(f"ffn_model: {name}: {rows[name]}", file=sys.stderr)
    record = {"stamp": time.strftime("%Y-%m-%d") + "-ffn-model", "model": str(args.model),
              "command": shlex.join(sys.orig_argv), "steps": args.steps, "results": rows}
    lines = [f"# FFN skipping on {args.model.name} {record['stamp']}", "",
             f"Command: `{record['command']}`", "",
             "| gates | FFNs skipped (decode) | decode tok/s (batch 1) | vs off | held-out "
             "mean KL / greedy agreement |", "|---|---|---|---|---|"]
    base = rows["off"]["decode_tok_s"]
    for name, r in rows.items():
        q = r.get("held_out_quality")
        lines.append(f"| {name} | {r.get('ffn_skip_ratio', 0.0):.1%} | "
                     f"{r['decode_tok_s']:.0f} | {r['decode_tok_s'] / base:.2f}x | "
                     + (f"{q['mean_kl']:.3f} / {q['greedy_agreement']:.3f}" if q else "–")
                     + " |")
    md = "\n".join(lines) + "\n"
    report.write_record(args.out, record, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
