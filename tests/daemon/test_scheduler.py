"""The scheduler in front of the engine, driven with a fake runner and decoder (the
scheduler's own logic is the subject: queue bound, expiry, batching, failures, stop,
liveness; tests/engines/test_batch.py runs the real continuous batch)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.tasks.runner import Prepared, TaskResult
from rung.engines.errors import brief
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation


class FakeRunner:
    """Echoes each input; ``{"boom": True}`` in a batch makes the engine step raise; ``gate``
    holds a step until the test opens it. Each ``run`` of its decoder finishes every
    sequence in the batch (so batches are visible as they were admitted)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[list[tuple[str, Any]]] = []
        self.params: list[SamplingParams] = []
        self.max_tokens: list[int | None] = []
        self.gate = gate
        self.halted = 0   # steps cut short by a halt

    def prepare(self, name: str, data: Any, params: SamplingParams,
                max_tokens: int | None = None) -> Prepared | TaskResult:
        self.params.append(params)
        self.max_tokens.append(max_tokens)
        task = SimpleNamespace(name=name)
        return Prepared(task, data, [1, 2, 3], None, params)  # type: ignore[arg-type]

    def finish(self, prepared: Prepared, gen: Generation) -> TaskResult:
        req = Request(prepared.task.name, prepared.data, 0.0, 0.0)
        if prepared.data.get("invalid"):
            return TaskResult(req, False, "invalid_output", "schema")
        return TaskResult(req, True, output={"echo": prepared.data},
                          validation={"ok": True}, generation=gen)

    def decoder(self, rows: int) -> FakeDecoder:
        return FakeDecoder(self, rows)


class FakeDecoder:
    def __init__(self, runner: FakeRunner, rows: int) -> None:
        self.runner, self.rows = runner, rows
        self.seqs: dict[Hashable, Any] = {}

    @property
    def free(self) -> int:
        return self.rows - len(self.seqs)

    @property
    def active(self) -> int:
        return len(self.seqs)

    def add(self, tag: Hashable, prompt: Sequence[int], params: SamplingParams,
            constraint: Any = None) -> int:
        self.seqs[tag] = params
        return len(self.seqs) - 1

    def run(self, interrupt: threading.Event | None = None,
            max_steps: int = 1_000_000) -> list[tuple[Hashable, Generation]]:
        sched = self.runner.scheduler
        batch = [sched._inflight[t][1] for t in self.seqs]
        self.runner.batches.append([(p.task.name, p.data) for p in batch])
        if self.runner.gate is not None:   # steps until the test opens the gate
            give_up = time.monotonic() + 5.0
            while not self.runner.gate.wait(0.005):
                if interrupt is not None and interrupt.is_set() and sched._halt:
                    self.runner.halted += 1
                    return []   # a real decoder returns after the step it is in
                assert time.monotonic() < give_up, "test never opened the gate"
        if any(p.data.get("boom") for p in batch):
            raise RuntimeError("engine fell over")
        done = [(t, Generation(prompt_tokens=12, token_ids=[1, 2, 3], text="", ttft_ms=8.04,
                               finish_reason="stop", decode_tok_s=40.06, cached_tokens=4))
                for t in self.seqs]
        self.seqs = {}
        return done


def _sched(runner: FakeRunner, answers: list[Answer], **kw: Any) -> Scheduler:
    s = Scheduler(runner, answers.append, make_decoder=runner.decoder,  # type: ignore[arg-type]
                  **kw)
    runner.scheduler = s
    return s


def _req(seq: int, data: dict[str, Any] | None = None, deadline_in: float = 60.0,
         **kw: Any) -> Request:
    now = time.time()
    return Request(task="st_code", input=data if data is not None else {"n": seq},
                   received=now, deadline=now + deadline_in, ref=str(seq), **kw)


def _seq(req: Request) -> int:
    return int(req.ref)


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), 15.0)
    asyncio.run(bounded())


