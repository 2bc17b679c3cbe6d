"""Structured answers against llama.cpp under the same JSON schema, on a real checkpoint.

Held-out corpus requests (seed 1000, ``--n`` per task), greedy, batch 1, the same prompt
token ids for both: rung answers through its task runner as ``rung serve`` does (shapes on;
fast decoding where it answers as plain decoding does); llama.cpp (llama-cpp-python)
answers under ``LlamaGrammar.from_json_schema`` of the task's published output schema,
streamed, from a reset context. Each in turn in this process, on the same weights at the
same precision (``--pairs``: rung engine = llama.cpp file, from ``bench/artifacts.py``'s
cache). Reports per task and engine: answer seconds (request to the closed JSON), time to
first token, answer tokens and tokens per second (rung's answer tokens include those of
the answer's start that code computes and feeds as prompt: a diagnosis's state detection;
the decoded ones in brackets), and the ratios of mean answer times and of tokens per
second. ``--warm``: each engine continues on the prompt head its last request left, as a
serving daemon does.

    cd bench && ../.venv/bin/python schema_answers.py [--preset smollm2-135m] [--n 4]

Writes ``bench/results/<date>-schema-answers.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import artifacts
import numpy as np
import report
from machine import machine_info

from rung.daemon.tasks.runner import Prepared, TaskResult, TaskRunner, fast_decoding
from rung.daemon.tasks.task import Task, load_tasks
from rung.engines import load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.onnx_engine import EngineOptions
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer
from rung.tools.corpus import generate as corpus

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ("st_code", "fault_tree", "diagnosis")


def rung_answers(engine_dir: Path, requests: dict[str, list[Any]], threads: int,
                 warm: Any = None
                 ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[list[int]]], str,
                            list[int] | None]:
    """rung's answers, one request at a time, the prompts' ids, the decoding, and the warm-up
    prompt's ids. Cold (``warm`` None): each through
    ``TaskRunner.run`` from an empty cache. Warm: ``warm`` (a diagnosis input not measured)
    first, then each through one decode loop of one row as the daemon's scheduler runs it
    (prepare, add, step, finish), which continues in place on the prompt head the last
    request left in its row."""
    engine = load_engine(engine_dir, "onnx", EngineOptions(threads=threads, decode="auto"))
    tok = Tokenizer.load(engine_dir, engine.manifest.tokenizer)
    fast = fast_decoding("auto", engine)
    runner = TaskRunner(engine, tok, load_tasks(), engine_dir, fast=fast)
    loop = BatchDecoder(engine, tok, 1, fast=fast) if warm is not None else None

    def answer(task: str, data: Any) -> TaskResult:
        if loop is None:
            (r,) = runner.run([(task, data)], SamplingParams())
            return r
        p = runner.prepare(task, data, SamplingParams())
        assert isinstance(p, Prepared), p
        loop.add(0, p.ids, p.params, p.constraint)
        done: list[tuple[Any, Generation]] = []
        while not done:
            done = loop.step()
        return runner.finish(p, done[0][1])

    answer("diagnosis", requests["diagnosis"][0] if warm is None else warm)   # warm up
    out: dict[str, list[dict[str, Any]]] = {}
    prompts: dict[str, list[list[int]]] = {}
    for task in TASKS:
        out[task], prompts[task] = [], []
        for data in requests[task]:
            prompts[task].append(runner.prompt_ids(runner.tasks[task], data))
            t0 = time.perf_counter()
            r = answer(task, data)
            s = time.perf_counter() - t0
            g = r.generation
            n = len(g.token_ids) if g is not None else 0
            # the answer's start computed by code (a diagnosis's state detection) is fed as
            # prompt: its tokens are the answer's too, written without decode steps
            computed = g.prompt_tokens - len(prompts[task][-1]) if g is not None else 0
            out[task].append({"s": s, "tokens": n + computed, "decoded": n,
                              "closed": (r.error or {}).get("code") != "truncated",
                              "ok": r.ok})
    warm_ids = None if warm is None else runner.prompt_ids(runner.tasks["diagnosis"], warm)
    return out, prompts, "fast" if fast else "plain", warm_ids


def _for_llama(schema: Any) -> Any:
    """``schema`` as llama.cpp's grammar converter can take it: without ``maxLength`` /
    ``maxItems`` (its parser refuses the repetitions a bound of thousands expands to) and
    with ``\\.`` in patterns written ``[.]`` (its parser refuses the escape it emits)."""
    if isinstance(schema, dict):
        return {k: (v.replace("\\.", "[.]") if k == "pattern" and isinstance(v, str)
                    else _for_llama(v))
                for k, v in schema.items() if k not in {"maxLength", "maxItems"}}
    if isinstance(schema, list):
        return [_for_llama(v) for v in schema]
    return schema


_PROBE = """
import json, sys, llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
grammar = llama_cpp.LlamaGrammar.from_json_schema(sys.stdin.read(), verbose=False)
llm.create_completion(prompt=[1], max_tokens=1, temperature=0.0, grammar=grammar)
"""


def _llama_grammar(llama_cpp: Any, gguf: Path, task: str, schema: dict[str, Any],
                   relaxed: list[str]) -> Any:
    """The grammar llama.cpp answers ``task`` under: its published schema, or, where
    llama.cpp cannot parse that grammar (it aborts the process: tried in a child), the
    schema rewritten as it can (``_for_llama``; ``task`` then joins ``relaxed``)."""
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(gguf)], input=json.dumps(schema),
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        relaxed.append(task)
        schema = _for_llama(schema)
    return llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)


def llama_answers(gguf: Path, tasks: dict[str, Task], prompts: dict[str, list[list[int]]],
                  threads: int, relaxed: list[str], warm: list[int] | None = None
                  ) -> tuple[dict[str, list[dict[str, Any]]], bool]:
    """llama.cpp's answers; ``relaxed`` gets the tasks whose schema llama.cpp could take
    only without its length bounds. Cold (``warm`` None): each from a reset context. Warm:
    the prompt ``warm`` (not measured) first, then each on the context the last one left
    (llama-cpp-python continues on the longest prefix its cache shares with the prompt)."""
    import llama_cpp

    # llama-cpp-python 0.3.36 as pip builds it here crashes on batches of quantized tokens
    # on AMX CPUs (bench/workers.py): quantized files prefill one token per batch
    token_batches = ("amx_tile" in Path("/proc/cpuinfo").read_text()
                     and not gguf.parent.name.endswith("f32"))
    batch = 1 if token_batches else 512
    llm = llama_cpp.Llama(str(gguf), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                          n_batch=batch, n_ubatch=batch, verbose=False)
    out: dict[str, list[dict[str, Any]]] = {}
    if warm is not None:
        grammar = _llama_grammar(llama_cpp, gguf, "diagnosis",
                                 tasks["diagnosis"].output_schema, [])
        for _ in llm.create_completion(prompt=warm, max_tokens=tasks["diagnosis"].max_tokens,
                                       temperature=0.0, grammar=grammar, stream=True):
            pass
    for task in TASKS:
        grammar = _llama_grammar(llama_cpp, gguf, task, tasks[task].output_schema, relaxed)
        out[task] = []
        for ids in prompts[task]:
            if warm is None:
                llm.reset()
            t0 = time.perf_counter()
            first, text, n = None, "", 0
            for chunk in llm.create_completion(prompt=ids, max_tokens=tasks[task].max_tokens,
                                               temperature=0.0, grammar=grammar, stream=True):
                first = first or time.perf_counter() - t0
                text += chunk["choices"][0]["text"]
                n += 1
            s = time.perf_counter() - t0
            try:
                json.loads(text)
                closed = True
            except json.JSONDecodeError:
                closed = False
            out[task].append({"s": s, "ttft_s": first, "tokens": n, "closed": closed})
    return out, token_batches


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    s = float(np.mean([r["s"] for r in rows]))
    tokens = float(np.mean([r["tokens"] for r in rows]))
    out = {"s_mean": s, "tokens_mean": tokens, "tok_per_s": tokens / s,
           "closed": sum(r["closed"] for r in rows), "n": len(rows)}
    if "ttft_s" in rows[0]:
        out["ttft_s_mean"] = float(np.mean([r["ttft_s"] or 0.0 for r in rows]))
    if "ok" in rows[0]:
        out["valid"] = sum(r["ok"] for r in rows)
    if "decoded" in rows[0]:
        out["decoded_mean"] = float(np.mean([r["decoded"] for r in rows]))
    return out


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [f"# Structured answers against llama.cpp {record['stamp']}", "",
             f"Command: `{record['command']}`", "",
             f"Machine: {m['cpu_model']}, {m['cpus_usable']} CPUs ({', '.join(m['simd'])}); "
             f"{record['preset']}, {record['n']} held-out requests per task, greedy, batch 1.",
             "", "| precision | task | rung decode | rung s / answer | rung answer tokens "
             "(decoded) | rung tok/s | llama.cpp s / answer | llama.cpp TTFT s | llama.cpp "
             "tokens | llama.cpp tok/s | answer time ratio | tok/s ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for pair, by_task in record["results"].items():
        for task, r in by_task.items():
            a, b = r["rung"], r["llama.cpp"]
            decoded = a.get("decoded_mean", a["tokens_mean"])
            lines.append(f"| {pair} | {task} | {r['decode']} | {a['s_mean']:.2f} | "
                         f"{a['tokens_mean']:.0f} ({decoded:.0f}) | {a['tok_per_s']:.0f} | "
                         f"{b['s_mean']:.2f} | {b['ttft_s_mean']:.2f} | "
                         f"{b['tokens_mean']:.0f} | {b['tok_per_s']:.0f} | "
                         f"{b['s_mean'] / a['s_mean']:.2f}x | "
                         f"{a['tok_per_s'] / b['tok_per_s']:.2f}x |")
    notes = [f"- {pair}: llama.cpp prefilled one token per batch (llama-cpp-python on this "
             "AMX CPU crashes on batched quantized prefill)"
             for pair, tb in record["token_batches"].items() if tb]
    notes += [f"- llama.cpp's grammar parser refused the published schema of {', '.join(r)}"
              " (\"number of rules that are going to be repeated ... exceeds sane "
              "defaults\", then the process aborts): it answered under that schema without "
              "maxLength/maxItems and with `\\.` in patterns written `[.]`"
              for r in [record.get("relaxed") or []] if r]
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--pairs", default="fp32=rung:llamacpp-f32,int4=rung-int4:llamacpp-q4_0")
    p.add_argument("--n", type=int, default=4, help="held-out requests per task")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--tag", default="", help="appended to the results' file name")
    p.add_argument("--warm", action="store_true",
                   help="serve as a daemon does: each engine continues on the prompt head "
                   "its last request left (rung: its decode loop's row; llama.cpp: its own "
                   "prefix match) after one unmeasured request")
    args = p.parse_args(argv)
    pairs = {k: tuple(v.split(":")) for k, v in
             (item.split("=") for item in args.pairs.split(","))}
    art, errors = artifacts.ensure(args.preset, tuple({e for pr in pairs.values() for e in pr}))
    if errors:
        sys.exit(f"schema_answers: build failed: {errors}")
    requests: dict[str, list[Any]] = {t: [] for t in TASKS}
    spare: list[Any] = []   # the warm-up request of --warm: a diagnosis not measured
    for s in corpus(60, seed=1000):
        if len(requests[s["task"]]) < args.n:
            requests[s["task"]].append(s["input"])
        elif s["task"] == "diagnosis" and not spare:
            spare.append(s["input"])
    tasks = load_tasks()
    record: dict[str, Any] = {"stamp": time.strftime("%Y-%m-%d") + "-schema-answers"
                              + (f"-{args.tag}" if args.tag else ""),
                              "command": shlex.join(sys.orig_argv), "machine": machine_info(),
                              "preset": args.preset, "n": args.n, "warm": args.warm,
                              "results": {},
                              "token_batches": {}}
    for pair, (rung_kind, llama_kind) in pairs.items():
        warm = spare[0] if args.warm else None
        got, prompts, decode, warm_ids = rung_answers(art.path(rung_kind), requests,
                                                      args.threads, warm)
        relaxed: list[str] = []
        theirs, token_batches = llama_answers(art.path(llama_kind) / "model.gguf", tasks,
                                              prompts, args.threads, relaxed, warm_ids)
        record.setdefault("relaxed", relaxed)
        record["token_batches"][pair] = token_batches
        record["results"][pair] = {t: {"decode": decode, "rung": summary(got[t]),
                                       "llama.cpp": summary(theirs[t])} for t in TASKS}
        print(f"schema_answers: {pair}: {record['results'][pair]}", file=sys.stderr)
    report.publish(args.out, record, markdown(record).splitlines())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
