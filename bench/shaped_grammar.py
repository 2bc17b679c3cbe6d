"""What the per-request grammars cost: build time per request, mask time per token.

For each task, held-out corpus requests and the hand-written ones
(``tests/data/handwritten.json``) answered greedy, one at a time, on the demo engine as
``rung serve`` loads it, once with the task's published schema only and once shaped
(``daemon/tasks/shaping.py``: narrowed schemas, the answer's computed start, the fault
tree's declared events and the ST answer's names and body grammar, built while decoding).
Reports per task: answers valid, grammar build ms per request (the narrowed schema before
the first token, plus every restage while decoding: compiling the new grammar and
replaying the answer so far), restages per answer, mask µs per token (mean, p99) and
seconds per answer.

    cd bench && ../.venv/bin/python shaped_grammar.py [--n 60] [--tag NAME]

Writes ``bench/results/<date>-shaped-grammar.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import machine
import numpy as np
import report

from rung.daemon.tasks.runner import Prepared, TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.generate import generate
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from rung.export.exporter import ExportOptions, export
from rung.tools.corpus import generate as corpus

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TASKS = ("st_code", "fault_tree", "diagnosis")


def answer(runner: TaskRunner, task: str, data: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    prepared = runner.prepare(task, data, SamplingParams())
    assert isinstance(prepared, Prepared), prepared
    (gen,) = generate(runner.engine, runner.tokenizer, [prepared.ids], prepared.params,
                      constraints=[prepared.constraint])
    result = runner.finish(prepared, gen)
    c = prepared.constraint
    return {"ok": result.ok, "s": time.perf_counter() - t0,
            "grammar_ms": prepared.grammar_ms + c.restage_seconds * 1e3,
            "restages": c.restages, "masks": list(c.mask_seconds)}


def measure(runner: TaskRunner, requests: dict[str, list[Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for task in TASKS:
        rows = [answer(runner, task, data) for data in requests[task]]
        masks = [m for r in rows for m in r["masks"]]
        out[task] = {"n": len(rows), "valid": sum(r["ok"] for r in rows) / len(rows),
                     "grammar_ms_mean": float(np.mean([r["grammar_ms"] for r in rows])),
                     "grammar_ms_max": float(np.max([r["grammar_ms"] for r in rows])),
                     "restages_mean": float(np.mean([r["restages"] for r in rows])),
                     "mask_us_mean": float(np.mean(masks)) * 1e6,
                     "mask_us_p99": float(np.percentile(masks, 99)) * 1e6,
                     "s_mean": float(np.mean([r["s"] for r in rows]))}
        print(f"shaped_grammar: {task}: {out[task]}", file=sys.stderr)
    return out


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# Per-request grammars {record['stamp']}", "", f"Command: `{record['command']}`",
             "", "Machine: {cpu_model}, {cpus_usable} CPUs ({simd}); demo engine (gates as "
             "trained, fp8 KV), greedy, one request at a time.".format(
                 **{**record["machine"], "simd": ", ".join(record["machine"]["simd"])}), "",
             "| requests | grammar | task | valid | grammar build ms per request (mean / max) "
             "| restages per answer | mask µs per token (mean / p99) | s per answer |",
             "|---|---|---|---|---|---|---|---|"]
    for inputs, by_mode in record["results"].items():
        for mode, rows in by_mode.items():
            for task, r in rows.items():
                lines.append(
                    f"| {inputs} ({r['n']}) | {mode} | {task} | {r['valid']:.0%} | "
                    f"{r['grammar_ms_mean']:.1f} / {r['grammar_ms_max']:.1f} | "
                    f"{r['restages_mean']:.1f} | {r['mask_us_mean']:.0f} / "
                    f"{r['mask_us_p99']:.0f} | {r['s_mean']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=60, help="held-out corpus requests (all tasks)")
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--tag", default="", help="appended to the results' file name")
    args = p.parse_args(argv)
    held_out: dict[str, list[Any]] = {t: [] for t in TASKS}
    for s in corpus(args.n, seed=args.seed):
        held_out[s["task"]].append(s["input"])
    hand = json.loads((ROOT / "tests" / "data" / "handwritten.json").read_text("utf-8"))
    record: dict[str, Any] = {"stamp": time.strftime("%Y-%m-%d") + "-shaped-grammar"
                              + (f"-{args.tag}" if args.tag else ""),
                              "command": shlex.join(sys.orig_argv),
                              "machine": machine.machine_info(), "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        engine_dir = Path(tmp) / "demo"
        export(ROOT / "models" / "edge-tiny", engine_dir, ExportOptions())
        engine = load_engine(engine_dir)
        tok = Tokenizer.load(engine_dir, engine.manifest.tokenizer)
        runners = {"schema only": TaskRunner(engine, tok, load_tasks(), engine_dir,
                                             shaped=False),
                   "shaped": TaskRunner(engine, tok, load_tasks(), engine_dir)}
        for inputs, requests in (("held-out corpus", held_out), ("hand-written", hand)):
            record["results"][inputs] = {mode: measure(r, {t: requests[t] for t in TASKS})
                                         for mode, r in runners.items()}
    report.publish(args.out, record, markdown(record).splitlines())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
