"""The Modbus handshake with one PLC: the PLC raises a request, rung answers with a diagnosis.

CONTRACTS.md, per PLC, in holding registers named by the register map::

    PLC: req_seq += 1, req = 1
    rung: ack_seq = req_seq, busy = 1          (the PLC sees its request taken)
    rung: snapshot -> diagnosis (+ fault tree) -> MQTT {base}/diag/{plc}/event and /last
    rung: result, err; then done = 1, busy = 0
    PLC: reads result/err, req = 0
    rung: done = 0
    rung: heartbeat += 1 every heartbeat_s

The PLC's registers are the journal: a trigger survives a rung restart because ``req``
stays 1 until rung says ``done``. At start-up a request already acknowledged
(``ack_seq == req_seq``, ``done == 0``) is run again from the snapshot on (``resumed``).
A link that drops is reconnected with backoff; the job's final writes are retried until
they land, so the PLC is never left waiting while the link works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rung.daemon.modbus import Link, ModbusConfigError, ModbusError, ModbusTransientError
from rung.daemon.regmap import PlcMap
from rung.daemon.requests import Address, Request
from rung.daemon.scheduler import Answer

log = logging.getLogger("rung.plc")

# err register: 0 success; the rest tell the PLC programmer what to look at
ERR_OK, ERR_SNAPSHOT, ERR_ANSWER, ERR_BUSY, ERR_TIMEOUT, ERR_INTERNAL, ERR_INPUT = range(7)
ERR_CODES = {
    ERR_OK: "success",
    ERR_SNAPSHOT: "snapshot could not be read over Modbus",
    ERR_ANSWER: "the model's answer failed validation (invalid_output or truncated)",
    ERR_BUSY: "rung's queue was full",
    ERR_TIMEOUT: "no answer before the deadline (expired)",
    ERR_INTERNAL: "internal error in rung",
    ERR_INPUT: "the snapshot does not fit the diagnosis task (bad_request, too_long)",
}
_ERR_BY_CODE = {"invalid_output": ERR_ANSWER, "truncated": ERR_ANSWER, "busy": ERR_BUSY,
                "expired": ERR_TIMEOUT, "bad_request": ERR_INPUT, "too_long": ERR_INPUT,
                "unknown_task": ERR_INTERNAL, "internal": ERR_INTERNAL}
SNAPSHOT_ATTEMPTS = 5
# result register: the advisory's priority (0 when err != 0)
PRIORITY = {"low": 1, "medium": 2, "high": 3, "critical": 4}

Submit = Callable[[Request], bool]
Publish = Callable[[str, dict[str, Any], bool], Awaitable[bool]]


@dataclass
class _Regs:
    req: int
    req_seq: int
    ack_seq: int
    busy: int
    done: int


@dataclass
class Job:
    """One trigger being answered."""

    req_seq: int
    resumed: bool
    started: float = field(default_factory=time.time)
    snapshot: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)
    err: int = ERR_OK
    result: int = 0


class PlcAgent:
    """Polls one PLC's handshake, runs its jobs through the shared scheduler, answers it."""

    def __init__(self, plc: PlcMap, link: Link, submit: Submit, publish: Publish,
                 base_topic: str, timeout_s: float, reconnect_min_s: float = 0.5,
                 reconnect_max_s: float = 30.0) -> None:
        self.plc, self.link, self.submit, self.publish = plc, link, submit, publish
        self.base = base_topic
        self.timeout_s = timeout_s
        self.backoff = (reconnect_min_s, reconnect_max_s)
        self.job: asyncio.Task[None] | None = None
        self.jobs_done = 0
        self.heartbeat = 0
        self._stop = asyncio.Event()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, poll, reconnect with backoff; until ``stop``."""
        delay = self.backoff[0]
        while not self._stop.is_set():
            try:
                await self.link.connect()
                delay = self.backoff[0]
                await self._poll()
            except ModbusError as e:
                # a configuration error (illegal address in the handshake block) will not
                # heal by itself: retry at the slowest pace, loudly
                if isinstance(e, ModbusConfigError):
                    delay = self.backoff[1]
                    log.error("PLC %s: %s", self.plc.id, e)
                else:
                    log.warning("PLC %s: %s", self.plc.id, e)
            if self._stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, self.backoff[1])

    async def stop(self) -> None:
        self._stop.set()
        if self.job is not None and not self.job.done():
            self.job.cancel()   # its request stays in the PLC (req = 1): resumed at restart
        await self.link.close()

    async def _poll(self) -> None:
        hs = self.plc.handshake
        next_beat = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= next_beat:
                self.heartbeat = (self.heartbeat + 1) & 0xFFFF
                await self.link.write_registers(hs.heartbeat, [self.heartbeat])
                next_beat = time.monotonic() + hs.heartbeat_s
            regs = await self._read_handshake()
            self._step(regs)
            if regs.req == 0 and self.job is None:
                if regs.done == 1:   # the PLC took the answer
                    await self.link.write_registers(hs.done, [0])
                elif regs.busy == 1:   # a job cut short (rung stopped), request withdrawn
                    await self.link.write_registers(hs.busy, [0])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), hs.poll_s)

    async def _read_handshake(self) -> _Regs:
        hs = self.plc.handshake
        start, count = hs.read_span()
        raw = await self.link.read("holding", start, count)
        regs = [int(v) for v in raw]

        def at(addr: int) -> int:
            return regs[addr - start]

        return _Regs(at(hs.req), at(hs.req_seq), at(hs.ack_seq), at(hs.busy), at(hs.done))

    def _step(self, r: _Regs) -> None:
        """Start a job for a new or an interrupted request."""
        if self.job is not None or r.req != 1:
            return
        if r.done == 1 and r.ack_seq == r.req_seq:
            return   # answered; waiting for the PLC to clear req
        # a new req_seq while done is still 1: the PLC raised the next request before
        # taking the last answer down; the job clears done with its acknowledgement
        resumed = r.ack_seq == r.req_seq   # acknowledged before a restart, never finished
        if resumed:
            log.warning("PLC %s: request %d was acknowledged before a restart: running it "
                        "again", self.plc.id, r.req_seq)
        self.job = asyncio.get_running_loop().create_task(
            self._run_job(Job(r.req_seq, resumed)), name=f"plc-{self.plc.id}-{r.req_seq}")
        self.job.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self.job = None
        if not task.cancelled() and task.exception() is not None:
            log.error("PLC %s: job failed: %s", self.plc.id, task.exception())

    # -- one job -------------------------------------------------------------------------

    async def _run_job(self, job: Job) -> None:
        hs = self.plc.handshake
        await self._write_retrying([(hs.ack_seq, job.req_seq), (hs.busy, 1), (hs.done, 0)])
        try:
            job.snapshot = await self._snapshot()
        except ModbusError as e:
            log.warning("PLC %s: snapshot for request %d failed: %s", self.plc.id,
                        job.req_seq, e)
            job.err = ERR_SNAPSHOT
        if job.err == ERR_OK:
            job.err = await self._ask(job, "diagnosis", self._diagnosis_input(job))
            if job.err == ERR_OK and self.plc.fault_tree:
                # reported on MQTT beside the diagnosis; err and result are the diagnosis's
                await self._ask(job, "fault_tree", self._fault_tree_input(job))
        diag = job.answers.get("diagnosis")
        if job.err == ERR_OK and diag is not None:
            priority = (diag.output or {}).get("advisory", {}).get("priority")
            job.result = PRIORITY.get(priority, 0)
        await self._report(job)
        await self._write_retrying([(hs.result, job.result), (hs.err, job.err)])
        await self._write_retrying([(hs.done, 1), (hs.busy, 0)])
        self.jobs_done += 1
        log.info("plc answered", extra={"rung_fields": {
            "plc": self.plc.id, "req_seq": job.req_seq, "err": job.err, "result": job.result,
            "resumed": job.resumed, "ms": round((time.time() - job.started) * 1000)}})

    async def _snapshot(self, attempts: int = SNAPSHOT_ATTEMPTS) -> dict[str, Any]:
        """The points, transient errors (device busy, gateway, timeouts) retried with
        backoff; a configuration error (illegal address) at once."""
        delay = self.backoff[0]
        for attempt in range(1, attempts):
            try:
                return await self.link.read_snapshot()
            except ModbusTransientError as e:
                log.warning("PLC %s: snapshot attempt %d failed, retrying in %.1f s: %s",
                            self.plc.id, attempt, delay, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])
        return await self.link.read_snapshot()   # the last attempt raises what it gets

    async def _ask(self, job: Job, task: str, data: dict[str, Any]) -> int:
        """Run one task request through the shared queue, wait for its answer; the err
        code it means for the PLC."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Answer] = loop.create_future()

        def resolve(answer: Answer) -> None:
            if not fut.done():
                fut.set_result(answer)

        now = time.time()
        req = Request(seq=0, task=task, input=data,
                      reply=Address(f"{self.base}/diag/{self.plc.id}/event", None,
                                    f"{self.plc.id}-{job.req_seq}-{task}"),
                      received=now, deadline=now + self.timeout_s,
                      session=f"plc:{self.plc.id}",
                      on_answer=resolve)
        if not self.submit(req):
            job.answers[task] = Answer(req, False, "busy", "queue full")
            return ERR_BUSY
        answer = await fut
        job.answers[task] = answer
        return ERR_OK if answer.ok else _ERR_BY_CODE.get(answer.code or "internal",
                                                         ERR_INTERNAL)

    def _points(self, job: Job, with_limits: bool) -> list[dict[str, Any]]:
        out = []
        for p in self.plc.points:
            if p.name not in job.snapshot:
                continue
            item: dict[str, Any] = {"name": p.name, "value": job.snapshot[p.name]}
            if p.unit:
                item["unit"] = p.unit
            if with_limits and p.limits:
                item["limits"] = dict(p.limits)
            out.append(item)
        return out

    def _diagnosis_input(self, job: Job) -> dict[str, Any]:
        return {"asset": self.plc.description[:200] or self.plc.id,
                "description": f"Diagnosis requested by PLC {self.plc.id} (request "
                               f"{job.req_seq}); values read over Modbus.",
                "points": self._points(job, with_limits=True)}

    def _fault_tree_input(self, job: Job) -> dict[str, Any]:
        ft = self.plc.fault_tree or {}
        return {"top_event": str(ft.get("top_event", "unplanned stop"))[:300],
                "system": str(ft.get("system") or self.plc.description or self.plc.id)[:2000],
                "points": self._points(job, with_limits=False)}

    async def _report(self, job: Job) -> None:
        """The event (QoS 1) and the retained summary on MQTT."""
        answers = {}
        for task, a in job.answers.items():
            answers[task] = ({"ok": True, "output": a.output, "validation": a.validation}
                             if a.ok else {"ok": False, "error": {"code": a.code,
                                                                  "message": a.message},
                                           "output": a.output, "validation": a.validation})
        event = {"plc": self.plc.id, "req_seq": job.req_seq, "resumed": job.resumed,
                 "time": _iso(job.started), "ms": round((time.time() - job.started) * 1000),
                 "err": job.err, "err_text": ERR_CODES[job.err], "result": job.result,
                 "snapshot": job.snapshot, **answers}
        last = {k: event[k] for k in ("plc", "req_seq", "time", "err", "err_text", "result")}
        diag = job.answers.get("diagnosis")
        if diag is not None and diag.ok:
            out = diag.output or {}
            last["priority"] = out.get("advisory", {}).get("priority")
            last["actions"] = out.get("advisory", {}).get("actions")
            last["faults"] = [h.get("fault") for h in out.get("health_assessment", [])]
        base = f"{self.base}/diag/{self.plc.id}"
        # the publisher keeps what the broker did not take and sends it after reconnect
        await self.publish(f"{base}/event", event, False)
        await self.publish(f"{base}/last", last, True)

    async def _write_retrying(self, writes: list[tuple[int, int]]) -> None:
        """Write (address, value) pairs, as one request when they are adjacent; retried
        with backoff until they land (the PLC is waiting for them)."""
        writes = sorted(writes)
        delay = self.backoff[0]
        while True:
            try:
                if all(b[0] == a[0] + 1 for a, b in zip(writes, writes[1:], strict=False)):
                    await self.link.write_registers(writes[0][0], [v for _, v in writes])
                else:
                    for addr, value in writes:
                        await self.link.write_registers(addr, [value])
                return
            except ModbusConfigError:
                raise
            except ModbusError as e:
                log.warning("PLC %s: handshake write failed, retrying in %.1f s: %s",
                            self.plc.id, delay, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
