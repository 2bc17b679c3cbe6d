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

if TYPE_CHECKING:   # the engine imports this module: no grammar library at engine load
    from rung.engines.grammar import Constraint

MAX_DRAFT = 8      # tokens offered per step
LOOKUP_NGRAMS = (3, 2)

# weights whose steps of several tokens answer otherwise than steps of one: the one-token
# and multi-token attention paths round differently (~4e-5 in the logits of SmolLM2's fp32
# engine), and the 8-bit activation quantization of the int8/int4 kernels turns such a
# difference into another rounding step, 0.3-0.6 in the logits, so near-ties break the other
# way (MatMulNBits itself gives a row the same result in a step of one or of nine rows; SmolLM2
# int4: 2 of 12 answers token for token the same; docs/benchmarks.md, "Fast decoding")
ROW_DEPENDENT_WEIGHTS = ("int8", "int4")


def inexact(weights: str, gated: bool) -> str | None:
    """Why fast decoding would answer otherwise than plain decoding on an engine with these
    weights (and FFN gates or not), or None where it answers the same: drafts run every FFN
    unskipped, and quantized weights are row-dependent (``ROW_DEPENDENT_WEIGHTS``)."""
    if gated:
        return "its FFN gates"
    if weights in ROW_DEPENDENT_WEIGHTS:
        return f"its {weights} weights"
    return None


def multi_token(decode: str, weights: str, gated: bool) -> bool:
    """Whether decoding ``decode`` (plain|fast|auto) on such an engine runs steps of
    several tokens (fast decoding's drafts)."""
    return decode == "fast" or (decode == "auto" and inexact(weights, gated) is None)


def lookup(context: Sequence[int], k: int = MAX_DRAFT) -> list[int]:
    """The tokens after the latest earlier occurrence of the context's last n tokens."""
    for n in LOOKUP_NGRAMS:
        if len(context) <= n:
            continue
        key = list(context[-n:])
        for start in range(len(context) - n - 1, -1, -1):
            if list(context[start:start + n]) == key:
                return list(context[start + n:start + n + k])
    return []


def propose(context: Sequence[int], constraint: Constraint | None, room: int,
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
    drafts = lookup(context, k)
    if constraint is not None and drafts:
        drafts = drafts[:constraint.valid_prefix(drafts)]
    return drafts, False
