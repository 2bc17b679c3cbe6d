"""The cold KV tier's codec on real KV: ratio and MB/s per KV dtype, shuffle, delta, level.

    .venv/bin/python bench/kv_real_compression.py ENGINE_DIR... [--levels 1 3] [--reps 5]
        [--out bench/results/<date>-kv-real-compression.json]

Each engine prefills real text (``export/prompts.py``'s held-out then calibration set,
joined by blank lines, tokenized with the engine's tokenizer) in one row; its full blocks
of ``--block`` positions (the prefix cache's 64) are taken with ``KVCache.read_block``, as
the daemon's cold tier gets them. Every combination of byte-plane shuffle (off/on), delta
coding across tokens and zstd level runs over all blocks: encode + compress, then
decompress + decode, checked bit-exact, best of ``--reps``. Delta coding (lossless, per
array and channel, position 0 kept, position t coded against position t - 1, on the bit
patterns as unsigned integers; fp8 codes and fp32 scales alike):

- ``none``: the codec as it is;
- ``xor``: ``bits[t] ^ bits[t - 1]``;
- ``sub``: ``bits[t] - bits[t - 1]`` (wrapping);
- ``ordered``: ``sub`` after mapping each sign-magnitude pattern to an order-preserving
  integer (negative: all bits flipped; positive: the sign bit set), so that the
  difference follows the difference of the values across a sign change.

MB/s count raw KV bytes (the arrays, scales included); the ratio is raw KV bytes over
compressed bytes. ``entropy bound`` is the ratio an order-0 coder would reach on each byte
plane of the whole set (what zstd's Huffman stage can do without matches); ``adjacent
variance`` is var(x[t] - x[t-1]) / var(x) per channel, averaged, for K and V of float
caches (below 1 only where neighbouring tokens are correlated, rho > 0.5). Writes the JSON
and a markdown table next to it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import report
import zstandard
from machine import machine_info

from rung.engines import engine_options, load_engine
from rung.engines.kv_store import decode_block, encode_block
from rung.engines.tokenizer import Tokenizer
from rung.export.prompts import CALIBRATION, HELD_OUT

RESULTS = Path(__file__).resolve().parent / "results"
DELTAS = ("none", "xor", "sub", "ordered")
Block = dict[str, np.ndarray]


# -- delta across tokens (array level: the codec then sees unsigned integer arrays) -------

def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"<u{a.dtype.itemsize}")


def _sign(u: np.ndarray) -> np.ndarray:
    return np.array(1, u.dtype) << np.array(8 * u.dtype.itemsize - 1, u.dtype)


def delta_encode(block: Mapping[str, np.ndarray], mode: str) -> Block:
    """Position 0 as is, position t as ``bits[t] op bits[t - 1]`` per channel."""
    if mode == "none":
        return dict(block)
    out: Block = {}
    for name, a in block.items():
        u = _bits(a)
        if mode == "ordered":
            sign = _sign(u)
            u = np.where(u & sign, ~u, u | sign)
        d = u.copy()
        if mode == "xor":
            np.bitwise_xor(u[1:], u[:-1], out=d[1:])
        else:
            np.subtract(u[1:], u[:-1], out=d[1:])
        out[name] = d
    return out


def delta_decode(block: Block, mode: str, dtypes: Mapping[str, np.dtype[Any]]) -> Block:
    if mode == "none":
        return block
    op = np.bitwise_xor if mode == "xor" else np.add
    out: Block = {}
    for name, d in block.items():
        op.accumulate(d, axis=0, dtype=d.dtype, out=d)
        if mode == "ordered":
            sign = _sign(d)
            d = np.where(d & sign, d ^ sign, ~d)
        out[name] = d.view(dtypes[name])
    return out


# -- real KV ------------------------------------------------------------------------------

def real_blocks(engine_dir: Path, block: int, threads: int) -> tuple[list[Block], dict[str, Any]]:
    engine = load_engine(engine_dir, "onnx", engine_options("onnx", threads=threads))
    m = engine.manifest
    tok = Tokenizer.load(engine_dir, m.tokenizer)
    ids = tok.encode("\n\n".join(HELD_OUT + CALIBRATION))
    n = min(len(ids), m.dims.max_seq) // block * block
    cache = engine.new_cache(1, n)
    engine.forward(cache, np.array([ids[:n]], np.int64), np.array([n], np.int64))
    blocks = [cache.read_block(0, s, block) for s in range(0, n, block)]
    info = {"engine_dir": str(engine_dir), "engine_id": m.engine_id, "kv_dtype": m.kv.dtype,
            "kv_layout": m.kv.layout, "weights": m.weights, "text_tokens": len(ids),
            "tokens": n, "blocks": len(blocks),
            "raw_mb": sum(a.nbytes for b in blocks for a in b.values()) / 1e6,
            "arrays": {k: [str(a.dtype), list(a.shape)] for k, a in sorted(blocks[0].items())}}
    return blocks, info


def entropy_bound(blocks: list[Block], mode: str) -> float:
    """Raw bytes over the order-0 entropy of each byte plane of each dtype, whole set."""
    planes: dict[tuple[int, int], np.ndarray] = {}
    raw = 0
    for b in blocks:
        for a in delta_encode(b, mode).values():
            flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, -1)
            raw += flat.size
            for p in range(flat.shape[1]):
                k = (a.dtype.itemsize, p)
                counts = np.bincount(flat[:, p], minlength=256)
                planes[k] = planes.get(k, np.zeros(256, np.int64)) + counts
    bits = 0.0
    for counts in planes.values():
        prob = counts[counts > 0] / counts.sum()
        bits += float(-(prob * np.log2(prob)).sum() * counts.sum())
    return raw * 8 / bits


def adjacent_variance(blocks: list[Block]) -> dict[str, float]:
    """var(x[t] - x[t-1]) / var(x) per channel over the whole sequence, mean, K and V."""
    out: dict[str, float] = {}
    for part in ("key", "value"):
        names = [n for n in blocks[0] if n.startswith(part) and not n.endswith("_scale")]
        if blocks[0][names[0]].dtype.kind != "f":
            continue
        ratios = []
        for n in names:
            x = np.concatenate([b[n] for b in blocks]).astype(np.float64)
            ratios.append(np.diff(x, axis=0).var(axis=0) / np.maximum(x.var(axis=0), 1e-30))
        out[part] = float(np.mean(ratios))
    return out


def measure(blocks: list[Block], shuffle: bool, delta: str, level: int,
            reps: int) -> dict[str, Any]:
    raw = sum(a.nbytes for b in blocks for a in b.values())
    dtypes = {k: a.dtype for k, a in blocks[0].items()}
    cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()

    def enc() -> list[tuple[bytes, int]]:
        out = []
        for b in blocks:
            payload = encode_block(delta_encode(b, delta), shuffle)
            out.append((cctx.compress(payload), len(payload)))
        return out

    def dec(frames: list[tuple[bytes, int]]) -> list[Block]:
        return [delta_decode(decode_block(dctx.decompress(f, max_output_size=n)), delta, dtypes)
                for f, n in frames]

    frames, t_enc = best(enc, reps)
    got, t_dec = best(lambda: dec(frames), reps)
    for want, have in zip(blocks, got, strict=True):
        for k, a in want.items():
            if have[k].dtype != a.dtype or have[k].tobytes() != a.tobytes():
                raise SystemExit(f"round trip not bit-exact: {k} (shuffle {shuffle}, "
                                 f"delta {delta}, level {level})")
    packed = sum(len(f) for f, _ in frames)
    return {"shuffle": shuffle, "delta": delta, "level": level, "ratio": raw / packed,
            "compressed_mb": packed / 1e6, "compress_mb_s": raw / 1e6 / t_enc,
            "decompress_mb_s": raw / 1e6 / t_dec}


def best(fn: Callable[[], Any], reps: int) -> tuple[Any, float]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, min(times)


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Cold-tier compression of real KV ({r['stamp']})", "",
             f"Command: `{r['command']}`", "",
             f"CPU: {r['machine']['cpu_model']}, {r['machine']['cpus_usable']} usable, "
             f"{', '.join(r['machine']['simd'])}; zstandard {zstandard.__version__} "
             f"(libzstd {'.'.join(map(str, zstandard.ZSTD_VERSION))}); best of {r['reps']}.",
             ""]
    for e in r["engines"]:
        lines += [f"## {e['kv_dtype']} KV ({e['kv_layout']}), {e['blocks']} blocks of "
                  f"{r['block']} positions, {e['raw_mb']:.1f} MB", "",
                  "entropy bound (order-0 per byte plane): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in e["entropy_bound"].items())
                  + "; adjacent variance: "
                  + (", ".join(f"{k} {v:.2f}" for k, v in e["adjacent_variance"].items())
                     or "n/a (fp8 codes)"), "",
                  "| level | shuffle | delta | ratio | compress MB/s | decompress MB/s |",
                  "|---|---|---|---|---|---|"]
        for row in e["rows"]:
            lines.append(f"| {row['level']} | {'on' if row['shuffle'] else 'off'} | "
                         f"{row['delta']} | {row['ratio']:.3f} | {row['compress_mb_s']:.0f} | "
                         f"{row['decompress_mb_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engines", type=Path, nargs="+")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--levels", type=int, nargs="+", default=[1, 3])
    p.add_argument("--deltas", nargs="+", default=list(DELTAS), choices=DELTAS)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path,
                   default=RESULTS / (time.strftime("%Y-%m-%d") + "-kv-real-compression.json"))
    args = p.parse_args(argv)
    record: dict[str, Any] = {"stamp": args.out.stem, "command": shlex.join(sys.orig_argv),
                              "machine": machine_info(), "block": args.block,
                              "reps": args.reps, "engines": []}
    for engine_dir in args.engines:
        blocks, info = real_blocks(engine_dir, args.block, args.threads)
        info["entropy_bound"] = {d: entropy_bound(blocks, d) for d in args.deltas}
        info["adjacent_variance"] = adjacent_variance(blocks)
        info["rows"] = []
        for level in args.levels:
            for shuffle in (False, True):
                for delta in args.deltas:
                    row = measure(blocks, shuffle, delta, level, args.reps)
                    info["rows"].append(row)
                    print(f"kv_real_compression: {info['kv_dtype']} {row}", file=sys.stderr)
        record["engines"].append(info)
    report.write_record(args.out.parent, record, markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
