"""The one request driver: task requests through the continuous batch, in one thread.

``Drive`` owns the batch decoder's rows (``engines.batch.BatchDecoder``) and the requests
in them. ``join`` prepares a request (input check, prompt, grammar: ``TaskRunner.prepare``)
and puts it in a free row; ``step`` runs the decoder until a sequence finishes (or
``interrupt`` is set: a request waits for a row), parses and validates each finished one
(``TaskRunner.finish``; the request counts as in flight until it is checked, and an ST
answer's run against the request's test vectors is held to its work budget,
``st.interpreter.DEFAULT_WORK_BUDGET``, so no check keeps the other rows waiting long) and,
where the retry policy allows it (tries, ``budget_s`` and the request's deadline), starts
the next try in the row the failed one just left; every other
finished request leaves with its :class:`~rung.daemon.request.Answer`.

Whatever fails with one request (its preparation, its row, its validation, its retry) is
that request's answer (``internal`` at worst, told in brief; the log has the traceback);
a failed engine step answers every request in the batch ``internal`` and starts a fresh
batch (its KV state is unknown). The daemon's scheduler drives it from its engine thread
(``Scheduler._cycle``); ``TaskRunner.run`` (``rung generate --task``, the eval, the bench)
drives it in a plain loop: so every answer, retry and number comes from the path ``rung
serve`` runs.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Protocol

from rung.daemon.request import Answer, Request
from rung.engines.errors import RungError, brief
from rung.engines.grammar import Constraint
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation

if TYPE_CHECKING:
    from rung.daemon.tasks.runner import Prepared, RetryPolicy, TaskRunner

log = logging.getLogger("rung.scheduler")   # its lines are the scheduler's (docs, tests)


class Decoder(Protocol):
    """What the driver steps (``engines.batch.BatchDecoder``)."""

    @property
    def free(self) -> int: ...
    @property
    def active(self) -> int: ...
    def add(self, tag: Hashable, prompt: Sequence[int], params: SamplingParams,
            constraint: Constraint | None = None) -> int: ...
    def run(self, interrupt: threading.Event | None = None,
            max_steps: int = 1_000_000) -> list[tuple[Hashable, Generation]]: ...


def batch_decoder(runner: TaskRunner, rows: int) -> Decoder:
    """The daemon's continuous batch for ``runner``'s engine: ``rows`` rows, prompts
    prefilled in chunks, the runner's prefix cache and decoding."""
    from rung.engines.batch import BatchDecoder

    return BatchDecoder(runner.engine, runner.tokenizer, rows, runner.prefix,
                        fast=runner.fast)


def request_params(req: Request) -> SamplingParams:
    """The sampling a request asks for (its token cap is applied by ``prepare``)."""
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          seed=req.seed)


