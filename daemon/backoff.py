"""The one backoff of ``rung serve``: delays that grow by ``factor`` from ``first_s`` up to
``max_s``, with optional jitter.

Every retry that waits longer after each failure in a row uses it, each with its own numbers
and config keys: the supervisor's restarts (``supervise.Policy``), the MQTT and Sparkplug
reconnections (``mqtt.reconnect_min_s``/``reconnect_max_s``), the PLC handshake's operations
and link (the map's ``poll_s``/``retry_max_s``, ``modbus.reconnect_*``) and the outbox's
journal reads. Two ways to use it:

- stateless, :meth:`Backoff.delay` of the number of failures in a row the caller counts
  (one ``Backoff`` shared by several operations, each with its own count);
- stateful, :meth:`Backoff.next` after each failure and :meth:`Backoff.reset` once it works
  again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_STEPS = 30   # the exponent stops growing here (the cap is reached long before)


@dataclass
class Backoff:
    """Delays from ``first_s``, times ``factor`` per failure in a row, up to ``max_s``.

    ``jitter`` (0 to 1): up to that fraction of each delay is taken off at random (``rng``),
    so that clients failing together do not retry together; 0 (the default) keeps the
    delays exact.
    """

    first_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 0.0
    rng: Callable[[], float] = field(default=random.random, compare=False, repr=False)
    failures: int = field(default=0, compare=False)   # in a row, for ``next``/``reset``

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within 0..1, not {self.jitter}")
        if self.factor < 1.0:
            raise ValueError(f"factor must be at least 1, not {self.factor}")

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (from 1; less counts as 1)."""
        steps = min(max(failures, 1) - 1, MAX_STEPS)
        wait = float(min(self.first_s * self.factor ** steps, self.max_s))
        if self.jitter:
            wait -= wait * self.jitter * self.rng()
        return wait

    def next(self) -> float:
        """Count one more failure in a row; the wait before the next try."""
        self.failures += 1
        return self.delay(self.failures)

    def reset(self) -> None:
        """It worked: the next failure waits ``first_s`` again."""
        self.failures = 0
