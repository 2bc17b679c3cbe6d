"""One PLC request answered: snapshot -> diagnosis (+ fault tree) -> the answer, kept until
the PLC has it.

:class:`Diagnoser` runs a request once and returns an :class:`Answered`: the err/result
pair for the PLC's handshake values and the MQTT event and summary. :class:`AnswerStore` keeps
that answer in a small JSON file per PLC while its final writes are pending, so a write the
PLC refuses is retried, across a rung restart too, without running the model again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rung.daemon.backoff import Backoff
from rung.daemon.plc.errors import PlcError
from rung.daemon.plc.transport import PlcSpec, Snapshots
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer
from rung.daemon.wallclock import iso

log = logging.getLogger("rung.plc")

# err value: 0 success; the rest tell the PLC programmer what to look at. {via}: the
# protocol's name, the transport's to say (err_codes)
ERR_OK, ERR_SNAPSHOT, ERR_ANSWER, ERR_BUSY, ERR_TIMEOUT, ERR_INTERNAL, ERR_INPUT = range(7)
_ERR_TEXTS = {
    ERR_OK: "success",
    ERR_SNAPSHOT: "snapshot could not be read over {via}",
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
# result value: the advisory's priority (0 when err != 0)
PRIORITY = {"low": 1, "medium": 2, "high": 3, "critical": 4}
_FORMAT = 1   # of the answer file



def err_codes(via: str) -> dict[int, str]:
    """What each err value means, as the event's ``err_text`` says it, for a PLC read over
    ``via`` (the protocol's name: ``Modbus``, ``OPC UA``)."""
    return {code: text.format(via=via) for code, text in _ERR_TEXTS.items()}


Submit = Callable[[Request], "asyncio.Future[Answer] | None"]   # None: the queue is full
OnRetry = Callable[[str, int], None]   # (operation, failed attempts in a row)


@dataclass
class Job:
    """One request being answered."""

    req_seq: int
    resumed: bool
    started: float = field(default_factory=time.time)
    snapshot: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)
    err: int = ERR_OK
    result: int = 0


@dataclass
class Answered:
    """A finished request: what goes into its handshake values and onto MQTT. ``published``: the
    event and summary were handed to the publisher (never published twice)."""

    plc: str
    req_seq: int
    err: int
    result: int
    event: dict[str, Any]
    last: dict[str, Any]
    published: bool = False


