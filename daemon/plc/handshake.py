"""The request handshake with one PLC, whatever the protocol: the PLC raises a request,
rung answers with a diagnosis.

Per PLC, in values the map names (Modbus holding registers, OPC UA nodes)::

    PLC: req_seq += 1, req = 1
    rung: ack_seq = req_seq, busy = 1          (the PLC sees its request taken)
    rung: snapshot -> diagnosis (+ fault tree) -> MQTT {base}/diag/{plc}/event and /last
    rung: result, err; then done = 1, busy = 0
    PLC: reads result/err, req = 0
    rung: done = 0
    rung: heartbeat += 1 every heartbeat_s, in a cycle that read the handshake

One loop per PLC, once per ``poll_s`` (and at once when the transport says a request may
have changed: an OPC UA subscription): read the handshake; only then bump the heartbeat (so
it means "rung sees this PLC's requests"); then compare what the PLC holds with what rung
knows (a request to acknowledge, an answer to deliver, values to clear) and write the
difference. Nothing is written from anywhere else, so every state has an exit: when the PLC
withdraws or replaces a request, the writes for it stop.

Faults are handled per operation. A reply that refuses one read or write fails that
operation only: it is retried with backoff (``poll_s`` doubling to the map's
``retry_max_s``) while the rest of the cycle goes on. Only a failed connection backs off
the whole link (``reconnect_min_s`` doubling to ``reconnect_max_s``, but never beyond
``retry_max_s``, which the PLC's heartbeat watchdog sets). Each operation logs once when it
starts failing and once when it works again or is no longer needed; the attempts are
counted in ``rung_plc_retries_total`` and ``rung_plc_failing``, and the link state reads
``degraded`` with the operation and its error while one keeps failing.

A request runs once (:class:`rung.daemon.plc.job.Diagnoser`). Its answer is kept, in a
file under ``state_dir`` when one is given, and published once; the writes that deliver it
are retried for as long as the PLC keeps the request up, never by running the model again.
A request found acknowledged but neither done nor answered (``ack_seq == req_seq``, ``done
== 0``, no kept answer: rung stopped during the job) is run again from the snapshot on
(``resumed``).

A map with ``history: {keep, every_s}`` has the loop also read a snapshot every
``every_s`` and keep the last ``keep`` (``Trends``); each diagnosis request gets them as its
numeric points' ``history``, so its prognosis comes from a trend (docs/tasks.md).

The transport (:class:`rung.daemon.plc.transport.Transport`) is the protocol's part:
``daemon/modbus/agent.py`` (registers) and ``daemon/opcua/link.py`` (nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from rung.daemon.backoff import Backoff
from rung.daemon.metrics import Metrics, PlcMetrics
from rung.daemon.plc.errors import PlcError
from rung.daemon.plc.job import Answered, AnswerStore, Diagnoser, Job, Submit
from rung.daemon.plc.link_state import LinkState, Publish
from rung.daemon.plc.transport import PlcSpec, Transport
from rung.daemon.plc.trends import Trends
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer

__all__ = ["HandshakeAgent", "Plant", "Publish", "Submit", "Trends"]

log = logging.getLogger("rung.plc")

Regs = dict[str, int]   # handshake value name -> value
_REQUEST_OPS = ("ack write", "answer write", "done write", "clear write")


class Plant(Protocol):
    """The plant's own view of its PLCs beside MQTT (the Sparkplug B edge node)."""

    def diagnosis(self, plc: str, event: Mapping[str, Any]) -> None: ...
    def plc_link(self, plc: str, up: bool) -> None: ...


@dataclass
class _Op:
    """One kind of operation's failures in a row, and when it may be tried again."""

    failures: int = 0
    next_at: float = 0.0


