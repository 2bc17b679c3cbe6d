"""Accuracy of the fp16 and fp8 KV caches against fp32 KV, on the bench model.

The fp32-KV engine generates greedily from N random prompts (one batch); the fp16/fp8-KV
engines are teacher-forced on exactly those tokens, so every step compares next-token
logits at the same position. Reports max / mean relative logit error, mean KL divergence
and greedy agreement (a weak signal on random weights), and KV bytes per token.

    .venv/bin/python bench/kv_accuracy.py [--prompts 50] [--tokens 64] [--prompt-len 32]

Writes ``bench/results/<date>-kv-accuracy.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import artifacts
import machine
import numpy as np

from rung.engines import Engine, load_engine
from rung.engines.onnx_engine import EngineOptions
from rung.export.verify import logit_metrics

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = {"fp32": "rung", "fp16": "rung-kv16", "fp8": "rung-kv8"}


def generate(engine: Engine, prompts: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy: (generated ids [N, tokens], logits [N, tokens, V])."""
    n, plen = prompts.shape
    cache = engine.new_cache(n, plen + tokens)
    logits = [engine.forward(cache, prompts, np.full(n, plen))[:, -1]]
    ids = [logits[-1].argmax(-1)]
    for _ in range(tokens - 1):
        logits.append(engine.forward(cache, ids[-1][:, None], np.ones(n, np.int64))[:, -1])
        ids.append(logits[-1].argmax(-1))
    return np.stack(ids, 1), np.stack(logits, 1)


def teacher_forced(engine: Engine, prompts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Logits [N, tokens, V] with the given continuation fed back."""
    n, plen = prompts.shape
    cache = engine.new_cache(n, plen + ids.shape[1])
    logits = [engine.forward(cache, prompts, np.full(n, plen))[:, -1]]
    for t in range(ids.shape[1] - 1):
        logits.append(engine.forward(cache, ids[:, t:t + 1], np.ones(n, np.int64))[:, -1])
    return np.stack(logits, 1)


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
    ref_engine = load_engine(art.path("rung"), "onnx", opts)
    vocab = ref_engine.manifest.dims.vocab_size
    prompts = np.random.default_rng(0).integers(0, vocab, (args.prompts, args.prompt_len))
    t0 = time.perf_counter()
    ids, ref = generate(ref_engine, prompts, args.tokens)
    print(f"kv_accuracy: fp32 generated {ids.size} tokens in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    rows: dict[str, Any] = {}
    for kv, kind in KINDS.items():
        engine = ref_engine if kv == "fp32" else load_engine(art.path(kind), "onnx", opts)
        m = engine.manifest
        got = ref if kv == "fp32" else teacher_forced(engine, prompts, ids)
        rows[kv] = dict(bytes_per_token=m.kv.bytes_per_token(m.dims),
                        **logit_metrics(ref.reshape(-1, vocab), got.reshape(-1, vocab)))
        print(f"kv_accuracy: {kv}: {rows[kv]}", file=sys.stderr)
    record = dict(stamp=time.strftime("%Y-%m-%d") + "-kv-accuracy",
                  command=shlex.join(sys.orig_argv), model=args.preset,
                  prompts=args.prompts, tokens=args.tokens, prompt_len=args.prompt_len,
                  machine=machine.machine_info(), results=rows)
    stem = args.out / record["stamp"]
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(record))
    print(markdown(record))
    return 0


def markdown(record: dict[str, Any]) -> str:
    fp32 = record["results"]["fp32"]["bytes_per_token"]
    lines = [f"# KV cache accuracy {record['stamp']} ({record['model']})", "",
             f"Command: `{record['command']}`", "",
             f"{record['prompts']} random prompts of {record['prompt_len']} tokens, "
             f"{record['tokens']} greedy tokens each generated with fp32 KV; the other KV "
             "dtypes teacher-forced on the same tokens.", "",
             "| KV | bytes/token | vs fp32 | max rel logit err | mean rel logit err | "
             "mean KL | greedy agreement |", "|---|---|---|---|---|---|---|"]
    for kv, r in record["results"].items():
        lines.append(f"| {kv} | {r['bytes_per_token']} | {r['bytes_per_token'] / fp32:.3f} | "
                     f"{r['max_rel_logit_err']:.2e} | {r['mean_rel_logit_err']:.2e} | "
                     f"{r['mean_kl']:.2e} | {r['greedy_agreement']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
