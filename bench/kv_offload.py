"""What offloading a leaving sequence's KV to the cold tier costs the decode step, per block.

    .venv/bin/python bench/kv_offload.py [--label after] [--kv fp32,fp16,fp8] [--dir DIR]

The real decode loop (``BatchDecoder``, ``PrefixCache``, ``ColdStore``) over a stand-in
engine with the bench model's KV shape (Qwen2.5-0.5B: 24 layers, 2 KV heads, head dim 64;
blocks of 64 positions, 1.57 MB in fp32), whose forward only advances the rows' lengths
(the fused kernel appends in place; here the buffers are filled once with KV-like values:
per-channel lognormal scales, outlier channels, normal noise). ``--rows`` sequences decode
together; each has a fresh random prompt, so every block it leaves is new to the store. A
sequence leaves after ``--prompt`` + ``--answer`` positions (8 full blocks by default: the
last answer token's KV is never computed) and its
blocks are offered to the cold tier inside that step (``BatchDecoder._leave`` ->
``PrefixCache.save``), while the other rows wait.

Timed per configuration: the ``save`` call inside the step, per block stored (median, p90
and max over the leaving steps, ``--rounds`` runs pooled, the tiers alternating), and the
step in which a sequence left minus the median step in which none did. Configurations:
``ram`` (a ColdStore without a state directory) and ``disk`` (with one, on the file system of
``--dir``; default: a temporary directory). ``--step-ms`` makes the stand-in engine's step
sleep that long (the GIL released, as ONNX Runtime's run releases it; 0: sequences leave
back to back, the worst case for a background writer). With a background disk writer, the
time it took to drain after the last step (``close``) is recorded too, and its counters
(files written, writes dropped from a full queue). Run it against older code by putting
that code's ``rung`` first on ``PYTHONPATH``: it only uses what both have.

Then one block's offload cut into its parts, each timed alone (median of ``--reps``):
``read_block`` (copy out of the cache), ``encode_block`` (byte planes), zstd level 1,
``pack_record`` (sha256 + header), write + flush of the file, its fsync, ``os.replace``,
the folder's fsync; and ``read_block`` when 8 blocks are kept until a later moment (as the
staging for a background writer keeps them), with the page faults per block either way.
Writes ``bench/results/<date>-kv-offload-<label>.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import report
import zstandard
from machine import machine_info

from rung.engines.batch import BatchDecoder
from rung.engines.kv import KVCache
from rung.engines.kv_disk import Record, pack_record
from rung.engines.kv_store import ColdStore, encode_block
from rung.engines.manifest import TokenizerSpec
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TOKENIZER = ROOT / "models" / "edge-tiny"
ENGINE_ID = "bench-kv-offload-0001"
KV_DTYPES = {"fp32": "float32", "fp16": "float16", "fp8": "float8_e4m3fn"}


class StubEngine:
    """Just enough of an engine for ``BatchDecoder``: KV buffers of a real shape, a forward
    that advances the rows' lengths and prefers one non-EOS token."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_seq: int, vocab: int,
                 dtype: str, step_s: float = 0.0) -> None:
        self.manifest = SimpleNamespace(dims=SimpleNamespace(max_seq=max_seq),
                                        engine_id=ENGINE_ID)
        self.shape = (layers, kv_heads, head_dim)
        self.max_seq, self.vocab, self.dtype, self.step_s = max_seq, vocab, dtype, step_s
        self.ffn_skips = None
        self.ffn_steps = 0
        self.steps = 0

    def new_cache(self, batch: int, max_seq: int | None = None) -> KVCache:
        layers, kv_heads, head_dim = self.shape
        cache = KVCache(layers, batch, max_seq or self.max_seq, kv_heads, head_dim,
                        self.dtype)
        fill_kv_like(cache)
        return cache

    def forward(self, cache: KVCache, tokens: np.ndarray, n_new: np.ndarray,
                index: np.ndarray | None = None, allow_skip: bool = False) -> np.ndarray:
        cache.advance(n_new)
        self.steps += 1
        if self.step_s:
            time.sleep(self.step_s)   # the model's step: the GIL released, as ONNX Runtime's
        k = 1 if index is None else index.shape[1]
        logits = np.zeros((len(n_new), k, self.vocab), np.float32)
        logits[:, :, 7] = 1.0   # never EOS: rows leave at max_tokens
        return logits


