"""One sequence's decoding state and what it yields: sample -> grammar -> stop checks, per
row, so a row whose token step fails (sampling, its grammar, its detokenizing) finishes
alone with ``finish_reason`` ``"error"`` while the rows beside it go on. The decode loop
that drives rows is ``batch.BatchDecoder`` (``generate.generate`` runs it for a fixed set
of prompts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rung.engines.grammar import Constraint
from rung.engines.sampler import Sampler, SamplingParams, StopChecker
from rung.engines.tokenizer import StreamDecoder, Tokenizer

log = logging.getLogger("rung.engine")


@dataclass
class Generation:
    """One finished sequence."""

    prompt_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "error" (then ``error`` says why)
    ttft_ms: float
    decode_tok_s: float
    ffn_skip_ratio: float | None = None  # skipped / (one-token steps x layers); None = n/a
    mask_seconds: list[float] | None = None  # per step, when decoding under a constraint
    cached_tokens: int = 0  # prompt positions restored from a cache instead of prefilled
    error: str | None = None  # why the row's token step failed (finish_reason "error")
    steps: int = 0            # decode steps (engine forwards) that produced its tokens
    drafted_tokens: int = 0   # draft tokens offered (fast decoding)
    forced_tokens: int = 0    # of those, forced by the grammar
    accepted_tokens: int = 0  # drafts the model's own pick confirmed


@dataclass
class Row:
    """One sequence's decoding state."""

    sampler: Sampler
    stream: StreamDecoder
    stop: StopChecker
    token_ids: list[int]
    eos_ids: frozenset[int]
    holdback: int
    constraint: Constraint | None = None
    text: str = ""
    emitted: int = 0
    finish: str | None = None
    error: str | None = None
    drafts: list[int] = field(default_factory=list)   # offered in the next step
    steps: int = 0
    drafted: int = 0
    forced: int = 0
    accepted: int = 0


def new_row(tokenizer: Tokenizer, params: SamplingParams, room: int,
            constraint: Constraint | None = None) -> Row:
    """The state of a sequence with ``room`` positions left in its context."""
    eos = frozenset(tokenizer.eos_token_ids)
    return Row(Sampler(params), tokenizer.stream(),
               StopChecker(eos, params.stop, min(params.max_tokens, room)), [], eos,
               max((len(s) for s in params.stop), default=1) - 1, constraint)


def advance(row: Row, logits: np.ndarray, tag: Any,
            on_text: Callable[[Any, str], None] | None) -> None:
    """Sample the row's next token from ``logits`` [V] and run its stop checks. Any failure
    in that finishes this row only: ``finish`` ``"error"``, ``error`` the reason."""
    try:
        safe = _step(row, logits)
    except Exception as e:  # one row's failure must not fail the rows beside it
        log.exception("row %s failed at token %d; the rows beside it go on", tag,
                      len(row.token_ids))
        row.finish, row.error = "error", f"{type(e).__name__}: {e}"
        return
    if on_text is not None and safe > row.emitted:
        on_text(tag, row.text[row.emitted:safe])
        row.emitted = safe


def _step(row: Row, logits: np.ndarray) -> int:
    """Append one token to the row; returns how much of its text is safe to emit."""
    constraint = row.constraint
    if constraint is None:
        tok = row.sampler.sample(logits)
    else:
        pick = constraint.first_choice(logits) if row.sampler.params.temperature == 0 else None
        tok = pick if pick is not None else row.sampler.sample(logits, constraint.allowed())
        constraint.consume(tok)
    row.token_ids.append(tok)
    is_eos = tok in row.eos_ids
    if not is_eos:
        row.text += row.stream.push(tok)
    row.finish = row.stop.check(tok, row.text, len(row.token_ids))
    if row.finish is not None:
        row.text = row.stop.truncate(row.text + ("" if is_eos else row.stream.flush()))
        safe = len(row.text)
    else:  # hold back what could still become a stop string
        safe = len(row.text) - row.holdback
    return safe


def row_result(row: Row, prompt_len: int, t0: float, t_first: float, t_end: float) -> Generation:
    n = len(row.token_ids)
    decode_s = t_end - t_first
    return Generation(prompt_tokens=prompt_len, token_ids=row.token_ids, text=row.text,
                      finish_reason=row.finish or "length",
                      ttft_ms=(t_first - t0) * 1000.0,
                      decode_tok_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
                      mask_seconds=None if row.constraint is None
                      else row.constraint.mask_seconds, error=row.error, steps=row.steps,
                      drafted_tokens=row.drafted, forced_tokens=row.forced,
                      accepted_tokens=row.accepted)
