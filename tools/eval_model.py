"""Evaluate a trained demo model on held-out instructions, end to end through rung's engine.

    python -m rung.tools.eval_model models/edge-tiny [--n 60] [--seed 1000] [--json OUT]
    python -m rung.tools.eval_model models/edge-tiny --inputs tests/data/handwritten.json
    python -m rung.tools.eval_model models/edge-tiny --retry-mode feedback [--inputs ...]

The shipped engine is the checkpoint exported with ``rung export``'s defaults and decoded as
``rung serve`` decodes it (``engine.decode: auto``: fast where that answers exactly as
plain); held-out instructions come from the corpus generator with a seed the training did
not use. Reports: unconstrained JSON-valid rate (greedy, no grammar), constrained
schema-valid rate, ST syntax-valid and identifier-check pass rates, fault-tree-valid and
diagnosis-valid rates, per task the share **right** beside the share valid
(``daemon.tasks.quality``), what each answer mechanism buys, an fp8 KV cache against fp32
(teacher-forced next-token KL and greedy agreement on the reference answers) and, for a
checkpoint with FFN gates, the skip ratio at decode and the gates' cost against the ungated
engine.

``--retry-mode`` measures verified retries made that way (``RetryPolicy.mode``) and
nothing else: on the held-out instructions the answers with retries on the shipped engine
(the "+ verified retries" mechanism), on ``--inputs`` the hand-written requests; each task
also reports how many retries carried the findings and how many were resampled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from rung.daemon.tasks.quality import Tally, Verdict, judge
from rung.daemon.tasks.runner import (
    FEEDBACK_FORMS,
    RETRY_MODES,
    Prepared,
    RetryPolicy,
    TaskResult,
    TaskRunner,
    fast_decoding,
)
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import check_schema
from rung.engines import AnyEngine, load_engine
from rung.engines.generate import generate
from rung.engines.progress import set_enabled
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from rung.export.exporter import ExportOptions, export
from rung.export.verify import logit_metrics
from rung.tools.corpus import generate as corpus


class _Tallied(TaskRunner):
    """A runner that counts its retries per task: fed back (the prompt carried the
    findings) or resampled."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.retries: Counter[str] = Counter()

    def retry(self, prepared: Prepared, policy: RetryPolicy, failed: TaskResult) -> Prepared:
        again = super().retry(prepared, policy, failed)
        kind = "fed_back" if again.feedback else "resampled"
        self.retries[f"{prepared.task.name}:{kind}"] += 1
        return again


def _runner(engine_dir: Path, shaped: bool = True) -> _Tallied:
    """A runner on ``engine_dir`` decoding as ``rung serve`` does (``engine.decode: auto``)."""
    engine = load_engine(engine_dir)
    return _Tallied(engine, Tokenizer.load(engine_dir, engine.manifest.tokenizer),
                    load_tasks(), engine_dir, shaped=shaped,
                    fast=fast_decoding("auto", engine))


def _gated(model_dir: Path) -> bool:
    """Whether the checkpoint carries trained FFN skip gates."""
    from rung.export.checkpoint import load_checkpoint

    return bool(load_checkpoint(model_dir).model.has_ffn_gates)


def unconstrained(runner: TaskRunner, samples: list[dict[str, Any]]) -> float:
    """Share of greedy, grammar-free answers that parse and fit the schema."""
    ok = 0
    for s in samples:
        task = runner.tasks[s["task"]]
        ids = runner.prompt_ids(task, s["input"])
        (g,) = generate(runner.engine, runner.tokenizer, [ids],
                        SamplingParams(max_tokens=task.max_tokens))
        with contextlib.suppress(json.JSONDecodeError):
            ok += int(check_schema(task.output_schema, json.loads(g.text))["ok"])
    return ok / len(samples)


