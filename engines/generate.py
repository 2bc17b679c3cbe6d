"""The generation loop: prefill -> sample -> decode one token at a time -> stop checks.

Several sequences of different lengths run as one batch: prompts are right-padded into one
prefill, then every step feeds one token per row; a finished row idles (``n_new = 0``) and
its cache stops growing. Each row has its own seeded sampler, so a prompt gives the same
tokens alone or in a batch (on an engine with FFN gates only when they skip nothing: gates
act on decode steps of a single sequence). A row whose token step fails (sampling, its
grammar, its detokenizing) finishes alone with ``finish_reason`` ``"error"``; the other rows
go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rung.engines import Engine
from rung.engines.errors import GenerationError
from rung.engines.grammar import Constraint
from rung.engines.kv import KVCache
from rung.engines.sampler import Sampler, SamplingParams, StopChecker
from rung.engines.tokenizer import StreamDecoder, Tokenizer

if TYPE_CHECKING:
    from rung.engines.prefix_cache import PrefixCache


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


@dataclass
class Row:
    """One sequence's decoding state (shared by ``generate`` and ``batch.BatchDecoder``)."""

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


def _prefill_batch(prompts: Sequence[Sequence[int]],
                   start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded suffixes ``prompt[start:]`` [B, S] and their lengths [B]."""
    lens = np.array([len(p) - int(s) for p, s in zip(prompts, start, strict=True)], np.int64)
    tokens = np.zeros((len(prompts), int(lens.max())), np.int64)
    for b, p in enumerate(prompts):
        tokens[b, :lens[b]] = p[int(start[b]):]
    return tokens, lens


def generate(engine: Engine, tokenizer: Tokenizer, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams],
             on_text: Callable[[int, str], None] | None = None,
             constraints: Sequence[Constraint | None] | None = None,
             cache: KVCache | None = None,
             prefix: PrefixCache | None = None) -> list[Generation]:
    """Generate a continuation for each prompt (token ids), batched.

    Args:
        on_text: called with (row, new text) as text becomes complete (streaming).
        params: one for all rows, or one per row.
        constraints: per row, a grammar the output must follow (token masks before
            sampling), or None.
        cache: KV buffers to run in (one row per prompt); rows whose ``lengths`` are set
            already hold that many positions of their prompt (a hot slot). Default: new.
        prefix: restore each row's longest cached prompt prefix before, and offer the
            row's full blocks to the cold tier after.
    Raises:
        GenerationError: empty prompt, or a prompt that leaves no room in the context.
    """
    if not prompts:
        raise GenerationError("no prompts given")
    if cache is None:
        cache = engine.new_cache(len(prompts))
    if cache.batch != len(prompts):
        raise GenerationError(f"cache has {cache.batch} rows for {len(prompts)} prompts")
    max_seq = min(engine.manifest.dims.max_seq, cache.max_seq)
    for b, p in enumerate(prompts):
        if not p:
            raise GenerationError("empty prompt", "give at least one token of input")
        if len(p) >= max_seq:
            raise GenerationError(f"prompt of {len(p)} tokens does not fit the engine's "
                                  f"context of {max_seq}", "shorten the prompt")
        if int(cache.lengths[b]) >= len(p):
            raise GenerationError(f"row {b} already holds {int(cache.lengths[b])} positions "
                                  f"of a {len(p)}-token prompt")
    per_row = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(per_row) != len(prompts) or (constraints is not None
                                        and len(constraints) != len(prompts)):
        raise GenerationError("params/constraints must match the prompts one to one")
    rows = [new_row(tokenizer, pr, max_seq - len(p),
                    None if constraints is None else constraints[i])
            for i, (p, pr) in enumerate(zip(prompts, per_row, strict=True))]
    t0 = time.perf_counter()  # time to first token includes restoring cached KV
    if prefix is not None:
        for b, p in enumerate(prompts):
            if int(cache.lengths[b]) == 0:
                prefix.restore(cache, b, p)
    start = cache.lengths.copy()
    steps0 = engine.ffn_steps
    skips0 = None if engine.ffn_skips is None else engine.ffn_skips.copy()
    tokens, n_new = _prefill_batch(prompts, start)
    logits = engine.forward(cache, tokens, n_new)
    t_first = 0.0
    while True:
        for b, row in enumerate(rows):
            if row.finish is None:
                advance(row, logits[b, -1], b, on_text)
        if not t_first:
            t_first = time.perf_counter()
        if all(r.finish is not None for r in rows):
            break
        # a row that failed on its first token has none: it idles on a pad of 0
        tokens = np.array([[r.token_ids[-1] if r.token_ids else 0] for r in rows], np.int64)
        n_new = np.array([r.finish is None for r in rows], np.int64)
        logits = engine.forward(cache, tokens, n_new, allow_skip=True)
    t_end = time.perf_counter()
    ratio = None
    if engine.ffn_skips is not None and skips0 is not None and engine.ffn_steps > steps0:
        ratio = float((engine.ffn_skips - skips0).sum()
                      / ((engine.ffn_steps - steps0) * len(skips0)))
    out = [row_result(row, len(p), t0, t_first, t_end) for row, p in zip(rows, prompts,
                                                                       strict=True)]
    for b, g in enumerate(out):
        g.ffn_skip_ratio = ratio
        g.cached_tokens = int(start[b])
        if prefix is not None and g.error is None:
            prefix.save(cache, b, list(prompts[b]) + g.token_ids)
    return out


def new_row(tokenizer: Tokenizer, params: SamplingParams, room: int,
            constraint: Constraint | None = None) -> Row:
    """The state of a sequence with ``room`` positions left in its context."""
    eos = frozenset(tokenizer.eos_token_ids)
    return Row(Sampler(params), tokenizer.stream(),
               StopChecker(eos, params.stop, min(params.max_tokens, room)), [], eos,
               max((len(s) for s in params.stop), default=1) - 1, constraint)


def advance(row: Row, logits: np.ndarray, b: int,
            on_text: Callable[[int, str], None] | None) -> None:
    """Sample the row's next token from ``logits`` [V] and run its stop checks. Any failure
    in that finishes this row only: ``finish`` ``"error"``, ``error`` the reason."""
    try:
        safe = _step(row, logits)
    except Exception as e:  # one row's failure must not fail the rows beside it
        row.finish, row.error = "error", f"{type(e).__name__}: {e}"
        return
    if on_text is not None and safe > row.emitted:
        on_text(b, row.text[row.emitted:safe])
        row.emitted = safe


def _step(row: Row, logits: np.ndarray) -> int:
    """Append one token to the row; returns how much of its text is safe to emit."""
    if row.constraint is None:
        tok = row.sampler.sample(logits)
    else:
        tok = row.sampler.sample(logits, row.constraint.allowed())
        row.constraint.consume(tok)
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
                      else row.constraint.mask_seconds, error=row.error)
