"""MQTT requests in, their answers out: record, route, answer.

A request message is recorded in the journal before the link acknowledges it
(``on_message``), then parsed at the edge (``requests.parse``) and routed: a ``Failure`` is
answered at once; an ``MqttRequest`` hands its ``Request`` to the scheduler and keeps the
rest here (journal row, reply address, answer forms) until the scheduler's future brings
the answer back, to be recorded and published by the outbox. A message the journal cannot
hold (a full or failing ``state_dir``) is answered ``unavailable`` from memory; a duplicate
is dropped.

After a restart ``recover`` routes what the journal still holds pending; one the daemon
died on ``journal.max_attempts`` times is quarantined (answered ``internal``, never run
again). A bug while routing one request answers that request ``internal``, nothing else.

``recover`` (``rung serve``'s start-up) also moves the journal's writes off the event loop
(``Journal.attach``): from then on ``on_message`` returns a future that the link awaits
before it acknowledges (resolved once the row is committed and checkpointed, in arrival
order), ``started`` a future the scheduler awaits before the model starts, and the link
publishes nothing before the journal has settled what was written before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from rung.daemon import envelope
from rung.daemon import request_form as form
from rung.daemon.config import Config
from rung.daemon.journal.store import Entry, Incoming, Journal, JournalError
from rung.daemon.metrics import Metrics
from rung.daemon.mqtt import requests as rq
from rung.daemon.mqtt.link import MQTTLink
from rung.daemon.mqtt.outbox import Outbox
from rung.daemon.mqtt.requests import Address, MqttRequest
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.engines.errors import brief

log = logging.getLogger("rung.serve")   # the ``answered`` lines keep their logger (docs/mqtt.md)


class MqttIntake:
    """Takes the link's request messages (``on_message``) and answers each exactly once.

    ``tasks``: the task names the runner serves (and their definitions, for
    ``output_formats``). ``holding``: once True, recorded requests stay pending instead of
    being run (a fleet node leaving its group: handed over, or run after its restart).
    """

    def __init__(self, cfg: Config, tasks: Mapping[str, Any], journal: Journal,
                 scheduler: Scheduler, outbox: Outbox, metrics: Metrics) -> None:
        self.cfg, self.tasks, self.journal = cfg, tasks, journal
        self.scheduler, self.outbox, self.metrics = scheduler, outbox, metrics
        self.holding = False
        # the requests with the scheduler, by their uid: their journal rows for ``started``
        self._open: dict[int, MqttRequest] = {}

    # -- intake --------------------------------------------------------------------------

    def on_message(self, msg: Incoming) -> bool | asyncio.Future[bool]:
        """Record, then route; True once the message is durable (the link acknowledges).
        With the journal attached: a future, True once recorded and routed."""
        if msg.retained:
            # a retained request replayed at subscribe time (MQTT 3.1.1; v5 subscribes with
            # Retain Handling 2 and never gets these): it was answered when it was
            # published, and would otherwise run again after every reconnect
            log.warning("retained request on %s ignored: publish requests with retain off",
                        msg.topic)
            self.metrics.observe_request(None, "retained_replay")
            return True
        msg = replace(msg, claimed_id=rq.claimed_id(msg.payload, self.cfg.mqtt.max_payload_bytes))
        if self.journal.attached:
            return self._record_soon(msg)
        try:
            entry = self.journal.record(msg)
        except JournalError as e:
            self.metrics.set_storage(False)
            self._unrecorded(msg, e)
            return True
        self._take(entry)
        return True

    def _record_soon(self, msg: Incoming) -> asyncio.Future[bool]:
        """The journal attached: the message is parsed first (on a provisional row), so
        that one refused at the edge is recorded already answered, in one write; the
        future resolves once the journal holds it and it is routed."""
        now = time.time()
        parsed: MqttRequest | rq.Failure | None = None
        answer = None
        try:
            mq = self.cfg.mqtt
            provisional = Entry(0, msg.topic, msg.payload, msg.response_topic,
                                msg.correlation, now,
                                None if msg.expiry_s is None else now + msg.expiry_s)
            parsed = rq.parse(provisional, mq.base_topic, mq.client_id, self.tasks,
                              mq.max_payload_bytes, self.cfg.queue.request_timeout_s)
            if isinstance(parsed, rq.Failure):
                answer = (parsed.reply.topic, envelope.error_response(
                    parsed.reply.id, parsed.task, parsed.code, parsed.message))
        except Exception:   # routed (and answered) from the recorded row as usual
            parsed = None
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.journal.record_soon(msg, now, answer).add_done_callback(
            partial(self._recorded, msg, parsed, done))
        return done

    def _recorded(self, msg: Incoming, parsed: MqttRequest | rq.Failure | None,
                  done: asyncio.Future[bool], recorded: asyncio.Future[Entry | None]) -> None:
        """The journal holds the message (or cannot): route it, then let the link
        acknowledge it. Runs in arrival order (the journal's writes land in order)."""
        ok = True
        try:
            err = recorded.exception()
            if isinstance(err, JournalError):
                self.metrics.set_storage(False)
                self._unrecorded(msg, err)
            elif err is not None:   # not recorded: left unacknowledged, redelivered later
                ok = False
                log.error("recording a request on %s failed", msg.topic, exc_info=err)
            else:
                self._take(recorded.result(), parsed)
        finally:
            if not done.done():
                done.set_result(ok)

    def _take(self, entry: Entry | None,
              parsed: MqttRequest | rq.Failure | None = None) -> None:
        self.metrics.set_storage(True)
        if entry is None:
            self.metrics.observe_request(None, "duplicate")
        else:
            self._route_or_fail(entry, parsed=_numbered(parsed, entry.seq))

    def recover(self) -> int:
        """Start-up: move the journal's writes to its writer thread (``attach``), re-queue
        requests recorded before a restart; answers left unpublished go out once connected.
        Returns the requests re-queued."""
        self.attach()
        pending = self.journal.pending()
        for e in pending:
            self._route_or_fail(e, recovered=True)
        if pending:
            log.info("recovered %d requests from the journal", len(pending))
        return len(pending)

    def attach(self) -> None:
        """Journal writes off the event loop from here on (on the loop; once): failures
        reach the metrics, and the link holds every publish until the journal has settled
        the writes made before it (an answer is published only once it is recorded)."""
        if self.journal.attached:
            return
        self.journal.attach(asyncio.get_running_loop())
        self.journal.on_failure = lambda _err: self.metrics.set_storage(False)
        link = getattr(self.outbox, "link", None)
        if isinstance(link, MQTTLink):
            link.hold = self.journal.settled

    def started(self, req: Request) -> asyncio.Future[None] | None:
        """Told by the scheduler when the model is about to start on one of this intake's
        requests (``submit(..., on_start=)``): count the attempt before the model starts (a
        poison message is recognised after a restart). With the journal attached, the
        future the scheduler awaits before it starts the model (it never raises)."""
        m = self._open.get(req.uid)
        if m is None:
            return None   # not from here: Modbus jobs live in the PLC's registers
        if self.journal.attached:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def counted(f: asyncio.Future[int]) -> None:
                if f.exception() is not None:   # on_failure has told the metrics
                    log.warning("request %d: its start could not be recorded (%s)", m.seq,
                                f.exception())
                done.set_result(None)

            self.journal.started_soon(m.seq).add_done_callback(counted)
            return done
        try:
            self.journal.started(m.seq)
        except JournalError:
            self.metrics.set_storage(False)
        return None

    def expire(self, e: Entry) -> None:
        """Answer a recorded request ``expired`` without running it (a fleet hand-over)."""
        self.outbox.answer_error(e.seq, self._reply(e, peek=True), _task(e), "expired",
                                 "deadline passed before the request was started (message "
                                 "expiry or queue.request_timeout_s)", e.received)

    def _unrecorded(self, msg: Incoming, err: JournalError) -> None:
        """A request the journal cannot hold (a full or failing ``state_dir``): answered
        ``unavailable`` at once, straight from memory, and acknowledged, so the broker's
        window never fills with requests rung can neither run nor refuse; intake works
        again with the first write that succeeds."""
        entry = Entry(0, msg.topic, msg.payload, msg.response_topic, msg.correlation,
                      time.time(), None)
        reply = self._reply(entry, peek=True)
        payload = envelope.error_response(reply.id, _task(entry), "unavailable",
                                          f"request not accepted: {err.message}; retry later")
        self.metrics.observe_request(None, "unavailable")
        self.outbox.direct(reply, payload)

    # -- routing -------------------------------------------------------------------------

    def _route_or_fail(self, entry: Entry, recovered: bool = False,
                       parsed: MqttRequest | rq.Failure | None = None) -> None:
        try:
            self._route(entry, recovered, parsed)
        except Exception as e:   # a bug in routing answers this request, nothing else
            # (and a recovered one is then not recovered again and again)
            log.exception("%srequest %d could not be routed", "recovered " if recovered
                          else "", entry.seq)
            self.outbox.answer_error(entry.seq, self._reply(entry), None, "internal",
                                     brief("routing the request failed", type(e).__name__),
                                     entry.received)

    def _route(self, entry: Entry, recovered: bool,
               parsed: MqttRequest | rq.Failure | None = None) -> None:
        mq = self.cfg.mqtt
        if parsed is None:
            parsed = rq.parse(entry, mq.base_topic, mq.client_id, self.tasks,
                              mq.max_payload_bytes, self.cfg.queue.request_timeout_s)
        if recovered and entry.attempts >= self.cfg.journal.max_attempts:
            self._quarantine(entry, parsed)
            return
        if isinstance(parsed, rq.Failure):
            self.outbox.answer_error(parsed.seq, parsed.reply, parsed.task, parsed.code,
                                     parsed.message, entry.received)
            self.metrics.observe_request(parsed.task if parsed.task in self.tasks else None,
                                         parsed.code, total_s=time.time() - entry.received)
        elif not self.holding:   # holding: stays pending (handed over, or run after restart)
            self._submit(parsed, recovered)
        self.metrics.set_queue(self.scheduler.depth, self.scheduler.inflight)

    def _submit(self, m: MqttRequest, recovered: bool) -> None:
        """Hand the request to the scheduler, or answer ``busy``. One taken is kept in
        ``_open`` until answered; the scheduler starts it from the event loop, after this
        returns, so ``started`` finds it."""
        req = m.request
        future = self.scheduler.submit(req, recovered, on_start=self.started)
        if future is None:
            self._answer(m, Answer(req, False, "busy", f"queue full "
                                   f"({self.cfg.queue.max_pending} pending); retry later"))
            self.metrics.observe_request(req.task, "busy", total_s=time.time() - req.received)
            return
        self._open[req.uid] = m
        future.add_done_callback(partial(self._answered, m))

    def _quarantine(self, entry: Entry, parsed: MqttRequest | rq.Failure) -> None:
        """A request the daemon died on ``attempts`` times: answered, never run again."""
        why = (f"quarantined: the daemon stopped {entry.attempts} times while this request "
               f"was in flight (journal.max_attempts = {self.cfg.journal.max_attempts}); "
               "it is not run again")
        log.error("request %d %s", entry.seq, why)
        self.metrics.quarantined.inc()
        task = parsed.request.task if isinstance(parsed, MqttRequest) else None
        self.outbox.answer_error(entry.seq, parsed.reply, task, "internal", why,
                                 entry.received, note=why)
        self.metrics.observe_request(task, "internal", total_s=time.time() - entry.received)

    def _reply(self, entry: Entry, peek: bool = False) -> Address:
        """Where to answer a request that was not parsed (``peek``: use what its payload
        says, when it is a JSON object)."""
        mq = self.cfg.mqtt
        doc = form.peek(entry.payload, mq.max_payload_bytes) if peek else {}
        return rq.reply_address(entry, mq.base_topic, mq.client_id, doc)

    # -- answers -------------------------------------------------------------------------

    def _answered(self, m: MqttRequest, future: asyncio.Future[Answer]) -> None:
        self._open.pop(m.request.uid, None)
        self._answer(m, future.result())

    def _answer(self, m: MqttRequest, a: Answer) -> None:
        """An MQTT request's answer: recorded, then published by the outbox."""
        req = m.request
        usage = envelope.wire_usage(a)
        if a.ok:
            payload = envelope.answer_payload(m.reply.id, a, m.output_formats,
                                              self.cfg.st.edition, usage)
            self.outbox.record(m.seq, m.reply, payload)
            log.info("answered", extra={"rung_fields": {
                "seq": m.seq, "task": req.task, "ok": True, "id": m.reply.id,
                "session": req.session, **usage}})
            return
        self.outbox.answer_error(m.seq, m.reply, req.task, a.code or "internal",
                                 a.message, req.received, envelope.error_extra(a, usage),
                                 req.session)


def _numbered(parsed: MqttRequest | rq.Failure | None,
              seq: int) -> MqttRequest | rq.Failure | None:
    """A message parsed before it had its journal row, given the row's number."""
    if isinstance(parsed, rq.Failure):
        return replace(parsed, seq=seq)
    if isinstance(parsed, MqttRequest):
        return replace(parsed, seq=seq, request=replace(parsed.request,
                                                        ref=f"mqtt request {seq}"))
    return None


def _task(entry: Entry) -> str | None:
    """The task a request's topic names (its last level), or None."""
    return entry.topic.rpartition("/")[2] or None