def constrained(runner: TaskRunner, samples: list[dict[str, Any]],
                retry: RetryPolicy | None = None) -> dict[str, Any]:
    """Greedy, grammar-constrained answers one at a time (batch 1: the gates can act);
    ``retry``: with verified retries, as the daemon makes them."""
    counts: Counter[str] = Counter()
    seconds: dict[str, float] = defaultdict(float)
    tally = Counter(runner.retries) if isinstance(runner, _Tallied) else Counter()
    engine = runner.engine
    steps0, skips0 = engine.ffn_steps, (None if engine.ffn_skips is None
                                        else engine.ffn_skips.copy())
    examples: dict[str, Any] = {}
    quality = Tally()
    for s in samples:
        t0 = time.perf_counter()
        (r,) = runner.run([(s["task"], s["input"])], SamplingParams(), retry=retry)
        seconds[s["task"]] += time.perf_counter() - t0
        counts[f"{s['task']}:attempts"] += r.attempts
        v = r.validation or {}
        err = r.error or {}
        quality.add(s["task"], judge(runner.tasks[s["task"]].kind, r.validation,
                                     error=f"{err.get('code')}: {err.get('message')}"))
        counts[f"{s['task']}:n"] += 1
        counts[f"{s['task']}:schema"] += int(bool(v.get("schema", {}).get("ok")))
        counts[f"{s['task']}:ok"] += int(r.ok)
        if s["task"] == "st_code":
            counts["st_syntax"] += int(bool(v.get("st_syntax", {}).get("ok")))
            counts["identifiers"] += int(bool(v.get("identifiers", {}).get("ok")))
        if r.ok and s["task"] not in examples:
            examples[s["task"]] = {"input": s["input"], "output": r.output,
                                   "pou_text": v.get("pou_text")}
    n = len(samples)
    per_task = {t: {"n": counts[f"{t}:n"],
                    "schema_valid": counts[f"{t}:schema"] / max(counts[f"{t}:n"], 1),
                    "valid": counts[f"{t}:ok"] / max(counts[f"{t}:n"], 1),
                    "right": quality.right[t] / max(counts[f"{t}:n"], 1),
                    "not_right_because": dict(quality.reasons.get(t, Counter())),
                    "mean_attempts": counts[f"{t}:attempts"] / max(counts[f"{t}:n"], 1),
                    "mean_s": seconds[t] / max(counts[f"{t}:n"], 1),
                    **_retries(runner, tally, t)}
                for t in ("st_code", "fault_tree", "diagnosis")}
    n_st = max(counts["st_code:n"], 1)
    out: dict[str, Any] = {
        "schema_valid": sum(counts[f"{t}:schema"] for t in per_task) / n,
        "st_syntax_valid": counts["st_syntax"] / n_st,
        "identifiers_pass": counts["identifiers"] / n_st,
        "fault_tree_valid": per_task["fault_tree"]["valid"],
        "diagnosis_valid": per_task["diagnosis"]["valid"],
        "per_task": per_task, "examples": examples}
    if engine.ffn_skips is not None and skips0 is not None and engine.ffn_steps > steps0:
        skips = engine.ffn_skips - skips0
        out["ffn_skip_ratio"] = float(skips.sum() / ((engine.ffn_steps - steps0) * len(skips)))
        out["ffn_skip_per_layer"] = (skips / (engine.ffn_steps - steps0)).round(3).tolist()
    return out


def _retries(runner: TaskRunner, before: Counter[str], task: str) -> dict[str, int]:
    """The retries of ``task`` made since ``before`` (a tally of ``runner.retries``)."""
    if not isinstance(runner, _Tallied):
        return {}
    return {k: runner.retries[f"{task}:{k}"] - before[f"{task}:{k}"]
            for k in ("fed_back", "resampled")}


def teacher_forced(engine: AnyEngine, tok: Tokenizer, runner: TaskRunner,
                   samples: list[dict[str, Any]]) -> np.ndarray:
    """Logits at every reference-answer position, the answer fed one token at a time."""
    rows = []
    for s in samples:
        task = runner.tasks[s["task"]]
        prompt = runner.prompt_ids(task, s["input"])
        answer = tok.encode(json.dumps(s["output"], separators=(",", ":"),
                                       ensure_ascii=False), add_bos=False)
        if len(prompt) + len(answer) > engine.manifest.dims.max_seq:
            continue
        cache = engine.new_cache(1)
        rows.append(engine.forward(cache, np.array([prompt]), np.array([len(prompt)]))[0, -1])
        for t in answer[:-1]:
            rows.append(engine.forward(cache, np.array([[t]]), np.ones(1, np.int64),
                                       allow_skip=True)[0, -1])
    return np.stack(rows)


