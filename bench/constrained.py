"""Cost and reliability of schema-constrained decoding (llguidance masks on numpy).

For each model: per-token mask time (mean, p99) next to the decode step time, and the
end-to-end overhead of constrained against unconstrained decoding of the same number of
tokens; on the tiny model, the schema-valid rate of N seeded generations per built-in task
(every answer must be schema-valid JSON or an explicit ``truncated``).

    .venv/bin/python bench/constrained.py [--generations 200]

Writes ``bench/results/<date>-constrained.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import artifacts
import numpy as np
import report

from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.generate import generate
from rung.engines.onnx_engine import EngineOptions
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
INPUTS = {
    "st_code": {"description": "Motor start/stop with interlock and a 5 s start delay"},
    "fault_tree": {"top_event": "Press loses pressure", "system": "Hydraulic press, line 3",
                   "points": [{"name": "oil_temp", "value": 91.0, "unit": "degC"}]},
    "diagnosis": {"asset": "Pump 3", "points": [
        {"name": "oil_temp", "value": 91.0, "unit": "degC",
         "limits": {"alert": 70, "alarm": 85}},
        {"name": "pressure", "value": 95.0, "unit": "bar",
         "limits": {"low_alarm": 80, "low_alert": 100}}]},
}


def overhead(runner: TaskRunner, tokens: int, reps: int) -> dict[str, Any]:
    """Same prompts, ``tokens`` each, with and without the task's constraint."""
    engine, tok = runner.engine, runner.tokenizer
    out: dict[str, Any] = {}
    for task, data in INPUTS.items():
        ids = runner.prompt_ids(runner.tasks[task], data)
        params = SamplingParams(temperature=1.0, seed=0, max_tokens=tokens)
        times: dict[str, list[float]] = {"free": [], "constrained": []}
        masks: list[float] = []
        for _ in range(reps):
            for mode in times:
                cons = ([runner.compiler.constraint(runner.grammars[task])]
                        if mode == "constrained" else None)
                t0 = time.perf_counter()
                (g,) = generate(engine, tok, [ids], params, constraints=cons)
                times[mode].append((time.perf_counter() - t0) / len(g.token_ids))
                masks += g.mask_seconds or []
        free, cons_t = float(np.median(times["free"])), float(np.median(times["constrained"]))
        out[task] = {"step_ms_free": free * 1e3, "step_ms_constrained": cons_t * 1e3,
                     "mask_us_mean": float(np.mean(masks)) * 1e6,
                     "mask_us_p99": float(np.percentile(masks, 99)) * 1e6,
                     "overhead_pct": (cons_t / free - 1.0) * 100.0, "tokens": len(masks)}
        print(f"constrained: {task}: {out[task]}", file=sys.stderr)
    return out


def valid_rate(runner: TaskRunner, n: int, batch: int = 20) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for task, data in INPUTS.items():
        counts = {"schema_valid": 0, "semantically_valid": 0, "truncated": 0,
                  "invalid_json_or_schema": 0}
        for start in range(0, n, batch):
            seeds = range(start, min(n, start + batch))
            res = runner.run([(task, data)] * len(seeds),
                             [SamplingParams(temperature=1.0, seed=s) for s in seeds])
            for r in res:
                if r.error and r.error["code"] == "truncated":
                    counts["truncated"] += 1
                elif r.validation and r.validation["schema"]["ok"]:
                    counts["schema_valid"] += 1
                    counts["semantically_valid"] += int(r.ok)
                else:
                    counts["invalid_json_or_schema"] += 1
        out[task] = counts
        print(f"constrained: {task}: {counts}", file=sys.stderr)
    return out


def runner_for(preset: str, threads: int) -> TaskRunner:
    art, errors = artifacts.ensure(preset, ("rung",))
    if errors:
        sys.exit(f"constrained: build failed: {errors}")
    engine = load_engine(art.path("rung"), "onnx", EngineOptions(threads=threads))
    tok = Tokenizer.load(art.path("rung"), engine.manifest.tokenizer)
    return TaskRunner(engine, tok, load_tasks(), art.path("rung"))


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# Constrained decoding {record['stamp']}", "", f"Command: `{record['command']}`",
             "", "| model (vocab) | task | decode step ms (free) | step ms (constrained) | "
             "mask µs mean | mask µs p99 | overhead |", "|---|---|---|---|---|---|---|"]
    for model, rows in record["overhead"].items():
        for task, r in rows.items():
            lines.append(f"| {model} ({record['vocab'][model]}) | {task} | "
                         f"{r['step_ms_free']:.2f} | {r['step_ms_constrained']:.2f} | "
                         f"{r['mask_us_mean']:.0f} | {r['mask_us_p99']:.0f} | "
                         f"{r['overhead_pct']:+.1f}% |")
    if "valid_rate" not in record:
        return "\n".join(lines) + "\n"
    lines += ["", f"Schema-valid rate, {record['generations']} seeded generations per task "
              f"(temperature 1.0) on {record['valid_model']}:", "",
              "| task | schema-valid | of which semantically valid | truncated | "
              "invalid JSON/schema |", "|---|---|---|---|---|"]
    for task, c in record["valid_rate"].items():
        lines.append(f"| {task} | {c['schema_valid']} | {c['semantically_valid']} | "
                     f"{c['truncated']} | {c['invalid_json_or_schema']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generations", type=int, default=200)
    p.add_argument("--tokens", type=int, default=48, help="tokens per overhead run")
    p.add_argument("--models", default="demo-tiny,qwen2.5-0.5b")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    models = args.models.split(",")
    record: dict[str, Any] = {"stamp": time.strftime("%Y-%m-%d") + "-constrained",
                              "command": shlex.join(sys.orig_argv), "overhead": {},
                              "vocab": {}, "generations": args.generations,
                              "valid_model": models[0]}
    for i, model in enumerate(models):
        runner = runner_for(model, args.threads)
        record["vocab"][model] = runner.engine.manifest.dims.vocab_size
        record["overhead"][model] = overhead(runner, args.tokens, 3 if i == 0 else 1)
        if i == 0 and args.generations > 0:
            record["valid_rate"] = valid_rate(runner, args.generations)
        del runner
    report.write_record(args.out, record, markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
