"""Progress lines on stderr for long steps (loading, export, verification)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

_enabled = True


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = on


@contextmanager
def step(what: str) -> Iterator[None]:
    """Print ``what ...`` before and ``done in X s`` after a long step."""
    t0 = time.perf_counter()
    if _enabled:
        print(f"rung: {what} ...", file=sys.stderr, flush=True)
    yield
    if _enabled:
        print(f"rung: {what}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr,
              flush=True)
