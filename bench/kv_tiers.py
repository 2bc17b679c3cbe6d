"""Time to first token with the KV tiers, and the cold tier's compression, on the bench model.

    .venv/bin/python bench/kv_tiers.py [--prefix 1024] [--suffix 16]

A request = a 1,024-token prefix shared with an earlier request + a short new suffix.
TTFT (prefill of what is not cached + the first token) when the prefix is (a) not cached,
(b) in the cold tier in RAM, (c) in the cold tier on disk after a restart (a new store on
the same state directory), (d) in a row of the decode loop that still holds it (the hot
tier: the row the earlier request left). Then compression ratio and MB/s of the cold
tier for fp32, fp16 and fp8 KV at two zstd levels. Writes
``bench/results/<date>-kv-tiers.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import artifacts
import numpy as np
import report

from rung.engines import AnyEngine, load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.generate import generate
from rung.engines.kv_store import ColdStore
from rung.engines.onnx_engine import EngineOptions
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = {"fp32": "rung", "fp16": "rung-kv16", "fp8": "rung-kv8"}


def ttft(engine: AnyEngine, tok: Tokenizer, prompt: list[int], **kw: Any) -> tuple[float, int]:
    (g,) = generate(engine, tok, [prompt], SamplingParams(max_tokens=1), **kw)
    return g.ttft_ms, g.cached_tokens


def tiers(engine: AnyEngine, tok: Tokenizer, prefix_len: int, suffix: int,
          state: Path) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    vocab = engine.manifest.dims.vocab_size
    shared = rng.integers(0, vocab, prefix_len).tolist()
    first = shared + rng.integers(0, vocab, suffix).tolist()
    second = shared + rng.integers(0, vocab, suffix).tolist()
    eid = engine.manifest.engine_id
    out: dict[str, Any] = {}
    out["a_not_cached_ms"], _ = ttft(engine, tok, second)
    store = ColdStore(eid, 1 << 30, level=3, state_dir=state)
    prefix = PrefixCache(store, eid)
    ttft(engine, tok, first, prefix=prefix)                         # fills the tiers
    out["b_cold_ram_ms"], out["b_cached_tokens"] = ttft(engine, tok, second, prefix=prefix)
    t0 = time.perf_counter()
    restarted = ColdStore(eid, 1 << 30, level=3, state_dir=state)   # "after a restart"
    out["c_startup_index_ms"] = (time.perf_counter() - t0) * 1000
    out["c_cold_disk_ms"], out["c_cached_tokens"] = ttft(
        engine, tok, second, prefix=PrefixCache(restarted, eid))
    out["c_disk_hits"] = restarted.stats()["hits_disk"]
    decoder = BatchDecoder(engine, tok, 1)
    for tag, prompt in (("first", first), ("second", second)):   # the same row, in turn
        decoder.add(tag, prompt, SamplingParams(max_tokens=1))
        while not (done := decoder.step()):
            pass
    [(_, g)] = done
    out["d_hot_ms"], out["d_cached_tokens"] = g.ttft_ms, g.cached_tokens
    for k in ("b_cold_ram_ms", "c_cold_disk_ms", "d_hot_ms"):
        out[k.replace("_ms", "_pct_of_a")] = 100.0 * out[k] / out["a_not_cached_ms"]
    out["store"] = store.stats()
    return out


def compression(engine: AnyEngine, tok: Tokenizer, prefix_len: int) -> dict[str, Any]:
    """Fill a cache with a real prefill, then put its blocks at two levels."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, engine.manifest.dims.vocab_size, prefix_len + 1).tolist()
    out: dict[str, Any] = {}
    for level in (1, 3):
        store = ColdStore(engine.manifest.engine_id, 1 << 30, level=level)
        prefix = PrefixCache(store, engine.manifest.engine_id)
        cache = engine.new_cache(1, prefix_len + 8)
        engine.forward(cache, np.array([prompt]), np.array([len(prompt)]))
        prefix.save(cache, 0, prompt)
        t0 = time.perf_counter()
        restore = engine.new_cache(1, prefix_len + 8)
        prefix.restore(restore, 0, prompt)
        s = store.stats()
        out[f"level{level}"] = {"ratio": s["compression_ratio"], "compress_mb_s":
                                s["compress_mb_s"], "decompress_mb_s": s["decompress_mb_s"],
                                "restore_ms": (time.perf_counter() - t0) * 1000,
                                "blocks": s["entries_ram"],
                                "raw_mb": s["bytes_raw"] / 1e6}
    return out


def markdown(r: dict[str, Any]) -> str:
    t = r["tiers"]
    lines = [f"# KV tiers {r['stamp']} ({r['model']}, fp32 KV)", "",
             f"Command: `{r['command']}`", "",
             f"TTFT of a request whose {r['prefix']}-token prefix is cached, + "
             f"{r['suffix']} new tokens:", "",
             "| prefix is | TTFT ms | % of not cached | cached tokens |", "|---|---|---|---|",
             f"| (a) not cached | {t['a_not_cached_ms']:.0f} | 100 % | 0 |",
             f"| (b) cold tier, RAM | {t['b_cold_ram_ms']:.0f} | "
             f"{t['b_cold_ram_pct_of_a']:.1f} % | {t['b_cached_tokens']} |",
             f"| (c) cold tier, disk after restart | {t['c_cold_disk_ms']:.0f} | "
             f"{t['c_cold_disk_pct_of_a']:.1f} % | {t['c_cached_tokens']} |",
             f"| (d) hot row | {t['d_hot_ms']:.0f} | {t['d_hot_pct_of_a']:.1f} % | "
             f"{t['d_cached_tokens']} |", "",
             f"Start-up indexing of the state directory (c): {t['c_startup_index_ms']:.0f} ms.",
             "", "| KV | zstd level | ratio | compress MB/s | decompress MB/s | restore ms "
             f"({r['prefix']} tokens) | raw MB |", "|---|---|---|---|---|---|---|"]
    for kv, levels in r["compression"].items():
        for lv, c in levels.items():
            lines.append(f"| {kv} | {lv[5:]} | {c['ratio']:.3f} | {c['compress_mb_s']:.0f} | "
                         f"{c['decompress_mb_s']:.0f} | {c['restore_ms']:.1f} | "
                         f"{c['raw_mb']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--prefix", type=int, default=1024)
    p.add_argument("--suffix", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    art, errors = artifacts.ensure(args.preset, tuple(KINDS.values()))
    if errors:
        sys.exit(f"kv_tiers: build failed: {errors}")
    opts = EngineOptions(threads=args.threads)
    record: dict[str, Any] = {"stamp": time.strftime("%Y-%m-%d") + "-kv-tiers",
                              "command": shlex.join(sys.orig_argv), "model": args.preset,
                              "prefix": args.prefix, "suffix": args.suffix, "compression": {}}
    for kv, kind in KINDS.items():
        engine = load_engine(art.path(kind), "onnx", opts)
        tok = Tokenizer.load(art.path(kind), engine.manifest.tokenizer)
        if kv == "fp32":
            state = Path(tempfile.mkdtemp(prefix="rung-kv-tiers-"))
            try:
                record["tiers"] = tiers(engine, tok, args.prefix, args.suffix, state)
            finally:
                shutil.rmtree(state, ignore_errors=True)
            print(f"kv_tiers: {record['tiers']}", file=sys.stderr)
        record["compression"][kv] = compression(engine, tok, args.prefix)
        print(f"kv_tiers: {kv}: {record['compression'][kv]}", file=sys.stderr)
    report.write_record(args.out, record, markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
