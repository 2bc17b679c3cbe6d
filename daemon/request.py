"""The typed request every adapter hands the scheduler, and where its answer goes.

An adapter parses its raw input at the edge (``mqtt/requests.py`` for a message, the PLC
job for a trigger) into a :class:`Request`; the scheduler runs it and hands back an
``Answer``. Nothing here knows a protocol's wire format: this module sits below the
adapters and the scheduler alike, so imports run one way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Address:
    """Where and how to answer."""

    topic: str
    correlation: bytes | None
    id: str | None


@dataclass(frozen=True)
class Request:
    """A task request: what the scheduler needs (task, input, sampling, deadline), and for
    one that came over MQTT its journal row (``seq``) and reply address. The input is
    checked against the task schema later, by the runner (``bad_request`` on a mismatch).
    Its answer comes back as the future ``Scheduler.submit`` returns."""

    seq: int                 # the journal row (0: not journaled, e.g. a PLC's job)
    task: str
    input: dict[str, Any]
    received: float
    deadline: float
    reply: Address | None = None   # MQTT only: where the answer goes
    session: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    output_formats: tuple[str, ...] = ()   # extra forms of the answer (mqtt/requests.py)