class Diagnoser:
    """Runs one PLC's requests through the shared scheduler: the snapshot (transient errors
    retried ``attempts`` times with ``backoff``, a configuration error ends it at once), the
    diagnosis and, when the map asks, a fault tree. ``via``: the protocol's name, for the
    diagnosis request and the err texts."""

    def __init__(self, plc: PlcSpec, link: Snapshots, submit: Submit, base_topic: str,
                 timeout_s: float, backoff: Backoff, on_retry: OnRetry,
                 attempts: int = SNAPSHOT_ATTEMPTS, *, via: str) -> None:
        self.plc, self.link, self.submit, self.via = plc, link, submit, via
        self.err_codes = err_codes(via)
        self.base, self.timeout_s = base_topic, timeout_s
        self.backoff, self.on_retry, self.attempts = backoff, on_retry, attempts

    async def run(self, job: Job) -> Answered:
        """The request's answer; any failure inside rung becomes err 5, never an exception
        (a job that cannot finish would be started again and again)."""
        try:
            await self._run(job)
        except Exception as e:   # a bug: the PLC gets err 5, the log says why
            log.exception("PLC %s: request %d failed inside rung: %s", self.plc.id,
                          job.req_seq, e)
            job.err, job.result = ERR_INTERNAL, 0
        return self._answered(job)

    async def _run(self, job: Job) -> None:
        try:
            job.snapshot = await self._snapshot(job)
        except PlcError as e:
            log.warning("PLC %s: snapshot for request %d failed: %s", self.plc.id,
                        job.req_seq, e)
            job.err = ERR_SNAPSHOT
            return
        job.err = await self._ask(job, "diagnosis", self._diagnosis_input(job))
        if job.err == ERR_OK and self.plc.fault_tree:
            # reported on MQTT beside the diagnosis; err and result are the diagnosis's
            await self._ask(job, "fault_tree", self._fault_tree_input(job))
        diag = job.answers.get("diagnosis")
        if job.err == ERR_OK and diag is not None:
            priority = (diag.output or {}).get("advisory", {}).get("priority")
            job.result = PRIORITY.get(priority, 0)

    async def _snapshot(self, job: Job) -> dict[str, Any]:
        """The points; one log line for the first failure, the outcome in the caller's."""
        for attempt in range(1, self.attempts):
            try:
                return await self.link.read_snapshot()
            except PlcError as e:
                if not e.transient:
                    raise
                self.on_retry("snapshot read", attempt)
                delay = self.backoff.delay(attempt)
                if attempt == 1:
                    log.warning("PLC %s: snapshot for request %d failed, retrying %d times "
                                "with backoff from %g s: %s", self.plc.id, job.req_seq,
                                self.attempts - 1, delay, e)
                await asyncio.sleep(delay)
        return await self.link.read_snapshot()   # the last attempt raises what it gets

    async def _ask(self, job: Job, task: str, data: dict[str, Any]) -> int:
        """Run one task request through the shared queue, wait for its answer; the err
        code it means for the PLC."""
        now = time.time()
        req = Request(task=task, input=data, received=now, deadline=now + self.timeout_s,
                      ref=f"PLC {self.plc.id} request {job.req_seq} ({task})",
                      session=f"plc:{self.plc.id}")
        future = self.submit(req)
        if future is None:
            job.answers[task] = Answer(req, False, "busy", "queue full")
            return ERR_BUSY
        answer = await future
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
                               f"{job.req_seq}); values read over {self.via}.",
                "points": self._points(job, with_limits=True)}

    def _fault_tree_input(self, job: Job) -> dict[str, Any]:
        ft = self.plc.fault_tree or {}
        return {"top_event": str(ft.get("top_event", "unplanned stop"))[:300],
                "system": str(ft.get("system") or self.plc.description or self.plc.id)[:2000],
                "points": self._points(job, with_limits=False)}

    def _answered(self, job: Job) -> Answered:
        """The event (QoS 1) and the retained summary for MQTT."""
        answers = {}
        for task, a in job.answers.items():
            answers[task] = ({"ok": True, "output": a.output, "validation": a.validation}
                             if a.ok else {"ok": False, "error": {"code": a.code,
                                                                  "message": a.message},
                                           "output": a.output, "validation": a.validation})
        event = {"plc": self.plc.id, "req_seq": job.req_seq, "resumed": job.resumed,
                 "time": iso(job.started), "ms": round((time.time() - job.started) * 1000),
                 "err": job.err, "err_text": self.err_codes[job.err], "result": job.result,
                 "snapshot": job.snapshot, **answers}
        last = {k: event[k] for k in ("plc", "req_seq", "time", "err", "err_text", "result")}
        diag = job.answers.get("diagnosis")
        if diag is not None and diag.ok:
            out = diag.output or {}
            last["priority"] = out.get("advisory", {}).get("priority")
            last["actions"] = out.get("advisory", {}).get("actions")
            last["faults"] = [h.get("fault") for h in out.get("health_assessment", [])]
        return Answered(self.plc.id, job.req_seq, job.err, job.result, event, last)


class AnswerStore:
    """One PLC's finished but undelivered answer, in ``path`` (JSON, replaced atomically).

    Kept from the moment the job finishes until the PLC takes the answer (clears ``req``) or
    raises another request. A file that cannot be read, or belongs to another PLC, is
    dropped with a warning: the request is then run again, as without a store. A write that
    fails is logged and the answer stays in memory."""

    def __init__(self, path: Path, plc_id: str) -> None:
        self.path, self.plc_id = path, plc_id

    def load(self) -> Answered | None:
        try:
            doc = json.loads(self.path.read_text())
            if doc.pop("format") != _FORMAT or doc["plc"] != self.plc_id:
                raise ValueError("another format or another PLC")
            answered = Answered(**doc)
            if not all(isinstance(getattr(answered, k), int) for k in ("req_seq", "err",
                                                                        "result")):
                raise ValueError("req_seq, err and result must be integers")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("PLC %s: dropping the kept answer %s: %s", self.plc_id, self.path, e)
            self.clear()
            return None
        return answered

    def save(self, answered: Answered) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("w") as f:
                json.dump({"format": _FORMAT, **asdict(answered)}, f, ensure_ascii=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            log.error("PLC %s: cannot keep the answer to request %d in %s (kept in memory "
                      "only): %s", self.plc_id, answered.req_seq, self.path, e)

    def clear(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            log.error("PLC %s: cannot remove %s: %s", self.plc_id, self.path, e)
