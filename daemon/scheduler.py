"""The scheduler: one bounded queue in front of the one task that owns the engine.

Adapters ``submit`` parsed requests; a full queue refuses at once (the adapter answers
``busy``). ``run`` keeps a continuous batch (``engines.batch``): between engine steps,
waiting requests join free rows (those past their deadline are answered ``expired``) and
finished sequences leave and are answered, so a request never waits for a whole batch.
The steps run in one worker thread, so the event loop keeps serving MQTT, Modbus, metrics
and the watchdog while the engine works; there the request driver (``tasks.drive.Drive``,
the one ``TaskRunner.run`` drives too) prepares, joins, steps, validates and retries. Every
request leaves through ``answer`` exactly once; whatever goes wrong with one request (its
prompt, its grammar, its sampling, its validation) is that request's answer (``internal``
at worst), never the loop's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

from rung.daemon.request import Answer as Answer  # the adapters import it from here
from rung.daemon.request import Request
from rung.daemon.tasks.drive import Decoder as Decoder
from rung.daemon.tasks.drive import Drive
from rung.daemon.tasks.runner import Prepared, RetryPolicy, TaskRunner

log = logging.getLogger("rung.scheduler")
HALT_WAIT_S = 10.0   # a halted engine thread ends within one step; waited for this long

AnswerFn = Callable[[Answer], None]


class Scheduler:
    """Owns a ``TaskRunner`` and a continuous batch of ``max_batch`` rows. ``submit`` gives
    each request the future of its answer; ``observe`` sees every answer too (metrics),
    on the event loop."""

    def __init__(self, runner: TaskRunner, observe: AnswerFn, max_pending: int,
                 max_batch: int = 1, stuck_after_s: float = 600.0,
                 make_decoder: Callable[[int], Decoder] | None = None,
                 on_start: Callable[[Request], object] | None = None,
                 retry: RetryPolicy | None = None) -> None:
        self.runner, self.observe = runner, observe
        self.retry = retry            # verified retries of answers that fail validation
        # told before the model starts on a request (an awaitable it returns is awaited
        # first: the start recorded off the event loop): the callback the request was
        # submitted with, else this one
        self.on_start = on_start
        self._on_start: dict[int, Callable[[Request], object]] = {}   # request uid -> it
        self._starting: list[Awaitable[object]] = []
        self.max_pending, self.max_batch = max_pending, max_batch
        self.stuck_after_s = stuck_after_s
        # the rows of the continuous batch and the requests in them, used from the engine
        # thread only (and read between cycles)
        self.drive = Drive(runner, max_batch, retry, make_decoder)
        self.queue: deque[Request] = deque()
        self._futures: dict[int, asyncio.Future[Answer]] = {}   # request uid -> its answer
        self.busy_since: float | None = None
        self._wake = asyncio.Event()
        self._arrived = threading.Event()   # tells the engine thread a row can be filled
        self._stopping = False
        self._halt = False   # stop's grace ran out: the engine thread ends at its next step
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rung-engine")
        self._task: asyncio.Task[None] | None = None

    @property
    def decoder(self) -> Decoder:
        return self.drive.decoder

    @property
    def _inflight(self) -> dict[Hashable, tuple[Request, Prepared]]:
        """Row tag -> the request and its try, in the batch now."""
        return self.drive.inflight

    @property
    def depth(self) -> int:
        return len(self.queue)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def submit(self, request: Request, recovered: bool = False,
               on_start: Callable[[Request], object] | None = None
               ) -> asyncio.Future[Answer] | None:
        """Queue a request; the future of its answer, or None when the queue is full or
        intake has stopped (a request recovered from the journal after a restart was
        accepted before: it always fits). ``on_start``: what the adapter does when the
        model is about to start on it (its journal counts the attempt). Call from the
        event loop."""
        if self._stopping or (not recovered and len(self.queue) >= self.max_pending):
            return None
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._futures[request.uid] = future
        if on_start is not None:
            self._on_start[request.uid] = on_start
        self.queue.append(request)
        self._wake.set()
        if self.decoder.free:
            self._arrived.set()
        return future

    def start(self) -> asyncio.Task[None]:
        """Start the engine loop. What is loaded by now (engine, tokenizer, grammars,
        modules) lives as long as the process: it is moved out of the cyclic garbage
        collector's sight, so a full collection triggered by the engine thread's
        allocations (a fault tree's BDD) is short instead of a ~50 ms stop of both
        threads (tests/daemon/test_responsiveness.py)."""
        gc.collect()
        gc.freeze()
        self._task = asyncio.get_running_loop().create_task(self.run(), name="scheduler")
        return self._task

    async def run(self) -> None:
        """The engine loop, one screen: take what fits (deadline checked, the start
        recorded) -> one cycle in the engine thread (prepare and join, steps until a
        sequence finishes or a request waits for a row, validate) -> answer. The event
        loop only moves requests and answers; every CPU-heavy part runs in the thread."""
        loop = asyncio.get_running_loop()
        while not (self._stopping and not self._inflight) and not self._halt:
            joining = [] if self._stopping else self._take()
            if not self._inflight and not joining:
                self._wake.clear()
                if not self.queue:
                    await self._wake.wait()
                continue
            if self._starting:   # the starts recorded (durable) before the model starts
                starting, self._starting = self._starting, []
                await asyncio.gather(*starting, return_exceptions=True)
            self._arrived.clear()
            self.busy_since = time.monotonic()
            try:
                results = await loop.run_in_executor(self._pool, self._cycle, joining)
            finally:
                self.busy_since = None
            for answer in results:
                self._reply_answer(answer)

    def _take(self) -> list[Request]:
        """Requests for the free rows, oldest first; the expired ones answered here."""
        now = time.time()
        joining: list[Request] = []
        while self.queue and len(joining) < self.decoder.free:
            req = self.queue.popleft()
            if now > req.deadline:
                self._reply_answer(Answer(req, False, "expired", f"deadline passed "
                                          f"{now - req.deadline:.1f} s before the request "
                                          "was started (message expiry or "
                                          "queue.request_timeout_s)"))
                continue
            try:
                on_start = self._on_start.pop(req.uid, None) or self.on_start
                if on_start is not None:
                    started = on_start(req)
                    if inspect.isawaitable(started):
                        self._starting.append(started)
            except Exception:   # bookkeeping must not keep a request from running
                log.exception("recording the start of %s failed", req.ref)
            joining.append(req)
        return joining

    def _cycle(self, joining: list[Request]) -> list[Answer]:
        """In the engine thread: join ``joining``, step, finish (the driver: whatever fails
        with one request answers that request; a failed engine step answers the batch)."""
        results = [a for req in joining if (a := self.drive.join(req)) is not None]
        if not self.drive.active or self._halt:
            return results
        return results + self.drive.step(self._arrived, retries=not self._stopping)

    def _reply_answer(self, answer: Answer) -> None:
        """Resolve the request's future; the observer sees every answer (metrics)."""
        future = self._futures.pop(answer.request.uid, None)
        self._on_start.pop(answer.request.uid, None)   # answered before it started
        if future is not None and not future.done():
            future.set_result(answer)
        try:
            self.observe(answer)
        except Exception:   # a failed observer must not stop the engine loop
            log.exception("observing the answer to %s failed", answer.request.ref)

    def liveness(self) -> str | None:
        """None when healthy, else why not (for the systemd watchdog)."""
        if self._task is not None and self._task.done():
            return "the scheduler loop has stopped"
        if self.busy_since is not None:
            busy = time.monotonic() - self.busy_since
            if busy > self.stuck_after_s:
                return f"the engine has not finished a sequence in {busy:.0f} s"
        return None

    async def stop(self, grace_s: float) -> int:
        """Stop intake, let the sequences being generated finish (up to ``grace_s``, no new
        retries), then halt the engine thread at its next step: the halted requests are
        not answered (an MQTT request stays pending in the journal and runs after the
        restart, a PLC's trigger stays raised). Returns how many requests are left for a
        restart (queued and halted)."""
        self._stopping = True
        self._wake.set()
        halted = 0
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace_s)
            except TimeoutError:
                halted = len(self._inflight)
                log.warning("generation still running after %g s: halting it; its %d "
                            "requests stay pending for the restart", grace_s, halted)
                self._halt = True
                self._arrived.set()   # the engine thread returns after the step it is in
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self._task), HALT_WAIT_S)
            except Exception:   # the loop had died (already reported): nothing to finish
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)
        return len(self.queue) + halted

