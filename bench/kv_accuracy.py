"""Accuracy of the fp16 and fp8 KV caches against fp32 KV, on the bench model.

The fp32-KV engine generates greedily from N random prompts (one batch); the fp16/fp8-KV
engines run in lockstep, fed exactly those tokens, so every step compares next-token
logits at the same position. Reports max / mean relative logit error, mean KL divergence
and greedy agreement (a weak signal on random weights), and KV bytes per token.

    .venv/bin/python bench/kv_accuracy.py [--prompts 50] [--tokens 64] [--prompt-len 32]

Writes ``bench/results/<date>-kv-accuracy.{json,md}``.
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

from rung.engines import AnyEngine, load_engine
from rung.engines.onnx_engine import EngineOptions
from rung.export.verify import logit_metrics

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = {"fp32": "rung", "fp16": "rung-kv16", "fp8": "rung-kv8"}


def lockstep(engines: dict[str, AnyEngine], prompts: np.ndarray,
             tokens: int) -> dict[str, list[dict[str, float]]]:
    """Greedy generation with the fp32 engine (the first); every other engine is fed the
    same tokens. Per step, each engine's logit metrics against fp32 (one step at a time:
    the logits of a whole run do not fit in memory at a 152k vocabulary)."""
    n, plen = prompts.shape
    caches = {kv: e.new_cache(n, plen + tokens) for kv, e in engines.items()}
    feed, lens = prompts, np.full(n, plen)
    per_step: dict[str, list[dict[str, float]]] = {kv: [] for kv in engines}
    for _ in range(tokens):
        logits = {kv: e.forward(caches[kv], feed, lens)[:, -1] for kv, e in engines.items()}
        ref = logits["fp32"]
        for kv, got in logits.items():
            per_step[kv].append(logit_metrics(ref, got))
        feed, lens = ref.argmax(-1)[:, None], np.ones(n, np.int64)
    return per_step


def aggregate(steps: list[dict[str, float]]) -> dict[str, float]:
    return {"max_rel_logit_err": max(s["max_rel_logit_err"] for s in steps),
            "mean_rel_logit_err": float(np.mean([s["mean_rel_logit_err"] for s in steps])),
            "mean_kl": float(np.mean([s["mean_kl"] for s in steps])),
            "greedy_agreement": float(np.mean([s["greedy_agreement"] for s in steps]))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--prompts", type=int, default=50)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    art, errors = artifacts.ensure(args.preset, tuple(KINDS.values()))
    if errors:
        sys.exit(f"kv_accuracy: build failed: {errors}")
    opts = EngineOptions(threads=args.threads)
    engines = {kv: load_engine(art.path(kind), "onnx", opts) for kv, kind in KINDS.items()}
    vocab = engines["fp32"].manifest.dims.vocab_size
    prompts = np.random.default_rng(0).integers(0, vocab, (args.prompts, args.prompt_len))
    t0 = time.perf_counter()
    per_step = lockstep(engines, prompts, args.tokens)
    print(f"kv_accuracy: {args.prompts} x {args.tokens} tokens in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows: dict[str, Any] = {}
    for kv, engine in engines.items():
        m = engine.manifest
        rows[kv] = dict(bytes_per_token=m.kv.bytes_per_token(m.dims),
                        **aggregate(per_step[kv]))
    record = dict(stamp=time.strftime("%Y-%m-%d") + "-kv-accuracy",
                  command=shlex.join(sys.orig_argv), model=args.preset,
                  prompts=args.prompts, tokens=args.tokens, prompt_len=args.prompt_len,
                  machine=machine.machine_info(), results=rows)
    report.write_record(args.out, record, markdown(record))
    print(markdown(record))
    return 0


def markdown(record: dict[str, Any]) -> str:
    fp32 = record["results"]["fp32"]["bytes_per_token"]
    lines = [f"# KV cache accuracy {record['stamp']} ({record['model']})", "",
             f"Command: `{record['command']}`", "",
             f"{record['prompts']} random prompts of {record['prompt_len']} tokens, "
             f"{record['tokens']} greedy tokens each generated with fp32 KV; the other KV "
             "dtypes fed the same tokens in lockstep.", "",
             "| KV | bytes/token | vs fp32 | max rel logit err | mean rel logit err | "
             "mean KL | greedy agreement |", "|---|---|---|---|---|---|---|"]
    for kv, r in record["results"].items():
        lines.append(f"| {kv} | {r['bytes_per_token']} | {r['bytes_per_token'] / fp32:.3f} | "
                     f"{r['max_rel_logit_err']:.2e} | {r['mean_rel_logit_err']:.2e} | "
                     f"{r['mean_kl']:.2e} | {r['greedy_agreement']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
