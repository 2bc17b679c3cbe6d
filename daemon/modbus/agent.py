"""The Modbus handshake with one PLC: the PLC raises a request, rung answers with a diagnosis.

CONTRACTS.md, per PLC, in holding registers named by the register map::

    PLC: req_seq += 1, req = 1
    rung: ack_seq = req_seq, busy = 1          (the PLC sees its request taken)
    rung: snapshot -> diagnosis (+ fault tree) -> MQTT {base}/diag/{plc}/event and /last
    rung: result, err; then done = 1, busy = 0
    PLC: reads result/err, req = 0
    rung: done = 0
    rung: heartbeat += 1 every heartbeat_s, in a poll that read the handshake

One loop per PLC, once per ``poll_s``: read the handshake block; only then bump the
heartbeat (so it means "rung sees this PLC's requests"); then compare what the registers
say with what rung knows (a request to acknowledge, an answer to deliver, registers to
clear) and write the difference. Nothing is written from anywhere else, so every state has
an exit: when the PLC withdraws or replaces a request, the writes for it stop.

Faults are handled per operation. A reply that refuses one read or write (an exception, a
short reply) fails that operation only: it is retried with backoff (``poll_s`` doubling to
the map's ``retry_max_s``) while the rest of the cycle goes on. Only a failed connection
backs off the whole link (``modbus.reconnect_min_s`` doubling to ``reconnect_max_s``, but
never beyond ``retry_max_s``, which the PLC's heartbeat watchdog sets). Each operation logs
once when it starts failing and once when it works again or is no longer needed; the
attempts are counted in ``rung_plc_retries_total`` and ``rung_plc_failing``, and the link
state reads ``degraded`` with the operation and its error while one keeps failing.

A request runs once (:class:`rung.daemon.modbus.job.Diagnoser`). Its answer is kept, in a file
under ``state_dir`` when one is given, and published once; the writes that deliver it are
retried for as long as the PLC keeps the request up, never by running the model again. A
request found acknowledged but neither done nor answered (``ack_seq == req_seq``, ``done ==
0``, no kept answer: rung stopped during the job) is run again from the snapshot on
(``resumed``).

A map with ``history: {keep, every_s}`` has the loop also read a snapshot every
``every_s`` and keep the last ``keep`` (``Trends``); each diagnosis request gets them as its
numeric points' ``history``, so its prognosis comes from a trend (docs/tasks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from rung.daemon.metrics import Metrics, PlcMetrics
from rung.daemon.modbus.job import (
    ERR_CODES,
    Answered,
    AnswerStore,
    Backoff,
    Diagnoser,
    Job,
    Submit,
)
from rung.daemon.modbus.link import Link, ModbusError
from rung.daemon.modbus.link_state import LinkState, Publish
from rung.daemon.modbus.regmap import History, PlcMap
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer

__all__ = ["ERR_CODES", "Plant", "PlcAgent", "Publish", "Submit"]

log = logging.getLogger("rung.plc")

Regs = dict[str, int]   # handshake register name -> value
_REQUEST_OPS = ("ack write", "answer write", "done write", "clear write")


class Plant(Protocol):
    """The plant's own view of its PLCs beside MQTT (the Sparkplug B edge node)."""

    def diagnosis(self, plc: str, event: Mapping[str, Any]) -> None: ...
    def plc_link(self, plc: str, up: bool) -> None: ...


@dataclass
class _Op:
    """One kind of Modbus operation's failures in a row, and when it may be tried again."""

    failures: int = 0
    next_at: float = 0.0