class HandshakeAgent:
    """Drives one PLC's handshake over ``transport``, runs its requests through the shared
    scheduler, answers; publishes its diagnoses and its link's state (``link_state``) under
    ``base_topic``.

    ``metrics``: the daemon's (its ``plc`` series); ``state_dir``: where the answer waiting
    for delivery is kept (``{state_dir}/{plc id}.json``); None keeps it in memory only;
    ``plant``: told every diagnosis and link change too (Sparkplug B), or None; ``via``: the
    protocol's name in the diagnosis request and the err texts. The transport's ``on_state`` and
    ``on_request`` are the agent's from here on.
    """

    def __init__(self, plc: PlcSpec, transport: Transport, submit: Submit, publish: Publish,
                 base_topic: str, timeout_s: float, reconnect_min_s: float = 0.5,
                 reconnect_max_s: float = 30.0, metrics: Metrics | None = None,
                 state_dir: Path | None = None, plant: Plant | None = None, *,
                 via: str) -> None:
        hs = plc.handshake
        self.plc, self.transport, self.publish, self.base = plc, transport, publish, base_topic
        self.plant = plant
        self.link_state = LinkState(plc.id, base_topic, publish,
                                    plant.plc_link if plant is not None else None)
        transport.on_state = self._state
        transport.on_request = self.wake
        self.retry = Backoff(hs.poll_s, hs.retry_max_s)
        self.reconnect = Backoff(min(reconnect_min_s, hs.retry_max_s),
                                 min(reconnect_max_s, hs.retry_max_s))
        self.metrics = metrics.plc if metrics is not None else PlcMetrics()
        self.metrics.add(plc.id)
        self.trends = Trends(plc.history) if plc.history is not None else None
        self._submit = submit
        self._next_sample = 0.0
        self.diagnoser = Diagnoser(plc, transport,
                                   submit if self.trends is None else self._with_history,
                                   base_topic, timeout_s,
                                   Backoff(reconnect_min_s, reconnect_max_s),
                                   lambda op, n: self.metrics.failed(plc.id, op, n), via=via)
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
            except PlcError as e:   # the connection; the rest is handled per operation
                delay = self._link_failed(e)
            except Exception:   # a bug: keep serving the PLC, slowly, and say so
                log.exception("PLC %s: poll failed inside rung", self.plc.id)
                self.serving, delay = False, self.retry.max_s
            self.metrics.set_link(self.plc.id, self.serving, self.transport.per_transaction)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()

    def _state(self, state: str, detail: str | None) -> None:
        """The link's state changed: on MQTT (retained) and in the metrics."""
        self.link_state.changed(state, detail)
        self.metrics.set_state(self.plc.id, state)

    def wake(self) -> None:
        """Run the next cycle now (the PLC may have raised or changed a request)."""
        self._wake.set()

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()   # its request stays in the PLC (req = 1): resumed at restart
        await self.transport.close()

    async def _cycle(self) -> None:
        regs: Regs = {}

        async def read() -> None:
            regs.update(await self.transport.read_handshake())

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

    def _link_failed(self, e: PlcError) -> float:
        self._down += 1
        self.serving = False
        self.metrics.failed(self.plc.id, "link", self._down)
        if self._down == 1:
            log.warning("PLC %s: link down, reconnecting with backoff from %g s up to "
                        "%g s: %s", self.plc.id, self.reconnect.first_s,
                        self.reconnect.max_s, e)
        return self.reconnect.delay(self._down)

    async def _beat(self) -> None:
        hs = self.plc.handshake
        now = time.monotonic()
        if now < self._next_beat:
            return
        value = (self.heartbeat + 1) & 0xFFFF
        if await self._try("heartbeat write",
                           lambda: self.transport.write({"heartbeat": value})):
            self.heartbeat, self._next_beat = value, now + hs.heartbeat_s

    # -- the snapshots kept for the points' trends (the map's ``history``) ----------------

    async def _sample(self) -> None:
        """Keep a snapshot every ``history.every_s`` (a failed read is retried with backoff
        like any operation)."""
        if self.trends is None or time.monotonic() < self._next_sample:
            return
        trends = self.trends

        async def read() -> None:
            trends.add(time.time(), await self.transport.read_snapshot())

        if await self._try("history read", read):
            self._next_sample = time.monotonic() + trends.spec.every_s

    def _with_history(self, req: Request) -> asyncio.Future[Answer] | None:
        """A diagnosis request with each point's kept history (the submit the diagnoser
        uses when the map keeps history)."""
        if self.trends is not None and req.task == "diagnosis":
            req = replace(req, input=self.trends.attach(req.input, req.received))
        return self._submit(req)

    # -- the handshake against what rung knows ------------------------------------------

    async def _reconcile(self, r: Regs) -> None:
        """Write what the PLC lacks: the acknowledgement of the request taken, the
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
        await self.transport.write(values)

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
        except PlcError as e:
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
                self.transport.set_fault(name, f"{what}: {e}")
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
        self.transport.set_fault(name, None)


def _differs(r: Regs, values: Regs) -> bool:
    return any(r[name] != value for name, value in values.items())
