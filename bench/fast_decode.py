"""Structured answers with fast decoding against plain decoding, on the demo model.

    cd bench && ../.venv/bin/python fast_decode.py [--n 12] [--engines DIR ...] [--no-demo]
                                                   [--tag NAME]

Held-out corpus requests (seed 1000), greedy, through the task runner (shapes on), one at a
time and as a 4-row continuous batch: answer time, decode steps, draft tokens offered, of
them grammar-forced, accepted; whether the answers are token for token the same. On the
demo model exported without FFN gates (fast decoding is exact there) and with its trained
gates (drafts run FFNs unskipped, so answers may differ: ``engine.decode: auto`` keeps
such engines plain). ``--engines``: other engine directories measured the same way (a
real checkpoint: its answers need not pass the validators; plain and fast must still agree
token for token). Writes ``bench/results/<date>-fast-decode.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report
from machine import machine_info

from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.onnx_engine import EngineOptions
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer
from rung.tools.corpus import generate as corpus

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TASK_ORDER = ("st_code", "fault_tree", "diagnosis")


def _run(runner: TaskRunner, samples: list[dict[str, Any]], fast: bool,
         rows: int) -> tuple[float, list[Generation]]:
    """Seconds for all answers, and the generations in sample order."""
    dec = BatchDecoder(runner.engine, runner.tokenizer, rows, fast=fast)
    waiting = list(enumerate(samples))
    got: dict[Any, Generation] = {}
    t0 = time.perf_counter()
    while waiting or dec.active:
        while waiting and dec.free:
            i, s = waiting.pop(0)
            p = runner.prepare(s["task"], s["input"], SamplingParams())
            assert not hasattr(p, "error"), p
            dec.add(i, p.ids, p.params, p.constraint)   # type: ignore[union-attr]
        got.update(dec.step())
    return time.perf_counter() - t0, [got[i] for i in range(len(samples))]


def _answer_s(gens: list[Generation]) -> float:
    """Seconds from request to last token, summed over answers decoded one at a time."""
    return sum(g.ttft_ms / 1e3 + (len(g.token_ids) - 1) / g.decode_tok_s
               if len(g.token_ids) > 1 and g.decode_tok_s > 0 else g.ttft_ms / 1e3
               for g in gens)


def measure(engine_dir: Path, samples: list[dict[str, Any]]) -> dict[str, Any]:
    # as the daemon loads it under engine.decode auto (fp32 weights prepacked where drafts
    # make steps of several tokens); plain decoding is measured on the same session
    engine = load_engine(engine_dir, options=EngineOptions(decode="auto"))
    runner = TaskRunner(engine, Tokenizer.load(engine_dir, engine.manifest.tokenizer),
                        load_tasks(), engine_dir)
    out: dict[str, Any] = {}
    if getattr(engine, "min_positions", 1) > 1:   # plain as it ran before padded lone tokens
        engine.min_positions = 1   # type: ignore[attr-defined]
        unpadded_s, unpadded = _run(runner, samples, False, 1)
        engine.min_positions = 2   # type: ignore[attr-defined]
        out["unpadded_plain"] = {"s": unpadded_s, "tok_s": sum(len(g.token_ids)
                                                               for g in unpadded) / unpadded_s}
    for rows in (1, 4):
        plain_s, plain = _run(runner, samples, False, rows)
        fast_s, fast = _run(runner, samples, True, rows)
        tokens = sum(len(g.token_ids) for g in fast)
        out[f"rows{rows}"] = {
            "plain_s": plain_s, "fast_s": fast_s, "speedup": plain_s / fast_s,
            "identical": sum(a.token_ids == b.token_ids for a, b in zip(plain, fast,
                                                                        strict=True)),
            "answers": len(samples), "tokens": tokens,
            "plain_steps": sum(g.steps for g in plain), "fast_steps": sum(g.steps for g in fast),
            "drafted": sum(g.drafted_tokens for g in fast),
            "forced": sum(g.forced_tokens for g in fast),
            "accepted": sum(g.accepted_tokens for g in fast),
            "plain_tok_s": sum(len(g.token_ids) for g in plain) / plain_s,
            "fast_tok_s": tokens / fast_s}
        if rows == 1:   # one request at a time: each answer's own time, summed per task
            out["per_task"] = {
                task: _answer_s([g for g, s in zip(plain, samples, strict=True)
                                 if s["task"] == task])
                / _answer_s([g for g, s in zip(fast, samples, strict=True)
                             if s["task"] == task])
                for task in sorted({s["task"] for s in samples})}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--engines", nargs="*", type=Path, default=[],
                    help="also measure these engine directories")
    ap.add_argument("--no-demo", action="store_true", help="skip the demo model")
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    args = ap.parse_args(argv)
    from rung.export.exporter import ExportOptions, export

    samples = corpus(args.n, seed=1000)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, gates in (() if args.no_demo else (
                ("demo model, no FFN gates", "off"),
                ("demo model, trained FFN gates", "trained"))):
            engine_dir = Path(tmp) / gates
            export(ROOT / "models" / "edge-tiny", engine_dir, ExportOptions(ffn_skip=gates))
            results[name] = measure(engine_dir, samples)
    for engine_dir in args.engines:
        m = load_engine(engine_dir).manifest
        results[f"{engine_dir.name} ({m.weights}, {m.kv.dtype} KV)"] = measure(engine_dir,
                                                                              samples)
    stamp = (time.strftime("%Y-%m-%d") + "-fast-decode" + ("-engines" if args.no_demo else "")
             + (f"-{args.tag}" if args.tag else ""))
    record = {"stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
              "machine": machine_info(), "n": args.n, "results": results}
    lines = [f"# Fast decoding {stamp} ({args.n} held-out requests, greedy)", "",
             f"Command: `{record['command']}`", "",
             "| engine | rows | plain s | fast s | speedup | identical | steps plain / fast "
             "| drafted | forced | accepted | tok/s plain / fast |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, by_rows in results.items():
        for rows, r in by_rows.items():
            if not rows.startswith("rows"):
                continue
            lines.append(f"| {name} | {rows[4:]} | {r['plain_s']:.2f} | {r['fast_s']:.2f} | "
                         f"{r['speedup']:.2f}x | {r['identical']}/{r['answers']} | "
                         f"{r['plain_steps']} / {r['fast_steps']} | {r['drafted']} | "
                         f"{r['forced']} | {r['accepted']} | {r['plain_tok_s']:.0f} / "
                         f"{r['fast_tok_s']:.0f} |")
    lines += ["", "Answer time plain / fast per task, one request at a time:", "",
              "| engine | " + " | ".join(TASK_ORDER) + " |", "|---|" + "---|" * len(TASK_ORDER)]
    for name, by_rows in results.items():
        per = by_rows["per_task"]
        lines.append(f"| {name} | " + " | ".join(
            f"{per[t]:.2f}x" if t in per else "-" for t in TASK_ORDER) + " |")
    for name, by_rows in results.items():
        if "unpadded_plain" in by_rows:
            u, r1 = by_rows["unpadded_plain"], by_rows["rows1"]
            lines += ["", f"{name}: plain with lone tokens unpadded (as before padded steps) "
                      f"{u['s']:.2f} s ({u['tok_s']:.0f} tok/s); fast against it "
                      f"{u['s'] / r1['fast_s']:.2f}x at one row"]
    report.publish(RESULTS, record, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
