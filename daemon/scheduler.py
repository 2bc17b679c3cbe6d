"""The scheduler: one bounded queue in front of the one task that owns the engine.

Adapters ``submit`` parsed requests; a full queue refuses at once (the adapter answers
``busy``). ``run`` takes up to ``max_batch`` waiting requests, answers ``expired`` for those
past their deadline, and generates the rest as one batch in a worker thread, so the event
loop keeps serving MQTT, metrics and the watchdog while the engine works. Every request
leaves through ``answer`` exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rung.daemon.requests import Request
from rung.daemon.task_runner import TaskResult, TaskRunner
from rung.engines.sampler import SamplingParams

log = logging.getLogger("rung.scheduler")


@dataclass
class Answer:
    """What the scheduler hands back for one request."""

    request: Request
    ok: bool
    code: str | None = None           # error code when not ok
    message: str = ""
    output: Any = None
    validation: Any = None
    usage: dict[str, Any] = field(default_factory=dict)
    result: TaskResult | None = None


AnswerFn = Callable[[Answer], None]


class Scheduler:
    """Owns a ``TaskRunner``; answers through ``answer`` (called on the event loop)."""

    def __init__(self, runner: TaskRunner, answer: AnswerFn, max_pending: int,
                 max_batch: int = 1, stuck_after_s: float = 600.0) -> None:
        self.runner, self.answer = runner, answer
        self.max_pending, self.max_batch = max_pending, max_batch
        self.stuck_after_s = stuck_after_s
        self.queue: deque[Request] = deque()
        self.inflight = 0
        self.busy_since: float | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rung-engine")
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self.queue)

    def submit(self, request: Request, recovered: bool = False) -> bool:
        """Queue a request; False when the queue is full or intake has stopped (a request
        recovered from the journal after a restart was accepted before: it always fits)."""
        if self._stopping or (not recovered and len(self.queue) >= self.max_pending):
            return False
        self.queue.append(request)
        self._wake.set()
        return True

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="scheduler")
        return self._task

    async def run(self) -> None:
        """The engine loop: pick -> expire -> generate (worker thread) -> answer."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._pick()
            if not batch:
                continue
            self.inflight, self.busy_since = len(batch), time.monotonic()
            try:
                results = await loop.run_in_executor(self._pool, self._generate, batch)
            except Exception as e:  # an engine failure answers the batch, the loop goes on
                log.exception("generation failed")
                results = [TaskResult(r.task, False, None, None, {
                    "code": "internal", "message": f"{type(e).__name__}: {e}"}, None)
                    for r in batch]
            finally:
                self.inflight, self.busy_since = 0, None
            if len(results) != len(batch):   # never leave a request without its answer
                log.error("runner returned %d results for %d requests", len(results),
                          len(batch))
                results = [TaskResult(r.task, False, None, None, {
                    "code": "internal", "message": "no result from the engine"}, None)
                    for r in batch]
            for req, res in zip(batch, results, strict=True):
                try:
                    self.answer(_answer(req, res))
                except Exception:   # a failed answer must not stop the engine loop
                    log.exception("answering request %d failed", req.seq)

    def _pick(self) -> list[Request]:
        batch: list[Request] = []
        now = time.time()
        while self.queue and len(batch) < self.max_batch:
            req = self.queue.popleft()
            if now > req.deadline:
                self.answer(Answer(req, False, "expired", f"deadline passed "
                                   f"{now - req.deadline:.1f} s before the request was "
                                   "started (message expiry or queue.request_timeout_s)"))
            else:
                batch.append(req)
        return batch

    def _generate(self, batch: list[Request]) -> list[TaskResult]:
        params = [SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                 seed=r.seed) for r in batch]
        return self.runner.run([(r.task, r.input) for r in batch], params,
                               [r.max_tokens for r in batch])

    def liveness(self) -> str | None:
        """None when healthy, else why not (for the systemd watchdog)."""
        if self._task is not None and self._task.done():
            return "the scheduler loop has stopped"
        if self.busy_since is not None:
            busy = time.monotonic() - self.busy_since
            if busy > self.stuck_after_s:
                return f"one generation has run for {busy:.0f} s"
        return None

    async def stop(self, grace_s: float) -> int:
        """Stop intake and wait (up to ``grace_s``) for the batch in progress; returns how
        many queued requests are left for the journal to carry over a restart."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace_s)
            except TimeoutError:
                log.warning("generation still running after %.0f s; its requests stay "
                            "pending in the journal", grace_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
        return len(self.queue)


def _answer(req: Request, res: TaskResult) -> Answer:
    g = res.generation
    usage: dict[str, Any] = {}
    if g is not None:
        usage = {"prompt_tokens": g.prompt_tokens, "completion_tokens": len(g.token_ids),
                 "cached_tokens": g.cached_tokens, "ttft_ms": round(g.ttft_ms, 1),
                 "decode_tok_s": round(g.decode_tok_s, 1),
                 "ffn_skip_ratio": g.ffn_skip_ratio}
    if res.ok:
        return Answer(req, True, output=res.output, validation=res.validation, usage=usage,
                      result=res)
    err = res.error or {"code": "internal", "message": "no result"}
    return Answer(req, False, err["code"], err["message"], output=res.output,
                  validation=res.validation, usage=usage, result=res)
