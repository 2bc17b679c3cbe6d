"""Training corpus for rung's demo model: instruction -> answer pairs for the built-in tasks.

Each sample is ``{"task", "kind", "input", "output"}``: ``input`` validates against the task's
``input_schema``, ``output`` against its ``output_schema`` and its semantic validators (ST
syntax and identifiers, fault-tree analysis, what code knows of a diagnosis request), and
the request's narrowed grammar lets it through (``rung.daemon.tasks.shaping``: a diagnosis
with the states and prognosis code computes, a fault tree written top-down). ``kind`` names
the ST archetype or the asset the sample was built from (for logs and coverage; not model
input).

Generation is deterministic: one ``random.Random(seed)`` deals the tasks round-robin, the
archetypes/assets from reshuffled decks and a sub-seed per sample; no global state, no clock.

    python -m rung.tools.corpus --n 100 --seed 0 --out corpus.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rung.tools.corpus_diagnosis import diagnosis_sample
from rung.tools.corpus_fault_tree import fault_tree_sample
from rung.tools.corpus_plant import ASSETS
from rung.tools.corpus_st import ARCHETYPES, st_sample

TASKS = ("st_code", "fault_tree", "diagnosis")

Pair = tuple[dict[str, Any], dict[str, Any]]
_BUILDERS: dict[str, tuple[Callable[[random.Random, str], Pair], tuple[str, ...]]] = {
    "st_code": (st_sample, tuple(ARCHETYPES)),
    "fault_tree": (fault_tree_sample, tuple(a.key for a in ASSETS.values() if a.tops)),
    "diagnosis": (diagnosis_sample, tuple(ASSETS)),
}


class _Deck:
    """Deals items in shuffled rounds, so that every item appears once per round."""

    def __init__(self, rng: random.Random, items: Sequence[str]) -> None:
        self.rng = rng
        self.items = list(items)
        self.hand: list[str] = []

    def deal(self) -> str:
        if not self.hand:
            self.hand = self.rng.sample(self.items, len(self.items))
        return self.hand.pop()


def generate(n: int, seed: int = 0, tasks: Sequence[str] = TASKS) -> list[dict[str, Any]]:
    """``n`` samples ``{"task", "kind", "input", "output"}``, tasks round-robin, seeded.

    The same ``(n, seed, tasks)`` gives the same list (identical ``json.dumps(...,
    sort_keys=True)``); a longer run starts with the samples of a shorter one.
    """
    tasks = tuple(tasks)
    unknown = [t for t in tasks if t not in _BUILDERS]
    if unknown or not tasks:
        raise ValueError(f"unknown or no tasks {unknown}: choose from {', '.join(TASKS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    master = random.Random(seed)
    decks = {t: _Deck(master, _BUILDERS[t][1]) for t in dict.fromkeys(tasks)}
    samples = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        kind = decks[task].deal()
        rng = random.Random(master.getrandbits(64))
        data, output = _BUILDERS[task][0](rng, kind)
        samples.append({"task": task, "kind": kind, "input": data, "output": output})
    return samples


def describe(sample: dict[str, Any]) -> str:
    """A one-line summary of a sample, for logs and test failures."""
    task, kind = sample.get("task"), sample.get("kind", "?")
    data, out = sample.get("input", {}), sample.get("output", {})
    size = len(json.dumps(out, separators=(",", ":"), ensure_ascii=False))
    if task == "st_code":
        lines = len(str(out.get("body", "")).splitlines())
        return (f"st_code[{kind}] {out.get('pou_type')} {out.get('name')}: "
                f"{len(out.get('variables', []))} vars, {lines} body lines, {size} chars")
    if task == "fault_tree":
        types = "/".join(sorted({g.get("type", "?") for g in out.get("gates", [])}))
        return (f"fault_tree[{kind}] {data.get('top_event')!r}: {len(out.get('gates', []))} "
                f"gates ({types}), {len(out.get('basic_events', []))} events, {size} chars")
    if task == "diagnosis":
        states = [r.get("state") for r in out.get("state_detection", [])]
        counts = ", ".join(f"{states.count(s)} {s}" for s in ("normal", "alert", "alarm"))
        history = sum(1 for p in data.get("points", []) if p.get("history"))
        return (f"diagnosis[{kind}] {data.get('asset')!r}: {counts}, {history} with history; "
                f"{len(out.get('health_assessment', []))} faults, prognosis "
                f"{out.get('prognosis', {}).get('status')}, priority "
                f"{out.get('advisory', {}).get('priority')}, {size} chars")
    return f"{task}[{kind}]: {size} chars"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write ``--n`` samples as JSON lines (sorted keys) to ``--out`` (``-``: stdout)."""
    parser = argparse.ArgumentParser(prog="python -m rung.tools.corpus", description=__doc__
                                     .split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=100, help="number of samples (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma-separated tasks (default {','.join(TASKS)})")
    parser.add_argument("--out", default="-", help="output JSONL file (default: stdout)")
    args = parser.parse_args(argv)
    try:
        samples = generate(args.n, args.seed, [t for t in args.tasks.split(",") if t])
    except ValueError as e:
        parser.error(str(e))
    lines = "".join(json.dumps(s, sort_keys=True, ensure_ascii=False) + "\n" for s in samples)
    if args.out == "-":
        sys.stdout.write(lines)
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
