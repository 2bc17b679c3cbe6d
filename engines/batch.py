"""The decode loop: sequences join and leave one shared KV cache between engine steps.

``BatchDecoder`` owns a cache of ``rows`` rows. ``add`` puts a prompt in a free row; every
``step`` is one ``engine.forward`` over all rows (schedule -> run -> postprocess): a
joining row feeds the next chunk of its prompt, a decoding row its last token, a free row
nothing (``n_new = 0``). Rows that finish leave with their ``Generation`` and free their
row at once, so a waiting request joins on the next step instead of after the whole batch.
Sampling, grammar masks and stop checks are per row (``sequence.advance``): a row whose
token step fails leaves with ``finish_reason`` ``"error"`` and the others decode on.

A row keeps the KV of the sequence that left it (its hot tier): a prompt that shares a
prefix with what a free row holds continues in that row without copying anything, and
only when the cold tier (``PrefixCache``) holds a longer prefix is that restored instead.
The daemon, ``generate`` (CLI, eval, bench) and the task runner all decode through here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rung.engines import AnyEngine
from rung.engines.drafts import Lookup, propose
from rung.engines.errors import GenerationError
from rung.engines.grammar import Constraint
from rung.engines.kv import KVCache
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation, Row, advance, new_row, row_result
from rung.engines.tokenizer import Tokenizer


@dataclass
class _Seq:
    tag: Hashable
    prompt: list[int]
    row: Row
    cached: int                  # prompt positions reused (hot row or cold tier)
    fed: int                     # prompt positions in the KV cache so far
    steps0: int = 0              # the engine's FFN-gate counters when the sequence joined
    skips0: np.ndarray | None = None
    t0: float = field(default_factory=time.perf_counter)
    t_first: float = 0.0
    lookup: Lookup | None = None   # prompt-lookup index of prompt + answer (fast decoding)


class BatchDecoder:
    """Up to ``rows`` sequences decoded together; ``prefill_chunk`` bounds the prompt
    tokens all joining rows feed together in one step (the row that joined first takes its
    share first), so a long prompt does not stall the others, and a step's activations stay
    those of ``prefill_chunk`` tokens however many rows join at once: ONNX Runtime's arena
    keeps what the largest step took, so an unbounded joint prefill would raise the
    process's memory for good (measured in docs/benchmarks/plant-load.md)."""

    def __init__(self, engine: AnyEngine, tokenizer: Tokenizer, rows: int,
                 prefix: PrefixCache | None = None, prefill_chunk: int = 512,
                 cache: KVCache | None = None,
                 on_text: Callable[[Any, str], None] | None = None,
                 fast: bool = False) -> None:
        """``cache``: KV buffers to decode in (default: new ones of ``rows`` rows at the
        engine's context); ``on_text``: called with (tag, new text) as text becomes final
        (streaming); ``fast``: greedy rows feed draft tokens with their last one
        (``drafts``), checked by the model in the same step."""
        if rows < 1 or prefill_chunk < 1:
            raise GenerationError("a batch needs at least one row and a positive chunk")
        self.engine, self.tokenizer, self.prefix = engine, tokenizer, prefix
        self.cache = cache if cache is not None else engine.new_cache(rows)
        if self.cache.batch != rows:
            raise GenerationError(f"cache has {self.cache.batch} rows for a batch of {rows}")
        self.max_seq = min(engine.manifest.dims.max_seq, self.cache.max_seq)
        self.prefill_chunk = prefill_chunk
        self.on_text = on_text
        self.fast = fast
        self.seqs: list[_Seq | None] = [None] * rows
        self.held: list[list[int]] = [[] for _ in range(rows)]   # a free row's KV tokens
        self.steps = 0

    @property
    def free(self) -> int:
        return sum(s is None for s in self.seqs)

    @property
    def active(self) -> int:
        return len(self.seqs) - self.free

    def add(self, tag: Hashable, prompt: Sequence[int], params: SamplingParams,
            constraint: Constraint | None = None) -> int:
        """Put a sequence in a free row (the one holding the longest prefix of it);
        returns the row.

        Raises:
            GenerationError: no free row, an empty prompt, or one that leaves no room.
        """
        if not prompt:
            raise GenerationError("empty prompt", "give at least one token of input")
        room = self.max_seq - len(prompt)
        if room < 1:
            raise GenerationError(f"prompt of {len(prompt)} tokens does not fit the "
                                  f"engine's context of {self.max_seq}", "shorten the prompt")
        free = [b for b, s in enumerate(self.seqs) if s is None]
        if not free:
            raise GenerationError("no free row in the batch")
        t0 = time.perf_counter()   # time to first token includes restoring cached KV
        hot = {b: _shared(self.held[b], prompt) for b in free}
        row = max(free, key=lambda b: (hot[b], -len(self.held[b])))
        cold = 0 if self.prefix is None else self.prefix.available(prompt)
        self.held[row] = []
        if hot[row] >= cold and hot[row] > 0:
            cached = hot[row]
            self.cache.truncate(row, cached)     # continue in place: keep the shared part
        else:
            self.cache.reset(row)
            cached = 0 if self.prefix is None else self.prefix.restore(self.cache, row, prompt)
        skips = self.engine.ffn_skips
        self.seqs[row] = _Seq(tag, list(prompt), new_row(self.tokenizer, params, room,
                                                         constraint), cached, cached,
                              self.engine.ffn_steps, None if skips is None else skips.copy(),
                              t0)
        return row

    def step(self) -> list[tuple[Hashable, Generation]]:
        """One engine step over every row (schedule -> run -> postprocess); the sequences
        that finished in it."""
        chunks, scored = self._schedule()
        n_new = np.array([len(c) for c in chunks], np.int64)
        if not n_new.any():
            return []
        tokens = np.zeros((len(self.seqs), int(n_new.max())), np.int64)   # [B, S]
        for b, chunk in enumerate(chunks):
            tokens[b, :len(chunk)] = chunk
        # [B, K]: a row's first scored position, then the next ones up to its last fed
        # token (a prefilling row scores only its last, a drafting row every one)
        k = max(scored)
        first = np.maximum(n_new - np.array(scored), 0)
        index = np.minimum(first[:, None] + np.arange(k), np.maximum(n_new - 1, 0)[:, None])
        # FFN gates act on one token of one sequence: not on prefill, not on drafts
        one_each = all(s is None or (s.fed >= len(s.prompt) and not s.row.drafts)
                       for s in self.seqs)
        logits = self.engine.forward(self.cache, tokens, n_new, index, allow_skip=one_each)
        self.steps += 1
        done: list[tuple[Hashable, Generation]] = []
        for b, s in enumerate(self.seqs):
            if s is None:
                continue
            if s.fed < len(s.prompt):
                s.fed += int(n_new[b])
                if s.fed < len(s.prompt):
                    continue   # more prompt to feed: these logits are not the answer's
            self._postprocess(b, s, logits[b])
            if s.row.finish is not None:
                done.append((s.tag, self._leave(b, s)))
        return done

    def _schedule(self) -> tuple[list[list[int]], list[int]]:
        """Each row's tokens for this step, and how many of its positions are scored."""
        chunks: list[list[int]] = []
        scored: list[int] = []
        share = self._prompt_shares()
        for b, s in enumerate(self.seqs):
            if s is None:
                chunks.append([])
                scored.append(1)
            elif s.fed < len(s.prompt):
                chunks.append(s.prompt[s.fed:s.fed + share.get(b, 0)])
                scored.append(1)
            else:   # the last token, then the drafts the model checks in the same step
                chunks.append([s.row.token_ids[-1], *s.row.drafts])
                scored.append(len(chunks[-1]))
        return chunks, scored

    def _prompt_shares(self) -> dict[int, int]:
        """Row -> prompt tokens it feeds this step: ``prefill_chunk`` in all, handed out in
        the order the rows joined; a row left without a share feeds nothing this step."""
        joining = sorted(((b, s) for b, s in enumerate(self.seqs)
                          if s is not None and s.fed < len(s.prompt)), key=lambda bs: bs[1].t0)
        left, share = self.prefill_chunk, {}
        for b, s in joining:
            share[b] = min(left, len(s.prompt) - s.fed)
            left -= share[b]
        return share

    def _postprocess(self, b: int, s: _Seq, logits: np.ndarray) -> None:
        """Sample from ``logits`` [K, V]; each draft the pick confirms is kept and the next
        position sampled too; the KV of drafts past the first miss is dropped."""
        row, drafts = s.row, s.row.drafts
        row.steps += 1
        advance(row, logits[0], s.tag, self.on_text)
        if not s.t_first:
            s.t_first = time.perf_counter()
        kept = 0
        while (row.finish is None and kept < len(drafts)
               and row.token_ids[-1] == drafts[kept]):
            kept += 1
            advance(row, logits[kept], s.tag, self.on_text)
        row.accepted += kept
        self.cache.rollback(b, len(drafts) - kept)   # their positions are free again
        row.drafts = []
        if self.fast and row.finish is None and row.sampler.params.temperature == 0:
            self._draft(s)

    def _draft(self, s: _Seq) -> None:
        row = s.row
        if s.lookup is None:
            s.lookup = Lookup(s.prompt)
        s.lookup.extend(row.token_ids[len(s.lookup.tokens) - len(s.prompt):])
        room = min(self.max_seq - len(s.lookup.tokens) - 1,
                   row.stop.max_tokens - len(row.token_ids) - 1)
        row.drafts, forced = propose(s.lookup, row.constraint, room)
        row.drafted += len(row.drafts)
        row.forced += len(row.drafts) if forced else 0

    def run(self, interrupt: threading.Event | None = None,
            max_steps: int = 1_000_000) -> list[tuple[Hashable, Generation]]:
        """Step until a sequence finishes, ``interrupt`` is set (a request is waiting for
        a free row) or nothing is active."""
        for _ in range(max_steps):
            done = self.step()
            if done or not self.active or (interrupt is not None and interrupt.is_set()):
                return done
        return []

    def _leave(self, b: int, s: _Seq) -> Generation:
        g = row_result(s.row, len(s.prompt), s.t0, s.t_first, time.perf_counter())
        g.cached_tokens = s.cached
        skips, steps = self.engine.ffn_skips, self.engine.ffn_steps - s.steps0
        if skips is not None and s.skips0 is not None and steps > 0:
            # gates act on one-token steps of a single sequence: with one row, all its own
            g.ffn_skip_ratio = float((skips - s.skips0).sum() / (steps * len(skips)))
        if g.error is None:
            tokens = s.prompt + g.token_ids
            if self.prefix is not None:
                self.prefix.save(self.cache, b, tokens)
            # the row keeps what it holds for the next prompt that shares a prefix with it
            self.held[b] = tokens[:int(self.cache.lengths[b])]
        else:
            self.cache.reset(b)   # a failed row's contents are not offered again
        self.seqs[b] = None
        return g


def _shared(held: Sequence[int], prompt: Sequence[int]) -> int:
    """Positions of ``held`` that start ``prompt`` (at most ``len(prompt) - 1``: the last
    prompt token is always run, its logits start the answer)."""
    n = min(len(held), len(prompt) - 1)
    i = 0
    while i < n and held[i] == prompt[i]:
        i += 1
    return i