def evaluate(model_dir: Path, n: int, seed: int) -> dict[str, Any]:
    samples = corpus(n, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        shipped_dir, plain_dir = Path(tmp) / "shipped", Path(tmp) / "plain"
        export(model_dir, shipped_dir, ExportOptions())   # rung export's defaults
        export(model_dir, plain_dir, ExportOptions(kv="fp32", ffn_skip="off"))
        kv8_dir = Path(tmp) / "kv8"
        export(model_dir, kv8_dir, ExportOptions(ffn_skip="off", kv="fp8"))
        shipped, plain = _runner(shipped_dir), _runner(plain_dir)
        result: dict[str, Any] = {"model": str(model_dir), "held_out": n, "seed": seed,
                                  "engine": {"kv": shipped.engine.manifest.kv.dtype,
                                             "ffn_gates": shipped.engine.ffn_skips is not None,
                                             "fast_decoding": shipped.fast},
                                  "unconstrained_json_valid": unconstrained(plain, samples),
                                  "constrained": constrained(shipped, samples)}
        # what each answer mechanism buys, on the shipped engine
        result["mechanisms"] = {
            "schema only": constrained(_runner(shipped_dir, shaped=False), samples),
            "+ per-request shapes": result["constrained"],
            "+ verified retries (3 attempts)": constrained(shipped, samples, RetryPolicy())}
        quality_n = samples[: min(len(samples), 24)]
        ref = teacher_forced(plain.engine, plain.tokenizer, plain, quality_n)
        if _gated(model_dir):
            gated_dir = Path(tmp) / "gated"
            export(model_dir, gated_dir, ExportOptions(kv="fp32", ffn_skip="trained"))
            gated = _runner(gated_dir)
            result["constrained_ungated"] = constrained(plain, samples)
            got = teacher_forced(gated.engine, gated.tokenizer, gated, quality_n)
            result["ffn_quality_vs_ungated"] = logit_metrics(ref, got)
        kv8 = _runner(kv8_dir)
        result["kv_fp8_vs_fp32"] = logit_metrics(
            ref, teacher_forced(kv8.engine, kv8.tokenizer, kv8, quality_n))
    return result


def retries(model_dir: Path, n: int, seed: int, policy: RetryPolicy) -> dict[str, Any]:
    """The held-out instructions answered with verified retries made by ``policy`` on the
    shipped engine as ``evaluate`` measures it (``rung export``'s defaults, shapes on)."""
    samples = corpus(n, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        engine_dir = Path(tmp) / "shipped"
        export(model_dir, engine_dir, ExportOptions())
        return {"model": str(model_dir), "held_out": n, "seed": seed,
                "retry": _policy(policy),
                "constrained_retried": constrained(_runner(engine_dir), samples, policy)}


def _policy(policy: RetryPolicy) -> dict[str, Any]:
    return {"attempts": policy.attempts, "temperature": policy.temperature,
            "mode": policy.mode, "form": policy.form,
            "feedback_sampled": policy.feedback_sampled}


def _answer_record(data: dict[str, Any], r: TaskResult, verdict: Verdict) -> dict[str, Any]:
    """What one hand-written request got: its description, right/valid and why not, the
    tries, and the last try's text (an ST answer as its POU, else the model's raw text)."""
    v = r.validation or {}
    text = v.get("pou_text") or (r.generation.text if r.generation else None)
    return {"request": data.get("description") or data.get("system") or data.get("symptom")
            or str(data)[:120],
            "right": verdict.right, "valid": verdict.valid, "reason": verdict.reason,
            "attempts": r.attempts, "failed_checks": list(r.failed_checks), "text": text}


def handwritten(model_dir: Path, path: Path, policy: RetryPolicy | None = None,
                opts: ExportOptions | None = None,
                tasks: tuple[str, ...] = ("st_code", "fault_tree", "diagnosis")
                ) -> dict[str, Any]:
    """Requests written by hand (``tests/data/handwritten.json``) answered as ``rung serve``
    answers them (``rung export``'s defaults, shapes, verified retries by ``policy``, default the
    daemon's): per task the share **right** beside the share valid
    (``daemon.tasks.quality``: every check a plant engineer would apply, ST by execution
    against the request's test vectors, ``st_vectors``), why the others are not right,
    mean tries, mean seconds, and the retries fed back and resampled."""
    policy = policy or RetryPolicy()
    opts = opts or ExportOptions()
    requests = json.loads(path.read_text(encoding="utf-8"))
    vectors = requests.get("st_vectors") or []
    out: dict[str, Any] = {"retry": _policy(policy)}
    quality = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        engine_dir = Path(tmp) / "shipped"
        m = export(model_dir, engine_dir, opts)
        out["engine"] = {"weights": m.weights, "kv": m.kv.dtype, "adapter": m.adapter}
        runner = _runner(engine_dir)
        for task in tasks:
            inputs = requests[task]
            if task == "st_code":   # the vectors travel with the request: checked, retried
                inputs = [{**data, "vectors": vectors[i]} if i < len(vectors) else data
                          for i, data in enumerate(inputs)]
            tally = Counter(runner.retries)
            t0 = time.perf_counter()
            results, times = [], []
            for data in inputs:
                t1 = time.perf_counter()
                results.append(runner.run([(task, data)], SamplingParams(), retry=policy)[0])
                times.append(time.perf_counter() - t1)
            answers = []
            for data, r in zip(inputs, results, strict=True):
                err = r.error or {}
                verdict = judge(runner.tasks[task].kind, r.validation,
                                error=f"{err.get('code')}: {err.get('message')}")
                quality.add(task, verdict)
                answers.append(_answer_record(data, r, verdict))
            entry: dict[str, Any] = {
                "n": len(inputs), **quality.report()[task],
                "passed_checks": sum(r.ok for r in results) / len(inputs),
                "mean_attempts": sum(r.attempts for r in results) / len(inputs),
                "mean_s": (time.perf_counter() - t0) / len(inputs),
                "p50_s": float(np.percentile(times, 50)), "p95_s": float(np.percentile(times, 95)),
                **_retries(runner, tally, task),
                "failures": [(r.error or {}).get("message") for r in results if not r.ok],
                "answers": answers}
            out[task] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--n", type=int, default=60)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--json", type=Path)
    p.add_argument("--inputs", type=Path,
                   help="hand-written requests (tests/data/handwritten.json) instead of the "
                        "held-out corpus")
    p.add_argument("--retry-mode", choices=RETRY_MODES,
                   help="measure only verified retries made this way (RetryPolicy.mode)")
    p.add_argument("--feedback-form", choices=FEEDBACK_FORMS, default=RetryPolicy.form,
                   help="with --retry-mode feedback: how the findings are put (default "
                        "%(default)s)")
    p.add_argument("--feedback-greedy", dest="feedback_sampled", action="store_false",
                   help="with --retry-mode feedback: sample the feedback tries as the "
                        "request asks (greedy) instead of at the retry temperature")
    p.add_argument("--retry-temperature", type=float, default=RetryPolicy.temperature,
                   help="the temperature a greedy request is resampled at (default "
                        "%(default)s; the config's retries.temperature)")
    p.add_argument("--adapter", type=Path, help="merge this LoRA adapter into the model first "
                   "(rung export --adapter)")
    p.add_argument("--weights", choices=["fp32", "fp16", "int8", "int4"],
                   help="export at this precision (default: rung export's)")
    p.add_argument("--tasks", default="st_code,fault_tree,diagnosis",
                   help="with --inputs: the tasks to answer (default all three)")
    args = p.parse_args(argv)
    set_enabled(False)
    from rung.export.bases import resolve

    args.model_dir = resolve(args.model_dir)
    opts = ExportOptions(weights=args.weights, adapter=args.adapter)
    policy = (None if args.retry_mode is None and args.retry_temperature ==
              RetryPolicy.temperature else
              RetryPolicy(temperature=args.retry_temperature,
                          mode=args.retry_mode or RetryPolicy.mode, form=args.feedback_form,
                          feedback_sampled=args.feedback_sampled))
    result = (handwritten(args.model_dir, args.inputs, policy, opts,
                          tuple(t for t in args.tasks.split(",") if t)) if args.inputs
              else evaluate(args.model_dir, args.n, args.seed) if policy is None
              else retries(args.model_dir, args.n, args.seed, policy))
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
