"""Throughput of continuous batching: N concurrent requests decoded together.

    .venv/bin/python bench/batching.py [--preset qwen2.5-0.5b] [--kind rung] [--tokens 64]
                                       [--prompt 128] [--concurrency 1,2,4,8] [--threads 2]
                                       [--engine DIR]

For each N, N sequences with different random prompts of ``--prompt`` tokens join a
``BatchDecoder`` of N rows (the scheduler's engine loop) and each generates ``--tokens``
tokens (greedy; random weights make an early end-of-sequence rare, and the count is of the
tokens actually generated). Reports aggregate decode tokens/s (all rows together, prefill
excluded), per-sequence tokens/s, and the ratio to N = 1. One engine, loaded once, in this
process. Writes ``bench/results/<date>-batching-<preset>.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import artifacts
import machine
import numpy as np
import report

from rung.engines import load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.onnx_engine import EngineOptions
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

RESULTS = Path(__file__).resolve().parent / "results"


def measure(engine: Any, tok: Tokenizer, n: int, prompt: int, tokens: int) -> dict[str, Any]:
    rng = np.random.default_rng(n)
    vocab = engine.manifest.dims.vocab_size
    dec = BatchDecoder(engine, tok, rows=n)
    for i in range(n):
        dec.add(i, rng.integers(10, vocab - 10, prompt).tolist(),
                SamplingParams(max_tokens=tokens))
    dec.step()                                  # the prefill of every row, together
    t0 = time.perf_counter()
    generated = n                               # the prefill step sampled one token per row
    steps = 0
    while dec.active:
        done = dec.step()
        steps += 1
        generated += dec.active + len(done)
    dt = time.perf_counter() - t0
    decoded = generated - n
    return {"n": n, "steps": steps, "seconds": round(dt, 3),
            "aggregate_tok_s": round(decoded / dt, 2),
            "per_sequence_tok_s": round(decoded / dt / n, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--kind", default="rung", help="bench artifact (rung, rung-kv8, ...)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prepack", choices=["auto", "on", "off"], default="auto",
                    help="weight prepacking (auto: as the daemon chooses for max_batch = the "
                    "largest concurrency)")
    ap.add_argument("--engine", type=Path, help="an engine directory to measure instead of "
                    "the bench artifact (e.g. one exported by another revision); --kind names "
                    "it in the record")
    args = ap.parse_args(argv)
    if args.engine is not None:
        path = args.engine
    else:
        art = artifacts.locate(args.preset)
        artifacts.build(art, "hf")
        artifacts.build(art, args.kind)
        path = art.path(args.kind)
    most = max(int(n) for n in args.concurrency.split(","))
    prepack = {"auto": None, "on": True, "off": False}[args.prepack]
    engine = load_engine(path, "onnx", EngineOptions(threads=args.threads, prepack=prepack,
                                                     max_batch=most))
    tok = Tokenizer.load(path, engine.manifest.tokenizer)
    measure(engine, tok, 1, 16, 4)              # warm-up
    rows = [measure(engine, tok, int(n), args.prompt, args.tokens)
            for n in args.concurrency.split(",")]
    base = rows[0]["aggregate_tok_s"]
    for r in rows:
        r["ratio_to_1"] = round(r["aggregate_tok_s"] / base, 2)
    name = args.kind + ("" if args.prepack == "auto" else f"-prepack-{args.prepack}")
    record = {"stamp": f"{time.strftime('%Y-%m-%d')}-batching-{name}-"
                       + args.preset.replace(".", "_"),
              "command": shlex.join(sys.orig_argv), "machine": machine.machine_info(),
              "engine": args.kind, "preset": args.preset, "threads": args.threads,
              "prepack": args.prepack,
              "prompt": args.prompt, "tokens": args.tokens, "rows": rows}
    md = [f"Continuous batching, {args.preset} ({args.kind}), {args.threads} threads, "
          f"{args.prompt}-token prompts, {args.tokens} tokens each; `{record['command']}`",
          "", "| concurrent | aggregate decode tok/s | per sequence tok/s | ratio to 1 |",
          "|---|---|---|---|"]
    md += [f"| {r['n']} | {r['aggregate_tok_s']} | {r['per_sequence_tok_s']} | "
           f"{r['ratio_to_1']}x |" for r in rows]
    report.publish(RESULTS, record, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