class Drive:
    """Requests in the rows of one batch decoder of ``rows`` rows (``make_decoder``;
    default ``batch_decoder``), answered by ``runner``, retried under ``retry``. Used
    from one thread at a time."""

    def __init__(self, runner: TaskRunner, rows: int, retry: RetryPolicy | None = None,
                 make_decoder: Callable[[int], Decoder] | None = None) -> None:
        self.runner, self.rows, self.retry = runner, rows, retry
        self.make_decoder: Callable[[int], Decoder] = (
            make_decoder or (lambda n: batch_decoder(runner, n)))
        self.decoder = self.make_decoder(rows)
        self.inflight: dict[Hashable, tuple[Request, Prepared]] = {}   # row tag -> its try
        # request uid -> when its first try joined a row (wall clock), then the ms from its
        # receipt to that try's first token (usage first_token_ms: the wait included)
        self._joined: dict[int, float] = {}
        self._first_token: dict[int, float] = {}
        self._tags = itertools.count()

    @property
    def free(self) -> int:
        return self.decoder.free

    @property
    def active(self) -> int:
        return self.decoder.active

    def join(self, req: Request, params: SamplingParams | None = None) -> Answer | None:
        """Prepare ``req`` (sampling: ``params``, default the request's own) and put it in
        a free row; None when it is in, else its answer (it cannot run: ``bad_request``,
        ``too_long``, ... or ``internal``)."""
        try:
            res = self._start(req, request_params(req) if params is None else params)
        except Exception as e:   # this request's failure, not the batch's
            log.exception("%s failed before generation", req.ref)
            res = _internal(req, e)
        return None if res is None else self._answer(req, res)

    def _start(self, req: Request, params: SamplingParams) -> Answer | None:
        prepared = self.runner.prepare(req.task, req.input, params, req.max_tokens)
        if isinstance(prepared, Answer):
            return prepared
        tag = next(self._tags)
        joined = time.time()   # the row's time to first token starts here
        try:
            self.decoder.add(tag, prepared.ids, prepared.params, prepared.constraint)
        except RungError as e:
            return Answer(req, False, "too_long", e.message)
        self.inflight[tag] = (req, prepared)
        self._joined[req.uid] = joined
        return None

    def step(self, interrupt: threading.Event | None = None,
             retries: bool = True) -> list[Answer]:
        """Run the batch until a sequence finishes (or ``interrupt`` is set); the answers
        of the requests that are done. ``retries``: False starts no new try (stopping)."""
        try:
            done = self.decoder.run(interrupt)
        except Exception as e:  # an engine failure answers the batch, the caller goes on
            log.exception("generation failed")
            return self.fail_all(brief("generation failed", type(e).__name__))
        answers: list[Answer] = []
        for tag, gen in done:
            # in flight until checked: its row is free, the request is not answered yet
            req, prepared = self.inflight[tag]
            joined = self._joined.pop(req.uid, None)
            if joined is not None:
                self._first_token[req.uid] = (joined - req.received) * 1000 + gen.ttft_ms
            try:
                res = self.runner.finish(prepared, gen)
            except Exception as e:   # the runner reports its validators' bugs itself
                log.exception("%s failed after generation", req.ref)
                res = _internal(req, e, gen)
                res.attempts = prepared.attempt
                res.failed_checks = (*prepared.failed_checks, "internal")
            del self.inflight[tag]
            if not (retries and self.retry is not None
                    and self.retry.allows(prepared, res, req.deadline)
                    and self._again(req, prepared, res)):
                answers.append(self._answer(req, res))
        return answers

    def _again(self, req: Request, prepared: Prepared, failed: Answer) -> bool:
        """Start the next try in the row the failed one just left; False when it cannot
        start (the failed answer stands)."""
        assert self.retry is not None
        try:
            again = self.runner.retry(prepared, self.retry, failed)
            tag = next(self._tags)
            self.decoder.add(tag, again.ids, again.params, again.constraint)
        except Exception:
            log.exception("%s: the retry could not start", req.ref)
            return False
        self.inflight[tag] = (req, again)
        return True

    def fail_all(self, message: str) -> list[Answer]:
        """Every request in the batch answered ``internal``; a fresh batch (its KV state
        is unknown after a failed step)."""
        failed, self.inflight = self.inflight, {}
        self.decoder = self.make_decoder(self.rows)
        return [self._answer(req, Answer(req, False, "internal", message))
                for req, _ in failed.values()]

    def _answer(self, req: Request, res: Answer) -> Answer:
        """``res`` as the answer to ``req`` (the runner names requests by task and input
        only), with the receipt-to-first-token time of its first try."""
        res.request = req
        self._joined.pop(req.uid, None)
        first = self._first_token.pop(req.uid, None)
        if first is not None and res.usage:
            res.usage["first_token_ms"] = round(first, 1)
        return res


def _internal(req: Request, e: Exception, gen: Generation | None = None) -> Answer:
    """A failure inside rung, told in brief (the log has its traceback): no library's
    internals reach a client."""
    return Answer(req, False, "internal", brief("the request failed", type(e).__name__),
                  generation=gen)


def drive_all(drive: Drive, requests: Sequence[tuple[Request, SamplingParams | None]]
              ) -> list[Answer]:
    """Answer ``requests`` through ``drive`` (a plain loop, one thread): join all that fit,
    step until one is done, join the rest; the answers in the order of ``requests``."""
    answers: dict[int, Answer] = {}
    waiting = list(reversed(requests))
    while waiting or drive.active:
        while waiting and drive.free:
            req, params = waiting.pop()
            a = drive.join(req, params)
            if a is not None:
                answers[req.uid] = a
        if drive.active:
            for a in drive.step():
                answers[a.request.uid] = a
    return [answers[req.uid] for req, _ in requests]


__all__ = ["Decoder", "Drive", "batch_decoder", "drive_all", "request_params"]
