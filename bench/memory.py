"""Load time, peak RSS and speed of one engine with ONNX Runtime's weight prepacking on/off.

    .venv/bin/python bench/memory.py [--preset qwen2.5-0.5b] [--kind rung] [--threads 2]
                                     [--prompt 214] [--tokens 64] [--repeats 3]

Each configuration runs in a fresh process (peak RSS is per process): load the engine,
prefill a ``--prompt``-token prompt, decode ``--tokens`` greedy tokens; median of
``--repeats`` runs. Reports load seconds, peak RSS against weight bytes + KV cache bytes
(the target is at most 1.2x), prefill and decode tokens/s. Writes
``bench/results/<date>-memory-<preset>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import artifacts
import machine
import report

RESULTS = Path(__file__).resolve().parent / "results"


def child(path: Path, prepack: bool, threads: int, prompt: int, tokens: int) -> dict[str, Any]:
    import numpy as np

    from rung.engines import load_engine
    from rung.engines.generate import generate
    from rung.engines.onnx_engine import EngineOptions
    from rung.engines.sampler import SamplingParams
    from rung.engines.tokenizer import Tokenizer

    t0 = time.perf_counter()
    engine = load_engine(path, "onnx", EngineOptions(threads=threads, prepack=prepack))
    tok = Tokenizer.load(path, engine.manifest.tokenizer)
    load_s = time.perf_counter() - t0
    ids = np.random.default_rng(0).integers(10, engine.manifest.dims.vocab_size - 10,
                                            prompt).tolist()
    cache = engine.new_cache(1, prompt + tokens + 8)
    t1 = time.perf_counter()
    (g,) = generate(engine, tok, [ids], SamplingParams(max_tokens=tokens), cache=cache)
    weights = sum(f.stat().st_size for f in path.iterdir()
                  if f.name.startswith("model.onnx"))
    return {"load_s": load_s, "ttft_ms": g.ttft_ms, "prefill_tok_s": prompt / (g.ttft_ms / 1000),
            "decode_tok_s": g.decode_tok_s, "generated": len(g.token_ids),
            "total_s": time.perf_counter() - t1,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "weights_bytes": weights, "kv_bytes": cache.nbytes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--kind", default="rung")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=214)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("PATH", "PREPACK"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1] == "1", args.threads,
                               args.prompt, args.tokens)))
        return 0
    art = artifacts.locate(args.preset)
    artifacts.build(art, "hf")
    artifacts.build(art, args.kind)
    path = art.path(args.kind)
    rows = []
    for prepack in (True, False):
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(path), str(int(prepack)),
                 "--threads", str(args.threads), "--prompt", str(args.prompt),
                 "--tokens", str(args.tokens)], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["rss_ratio"] = med["peak_rss"] / (med["weights_bytes"] + med["kv_bytes"])
        rows.append({"prepack": prepack, **med})
    record = {"stamp": time.strftime("%Y-%m-%d") + f"-memory-{args.kind}-"
              + args.preset.replace(".", "_"),
              "command": shlex.join(sys.orig_argv), "machine": machine.machine_info(),
              "engine": args.kind, "preset": args.preset, "threads": args.threads,
              "prompt": args.prompt,
              "tokens": args.tokens, "repeats": args.repeats, "rows": rows}
    md = [f"Weight prepacking on/off, {args.preset} ({args.kind}), {args.threads} threads, "
          f"{args.prompt}-token prompt, {args.tokens} tokens, median of {args.repeats} "
          f"processes; `{record['command']}`", "",
          "| prepack | load s | peak RSS GB | RSS / (weights + KV) | prefill tok/s | "
          "decode tok/s |", "|---|---|---|---|---|---|"]
    md += [f"| {'on' if r['prepack'] else 'off'} | {r['load_s']:.2f} | "
           f"{r['peak_rss'] / 2**30:.2f} | {r['rss_ratio']:.2f} | {r['prefill_tok_s']:.0f} | "
           f"{r['decode_tok_s']:.1f} |" for r in rows]
    report.publish(RESULTS, record, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
