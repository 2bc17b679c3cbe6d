"""Generate continuations of a fixed set of prompts: the daemon's decode loop
(``batch.BatchDecoder``) driven until every row has finished, for ``rung generate
--prompt`` and the raw prompts of the eval and the bench, so every number they report comes
from the loop the daemon runs (task requests go through the daemon's own request driver,
``daemon/tasks/drive.py``).

Each row has its own seeded sampler, so a prompt gives the same tokens alone or in a batch
(on an engine with FFN gates only when they skip nothing: gates act on decode steps of a
single sequence). A row whose token step fails finishes alone with ``finish_reason``
``"error"``; the other rows go on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from rung.engines import AnyEngine
from rung.engines.batch import BatchDecoder
from rung.engines.errors import GenerationError
from rung.engines.grammar import Constraint
from rung.engines.kv import KVCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

if TYPE_CHECKING:
    from rung.engines.prefix_cache import PrefixCache

__all__ = ["Generation", "generate"]


def generate(engine: AnyEngine, tokenizer: Tokenizer, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams],
             on_text: Callable[[int, str], None] | None = None,
             constraints: Sequence[Constraint | None] | None = None,
             cache: KVCache | None = None,
             prefix: PrefixCache | None = None, fast: bool = False) -> list[Generation]:
    """Generate a continuation for each prompt (token ids), batched.

    Args:
        on_text: called with (row, new text) as text becomes complete (streaming).
        params: one for all rows, or one per row.
        constraints: per row, a grammar the output must follow (token masks before
            sampling), or None.
        cache: KV buffers to run in, one row per prompt (default: new ones).
        prefix: restore each row's longest cached prompt prefix before, and offer the
            row's full blocks to the cold tier after.
        fast: greedy rows also feed draft tokens, checked by the model in the same step
            (``engines/drafts.py``); the tokens are the same as without.
    Raises:
        GenerationError: no prompts, an empty prompt, one that leaves no room in the
            context, or params/constraints that do not match the prompts.
    """
    if not prompts:
        raise GenerationError("no prompts given")
    per_row = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(per_row) != len(prompts) or (constraints is not None
                                        and len(constraints) != len(prompts)):
        raise GenerationError("params/constraints must match the prompts one to one")
    # one prefill over the whole prompts, as a fixed batch wants it; the daemon chunks
    decoder = BatchDecoder(engine, tokenizer, len(prompts), prefix,
                           prefill_chunk=sum(len(p) for p in prompts) or 1, cache=cache,
                           on_text=on_text, fast=fast)
    for i, (p, pr) in enumerate(zip(prompts, per_row, strict=True)):
        decoder.add(i, p, pr, None if constraints is None else constraints[i])
    done: dict[Hashable, Generation] = {}
    while decoder.active:
        done.update(decoder.step())
    return [done[i] for i in range(len(prompts))]
