"""Random walks through a request's grammar, restaged as the runner restages: the tests
that no restage refuses what was written, and that whatever closes passes its check."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.task import Task
from rung.engines.grammar import Constraint


def walk(runner: TaskRunner, task: Task, data: Any, leaning: Callable[[str], bool],
         seed: int, most: int, lean: float, start: str = "") -> Constraint:
    """One walk from the answer's start (or from ``start``, a beginning the grammar allows,
    tokenized as the model would write it): at each position a token the grammar allows,
    with probability ``lean`` one whose text ``leaning`` picks (the tokens that end
    things, so walks get somewhere), until the answer closes or ``most`` tokens."""
    texts = runner.tokenizer.token_texts()
    vocab = runner.engine.manifest.dims.vocab_size
    picked = np.array([leaning(x) for x in texts] + [False] * (vocab - len(texts)))
    rng = random.Random(seed)
    constraint, prefix, _ = runner._shaped(task, data)
    if start:
        ids = runner.tokenizer.encode(start, add_bos=False)
        assert ids[:len(prefix)] == prefix, "start does not begin with the answer's prefix"
        for t in ids[len(prefix):]:
            constraint.consume(t)
    while not constraint.accepting and len(constraint.tokens) < most:
        ids = np.flatnonzero(constraint.allowed())
        marks = ids[picked[ids]]
        constraint.consume(int(rng.choice(marks if len(marks) and rng.random() < lean
                                          else ids)))
    return constraint