class PlcAgent:
    """Polls one PLC's handshake, runs its requests through the shared scheduler, answers;
    publishes its diagnoses and its link's state (``link_state``) under ``base_topic``.

    ``metrics``: the daemon's (its ``plc`` series); ``state_dir``: where the answer waiting
    for delivery is kept (``{state_dir}/{plc id}.json``); None keeps it in memory only;
    ``plant``: told every diagnosis and link change too (Sparkplug B), or None. The
    link's ``on_state`` is the agent's from here on.
    """

    def __init__(self, plc: PlcMap, link: Link, submit: Submit, publish: Publish,
                 base_topic: str, timeout_s: float, reconnect_min_s: float = 0.5,
                 reconnect_max_s: float = 30.0, metrics: Metrics | None = None,
                 state_dir: Path | None = None, plant: Plant | None = None) -> None:
        hs = plc.handshake
        self.plc, self.link, self.publish, self.base = plc, link, publish, base_topic
        self.plant = plant
        self.link_state = LinkState(plc.id, base_topic, publish,
                                    plant.plc_link if plant is not None else None)
        link.on_state = self.link_state.changed
        self.retry = Backoff(hs.poll_s, hs.retry_max_s)
        self.reconnect = Backoff(min(reconnect_min_s, hs.retry_max_s),
                                 min(reconnect_max_s, hs.retry_max_s))
        self.metrics = metrics.plc if metrics is not None else PlcMetrics()
        self.metrics.add(plc.id)
        self.trends = Trends(plc.history) if plc.history is not None else None
        self._submit = submit
        self._next_sample = 0.0
        self.diagnoser = Diagnoser(plc, link, submit if self.trends is None else self._with_history,
                                   base_topic, timeout_s,
                                   Backoff(reconnect_min_s, reconnect_max_s),
                                   lambda op, n: self.metrics.failed(plc.id, op, n))
        self.store = AnswerStore(state_dir / f"{plc.id}.json", plc.id) if state_dir else None
        self.answer: Answered | None = self.store.load() if self.store else None
        self.job: Job | None = None                  # the request taken, not yet answered
        self.task: asyncio.Task[None] | None = None  # its run, once acknowledged
        self.heartbeat = 0
        self.serving = False   # the last cycle read the handshake
        self._next_beat = 0.0
        self._ops: dict[str, _Op] = {}
        self._down = 0         # connection failures in a row
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll until ``stop``: each cycle reads, beats and reconciles; a failed connection
        backs off, anything else is retried per operation."""
        if self.answer is not None and not self.answer.published:
            await self._publish(self.answer)   # finished before a restart, never published
        while not self._stop.is_set():
            try:
                await self._cycle()
                delay = self._link_ok()
            except ModbusError as e:   # the connection; the rest is handled per operation
                delay = self._link_failed(e)
            except Exception:   # a bug: keep serving the PLC, slowly, and say so
                log.exception("PLC %s: poll failed inside rung", self.plc.id)
                self.serving, delay = False, self.retry.max_s
            self.metrics.set_link(self.plc.id, self.serving, self.link.per_transaction)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()   # its request stays in the PLC (req = 1): resumed at restart
        await self.link.close()

    async def _cycle(self) -> None:
        regs: Regs = {}

        async def read() -> None:
            regs.update(await self._read_handshake())

        self.serving = await self._try("handshake read", read)
        if self.serving:   # the heartbeat says "rung sees your requests": only after a read
            await self._beat()
            await self._reconcile(regs)
            await self._sample()

    def _link_ok(self) -> float:
        if self._down:
            log.info("PLC %s: link back after %d failed attempts", self.plc.id, self._down)
            self.metrics.worked(self.plc.id, "link")
            self._down = 0
        return self.plc.handshake.poll_s

    def _link_failed(self, e: ModbusError) -> float:
        self._down += 1
        self.serving = False
        self.metrics.failed(self.plc.id, "link", self._down)
        if self._down == 1:
            log.warning("PLC %s: link down, reconnecting with backoff from %g s up to "
                        "%g s: %s", self.plc.id, self.reconnect.first_s,
                        self.reconnect.max_s, e)
        return self.reconnect.delay(self._down)

    async def _read_handshake(self) -> Regs:
        start, count = self.plc.handshake.read_span()
        raw = [int(v) for v in await self.link.read("holding", start, count)]
        return {name: raw[addr - start]
                for name, addr in self.plc.handshake.registers.items()}

    async def _beat(self) -> None:
        hs = self.plc.handshake
        now = time.monotonic()
        if now < self._next_beat:
            return
        value = (self.heartbeat + 1) & 0xFFFF
        if await self._try("heartbeat write",
                           lambda: self.link.write_registers(hs.heartbeat, [value])):
            self.heartbeat, self._next_beat = value, now + hs.heartbeat_s

    # -- the snapshots kept for the points' trends (the map's ``history``) ----------------

    async def _sample(self) -> None:
        """Keep a snapshot every ``history.every_s`` (a failed read is retried with backoff
        like any operation)."""
        if self.trends is None or time.monotonic() < self._next_sample:
            return
        trends = self.trends

        async def read() -> None:
            trends.add(time.time(), await self.link.read_snapshot())

        if await self._try("history read", read):
            self._next_sample = time.monotonic() + trends.spec.every_s

    def _with_history(self, req: Request) -> asyncio.Future[Answer] | None:
        """A diagnosis request with each point's kept history (the submit the diagnoser
        uses when the map keeps history)."""
        if self.trends is not None and req.task == "diagnosis":
            req = replace(req, input=self.trends.attach(req.input, req.received))
        return self._submit(req)

    # -- registers against what rung knows -----------------------------------------------

    async def _reconcile(self, r: Regs) -> None:
        """Write what the registers lack: the acknowledgement of the request taken, the
        answer to the request up, or the clearing after the PLC took it."""
        self._adopt(r)
        job, ans = self.job, self.answer
        wanted: set[str] = set()
        if r["req"] == 1 and job is not None and self.task is None:
            ack = {"ack_seq": job.req_seq, "busy": 1, "done": 0}
            wanted.add("ack write")
            if not _differs(r, ack) or await self._try("ack write", lambda: self._write(ack),
                                                       f"request {job.req_seq}"):
                self._start(job)
        elif r["req"] == 1 and ans is not None:
            values, done = {"result": ans.result, "err": ans.err}, {"done": 1, "busy": 0}
            if _differs(r, values):
                wanted.add("answer write")
                landed = await self._try("answer write", lambda: self._write(values),
                                         f"request {ans.req_seq}")
            else:
                landed = True
            if landed and _differs(r, done):
                wanted.add("done write")
                if await self._try("done write", lambda: self._write(done),
                                   f"request {ans.req_seq}"):
                    self._delivered(ans)
        elif (r["req"] == 0 and self.task is None) or (r["done"] == 1 and job is None
                                                       and ans is None and r["req"] == 1):
            # the PLC took the answer or gave up; or done before a restart, busy left up
            clear = {n: 0 for n in (("busy", "done") if r["req"] == 0 else ("busy",)) if r[n]}
            if clear:
                wanted.add("clear write")
                await self._try("clear write", lambda: self._write(clear))
        for name in _REQUEST_OPS:
            if name not in wanted:
                self._settled(name, "no longer needed")

    def _adopt(self, r: Regs) -> None:
        """Take a new request, drop what the PLC withdrew or replaced."""
        seq = r["req_seq"]
        if r["req"] == 0:
            if self.job is not None and self.task is None:
                self.job = None   # withdrawn before it was acknowledged
            self._forget_answer()
        if r["req"] != 1:
            return
        if self.job is not None:
            if self.task is not None or self.job.req_seq == seq:
                return   # one request at a time: the next waits for this one's answer
            self.job = None   # replaced before it was acknowledged
        if self.answer is not None:
            if self.answer.req_seq == seq and r["ack_seq"] == seq:
                return   # being delivered
            self._forget_answer()   # the PLC moved on
        if r["done"] == 1 and r["ack_seq"] == seq:
            return   # answered earlier; waiting for the PLC to clear req
        resumed = r["ack_seq"] == seq
        if resumed:
            log.warning("PLC %s: request %d was acknowledged before a restart: running it "
                        "again", self.plc.id, seq)
        self.job = Job(seq, resumed)
        self._settled("ack write", "replaced by a new request")

    def _forget_answer(self) -> None:
        if self.answer is not None:
            self.answer = None
            if self.store is not None:
                self.store.clear()

    def _start(self, job: Job) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run_job(job), name=f"plc-{self.plc.id}-{job.req_seq}")

    async def _run_job(self, job: Job) -> None:
        """Run the request once, keep its answer, publish it, hand it to the loop."""
        answered = await self.diagnoser.run(job)
        self.metrics.job(self.plc.id, answered.err)
        if self.store is not None:
            self.store.save(answered)
        await self._publish(answered)
        self._settled("answer write", "replaced by a new answer")
        self._settled("done write", "replaced by a new answer")
        self.answer, self.job, self.task = answered, None, None
        self._wake.set()   # deliver it now rather than at the next poll

    async def _publish(self, answered: Answered) -> None:
        """The event (QoS 1) and the retained summary; the publisher keeps what the broker
        did not take and sends it after the reconnect."""
        topic = f"{self.base}/diag/{self.plc.id}"
        try:
            if self.plant is not None:
                self.plant.diagnosis(self.plc.id, answered.event)
            await self.publish(f"{topic}/event", answered.event, False)
            await self.publish(f"{topic}/last", answered.last, True)
        except Exception as e:   # a broken publisher: the PLC still gets its answer
            log.error("PLC %s: publishing request %d failed: %s", self.plc.id,
                      answered.req_seq, e)
        answered.published = True
        if self.store is not None:
            self.store.save(answered)

    def _delivered(self, ans: Answered) -> None:
        event = ans.event
        log.info("plc answered", extra={"rung_fields": {
            "plc": self.plc.id, "req_seq": ans.req_seq, "err": ans.err, "result": ans.result,
            "resumed": event.get("resumed"), "ms": event.get("ms")}})

    async def _write(self, values: Regs) -> None:
        """Write handshake registers by name: one request when their addresses are
        adjacent, else one per register in address order."""
        registers = self.plc.handshake.registers
        writes = sorted((registers[name], v) for name, v in values.items())
        if all(b[0] == a[0] + 1 for a, b in zip(writes, writes[1:], strict=False)):
            await self.link.write_registers(writes[0][0], [v for _, v in writes])
            return
        for address, value in writes:
            await self.link.write_registers(address, [value])

    # -- one operation, retried with backoff ---------------------------------------------

    async def _try(self, name: str, call: Callable[[], Awaitable[None]],
                   about: str | None = None) -> bool:
        """Run ``call`` unless ``name`` waits out its backoff; True when it worked. A reply
        that fails it is counted, logged once and shown on the link; a failed connection
        is raised to the loop."""
        op = self._ops.setdefault(name, _Op())
        if time.monotonic() < op.next_at:
            return False
        try:
            await call()
        except ModbusError as e:
            if e.connection:
                raise
            op.failures += 1
            op.next_at = time.monotonic() + self.retry.delay(op.failures)
            self.metrics.failed(self.plc.id, name, op.failures)
            if op.failures == 1:
                what = f"{name} for {about}" if about else name
                log.log(logging.WARNING if e.transient else logging.ERROR,
                        "PLC %s: %s fails, retrying with backoff up to %g s: %s",
                        self.plc.id, what, self.retry.max_s, e)
                self.link.set_fault(name, f"{what}: {e}")
            return False
        self.metrics.worked(self.plc.id, name)
        self._settled(name, None)
        return True

    def _settled(self, name: str, why: str | None) -> None:
        """``name`` worked (``why`` None) or is no longer wanted: its failures end."""
        op = self._ops.get(name)
        if op is None or not op.failures:
            return
        if why is None:
            log.info("PLC %s: %s works again after %d failed attempts", self.plc.id, name,
                     op.failures)
        else:
            log.info("PLC %s: %s %s after %d failed attempts", self.plc.id, name, why,
                     op.failures)
        op.failures, op.next_at = 0, 0.0
        self.metrics.worked(self.plc.id, name)
        self.link.set_fault(name, None)


class Trends:
    """The last ``spec.keep`` snapshots of one PLC, newest last, handed to a diagnosis as
    each numeric point's ``history`` (``[[t, value], ...]``, unix seconds, increasing; the
    request's own value the newest sample)."""

    def __init__(self, spec: History) -> None:
        self.spec = spec
        self.snapshots: deque[tuple[float, dict[str, Any]]] = deque(maxlen=spec.keep)

    def add(self, t: float, snapshot: Mapping[str, Any]) -> None:
        if not self.snapshots or t > self.snapshots[-1][0]:
            self.snapshots.append((t, dict(snapshot)))

    def attach(self, data: Mapping[str, Any], now: float) -> dict[str, Any]:
        """``data`` (a diagnosis input) with the history of each numeric point; its values
        are kept as a snapshot too."""
        points = []
        for p in data.get("points") or []:
            value = p.get("value") if isinstance(p, Mapping) else None
            if _numeric(value):
                past = [[round(t, 3), s[p["name"]]] for t, s in self.snapshots
                        if round(t, 3) < round(now, 3) and _numeric(s.get(p["name"]))]
                if past:
                    p = {**p, "history": [*past, [round(now, 3), value]]}
            points.append(p)
        self.add(now, {p["name"]: p.get("value") for p in points
                       if isinstance(p, Mapping) and "name" in p})
        return {**data, "points": points}


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _differs(r: Regs, values: Regs) -> bool:
    return any(r[name] != value for name, value in values.items())
