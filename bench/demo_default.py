"""The demo model's default engine: FFN gates and KV dtype, measured on the demo's requests.

    cd bench && ../.venv/bin/python demo_default.py [--repeat 3] [--tag NAME] \
        [--model DIR [--model DIR ...]]

Each ``--model`` (default: the shipped ``models/edge-tiny``) is measured in the same run,
its engines interleaved with the others'. A model with trained FFN gates is exported the
ways below; one without gates as fp32 KV plain (its reference), fp16 KV plain, and with
the export defaults decoded fast.

``models/edge-tiny`` exported five ways: with its trained FFN gates and fp8 KV (the export
default until 2026-12-02), gated with fp32 and with fp16 KV, without gates with fp16 KV,
and with ``rung export``'s own defaults (no options: what ``rung demo`` and ``rung export``
give now). Each engine is loaded as the daemon loads it under the decoding named (``engine.decode``
plain, or auto, which decodes fast where that answers exactly as plain) and answers the
demo's requests (``daemon/demo/run.py``: 5 held-out corpus requests per task, seed 4242)
one at a time, greedy, shapes on, no retries, as the task runner does them: seconds for all
answers (best of ``--repeat`` rounds, the engines interleaved within each round), decode
steps, the answers valid, and whether each answer is token for token that of the model as
trained with an exact cache (gates, fp32 KV) and that of plain decoding without gates. Writes
``bench/results/<date>-demo-default.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report
from machine import machine_info

from rung.daemon.demo.run import _requests
from rung.daemon.tasks.runner import TaskRunner, fast_decoding
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.onnx_engine import EngineOptions
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = ROOT / "models" / "edge-tiny"
REFERENCE = "gates as trained, fp32 KV, plain"   # the model as trained, its cache exact
UNGATED = "no gates, fp16 KV, plain"
REFERENCE_UNGATED = "fp32 KV, plain"              # a model trained without gates, exact


def variants(gated: bool) -> list[tuple[str, dict[str, Any], str]]:
    """(name, ExportOptions keywords, engine.decode) for a model with or without gates."""
    if not gated:
        return [(REFERENCE_UNGATED, {"kv": "fp32"}, "plain"),
                ("fp16 KV, plain", {"kv": "fp16"}, "plain"),
                ("export defaults, decode auto", {}, "auto")]
    return [
        ("gates as trained, fp8 KV, plain (old default)", {"ffn_skip": "trained", "kv": "fp8"},
         "auto"),
        (REFERENCE, {"ffn_skip": "trained", "kv": "fp32"}, "auto"),
        ("gates as trained, fp16 KV, plain", {"ffn_skip": "trained", "kv": "fp16"}, "auto"),
        ("no gates, fp16 KV, plain", {"ffn_skip": "off", "kv": "fp16"}, "plain"),
        ("no gates, fp16 KV, fast", {"ffn_skip": "off", "kv": "fp16"}, "auto"),
        ("export defaults, decode auto (new default)", {}, "auto"),
    ]


class Variant:
    """One engine loaded as the daemon loads it under ``decode``, and its runner."""

    def __init__(self, engine_dir: Path, decode: str) -> None:
        self.engine = load_engine(engine_dir, options=EngineOptions(decode=decode))
        self.fast = fast_decoding(decode, self.engine)
        self.runner = TaskRunner(self.engine, Tokenizer.load(engine_dir,
                                                             self.engine.manifest.tokenizer),
                                 load_tasks(), engine_dir, fast=self.fast)
        self.times: list[float] = []
        self.results: list[Any] = []

    def run(self, requests: list[tuple[str, Any]]) -> None:
        t0 = time.perf_counter()
        self.results = [self.runner.run([req], SamplingParams())[0] for req in requests]
        self.times.append(time.perf_counter() - t0)

    def record(self, requests: list[tuple[str, Any]]) -> dict[str, Any]:
        gens = [r.generation for r in self.results]
        m = self.engine.manifest
        return {"s": min(self.times), "times": self.times, "fast": self.fast,
                "kv": m.kv.dtype, "layout": m.kv.layout,
                "gated": self.engine.ffn_skips is not None,
                "valid": sum(r.ok for r in self.results), "answers": len(self.results),
                "tokens": sum(len(g.token_ids) for g in gens if g is not None),
                "steps": sum(g.steps for g in gens if g is not None),
                "token_ids": [None if g is None else g.token_ids for g in gens],
                "valid_by_task": {t: sum(r.ok for r, (task, _) in zip(self.results, requests,
                                                                       strict=True)
                                         if task == t)
                                  for t in sorted({t for t, _ in requests})}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    ap.add_argument("--model", type=Path, action="append",
                    help="a checkpoint to measure (repeatable; default models/edge-tiny)")
    args = ap.parse_args(argv)
    from rung.export.checkpoint import load_checkpoint
    from rung.export.exporter import ExportOptions, export

    models = args.model or [MODEL]

    requests = [(task, data) for task, inputs in _requests().items() for data in inputs]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        exported: dict[str, Path] = {}
        loaded: dict[str, Variant] = {}
        refs: dict[str, tuple[str, str | None]] = {}
        for model in models:
            label = f"{model.name} ({model.parent.name})" if len(models) > 1 else ""
            gated = bool(load_checkpoint(model).model.has_ffn_gates)
            for name, opts, decode in variants(gated):
                key = repr((str(model), sorted(opts.items())))
                if key not in exported:
                    exported[key] = Path(tmp) / f"e{len(exported)}"
                    export(model, exported[key], ExportOptions(**opts))
                full = f"{label}: {name}" if label else name
                loaded[full] = Variant(exported[key], decode)
                refs[full] = ((f"{label}: " if label else "") + (REFERENCE if gated
                                                                  else REFERENCE_UNGATED),
                              ((f"{label}: " if label else "") + UNGATED) if gated else None)
        for r in range(args.repeat):   # interleaved: a busy spell spreads over every engine
            for name, v in loaded.items():
                v.run(requests)
                print(f"round {r + 1}: {name}: {v.times[-1]:.2f} s", file=sys.stderr)
        results = {name: v.record(requests) for name, v in loaded.items()}
    base_name = next(iter(results))
    for full, r in results.items():
        for key, ref in zip(("identical_to_reference", "identical_to_ungated_plain"),
                            refs[full], strict=True):
            r[key] = None if ref is None else sum(
                a == b for a, b in zip(r["token_ids"], results[ref]["token_ids"], strict=True))
    stamp = time.strftime("%Y-%m-%d") + "-demo-default" + (f"-{args.tag}" if args.tag else "")
    record = {"stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
              "machine": machine_info(), "requests": len(requests), "repeat": args.repeat,
              "results": results}
    base_s = results[base_name]["s"]
    lines = [f"# The demo model's default engine {stamp} ({len(requests)} demo requests, "
             f"greedy, one at a time, best of {args.repeat})", "",
             f"Command: `{record['command']}`", "",
             "| engine | KV | fast | s (best) | vs the first row | decode steps | tokens | "
             f"valid | identical to the model's reference ('{REFERENCE}' or "
             f"'{REFERENCE_UNGATED}') / to '{UNGATED}' |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['kv']} ({r['layout']}) | {'yes' if r['fast'] else 'no'} | "
                     f"{r['s']:.2f} | {base_s / r['s']:.2f}x | {r['steps']} | {r['tokens']} | "
                     f"{r['valid']}/{r['answers']} {r['valid_by_task']} | "
                     f"{r['identical_to_reference']}/{r['answers']} / "
                     + ("–" if r["identical_to_ungated_plain"] is None
                        else f"{r['identical_to_ungated_plain']}/{r['answers']}") + " |")
    lines += ["", "Every round's seconds: " + "; ".join(
        f"{name}: {', '.join(f'{t:.2f}' for t in r['times'])}" for name, r in results.items())]
    report.publish(RESULTS, record, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