def test_full_queue_refuses_but_recovered_fits() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        s = _sched(FakeRunner(), answers, max_pending=2)
        assert s.submit(_req(1)) and s.submit(_req(2))
        assert s.submit(_req(3)) is None
        assert s.submit(_req(4), recovered=True) is not None
        assert s.depth == 3 and [_seq(r) for r in s.queue] == [1, 2, 4]
        assert await s.stop(1.0) == 3 and answers == []
    _run(body)


def test_expired_requests_are_answered_without_running() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        runner = FakeRunner()
        s = _sched(runner, answers, max_pending=10, max_batch=4)
        s.submit(_req(1, deadline_in=-5.0))
        s.submit(_req(2))
        s.submit(_req(3, deadline_in=-0.5))
        s.start()
        await _until(lambda: len(answers) == 3)
        by_seq = {_seq(a.request): a for a in answers}
        assert (by_seq[1].ok, by_seq[1].code) == (False, "expired")
        assert "deadline passed 5." in by_seq[1].message
        assert (by_seq[3].ok, by_seq[3].code) == (False, "expired")
        assert by_seq[2].ok and by_seq[2].output == {"echo": {"n": 2}}
        assert runner.batches == [[("st_code", {"n": 2})]]
        await s.stop(1.0)
    _run(body)


def test_batches_up_to_max_batch_with_per_request_params() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        runner = FakeRunner()
        s = _sched(runner, answers, max_pending=20, max_batch=3)
        for i in range(7):
            s.submit(_req(i, max_tokens=10 + i, temperature=0.1 * i, top_k=i, seed=100 + i))
        s.start()
        await _until(lambda: len(answers) == 7)
        assert [len(b) for b in runner.batches] == [3, 3, 1]
        assert [_seq(a.request) for a in answers] == list(range(7))
        assert runner.max_tokens == [10 + i for i in range(7)]
        assert [(p.temperature, p.top_k, p.seed) for p in runner.params] == [
            (0.1 * i, i, 100 + i) for i in range(7)]
        a = answers[0]
        assert a.ok and a.code is None and a.validation == {"ok": True}
        # receipt to the first token: the wait for a row, then the engine's own ttft_ms
        assert a.usage.pop("first_token_ms") >= 8.0
        assert a.usage == {"prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 4,
                           "ttft_ms": 8.0, "decode_tok_s": 40.1, "ffn_skip_ratio": None, "steps": 0}
        await s.stop(1.0)
    _run(body)


def test_runner_failure_answers_the_batch_internal_and_goes_on() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        runner = FakeRunner()
        s = _sched(runner, answers, max_pending=10, max_batch=2)
        s.submit(_req(1))
        s.submit(_req(2, {"boom": True}))
        s.submit(_req(3, {"invalid": True}))
        s.start()
        await _until(lambda: len(answers) == 3)
        assert [(_seq(a.request), a.ok, a.code) for a in answers] == [
            (1, False, "internal"), (2, False, "internal"), (3, False, "invalid_output")]
        # the client is told in brief; the traceback is in the log, not in the answer
        assert answers[0].message == brief("generation failed", "RuntimeError")
        assert "engine fell over" not in answers[0].message
        assert answers[0].usage == {} and answers[2].message == "schema"
        assert s.submit(_req(4))                           # the loop is still serving
        await _until(lambda: len(answers) == 4)
        assert answers[3].ok and _seq(answers[3].request) == 4
        assert s.liveness() is None
        await s.stop(1.0)
    _run(body)


def test_every_request_is_answered_exactly_once() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        s = _sched(FakeRunner(), answers, max_pending=100, max_batch=4)
        s.start()
        for i in range(40):
            data = {"boom": True} if i % 11 == 5 else {"invalid": True} if i % 7 == 3 else None
            assert s.submit(_req(i, data, deadline_in=-1.0 if i % 5 == 0 else 60.0))
            if i % 3 == 0:
                await asyncio.sleep(0)
        await _until(lambda: len(answers) >= 40)
        await asyncio.sleep(0.05)
        assert Counter(_seq(a.request) for a in answers) == Counter(range(40))
        codes = Counter(a.code for a in answers)
        assert codes["expired"] == 8 and codes[None] > 0 and codes["internal"] > 0
        assert await s.stop(1.0) == 0
    _run(body)


