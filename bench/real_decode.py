"""Decode speed on the real checkpoint (SmolLM2-135M-Instruct): rung engines against
llama.cpp running GGUF files of the same weights, 2 threads each, one sequence, greedy.

Each run: a 128-token prompt of real text, then 64 decode steps one token at a time;
median of 3 runs, decode tok/s over the 64 steps.

    python bench/real_decode.py ENGINE_DIR... [--gguf FILE...] [--out bench/results/X.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rung.engines import engine_options, load_engine  # noqa: E402
from rung.engines.tokenizer import Tokenizer  # noqa: E402
from rung.export.prompts import CALIBRATION, HELD_OUT  # noqa: E402

PROMPT, STEPS, RUNS = 128, 64, 3


def prompt_ids(tok: Tokenizer) -> list[int]:
    ids = tok.encode("\n\n".join(HELD_OUT + CALIBRATION), add_bos=False)
    return ids[:PROMPT]


def rung_decode(engine_dir: Path) -> dict[str, Any]:
    engine = load_engine(engine_dir, "onnx", engine_options("onnx", threads=2))
    tok = Tokenizer.load(engine_dir, engine.manifest.tokenizer)
    ids = prompt_ids(tok)
    rates = []
    for _ in range(RUNS):
        cache = engine.new_cache(1)
        logits = engine.forward(cache, np.array([ids]), np.array([len(ids)]))
        t0 = time.perf_counter()
        for _ in range(STEPS):
            nxt = np.array([[int(logits[0, -1].argmax())]])
            logits = engine.forward(cache, nxt, np.ones(1, np.int64))
        rates.append(STEPS / (time.perf_counter() - t0))
    m = engine.manifest
    return {"engine": f"rung {engine_dir.name}", "weights": m.weights, "kv": m.kv.dtype,
            "decode_tok_s": statistics.median(rates)}


def llama_decode(path: Path, ids: list[int]) -> dict[str, Any]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, n_threads=2,
                          n_threads_batch=2, verbose=False)
    vocab = llm.n_vocab()
    rates = []
    for _ in range(RUNS):
        llm.reset()
        for token in ids:  # batched prompts of quantized GGUFs crash llama-cpp-python 0.3.36
            llm.eval([token])  # on this AMX CPU (a segfault in decode); one at a time works
        t0 = time.perf_counter()
        for _ in range(STEPS):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                           shape=(vocab,))
            llm.eval([int(logits.argmax())])
        rates.append(STEPS / (time.perf_counter() - t0))
    return {"engine": f"llama.cpp {path.name}", "decode_tok_s": statistics.median(rates)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("engines", nargs="*", type=Path)
    ap.add_argument("--gguf", nargs="*", type=Path, default=[])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = [rung_decode(e) for e in args.engines]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.gguf:
        first = args.engines[0] if args.engines else None
        if first is None:
            raise SystemExit("give one rung engine first: its tokenizer makes the prompt")
        engine = load_engine(first)
        ids = prompt_ids(Tokenizer.load(first, engine.manifest.tokenizer))
        for path in args.gguf:
            rows.append(llama_decode(path, ids))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"prompt_tokens": PROMPT, "steps": STEPS,
                                        "runs": RUNS, "threads": 2, "rows": rows},
                                       indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
