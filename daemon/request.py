"""The typed request every adapter hands the scheduler, and the one shape of its answer.

An adapter reads its raw input at the edge through its own entry (``mqtt/requests.py`` for
a message and ``opcua/call.py`` for a method call, both on the one request form,
``request_form.py``; the PLC job for a trigger) into a :class:`Request`; the scheduler runs
it and hands back an :class:`Answer`, which every adapter answers in the one envelope
(``envelope.py``). A request carries the task, its input, sampling and deadline only: where
its answer goes and what else its protocol needs stay with the adapter (``mqtt.requests.
MqttRequest``). Each request has one stable ``uid`` for the life of the process (kept by
``dataclasses.replace``), by which the scheduler and the driver match it. The task runner
answers in the same shape (``TaskResult`` is its name there), so a result is one type from
the validator to the payload. This module sits below the adapters, the scheduler and the
tasks alike, so imports run one way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from rung.engines.sequence import Generation

_uids = itertools.count(1)   # next() on a count is atomic under the GIL


def _next_uid() -> int:
    return next(_uids)


@dataclass(frozen=True)
class Request:
    """A task request: what the scheduler needs (task, input, sampling, deadline). The
    input is checked against the task schema later, by the runner (``bad_request`` on a
    mismatch). Its answer comes back as the future ``Scheduler.submit`` returns; ``ref``
    names the request in the scheduler's log lines (``mqtt request 12``); ``uid`` is its
    identity inside this process, left out of comparisons so that requests compare by
    what they ask: two requests with equal fields are equal."""

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
    uid: int = field(default_factory=_next_uid, compare=False, repr=False)


def usage(g: Generation) -> dict[str, Any]:
    """The ``usage`` of an answer the model wrote: its tokens and timings (the one place
    it is built; the scheduler adds ``first_token_ms``, the MQTT intake ``total_ms``)."""
    u: dict[str, Any] = {"prompt_tokens": g.prompt_tokens, "completion_tokens": len(g.token_ids),
                         "cached_tokens": g.cached_tokens, "ttft_ms": round(g.ttft_ms, 1),
                         "decode_tok_s": round(g.decode_tok_s, 1),
                         "ffn_skip_ratio": g.ffn_skip_ratio, "steps": g.steps}
    if g.drafted_tokens:
        u.update(drafted_tokens=g.drafted_tokens, forced_tokens=g.forced_tokens,
                 accepted_tokens=g.accepted_tokens)
    return u


@dataclass
class Answer:
    """One request's outcome, from the task runner to the adapters: ``ok`` with the
    output and its validation, or an error ``code`` and ``message`` (the output and
    validation of an answer that failed its checks stay, so the asker sees why).
    ``generation``: the model's last try, when it reached the model; its ``usage`` is
    derived from it (empty when the request never reached the model). ``attempts``: the
    tries it took; ``failed_checks``: the first failing check of each failed try."""

    request: Request
    ok: bool
    code: str | None = None           # error code when not ok
    message: str = ""
    output: Any = None
    validation: Any = None
    usage: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1
    failed_checks: tuple[str, ...] = ()
    generation: Generation | None = None

    def __post_init__(self) -> None:
        if self.generation is not None and not self.usage:
            self.usage = usage(self.generation)

    @property
    def task(self) -> str:
        return self.request.task

    @property
    def error(self) -> dict[str, str] | None:
        """``{"code", "message"}`` when not ok (a missing code reads ``internal``)."""
        if self.ok:
            return None
        return {"code": self.code or "internal", "message": self.message}