def test_stop_ends_intake_and_reports_what_is_left() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        gate = threading.Event()
        runner = FakeRunner(gate)
        s = _sched(runner, answers, max_pending=10, max_batch=1)
        for i in range(3):
            s.submit(_req(i))
        s.start()
        await _until(lambda: s.inflight == 1)
        stopping = asyncio.ensure_future(s.stop(5.0))
        await asyncio.sleep(0.02)
        assert s.submit(_req(9)) is None and s.submit(_req(10), recovered=True) is None
        gate.set()
        assert await stopping == 2                         # the batch in progress finished
        assert [_seq(a.request) for a in answers] == [0] and len(runner.batches) == 1
        assert [_seq(r) for r in s.queue] == [1, 2]
        assert s.liveness() == "the scheduler loop has stopped"
    _run(body)


def test_stop_halts_the_engine_thread_after_the_grace() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        gate = threading.Event()
        s = _sched(FakeRunner(gate), answers, max_pending=10, max_batch=1)
        s.submit(_req(1))
        s.submit(_req(2))
        task = s.start()
        await _until(lambda: s.inflight == 1)
        runner = s.runner
        assert await s.stop(0.05) == 2   # one queued, one halted: both for the restart
        # the engine thread was halted at its next step: nothing runs on after the stop
        assert task.done() and runner.halted == 1 and answers == []  # type: ignore[attr-defined]
        gate.set()
        assert answers == []
    _run(body)


def test_liveness_reports_a_stuck_generation() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        gate = threading.Event()
        s = _sched(FakeRunner(gate), answers, max_pending=10,
                      stuck_after_s=0.05)
        assert s.liveness() is None
        s.start()
        assert s.liveness() is None                        # idle, waiting for work
        s.submit(_req(1))
        await _until(lambda: s.inflight == 1)
        await asyncio.sleep(0.1)
        why = s.liveness()
        assert why is not None and why.startswith("the engine has not finished a sequence")
        gate.set()
        await _until(lambda: len(answers) == 1)
        assert s.liveness() is None and s.inflight == 0 and s.busy_since is None
        await s.stop(1.0)
    _run(body)


class ExplodingRunner(FakeRunner):
    """``{"explode": "prepare"}`` raises in prepare (like a tokenizer refusing a string),
    ``{"explode": "add"}`` makes its decoder raise in ``add``."""

    def prepare(self, name: str, data: Any, params: SamplingParams,
                max_tokens: int | None = None) -> Prepared | TaskResult:
        if data.get("explode") == "prepare":
            raise TypeError("TextInputSequence must be str")
        p = super().prepare(name, data, params, max_tokens)
        if isinstance(p, Prepared) and data.get("explode") == "add":
            p.ids = [9]
        return p

    def decoder(self, rows: int) -> FakeDecoder:
        return ExplodingDecoder(self, rows)


class ExplodingDecoder(FakeDecoder):
    def add(self, tag: Hashable, prompt: Sequence[int], params: SamplingParams,
            constraint: Any = None) -> int:
        if list(prompt) == [9]:
            raise ValueError("row state")
        return super().add(tag, prompt, params, constraint)


def test_one_requests_failure_before_generation_answers_it_alone() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        runner = ExplodingRunner()
        started: list[int] = []
        s = _sched(runner, answers, max_pending=10, max_batch=2,
                   on_start=lambda r: started.append(_seq(r)))
        s.submit(_req(1, {"explode": "prepare"}))
        s.submit(_req(2))
        s.submit(_req(3, {"explode": "add"}))
        s.submit(_req(4))
        task = s.start()
        await _until(lambda: len(answers) == 4)
        by_seq = {_seq(a.request): a for a in answers}
        assert (by_seq[1].ok, by_seq[1].code) == (False, "internal")
        assert by_seq[1].message == brief("the request failed", "TypeError")
        assert (by_seq[3].ok, by_seq[3].code) == (False, "internal")
        assert "ValueError" in by_seq[3].message
        assert by_seq[2].ok and by_seq[4].ok
        assert sorted(started) == [1, 2, 3, 4]      # counted before the model starts
        assert not task.done() and s.liveness() is None
        s.submit(_req(5))
        await _until(lambda: len(answers) == 5)
        assert answers[-1].ok
        await s.stop(1.0)
    _run(body)


