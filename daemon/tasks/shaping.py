"""Per-request output shapes: what the request fixes, the grammar enforces, and what code
can compute, code writes.

A task's published output schema is the contract; a request narrows it. A task's kind
(``kind.Kind.shape``) turns the request's input into a ``Shape``:

- ``schema``: the task's output schema specialized to this input, so whole classes of
  wrong answers cannot be generated (names that must come from the input are enums of the
  input's names; values the input states are constants);
- ``prefix``: the start of the answer, computed by code and fed to the model as prompt
  (one prefill, no decode steps): the diagnosis's state detection is the snapshot's
  values against their limits (ISO 13374 puts it below health assessment), so answer and
  snapshot cannot disagree.

The answer is always a document of the published schema (a narrowed schema accepts a
subset of it); the validators stay the judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rung.daemon.tasks.names import NamesAt
from rung.engines.grammar import Lark

Schema = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    schema: Schema
    prefix: str = ""      # compact JSON the answer starts with (computed by code)
    # (the answer's text so far) -> the schema or grammar the whole answer must follow,
    # once the text decides it (None: nothing new); applied each time it says something new
    restage: Callable[[str], Schema | Lark | None] | None = None
    restage_at: str = "["   # asked only after a token carrying this character
    # names the answer declares that must be new (``names.NameGuard``): at such a name,
    # what of it is written and the names it may not be
    names: NamesAt | None = None


def compact(value: Any) -> str:
    """JSON as the grammar writes it (no whitespace)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