def fill_kv_like(cache: KVCache, seed: int = 0) -> None:
    """KV-like values: per-channel lognormal scales, 3 outlier channels x8, normal noise
    (fp8: e4m3 bytes of x / (absmax / 448) and float32 scales)."""
    rng = np.random.default_rng(seed)
    for name, buf in cache.buffers.items():
        if name.endswith("_scale"):
            buf[:] = rng.lognormal(-3.0, 0.3, buf.shape).astype(np.float32)
            continue
        scale = rng.lognormal(0.0, 0.7, buf.shape[-1])
        scale[rng.choice(buf.shape[-1], 3, replace=False)] *= 8
        x = (scale * rng.standard_normal(buf.shape, np.float32)).astype(np.float32)
        if buf.dtype == np.uint8:
            import ml_dtypes

            amax = np.abs(x).max(axis=-1, keepdims=True)
            buf[:] = (x / (amax / 448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        else:
            buf[:] = x.astype(buf.dtype)


def tokenizer() -> Tokenizer:
    spec = TokenizerSpec(files=["tokenizer.json"], chat_template=None, bos_token=None,
                         bos_token_id=None, eos_token_ids=[2], pad_token_id=0,
                         add_bos_token=False)
    return Tokenizer.load(TOKENIZER, spec)


class TimedPrefix(PrefixCache):
    """``PrefixCache`` whose ``save`` (the decode step's offload) is timed."""

    def __init__(self, store: ColdStore, engine_id: str, block: int) -> None:
        super().__init__(store, engine_id, block)
        self.saves: list[tuple[float, int]] = []   # (seconds, blocks stored)

    def save(self, cache: KVCache, row: int, tokens: Any, pinned: bool = False) -> int:
        t0 = time.perf_counter()
        n = super().save(cache, row, tokens, pinned)
        self.saves.append((time.perf_counter() - t0, n))
        return n


def _ms(xs: list[float], q: float) -> float:
    return float(np.quantile(np.array(xs), q) * 1e3) if xs else 0.0


def decode_loop(args: argparse.Namespace, dtype: str, state: Path | None) -> dict[str, Any]:
    """Sequences through the decode loop; the leaving steps' offload timed."""
    engine = StubEngine(args.layers, args.kv_heads, args.head_dim,
                        args.prompt + args.answer + 8, 2048, dtype, args.step_ms / 1e3)
    store = ColdStore(ENGINE_ID, args.ram_mb << 20, state_dir=state)
    prefix = TimedPrefix(store, ENGINE_ID, args.block)
    dec = BatchDecoder(engine, tokenizer(), args.rows, prefix,
                       prefill_chunk=args.prompt * args.rows)
    rng = np.random.default_rng(1)
    params = SamplingParams(max_tokens=args.answer)
    leaving, plain = [], []
    started = 0
    stagger = max(args.answer // args.rows, 1)   # the first rows join apart, so they leave apart
    while started < args.sequences or dec.active:
        if dec.free and started < args.sequences and (
                started >= args.rows or engine.steps >= started * stagger):
            dec.add(started, rng.integers(10, 2000, args.prompt).tolist(), params)
            started += 1
        t0 = time.perf_counter()
        done = dec.step()
        dt = time.perf_counter() - t0
        (leaving if done else plain).append(dt)
    drain = None
    for name in ("close", "flush"):   # a background writer: wait for it to drain
        fn = getattr(store, name, None)
        if fn is not None:
            t0 = time.perf_counter()
            fn()
            drain = time.perf_counter() - t0
            break
    per_block = [s / n for s, n in prefix.saves if n]
    stats = store.stats()
    blocks = sum(n for _, n in prefix.saves)
    raw = stats["bytes_raw"] / max(stats["entries_ram"], 1)
    out: dict[str, Any] = {
        "blocks": blocks, "leaving_steps": len(leaving),
        "offload_ms_per_block_median": _ms(per_block, 0.5),
        "offload_ms_per_block_p90": _ms(per_block, 0.9),
        "offload_ms_per_block_max": _ms(per_block, 1.0),
        "leaving_step_ms_median": _ms(leaving, 0.5),
        "other_step_ms_median": _ms(plain, 0.5),
        "block_raw_mb": raw / 1e6, "compression_ratio": stats["compression_ratio"],
        "writer_drain_ms": None if drain is None else drain * 1e3,
        "store": stats, "samples_ms_per_block": [x * 1e3 for x in per_block],
        "samples_leaving_ms": [x * 1e3 for x in leaving],
        "samples_other_ms": [x * 1e3 for x in plain]}
    if state is not None:
        out["files_on_disk"] = sum(1 for p in (state / "kv").iterdir() if p.suffix == ".rkv")
    return out


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one configuration as one: samples pooled, counters of each run kept."""
    per_block = [x / 1e3 for r in runs for x in r["samples_ms_per_block"]]
    leaving = [x / 1e3 for r in runs for x in r["samples_leaving_ms"]]
    plain = [x / 1e3 for r in runs for x in r["samples_other_ms"]]
    drains = [r["writer_drain_ms"] for r in runs if r["writer_drain_ms"] is not None]
    out = {k: v for k, v in runs[-1].items() if not k.startswith("samples_")}
    out.update(
        offload_ms_per_block_median=_ms(per_block, 0.5),
        offload_ms_per_block_p90=_ms(per_block, 0.9),
        offload_ms_per_block_max=_ms(per_block, 1.0),
        leaving_step_ms_median=_ms(leaving, 0.5), other_step_ms_median=_ms(plain, 0.5),
        blocks=sum(r["blocks"] for r in runs), leaving_steps=len(leaving),
        writer_drain_ms=statistics.median(drains) if drains else None,
        runs_ms_per_block_median=[r["offload_ms_per_block_median"] for r in runs],
        samples_ms_per_block=[x * 1e3 for x in per_block])
    return out


def parts(args: argparse.Namespace, dtype: str, folder: Path) -> dict[str, float]:
    """One block's offload cut into its parts, each timed alone (median ms)."""
    engine = StubEngine(args.layers, args.kv_heads, args.head_dim, 4 * args.block, 2048,
                        dtype)
    cache = engine.new_cache(2)
    cctx = zstandard.ZstdCompressor(level=1)
    times: dict[str, list[float]] = {k: [] for k in (
        "read_block", "encode_block", "zstd_l1", "pack_record_sha256", "write_flush",
        "fsync_file", "os_replace", "fsync_dir", "unlink")}

    def timed(name: str, fn: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        r = fn(*a)
        times[name].append(time.perf_counter() - t0)
        return r

    for i in range(args.reps):
        arrays = timed("read_block", cache.read_block, 1, args.block, args.block)
        payload = timed("encode_block", encode_block, arrays, None)
        data = timed("zstd_l1", cctx.compress, payload)
        key = hashlib.sha256(str(i).encode()).hexdigest()
        blob = timed("pack_record_sha256", pack_record,
                     Record(data, len(payload), dtype != "float8_e4m3fn", 1), ENGINE_ID, key)
        tmp, path = folder / f"{key}.tmp", folder / f"{key}.rkv"
        with open(tmp, "wb") as f:
            def write(f: Any = f, blob: bytes = blob) -> None:
                f.write(blob)
                f.flush()
            timed("write_flush", write)
            timed("fsync_file", os.fsync, f.fileno())
        timed("os_replace", os.replace, tmp, path)
        fd = os.open(folder, os.O_RDONLY)
        try:
            timed("fsync_dir", os.fsync, fd)
        finally:
            os.close(fd)
        timed("unlink", os.unlink, path)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.reps):
        timed("read_block", cache.read_block, 1, args.block, args.block)
    faults_plain = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.reps
    staged: list[float] = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.reps):
        kept = []
        for _ in range(8):
            t0 = time.perf_counter()
            kept.append(cache.read_block(1, args.block, args.block))
            staged.append(time.perf_counter() - t0)
        del kept   # the writer is done with them
    faults_kept = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (8 * args.reps)
    out = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    out["read_block_8_kept"] = statistics.median(staged) * 1e3
    out["page_faults_per_block"] = faults_plain
    out["page_faults_per_block_8_kept"] = faults_kept
    out["ram_tier_sum"] = out["read_block"] + out["encode_block"] + out["zstd_l1"]
    out["disk_sum"] = sum(out[k] for k in ("pack_record_sha256", "write_flush", "fsync_file",
                                           "os_replace", "fsync_dir"))
    return out


def markdown(r: dict[str, Any]) -> list[str]:
    m = r["machine"]
    lines = [f"# Cold-tier offload in the decode step, {r['stamp']}", "",
             f"Command: `{r['command']}`", "",
             f"CPU: {m['cpu_model']}, {m['cpus_usable']} usable cores; "
             f"git {str(m['git']['commit'])[:10]}{' (dirty)' if m['git']['dirty'] else ''}; "
             f"{r['rows']} rows, {r['sequences']} sequences of {r['prompt']} + "
             f"{r['answer']} positions, blocks of {r['block']}, stand-in step "
             f"{r['step_ms']:g} ms; load average {r['loadavg_before'][0]:.1f} before, "
             f"{r['loadavg_after'][0]:.1f} after", "",
             "| KV | tier | block MB | offload ms/block median | p90 | max | leaving step "
             "minus other step, ms | writer drain ms | blocks | files | writes dropped |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kv, tiers in r["loop"].items():
        for tier, t in tiers.items():
            drain = "-" if t["writer_drain_ms"] is None else f"{t['writer_drain_ms']:.0f}"
            extra = t["leaving_step_ms_median"] - t["other_step_ms_median"]
            lines.append(
                f"| {kv} | {tier} | {t['block_raw_mb']:.2f} | "
                f"{t['offload_ms_per_block_median']:.2f} | {t['offload_ms_per_block_p90']:.2f}"
                f" | {t['offload_ms_per_block_max']:.2f} | {extra:.1f} | {drain} | "
                f"{t['blocks']} | {t.get('files_on_disk', '-')} | "
                f"{t['store'].get('writes_dropped', '-')} |")
    names = list(next(iter(r["parts"].values())))
    lines += ["", "One block's parts, median ms:", "",
              "| KV | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for kv, p in r["parts"].items():
        lines.append(f"| {kv} | " + " | ".join(f"{p[n]:.2f}" for n in names) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="after", help="names the result files")
    p.add_argument("--kv", default="fp32,fp16,fp8")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--answer", type=int, default=64)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ram-mb", type=int, default=1024)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="how long the stand-in engine's step takes (sleeping, GIL released)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each tier, alternating")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--dir", type=Path, help="where the disk tier writes (default: a temp dir)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    record: dict[str, Any] = {
        "stamp": time.strftime("%Y-%m-%d") + f"-kv-offload-{args.label}",
        "command": shlex.join(sys.orig_argv), "machine": machine_info(),
        **{k: getattr(args, k) for k in ("rows", "sequences", "prompt", "answer", "block",
                                         "layers", "kv_heads", "head_dim", "ram_mb",
                                         "rounds", "step_ms")},
        "loadavg_before": os.getloadavg(),
        "loop": {}, "parts": {}}
    for kv in args.kv.split(","):
        dtype = KV_DTYPES[kv]
        runs: dict[str, list[dict[str, Any]]] = {"ram": [], "disk": []}
        for _ in range(args.rounds):   # the tiers alternate, so both see the same drift
            for tier, got in runs.items():
                tmp = Path(tempfile.mkdtemp(prefix="rung-kv-offload-", dir=args.dir))
                try:
                    got.append(decode_loop(args, dtype, tmp if tier == "disk" else None))
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                print(f"kv_offload: {kv} {tier}: "
                      f"{got[-1]['offload_ms_per_block_median']:.2f} ms/block", file=sys.stderr)
        record["loop"][kv] = {tier: pooled(got) for tier, got in runs.items()}
        tmp = Path(tempfile.mkdtemp(prefix="rung-kv-parts-", dir=args.dir))
        try:
            record["parts"][kv] = parts(args, dtype, tmp)
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
    record["loadavg_after"] = os.getloadavg()
    report.publish(args.out, record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
