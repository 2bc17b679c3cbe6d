"""Time to first token of repeated PLC diagnoses with and without the hot tier.

    .venv/bin/python bench/hot_rows.py [--requests 12] [--points 16]

The daemon's path on the demo engine (models/edge-tiny exported as ``rung serve`` loads
it): the diagnosis task, its prompt head pinned in the cold tier (as ``rung serve`` warms
it), greedy, one row. A PLC triggers the same diagnosis again and again with a few values
changed (the snapshot of a press between two cycles). With the hot tier the row the last
request left still holds its KV, and the next request continues in it from the first
changed token; without it (a fresh decode loop per request) the cold tier restores whole
64-token blocks and the rest is prefilled. Writes ``bench/results/<date>-hot-rows.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
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
from rung.engines.kv_store import ColdStore
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def snapshot(i: int, points: int) -> dict[str, Any]:
    """Cycle ``i`` of a press: the same points, two of them moved."""
    pts = [{"name": f"p{j:02d}_pressure", "value": round(100.0 + j + (i if j in (points - 2,
            points - 1) else 0) * 0.7, 1), "unit": "bar",
            "limits": {"low_alert": 80.0, "low_alarm": 60.0}} for j in range(points)]
    return {"asset": "Hydraulic press 1, line 3", "description": "Cycle report.",
            "points": pts}


def run(engine_dir: Path, requests: int, points: int, hot: bool) -> dict[str, Any]:
    engine = load_engine(engine_dir)
    m = engine.manifest
    tok = Tokenizer.load(engine_dir, m.tokenizer)
    prefix = PrefixCache(ColdStore(m.engine_id, 64 << 20), m.engine_id)
    runner = TaskRunner(engine, tok, load_tasks(), engine_dir, prefix=prefix)
    runner.warm()
    task = runner.tasks["diagnosis"]
    decoder = BatchDecoder(engine, tok, 1, prefix)
    ttft, cached, prompt = [], [], 0
    for i in range(requests):
        if not hot:
            decoder = BatchDecoder(engine, tok, 1, prefix)
        ids = runner.prompt_ids(task, snapshot(i, points))
        decoder.add(i, ids, SamplingParams(max_tokens=1))
        while not (done := decoder.step()):
            pass
        [(_, g)] = done
        if i:   # the first request has nothing to share yet
            ttft.append(g.ttft_ms)
            cached.append(g.cached_tokens)
        prompt = len(ids)
    return {"ttft_ms_median": statistics.median(ttft), "ttft_ms_all": ttft,
            "cached_tokens_median": statistics.median(cached), "prompt_tokens": prompt}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--points", type=int, default=16)
    args = ap.parse_args(argv)
    from rung.export.exporter import ExportOptions, export

    with tempfile.TemporaryDirectory() as tmp:
        engine_dir = Path(tmp) / "engine"
        export(ROOT / "models" / "edge-tiny", engine_dir, ExportOptions())
        results = {name: run(engine_dir, args.requests, args.points, hot)
                   for name, hot in (("hot tier", True), ("cold tier only", False))}
    stamp = time.strftime("%Y-%m-%d") + "-hot-rows"
    record = {"stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
              "machine": machine_info(), "requests": args.requests, "points": args.points,
              "results": results}
    base = results["cold tier only"]["ttft_ms_median"]
    lines = [f"# Hot tier {stamp} (demo engine, diagnosis, {args.points} points)", "",
             f"Command: `{record['command']}`", "",
             "| path | TTFT ms (median) | cached prompt tokens (median) | prompt tokens | "
             "TTFT vs cold only |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['ttft_ms_median']:.1f} | {r['cached_tokens_median']:.0f}"
                     f" | {r['prompt_tokens']} | {r['ttft_ms_median'] / base:.2f}x |")
    report.publish(RESULTS, record, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
