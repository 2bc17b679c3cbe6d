"""The one way out: every answer and every PLC event leaves rung through here.

Answers to MQTT requests are recorded in the journal first and published in journal order
by ``run``; what the broker acknowledges is marked delivered. An answer whose publish keeps
ending the connection (``PUBLISH_ATTEMPTS`` in a row) is dead-lettered and the rest flow;
one that cannot be recorded (a failing disk) goes out from memory, and a delivery that
cannot be marked is kept in memory so nothing is published twice meanwhile. PLC events and
link states (``publish_json``) are held in memory across a broker outage, bounded, the
newest of a retained topic kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from rung.daemon import envelope
from rung.daemon.backoff import Backoff
from rung.daemon.journal.store import Journal, JournalError
from rung.daemon.metrics import Metrics
from rung.daemon.mqtt.link import MQTTLink
from rung.daemon.mqtt.requests import Address
from rung.daemon.supervise import spawn
from rung.daemon.topics import topic_problem

log = logging.getLogger("rung.serve")
PUBLISH_ATTEMPTS = 3   # publishes of one answer that end the connection before it is dropped
HELD_EVENTS = 1000     # PLC events kept across a broker outage (the oldest go first)
JOURNAL_RETRY_S = 0.5      # first retry of a journal that cannot be read, doubled per try
JOURNAL_RETRY_MAX_S = 30.0


class Outbox:
    """Answers (journal) and events (memory) to the broker, in order, across outages."""

    def __init__(self, journal: Journal, link: MQTTLink, metrics: Metrics) -> None:
        self.journal, self.link, self.metrics = journal, link, metrics
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()    # set when every recorded answer is delivered
        self._refused: dict[int, int] = {}     # answer seq -> publishes the broker refused
        # answers done with whose journal row could not be updated yet (a failing disk):
        # seq -> None (published: delivered) or why it was dead-lettered; never resent
        self._unmarked: dict[int, str | None] = {}
        self._direct: set[asyncio.Task[Any]] = set()   # one-shot publishes in flight
        self._held: list[tuple[str, bytes, bool]] = []

    # -- answers -------------------------------------------------------------------------

    def answer_error(self, seq: int, reply: Address, task: str | None, code: str,
                     message: str, received: float, extra: dict[str, Any] | None = None,
                     session: str | None = None, note: str | None = None) -> None:
        """Record and send an error answer (logged as ``answered``)."""
        self.record(seq, reply, envelope.error_response(reply.id, task, code, message, extra),
                    note)
        log.info("answered", extra={"rung_fields": {
            "seq": seq, "task": task, "ok": False, "code": code, "error": message,
            "id": reply.id, "session": session,
            "ms": round((time.time() - received) * 1000, 1)}})

    def record(self, seq: int, reply: Address, payload: bytes,
               note: str | None = None) -> None:
        """Record an answer, then publish it in journal order."""
        try:
            self.journal.answer(seq, reply.topic, payload, note)
        except JournalError:
            # the answer still goes out, straight from memory; the row stays pending, so
            # a restart answers the request again (at least once beats never)
            self.metrics.set_storage(False)
            self.direct(reply, payload)
            return
        self.wake()

    def direct(self, reply: Address, payload: bytes) -> None:
        """Publish an answer that is not (cannot be) in the journal."""
        spawn(self.link.publish(reply.topic, payload, correlation=reply.correlation),
              "outbox-direct", self._direct)

    def wake(self) -> None:
        self.idle.clear()
        self._wake.set()

    async def run(self) -> None:
        """Publish recorded answers in order; after a reconnect, what is left over. A
        journal that cannot be read (a failing disk) is tried again with backoff (logged
        once, ``rung_storage_ok`` 0 meanwhile) and every answer recorded meanwhile goes out
        once it can be read; anything else ends this part for its supervisor."""
        retry = Backoff(JOURNAL_RETRY_S, JOURNAL_RETRY_MAX_S)
        self.wake()   # (re)started: what is recorded and not delivered yet goes first
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._publish_recorded()
            except JournalError as e:
                delay = retry.next()
                if retry.failures == 1:
                    log.error("outbox: %s; trying again with backoff up to %g s", e,
                              JOURNAL_RETRY_MAX_S)
                self.metrics.set_storage(False)
                asyncio.get_running_loop().call_later(delay, self.wake)
                continue
            if retry.failures:
                log.warning("outbox: the journal can be read again after %d failed tries",
                            retry.failures)
                retry.reset()

    async def _publish_recorded(self) -> None:
        self._mark()
        for e in self.journal.undelivered():
            if e.reply_topic is None or e.response is None or e.seq in self._unmarked:
                continue
            why = topic_problem(e.reply_topic)
            if why is not None:    # recorded by an older version: the broker refuses it
                self._dead_letter(e.seq, e.reply_topic, f"reply topic {why}")
                continue
            was_connected = self.link.connected
            if await self.link.publish(e.reply_topic, e.response,
                                       correlation=e.correlation):
                self._refused.pop(e.seq, None)
                self._unmarked[e.seq] = None
                self._mark()
                continue
            if was_connected and self._refuse(e.seq, e.reply_topic):
                continue   # dead-lettered: the rest flow
            break   # disconnected: the next connection wakes us
        else:
            if not self._wake.is_set() and not self._unmarked:
                self.idle.set()
        self.metrics.set_journal_pending(len(self.journal.pending()))

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every recorded answer is delivered (at shutdown); False on timeout."""
        self.wake()
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _mark(self) -> None:
        """Record deliveries (kept in memory while the journal cannot write, so a published
        answer is not published again meanwhile)."""
        for seq, dead in sorted(self._unmarked.items()):
            try:
                if dead is None:
                    self.journal.delivered(seq)
                else:
                    self.journal.dead(seq, dead)
            except JournalError:
                self.metrics.set_storage(False)
                return
            del self._unmarked[seq]

    def _refuse(self, seq: int, topic: str) -> bool:
        """Count a publish that failed while connected (the broker may have dropped the
        connection because of it); True once it is dead-lettered."""
        n = self._refused[seq] = self._refused.get(seq, 0) + 1
        if n < PUBLISH_ATTEMPTS:
            return False
        self._dead_letter(seq, topic, f"the broker refused it {n} times (the connection "
                          "ended or the publish timed out on each)")
        return True

    def _dead_letter(self, seq: int, topic: str, why: str) -> None:
        self._refused.pop(seq, None)
        log.error("answer dead-lettered", extra={"rung_fields": {
            "seq": seq, "reply_topic": topic, "why": why}})
        self.metrics.dead_letters.inc()
        self._unmarked[seq] = why
        self._mark()

    # -- events --------------------------------------------------------------------------

    async def publish_json(self, topic: str, doc: dict[str, Any], retain: bool) -> bool:
        """Publish now, or keep it (in memory) for the next connection: PLC events and
        link states are not lost to a broker outage (retained topics keep the newest)."""
        payload = json.dumps(doc, ensure_ascii=False).encode()
        if await self.link.publish(topic, payload, retain=retain):
            return True
        if retain:
            self._held = [h for h in self._held if h[0] != topic]
        self._held.append((topic, payload, retain))
        del self._held[:-HELD_EVENTS]
        log.warning("broker down: %s held for the next connection", topic)
        return False

    def connected(self) -> None:
        """After every (re)connection of the link: the answers left over, then the events
        held meanwhile."""
        self.wake()
        spawn(self.flush_held(), "Outbox.flush_held", self._direct)

    async def flush_held(self) -> None:
        """After a reconnection: the events held meanwhile, in order."""
        held, self._held = self._held, []
        for i, (topic, payload, retain) in enumerate(held):
            if not await self.link.publish(topic, payload, retain=retain):
                self._held = held[i:] + self._held
                return
