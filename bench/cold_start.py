"""Cold start: process start to first token, as a service restart sees it.

For each engine directory, ``--runs`` fresh Python processes each import rung, load the
engine (artifacts checked) and its tokenizer, tokenize a short chat prompt and run its
prefill to the first token. The parent times from spawning the process to the child's
line saying the first token is out; the child reports where its time went. Engines take
turns run by run, so drift falls on all alike; the page cache is warm (the engine was
just exported or loaded), as after a service restart on the same box.

    python bench/cold_start.py ENGINE_DIR... [--runs 5] [--threads 2] [--out bench/results]
                                             [--decode auto|plain|fast] [--tag NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from report import publish  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from pathlib import Path
from rung.engines import engine_options, load_engine
from rung.engines.manifest import load_manifest, sha256_file
from rung.engines.onnx_engine import OnnxEngine
from rung.engines.tokenizer import Tokenizer
t1 = time.perf_counter()
d = Path(sys.argv[1])
options = engine_options("onnx", threads=int(sys.argv[2]), decode=sys.argv[4])
if sys.argv[3] == "sha256-first":   # the earlier load: every artifact hashed, then the session
    m = load_manifest(d, verify_artifacts=False)
    assert all(sha256_file(d / f) == digest for f, digest in m.artifacts.items())
    engine = OnnxEngine(d, m, options)
else:                               # load_engine: digests checked beside the session
    engine = load_engine(d, "onnx", options)
t2 = time.perf_counter()
tok = Tokenizer.load(d, engine.manifest.tokenizer)
t3 = time.perf_counter()
ids = tok.encode("Which limit does oil_temp exceed when it reads 86.2 C?")
cache = engine.new_cache(1)
logits = engine.forward(cache, np.array([ids]), np.array([len(ids)]))
first = int(logits[0, -1].argmax())
t4 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "engine_ms": (t2 - t1) * 1e3,
                  "tokenizer_ms": (t3 - t2) * 1e3, "first_token_ms": (t4 - t3) * 1e3,
                  "prompt_tokens": len(ids), "token": first}), flush=True)
"""
PARTS = ("import_ms", "engine_ms", "tokenizer_ms", "first_token_ms")


def one_run(engine_dir: Path, threads: int, mode: str, decode: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(engine_dir), str(threads), mode,
                             decode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    wall = (time.perf_counter() - t0) * 1e3
    proc.wait()
    if proc.returncode != 0 or not line:
        raise SystemExit(f"cold start of {engine_dir} failed (exit {proc.returncode})")
    return dict(json.loads(line), start_to_first_token_ms=wall)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--sha256-first", action="store_true",
                    help="also time the earlier load (sha256 of every artifact, then the "
                    "session), side by side")
    ap.add_argument("--decode", default="auto", choices=("auto", "plain", "fast"),
                    help="the decoding the engine is loaded for, as engine.decode (auto, the "
                    "daemon's default, packs fp32 weights where it decodes fast)")
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    args = ap.parse_args(argv)
    modes = ["load_engine", *(["sha256-first"] if args.sha256_first else [])]
    runs: dict[tuple[Path, str], list[dict[str, Any]]] = {
        (e, mode): [] for e in args.engines for mode in modes}
    for _ in range(args.runs):
        for e, mode in runs:
            runs[(e, mode)].append(one_run(e, args.threads, mode, args.decode))
    rows = ["| engine | load | weights | files MB | process start to first token ms | import | "
            "engine load | tokenizer | prefill to first token |", "|---" * 9 + "|"]
    results = {}
    for (e, mode), rs in runs.items():
        manifest = json.loads((e / "manifest.json").read_text())
        mb = sum(p.stat().st_size for p in e.iterdir() if p.is_file()) / 1e6
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("start_to_first_token_ms", *PARTS)}
        results[f"{e} {mode}"] = {"weights": manifest["weights"], "files_mb": mb,
                                   "median": med, "runs": rs}
        rows.append(f"| {e.name} | {mode} | {manifest['weights']} | {mb:.0f} | "
                    f"{med['start_to_first_token_ms']:.0f} | "
                    + " | ".join(f"{med[k]:.0f}" for k in PARTS) + " |")
    m = machine.machine_info()
    record = {"stamp": time.strftime("%Y-%m-%d") + "-cold-start"
              + (f"-{args.tag}" if args.tag else ""), "decode": args.decode,
              "command": " ".join(sys.orig_argv), "machine": m, "runs": args.runs,
              "threads": args.threads, "results": results}
    publish(args.out, record, [
        f"# Cold start ({m['cpu_model']}, {', '.join(m['simd'])}; median of {args.runs} "
        f"processes each; engines loaded for decode {args.decode})", "",
        f"Command: `{record['command']}`", "", *rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
