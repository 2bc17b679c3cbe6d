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

from rung.engines.grammar import Constraint

MAX_DRAFT = 8      # tokens offered per step
LOOKUP_NGRAMS = (3, 2)


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
