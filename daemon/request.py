"""The typed request every adapter hands the scheduler.

An adapter parses its raw input at the edge (``mqtt/requests.py`` for a message, the PLC
job for a trigger) into a :class:`Request`; the scheduler runs it and hands back an
``Answer``. A request carries the task, its input, sampling and deadline only: where its
answer goes and what else its protocol needs stay with the adapter (``mqtt.requests.
MqttRequest``). This module sits below the adapters and the scheduler alike, so imports
run one way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """A task request: what the scheduler needs (task, input, sampling, deadline). The
    input is checked against the task schema later, by the runner (``bad_request`` on a
    mismatch). Its answer comes back as the future ``Scheduler.submit`` returns; ``ref``
    names the request in the scheduler's log lines (``mqtt request 12``)."""

    task: str
    input: dict[str, Any]
    received: float
    deadline: float
    ref: str = "request"
    session: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
