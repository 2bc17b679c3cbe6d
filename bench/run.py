"""``make bench``: rung vs transformers, onnxruntime-genai, llama.cpp and OpenVINO GenAI.

Builds the cached artifacts (bench/artifacts.py), runs each engine in its own process
(``run.py --worker ENGINE``, bench/workers.py) one after another, and writes
``<out>/<date>-fp32.{json,md,png}`` (``-mixed`` when int8/int4 engines are among them;
bench/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import artifacts
import machine
import numpy as np
import report
import roofline
import workers

ENGINES = ("rung", "rung-kv16", "rung-kv8", *artifacts.RUNG_WEIGHTS, *artifacts.RUNG_DEFAULT,
           *artifacts.RUNG_FFN, "hf", *artifacts.GENAI, *artifacts.OPENVINO, *artifacts.LLAMACPP)
DEFAULT_ENGINES = ("rung", "hf", "ortgenai")
# engine -> artifact kind; the rung-kv* engines are rung with an fp16 / fp8 KV cache; the
# OpenVINO GenAI engines read llama.cpp's GGUF files
ARTIFACT = {**{e: e for e in ENGINES}, **artifacts.OPENVINO}
# engine -> weight precision (fp32 unless listed)
WEIGHTS = {**{k: v.partition(":")[0] for k, v in artifacts.RUNG_WEIGHTS.items()},
           **{k: v.partition(":")[0] for k, v in artifacts.RUNG_DEFAULT.items()},
           **artifacts.GENAI,
           **{k: k.rpartition("-")[2] for k in artifacts.OPENVINO},   # GGUF q4_0 / q8_0
           **{k: {"f32": "fp32", "q8_0": "int8", "q4_0": "int4", "q4_k_m": "int4",
                  "original": "int4"}[v]
              for k, v in artifacts.LLAMACPP.items()}}
RESULTS = Path(__file__).resolve().parent / "results"
QUICK = dict(preset="demo-tiny", prompt=128, contexts="64,256", steps=8, reps=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES),
                   help=f"comma-separated, from {', '.join(ENGINES)}")
    p.add_argument("--reps", type=int, default=3, help="repetitions; the median is reported")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the engine list this many times, round-robin, --reps each; the "
                   "median over all repetitions is reported (spreads a noisy machine's "
                   "drift over every engine alike)")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per run")
    p.add_argument("--prompt", type=int, default=512, help="prefill / TTFT prompt length")
    p.add_argument("--contexts", default="128,1024", help="decode contexts, comma-separated")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads per engine")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt ids")
    p.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(artifacts.MAX_SEQ),
                   help="the checkpoint: random weights of a shape (qwen2.5-0.5b, demo-tiny) "
                   "or a real model (smollm2-135m, edge-tiny; bench/artifacts.py)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: demo-tiny preset, short contexts, 1 repetition")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    p.add_argument("--tag", default="", help="suffix of the result file names (e.g. kv)")
    p.add_argument("--baseline", default=report.BASELINE,
                   help="engine the decode ratios are taken against (default ortgenai)")
    p.add_argument("--quality", action="store_true",
                   help="also: each engine's mean KL and greedy agreement against the fp32 "
                   "reference on held-out real text, the weights it reads per decode step, "
                   "and the memory bandwidth measured in the run (share of the roofline)")
    p.add_argument("--logits-ids", help=argparse.SUPPRESS)
    p.add_argument("--logits-out", help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        given = set(argv if argv is not None else sys.argv[1:])
        for key, value in QUICK.items():
            if f"--{key}" not in given:
                setattr(args, key, value)
    return args


def workload(args: argparse.Namespace) -> workers.Workload:
    return workers.Workload(prompt=args.prompt,
                            contexts=[int(c) for c in str(args.contexts).split(",")],
                            steps=args.steps, reps=args.reps, seed=args.seed,
                            threads=args.threads, logits_ids=args.logits_ids,
                            logits_out=args.logits_out)


def vocab_size(art: artifacts.Artifacts) -> int:
    return int(json.loads((art.hf / "config.json").read_text())["vocab_size"])


def worker_main(args: argparse.Namespace) -> None:
    art = artifacts.locate(args.preset)
    res = workers.run_worker(args.worker, art.path(ARTIFACT[args.worker]), vocab_size(art),
                             workload(args))
    args.result.write_text(json.dumps(res, indent=2))


def spawn_worker(engine: str, args: argparse.Namespace, tmp: Path,
                 logits: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """Run one engine in a fresh process; its JSON, or ``{"error": ...}``. ``logits``:
    (token ids, output) to save the engine's teacher-forced logits over those ids."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine,
           "--result", str(tmp), "--preset", args.preset, "--prompt", str(args.prompt),
           "--contexts", str(args.contexts), "--steps", str(args.steps),
           "--reps", str(args.reps), "--threads", str(args.threads), "--seed", str(args.seed)]
    if logits:
        cmd += ["--logits-ids", str(logits[0]), "--logits-out", str(logits[1])]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    print(f"bench: measuring {engine} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, env=env, check=False).returncode
    if rc != 0 or not tmp.is_file():
        return {"error": f"worker exited with status {rc}"}
    res: dict[str, Any] = json.loads(tmp.read_text())
    tmp.unlink()
    print(f"bench: {engine} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
          flush=True)
    return res


def measure_all(args: argparse.Namespace, engines: list[str]) -> dict[str, Any]:
    _, errors = artifacts.ensure(args.preset, tuple(ARTIFACT[e] for e in engines))
    os.sync()  # a fresh build leaves GBs of dirty pages; don't time their write-back
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    ids = args.out / ".held-out-ids.npy"
    if args.quality:
        np.save(ids, roofline.held_out_ids(artifacts.locate(args.preset).hf))
    for i in range(max(args.rounds, 1)):
        for engine in engines:
            if ARTIFACT[engine] in errors:
                runs[engine] = [{"error": f"build failed: {errors[ARTIFACT[engine]]}"}]
                continue
            logits = ((ids, args.out / f".logits-{engine}.npy") if args.quality and i == 0
                      else None)
            runs[engine].append(spawn_worker(engine, args, args.out / f".worker-{engine}.tmp",
                                             logits))
    ids.unlink(missing_ok=True)
    return {engine: merge_rounds(r) for engine, r in runs.items()}


def add_quality(results: dict[str, dict[str, Any]], preset: str) -> None:
    """Each engine's weights read per step and, where it saved logits, its KL and greedy
    agreement against the fp32 reference (transformers, else rung fp32, else llama.cpp f32)."""
    art = artifacts.locate(preset)
    saved = {e: Path(r["logits"]) for e, r in results.items() if "logits" in r}
    ref = next((e for e in ("hf", "rung", "llamacpp-f32") if e in saved), None)
    reference = np.load(saved[ref]) if ref else None
    for engine, res in results.items():
        if "error" in res:
            continue
        res["weight_bytes"] = roofline.weight_bytes(art.path(ARTIFACT[engine]))
        if reference is not None and engine in saved:
            res["quality"] = dict(roofline.quality(reference, np.load(saved[engine])),
                                  reference=ref)
    for path in saved.values():
        path.unlink(missing_ok=True)


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from an engine's rounds: every repetition's time pooled, medians and
    rates recomputed from the pool; load time the median, peak RSS the largest."""
    failed = [r for r in runs if "error" in r]
    if failed or len(runs) == 1:
        return failed[0] if failed else runs[0]
    out = dict(runs[0], rounds=len(runs), load_s=statistics.median(r["load_s"] for r in runs),
               peak_rss_mb=max(r["peak_rss_mb"] for r in runs),
               loadavg_1m=[r["loadavg_1m"] for r in runs])
    if "prefill" in out:
        times = [t for r in runs for t in r["prefill"]["times_s"]]
        med = statistics.median(times)
        out["prefill"] = dict(runs[0]["prefill"], times_s=times, median_s=med,
                              tok_s=runs[0]["prefill"]["tokens"] / med, ttft_ms=med * 1000)
    decode = {}
    for ctx, first in runs[0].get("decode", {}).items():
        times = [t for r in runs for t in r["decode"][ctx]["times_s"]]
        med = statistics.median(times)
        decode[ctx] = dict(first, times_s=times, median_s=med, tok_s=first["steps"] / med,
                           ms_per_token=med * 1000 / first["steps"])
    if decode:
        out["decode"] = decode
    return out


def write_outputs(record: dict[str, Any], out: Path) -> Path:
    stem = report.write_record(out, record, report.markdown(record))
    report.plot(record, Path(f"{stem}.png"))
    return stem


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        sys.exit(f"bench: unknown engine {unknown[0]!r}; choose from {', '.join(ENGINES)}")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    bandwidth = [roofline.bandwidth_gbs(args.threads)] if args.quality else []
    results = measure_all(args, engines)
    if args.quality:
        bandwidth.append(roofline.bandwidth_gbs(args.threads))
        add_quality(results, args.preset)
    weights = {e: WEIGHTS.get(e, "fp32") for e in engines}
    label = "fp32" if set(weights.values()) == {"fp32"} else "mixed"
    model = "" if args.preset == "qwen2.5-0.5b" else f"-{args.preset}"
    stamp = (time.strftime("%Y-%m-%d") + model + f"-{label}" + (f"-{args.tag}" if args.tag else "")
             + ("-quick" if args.quick else ""))
    record = {"stamp": stamp, "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "command": shlex.join(sys.orig_argv), "cwd": os.getcwd(), "model": args.preset,
              "weights": label, "engine_weights": weights, "baseline": args.baseline,
              "workload": dict(vars(workload(args)), rounds=max(args.rounds, 1)),
              "artifacts": str(artifacts.locate(args.preset).root),
              "machine": machine.machine_info(), "results": results}
    if bandwidth:
        record["bandwidth_gbs"] = statistics.median(bandwidth)
        record["bandwidth_runs_gbs"] = bandwidth
    stem = write_outputs(record, args.out)
    print(report.table(record))
    print(f"bench: wrote {stem}.json, .md, .png", file=sys.stderr)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