class FinishingRunner(FakeRunner):
    """``{"explode": "finish"}`` raises while its answer is checked (a bug the runner's
    own guard does not catch)."""

    def finish(self, prepared: Prepared, gen: Generation) -> TaskResult:
        if prepared.data.get("explode") == "finish":
            raise KeyError("section")
        return super().finish(prepared, gen)


def test_one_requests_failure_after_generation_answers_it_alone() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        s = _sched(FinishingRunner(), answers, max_pending=10, max_batch=3)
        for i, data in enumerate([None, {"explode": "finish"}, None]):
            s.submit(_req(i, data))
        task = s.start()
        await _until(lambda: len(answers) == 3)
        by_seq = {_seq(a.request): a for a in answers}
        assert (by_seq[1].ok, by_seq[1].code) == (False, "internal")
        assert by_seq[1].message == brief("the request failed", "KeyError")
        assert by_seq[1].usage["completion_tokens"] == 3    # it reached the model
        assert by_seq[0].ok and by_seq[2].ok
        assert not task.done() and s.liveness() is None
        await s.stop(1.0)
    _run(body)


def test_log_lines_name_a_request_by_its_ref(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        answers: list[Answer] = []

        def broken(_: Request) -> None:
            raise RuntimeError("journal gone")

        s = _sched(FakeRunner(), answers, max_pending=10, on_start=broken)
        s.submit(_req(7))
        s.start()
        await _until(lambda: len(answers) == 1)
        assert answers[0].ok   # bookkeeping does not keep a request from running
        await s.stop(1.0)
    _run(body)
    assert "recording the start of 7 failed" in caplog.text


def test_a_dead_loop_is_reported_by_liveness() -> None:
    async def body() -> None:
        answers: list[Answer] = []
        runner = FakeRunner()
        s = _sched(runner, answers, max_pending=10)

        def broken() -> None:
            raise MemoryError("no room for a batch")

        s._take = broken   # type: ignore[method-assign]
        task = s.start()
        s.submit(_req(1))
        await _until(task.done)
        assert s.liveness() == "the scheduler loop has stopped"
        assert await s.stop(1.0) == 1    # stop still works, the request stays queued
    _run(body)


def test_submit_returns_the_future_of_its_answer() -> None:
    async def body() -> None:
        seen: list[Answer] = []
        s = _sched(FakeRunner(), seen, max_pending=4)
        s.start()
        futures = [s.submit(_req(i)) for i in range(3)]
        answers = [await f for f in futures if f is not None]
        assert [_seq(a.request) for a in answers] == [0, 1, 2] and all(a.ok for a in answers)
        assert seen == answers          # the observer sees each answer once
        await s.stop(1.0)
    _run(body)


def test_a_request_carries_its_own_start_callback() -> None:
    """Each adapter hands the scheduler what to do when the model starts on its request
    (``submit(..., on_start=)``): that one is told, not the scheduler-wide one, and a
    request answered before it starts (expired) leaves no callback behind."""
    async def body() -> None:
        answers: list[Answer] = []
        told: list[tuple[str, int]] = []
        s = _sched(FakeRunner(), answers, max_pending=10,
                   on_start=lambda r: told.append(("scheduler", _seq(r))))
        s.submit(_req(1), on_start=lambda r: told.append(("mqtt", _seq(r))))
        s.submit(_req(2))
        s.submit(_req(3, deadline_in=-1.0), on_start=lambda r: told.append(("late", _seq(r))))
        s.submit(_req(4), on_start=lambda r: told.append(("opcua", _seq(r))))
        task = s.start()
        await _until(lambda: len(answers) == 4)
        assert sorted(told) == [("mqtt", 1), ("opcua", 4), ("scheduler", 2)]
        assert {_seq(a.request): a.code for a in answers}[3] == "expired"
        assert not s._on_start
        await s.stop(1.0)
        assert task.done()
    _run(body)
