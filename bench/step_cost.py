"""What a step of several new tokens costs against a step of one, weights packed or not.

    cd bench && ../.venv/bin/python step_cost.py ENGINE_DIR... [--prompt 200] [--threads 2]
                                                [--tag NAME] [--profile]

Fast decoding checks its drafts in the step that feeds a row's last token, so it pays off
as far as a step over 1 + k tokens costs little more than a step over one. For each engine
and for ONNX Runtime's weight prepacking off and on (each in its own session): a
``--prompt``-token prefill, then steps of 1, 2, 3, 5 and 9 new tokens from the same cache
length (the cache set back after each), 3 rounds x 5 steps each, median step time; a
quantized fused engine's one-token step also the ways it can run (padded as loaded, fed
twice, unpadded: ``OnnxEngine._padded``), alternated in one session so that the host's
drift falls on each alike. Writes
``bench/results/<date>-step-cost.{json,md}``. ``--profile`` adds, per engine (packed, one
session), ONNX Runtime's own profile of one step of 1 and one of 9 new tokens: ms per
operator type, the costliest node, and the weight products by bits (ms and the bytes they
read: how near each runs to the memory's rate).
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import report
from machine import machine_info

from rung.engines import load_engine, parted
from rung.engines.onnx_engine import EngineOptions

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (1, 2, 3, 5, 9)


def measure(engine_dir: Path, prepack: bool, prompt: int, threads: int) -> dict[int, float]:
    """Median ms of a step over n new tokens, per n."""
    engine: Any = load_engine(engine_dir, "onnx", EngineOptions(threads=threads,
                                                                prepack=prepack))
    rng = np.random.default_rng(0)
    cache = engine.new_cache(1)
    engine.forward(cache, rng.integers(100, 1000, (1, prompt)), np.array([prompt]))
    base = int(cache.lengths[0])
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(3):
        for n in SIZES:
            for _ in range(5):
                cache.truncate(0, base)
                t = time.perf_counter()
                engine.forward(cache, rng.integers(100, 1000, (1, n)), np.array([n]),
                               np.arange(n, dtype=np.int64)[None])
                times[n].append((time.perf_counter() - t) * 1e3)
    return {n: statistics.median(ts) for n, ts in times.items()}


def lone_tokens(engine_dir: Path, prompt: int, threads: int,
                rounds: int = 30) -> dict[str, dict[str, float]]:
    """A quantized fused engine's one-token step both ways it can run, alternated in one
    session (``rounds`` x 8 steps each after a ``prompt``-token prefill): ``padded`` as it
    loads (the graph repeats the attention position), ``unpadded`` (one position, the
    kernels' one-query paths). Median and quartile ms per way."""
    engine: Any = load_engine(engine_dir, "onnx", EngineOptions(threads=threads))
    ways = {"padded": 2, "unpadded": 1}
    rng = np.random.default_rng(0)
    cache = engine.new_cache(1)
    engine.forward(cache, rng.integers(100, 1000, (1, prompt)), np.array([prompt]))
    base = int(cache.lengths[0])
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(rounds):
        for way, positions in ways.items():
            engine.min_positions = positions
            cache.truncate(0, base)
            for _ in range(8):
                t = time.perf_counter()
                engine.forward(cache, rng.integers(100, 1000, (1, 1)), np.array([1]))
                times[way].append((time.perf_counter() - t) * 1e3)
    return {way: {"median": statistics.median(ts), "p25": float(np.percentile(ts, 25)),
                  "p75": float(np.percentile(ts, 75))} for way, ts in times.items()}


def profile(engine_dir: Path, prompt: int, threads: int) -> dict[str, Any]:
    """ONNX Runtime's profile of a step of 1 and of 9 new tokens after ``prompt``: per size,
    the step's ms, ms per operator type and the costliest node."""
    load = parted.load

    def profiled(path: Path, make_options: Any, providers: list[str], parts: int) -> Any:
        def options() -> Any:
            so = make_options()
            so.enable_profiling = True
            so.profile_file_prefix = str(Path(tmp) / "step")
            return so
        return load(path, options, providers, 1)

    with tempfile.TemporaryDirectory() as tmp:
        parted.load = profiled
        try:
            engine: Any = load_engine(engine_dir, "onnx", EngineOptions(threads=threads,
                                                                        prepack=True))
        finally:
            parted.load = load
        rng = np.random.default_rng(0)
        cache = engine.new_cache(1)
        engine.forward(cache, rng.integers(100, 1000, (1, prompt)), np.array([prompt]))
        base = int(cache.lengths[0])
        for n in (1, 1, 9, 9):   # the second of each is read
            cache.truncate(0, base)
            engine.forward(cache, rng.integers(100, 1000, (1, n)), np.array([n]),
                           np.arange(n, dtype=np.int64)[None])
        events = json.loads(Path(engine.session.parts[0].end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    products = weight_products(engine_dir / engine.manifest.graph_file,
                               engine.dims.vocab_size)
    out: dict[str, Any] = {}
    for n, run in ((1, runs[-3]), (9, runs[-1])):
        inside = [e for e in nodes if run["ts"] <= e["ts"] < run["ts"] + run["dur"]]
        by_op: collections.Counter[str] = collections.Counter()
        by_bits: dict[str, dict[str, float]] = {}
        for e in inside:
            by_op[e["args"]["op_name"]] += e["dur"] / 1e3
            group = products.get(e["name"].removesuffix("_kernel_time"))
            if group is not None:
                kind, mb = group
                g = by_bits.setdefault(kind, {"nodes": 0, "ms": 0.0, "mb": 0.0})
                g["nodes"] += 1
                g["ms"] += e["dur"] / 1e3
                g["mb"] += mb
        top = max(inside, key=lambda e: e["dur"])
        out[str(n)] = {"ms": run["dur"] / 1e3, "by_op": dict(by_op.most_common()),
                       "weight_products": by_bits,
                       "costliest": {"node": top["name"].removesuffix("_kernel_time"),
                                     "op": top["args"]["op_name"], "ms": top["dur"] / 1e3}}
    return out


def weight_products(graph: Path, vocab: int) -> dict[str, tuple[str, float]]:
    """The graph's ``MatMulNBits`` nodes: name -> ("4-bit" | "8-bit", plus " head" for the
    LM head), and the MB of packed weights each reads (scales and zero points left out)."""
    import onnx

    proto = onnx.load(str(graph), load_external_data=False)
    out: dict[str, tuple[str, float]] = {}
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            a = {x.name: x.i for x in node.attribute}
            kind = f"{a['bits']}-bit" + (" head" if a["N"] == vocab else "")
            out[node.name] = (kind, a["N"] * a["K"] * a["bits"] / 8 / 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", nargs="+", type=Path)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    ap.add_argument("--profile", action="store_true",
                    help="add ONNX Runtime's profile of a step of 1 and of 9 new tokens")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    lone: dict[str, Any] = {}
    for d in args.engines:
        probe: Any = load_engine(d, "onnx", EngineOptions(prepack=False))
        weights, padded = probe.manifest.weights, probe.min_positions > 1
        for prepack in (False, True):
            name = f"{d.parent.name}/{d.name} ({weights}), prepack {'on' if prepack else 'off'}"
            results[name] = measure(d, prepack, args.prompt, args.threads)
        if padded:   # lone tokens run padded to two positions: what that costs
            lone[f"{d.parent.name}/{d.name} ({weights})"] = lone_tokens(d, args.prompt,
                                                                        args.threads)
    stamp = time.strftime("%Y-%m-%d") + "-step-cost" + (f"-{args.tag}" if args.tag else "")
    record = {"stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
              "machine": machine_info(), "prompt": args.prompt, "threads": args.threads,
              "results": {k: {str(n): ms for n, ms in v.items()} for k, v in results.items()},
              "lone_tokens": lone}
    lines = [f"# Step cost {stamp} (after a {args.prompt}-token prompt, {args.threads} threads)",
             "", f"Command: `{record['command']}`", "",
             *report.by_size("engine", lambda n: f"{n} token{'s' if n > 1 else ''}", SIZES,
                             results, lambda ms, n: f"{ms[n]:.1f} ms ({ms[n] / ms[1]:.2f}x)")]
    if lone:
        lines += ["", "A one-token step of a quantized fused engine, the ways alternated in one "
                  "session (median, quartiles):", "", "| engine | way | ms | p25-p75 |",
                  "|---|---|---|---|"]
        for name, ways in lone.items():
            for way, t in ways.items():
                lines.append(f"| {name} | {way} | {t['median']:.2f} | "
                             f"{t['p25']:.2f}-{t['p75']:.2f} |")
    if args.profile:
        record["profiles"] = {f"{d.parent.name}/{d.name}": profile(d, args.prompt, args.threads)
                              for d in args.engines}
        lines += ["", "ONNX Runtime's profile of one step (packed, one session):", "",
                  "| engine | new tokens | step ms | ms by operator (top 4) | costliest node |",
                  "|---|---|---|---|---|"]
        for name, sizes in record["profiles"].items():
            for n, p in sizes.items():
                ops = ", ".join(f"{op} {ms:.2f}" for op, ms in list(p["by_op"].items())[:4])
                top = p["costliest"]
                lines.append(f"| {name} | {n} | {p['ms']:.2f} | {ops} | {top['node']} "
                             f"({top['op']}) {top['ms']:.2f} |")
        lines += ["", "The weight products (`MatMulNBits`) of those steps by bits: nodes, ms, "
                  "MB of packed weights read, GB/s:", "",
                  "| engine | new tokens | products | nodes | ms | MB | GB/s |",
                  "|---|---|---|---|---|---|---|"]
        for name, sizes in record["profiles"].items():
            for n, p in sizes.items():
                for kind, g in sorted(p["weight_products"].items()):
                    lines.append(f"| {name} | {n} | {kind} | {g['nodes']:.0f} | "
                                 f"{g['ms']:.2f} | {g['mb']:.1f} | {g['mb'] / g['ms']:.1f} |")
    report.publish(RESULTS, record, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
