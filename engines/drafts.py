"""Draft tokens for one row's next step, checked by the model in that step (fast decoding).

Structured answers repeat what they were given and what their grammar dictates, so a
forward over a few more tokens costs about what one token costs on a memory-bound box.
Two sources, no draft model:

- grammar fast-forward: the tokens the row's grammar forces next (llguidance
  ``compute_ff_tokens``: keys, punctuation, the tails of enum values);
- prompt lookup: the tokens that followed the latest earlier occurrence of the row's last
  n tokens (n = 3, then 2) in its prompt and its answer so far (point names, ids and
  identifiers copied from the request).

Drafts are offered only under greedy decoding and are accepted only where the model's own
greedy pick (under the grammar mask) equals them, so the output is token for token the
one plain decoding gives; a sampled row decodes one token per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rung.engines.manifest import HEAD_MAJOR

if TYPE_CHECKING:   # the engine imports this module: no grammar library at engine load
    from rung.engines.grammar import Constraint

MAX_DRAFT = 8      # tokens offered per step
LOOKUP_NGRAMS = (3, 2)

# weights whose engines run every step over at least two positions. A row that feeds one
# new token takes other kernel paths in ONNX Runtime than a row that feeds several (its
# attention's one-query path), which round slightly otherwise, while steps of several
# tokens give a row the same logits bit for bit however they are split and batched
# (MatMulNBits itself is row-invariant). The 8-bit activation quantization of the
# int8/int4 kernels amplifies such a difference a few positions on, so greedy near-ties
# break the other way and answers would depend on drafts and on the batch. So on the
# fused graph a quantized engine runs a second, unscored position beside every lone token
# and drops its KV (``OnnxEngine._padded``): drafts, batches and plain decoding then give
# a row the same logits. The generic graph's plain MatMul attention rounds by the step's
# length, so there fast decoding is not exact on quantized weights. fp32 differences stay
# below greedy near-ties, so fp32 steps stay unpadded. The graph adds the second position
# after the weight products (``attention_positions``), so the padding costs only the
# attention's share of a step. The measurements: docs/benchmarks/fast-decoding.md.
PADDED_WEIGHTS = ("int8", "int4")


def pads_steps(weights: str, gated: bool, layout: str) -> bool:
    """Whether an engine with these weights, FFN gates or not and this KV layout runs every
    row over two positions or more (a gated engine skips FFNs on one-token steps only)."""
    return weights in PADDED_WEIGHTS and not gated and layout == HEAD_MAJOR


def inexact(weights: str, gated: bool, layout: str) -> str | None:
    """Why fast decoding would answer otherwise than plain decoding on such an engine, or
    None where it answers the same: drafts run every FFN unskipped, and quantized weights
    are exact through padded steps on the fused graph only."""
    if gated:
        return "its FFN gates"
    if weights in PADDED_WEIGHTS and layout != HEAD_MAJOR:
        return f"its {weights} weights on the generic graph"
    return None


def multi_token(decode: str, weights: str, gated: bool, layout: str) -> bool:
    """Whether decoding ``decode`` (plain|fast|auto) on such an engine runs steps of
    several tokens (fast decoding's drafts)."""
    return decode == "fast" or (decode == "auto" and inexact(weights, gated, layout) is None)


class Lookup:
    """The prompt-lookup index of one row: its context (prompt, then the answer's accepted
    tokens) and, for each n-gram of ``LOOKUP_NGRAMS``, where its latest occurrence ends
    (the context's own last n-gram left out), kept as tokens are appended: a lookup is a
    dict probe instead of a scan of the context (~90 us a step on a 600-token context)."""

    def __init__(self, context: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        ctx, ends = self.tokens, self._ends
        for tok in tokens:
            end = len(ctx)   # the n-grams ending here are earlier ones once a token follows
            for n in LOOKUP_NGRAMS:
                if end >= n:
                    ends[tuple(ctx[end - n:end])] = end
            ctx.append(tok)

    def drafts(self, k: int = MAX_DRAFT) -> list[int]:
        """The tokens after the latest earlier occurrence of the context's last n tokens."""
        ctx = self.tokens
        for n in LOOKUP_NGRAMS:
            if len(ctx) <= n:
                continue
            end = self._ends.get(tuple(ctx[-n:]))
            if end is not None:
                return ctx[end:end + k]
        return []


def propose(lookup: Lookup, constraint: Constraint | None, room: int,
            k: int = MAX_DRAFT) -> tuple[list[int], bool]:
    """Drafts for the next step (at most ``room``) and whether the grammar forced them;
    a draft the grammar would refuse is never offered."""
    k = min(k, room)
    if k <= 0:
        return [], False
    if constraint is not None:
        forced = constraint.forced()[:k]
        if forced:
            return forced, True
    drafts = lookup.drafts(k)
    if constraint is not None and drafts:
        drafts = drafts[:constraint.valid_prefix(drafts)]
    return drafts, False
