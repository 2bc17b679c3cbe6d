"""A rung fleet: several nodes behind one broker, each request taken by one of them.

The nodes of a group share ``mqtt.base_topic`` and ``mqtt.shared_group``; each keeps its own
client id, persistent session, journal, cold KV tier and status topic (docs/mqtt.md,
"Fleet")::

    $share/{group}/{base}/req/#   requests: the broker hands each one to one node
    {base}/fleet/{client_id}      the node's status, retained: birth, updates, Last Will

A status says the node's engine, tasks, queue depth and the PLCs it drives; it is
republished every ``mqtt.fleet_update_s`` while the queue changes. ``rung fleet`` lists the
statuses (``fleet_view.py``). A node reads the others' statuses only while it settles its
claims and while it leaves (subscribed to ``{base}/fleet/+`` for those moments), so the
updates of N nodes cost the broker N messages, not N x N deliveries.

**One writer per PLC.** A node claims the PLCs of its config by listing them in its status.
Claims are ordered by the broker, which hands every publish to every subscriber in the order
it took them: a node subscribes to ``{base}/fleet/+`` before it publishes its birth, so by
the time its own birth comes back it has seen every status published before it. A PLC that
another online node lists there belongs to that node, and this node refuses it (log line
``plc refused``, its status, ``rung check``); the other node sees this claim only after its
own and keeps the PLC. A claim ends with its node: the Last Will and the offline status of
a clean stop list no PLCs. A refused PLC stays refused until the node restarts (no node
takes a PLC over by itself: a node cut off from the broker may still be driving it). A node
that finds after a reconnection that another node claimed one of its PLCs meanwhile stops
driving it.

**Leaving.** mosquitto 2.0 keeps handing a share of the requests to a member whose
persistent session is subscribed, online or not (measured: docs/mqtt.md). So on a clean
stop a node that sees another member online and staying unsubscribes from the requests,
takes in what the broker had already queued for it (its own status coming back after the
UNSUBACK is the fence), and once its scheduler has stopped republishes every request it
recorded and did not answer, with its properties, for the others to answer
(:meth:`Fleet.hand_over`). The last node of a group keeps its subscription, so requests
wait in the broker for it as they do for a single rung.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiomqtt

from rung.daemon.config import MQTTConfig
from rung.daemon.mqtt.journal import Entry, Journal, JournalError
from rung.daemon.mqtt.link import MQTTLink

log = logging.getLogger("rung.fleet")

ECHO_TIMEOUT_S = 10.0   # a status published and not back by then: the broker went away
LEAVE_TIMEOUT_S = 5.0

Claims = Callable[[set[str], dict[str, str]], None]   # PLCs to drive; refused PLC -> owner


def nodes_filter(base: str) -> str:
    """Every node's status topic in a fleet under ``base``."""
    return f"{base}/fleet/+"


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class NodeStatus:
    """One node's retained status as read from the broker (``doc`` is all of it)."""

    client_id: str
    online: bool
    leaving: bool = False
    plcs: tuple[str, ...] = ()    # claimed: an offline node claims nothing
    doc: Mapping[str, Any] = field(default_factory=dict)


def parse_status(topic: str, payload: bytes) -> NodeStatus | None:
    """The status on ``{base}/fleet/{client_id}``, or None (cleared, not a JSON object).
    The client id is the topic's, whatever the payload says."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    online = doc.get("online") is True
    plcs = doc.get("plcs")
    claimed = tuple(p for p in plcs if isinstance(p, str)) if isinstance(plcs, list) else ()
    return NodeStatus(topic.rpartition("/")[2], online, online and doc.get("leaving") is True,
                      claimed if online else (), doc)


def _payload(message: aiomqtt.Message) -> bytes:
    p = message.payload
    return bytes(p) if isinstance(p, bytes | bytearray) else str(p or "").encode()


class Fleet:
    """This node's part in its group: status, PLC claims, leaving, handing requests over.

    ``birth`` gives the node's own fields (engine, tasks, ...), ``queue`` its queue depth;
    ``on_claims`` is told which configured PLCs to drive (and which are refused) after every
    connection.
    """

    def __init__(self, cfg: MQTTConfig, link: MQTTLink, birth: Callable[[], dict[str, Any]],
                 queue: Callable[[], dict[str, int]], plcs: Sequence[str],
                 on_claims: Claims) -> None:
        self.cfg, self.link, self.birth, self.queue = cfg, link, birth, queue
        self.group = cfg.shared_group
        self.plcs, self.on_claims = tuple(plcs), on_claims
        self.nodes: dict[str, NodeStatus] = {}   # the other nodes, as last seen
        self.driving: set[str] = set()
        self.refused: dict[str, str] = {}        # PLC -> the node that drives it
        self.leaving = False
        self.boot = uuid.uuid4().hex[:12]        # this process's statuses carry it
        self._n = 0                              # statuses numbered, to recognise their echo
        self._echoed = 0
        self._echo = asyncio.Event()
        self._published_queue: dict[str, int] | None = None
        self._settling: asyncio.Task[None] | None = None
        link.watch(nodes_filter(cfg.base_topic), self._on_status)

    # -- the node's status ---------------------------------------------------------------

    @property
    def claims(self) -> list[str]:
        return sorted(p for p in self.plcs if p not in self.refused)

    def doc(self) -> dict[str, Any]:
        """The status to publish now (also the link's birth), numbered."""
        self._n += 1
        self._published_queue = self.queue()
        return {**self.birth(), "group": self.group, "queue": self._published_queue,
                "plcs": self.claims, "refused": dict(sorted(self.refused.items())),
                "leaving": self.leaving, "boot": self.boot, "n": self._n,
                "updated": iso(time.time())}

    async def publish(self) -> int | None:
        """Publish the status (retained); its number once the broker has it, else None."""
        if not self.link.connected:
            return None
        doc = self.doc()
        ok = await self.link.publish(self.link.status_topic, json.dumps(doc).encode(),
                                     retain=True)
        return int(doc["n"]) if ok else None

    async def run(self) -> None:
        """Republish the status every ``mqtt.fleet_update_s`` while the queue changed."""
        while True:
            await asyncio.sleep(self.cfg.fleet_update_s)
            if self.link.connected and self.queue() != self._published_queue:
                await self.publish()

    def close(self) -> None:
        if self._settling is not None:
            self._settling.cancel()

    def _on_status(self, message: aiomqtt.Message) -> None:
        topic, payload = str(message.topic), _payload(message)
        if topic == self.link.status_topic:
            status = parse_status(topic, payload)
            n = status.doc.get("n") if status is not None else None
            if status is not None and status.doc.get("boot") == self.boot \
                    and isinstance(n, int):
                self._echoed = max(self._echoed, n)
                self._echo.set()
            return   # a status of an earlier run of this node is no competitor
        status = parse_status(topic, payload)
        name = topic.rpartition("/")[2]
        if status is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = status

    async def _wait_echo(self, n: int, timeout_s: float) -> bool:
        """True once status ``n`` came back: everything the broker took before it is here."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._echoed < n:
                    self._echo.clear()
                    await self._echo.wait()
        except TimeoutError:
            return False
        return True

    # -- PLC claims ----------------------------------------------------------------------

    def connected(self) -> None:
        """After every connection (its birth, the claim, is out): settle the claims once
        the birth comes back. The statuses seen on the last connection are dropped: the
        new subscription brings every retained one again, before the birth."""
        self.nodes.clear()
        if self._settling is not None:
            self._settling.cancel()
        self._settling = asyncio.get_running_loop().create_task(self._settle(self._n))

    async def _settle(self, n: int) -> None:
        if not await self._wait_echo(n, ECHO_TIMEOUT_S):
            log.warning("fleet: the birth did not come back in %g s; PLC claims are "
                        "settled on the next connection", ECHO_TIMEOUT_S)
            return
        lost: dict[str, str] = {}
        for plc in self.claims:
            owner = self.owner(plc)
            if owner is not None:
                lost[plc] = owner
        for plc, owner in lost.items():
            self.refused[plc] = owner
            was = plc in self.driving
            log.error("plc lost" if was else "plc refused", extra={"rung_fields": {
                "plc": plc, "owner": owner, "group": self.group,
                "why": (f"PLC {plc} is driven by {owner}, which claimed it "
                        + ("while this node was away from the broker: this node stops "
                           "driving it" if was else
                           "first: this node does not drive it (one writer per PLC); "
                           "remove it from plcs here or stop that node, then restart"))}})
        won = set(self.claims)
        for plc in sorted(won - self.driving):
            log.info("plc claimed", extra={"rung_fields": {"plc": plc, "group": self.group}})
        self.driving = won
        self.on_claims(set(won), dict(self.refused))
        if lost:
            await self.publish()   # the claim withdrawn
        await self.link.watching(nodes_filter(self.cfg.base_topic), False)

    def owner(self, plc: str) -> str | None:
        """Another online node that claims ``plc`` (first by name when several do)."""
        return next((s.client_id for _, s in sorted(self.nodes.items())
                     if s.client_id != self.cfg.client_id and s.online and plc in s.plcs),
                    None)

    # -- leaving -------------------------------------------------------------------------

    async def leave(self) -> bool:
        """Before a clean stop: when another node of the group is online and staying, stop
        taking requests and take in what the broker queued for this node. True when the
        node left the group (its pending requests are then :meth:`hand_over`-ed); False
        when it is the last node, or the broker is away: it keeps its subscription and its
        requests wait for its restart."""
        self.leaving = True
        self.close()         # claims still settling: no longer needed
        self.nodes.clear()   # every retained status comes again with the subscription
        watched = await self.link.watching(nodes_filter(self.cfg.base_topic), True)
        n = await self.publish() if watched else None
        if n is None or not await self._wait_echo(n, LEAVE_TIMEOUT_S):
            log.warning("fleet: broker away at stop: this node keeps its shared "
                        "subscription; requests queued for it wait for its restart")
            return False
        staying = sorted(name for name, s in self.nodes.items() if s.online and not s.leaving)
        if not staying:
            log.warning("last node of the group", extra={"rung_fields": {
                "group": self.group, "why": "no other node of the group is online and "
                "staying: this node keeps its shared subscription, so requests wait in the "
                "broker for it (or for the next node to start)"}})
            return False
        if not await self.link.leave_requests():
            return False
        n = await self.publish()   # back after everything the broker queued for this node
        if n is None or not await self._wait_echo(n, LEAVE_TIMEOUT_S):
            log.warning("fleet: left the group without confirming that every queued "
                        "request arrived; any still queued waits for this node's restart")
        log.info("left the group", extra={"rung_fields": {"group": self.group,
                                                          "staying": staying}})
        return True

    async def hand_over(self, journal: Journal, request_timeout_s: float,
                        expire: Callable[[Entry], None]) -> int:
        """Republish every request recorded here and not answered (the scheduler has
        stopped) to its topic, for the nodes staying: same payload, v5 Response Topic,
        Correlation Data and what is left of its Message Expiry. One past its deadline is
        answered ``expired`` by ``expire`` instead. Returns the requests handed over."""
        try:
            pending = journal.pending()
        except sqlite3.Error as err:
            log.error("fleet: cannot read the journal to hand requests over (%s): they are "
                      "answered after the restart", err)
            return 0
        handed, now = 0, time.time()
        for e in pending:
            deadline = e.received + request_timeout_s
            if e.expires is not None:
                deadline = min(deadline, e.expires)
            if deadline <= now:
                expire(e)
                continue
            expiry = max(1, math.ceil(e.expires - now)) if e.expires is not None else None
            if not await self.link.publish(e.topic, e.payload, correlation=e.correlation,
                                           response_topic=e.response_topic, expiry_s=expiry,
                                           content_type=None):
                log.warning("fleet: broker away: %d requests stay pending here and are "
                            "answered after the restart", len(pending) - handed)
                break
            try:
                journal.handed_over(e.seq, f"handed over to group {self.group} at stop")
            except JournalError as err:   # republished all the same: maybe answered twice
                log.error("fleet: request %d handed over but not marked (%s): it is "
                          "answered again after the restart", e.seq, err)
            handed += 1
        if handed:
            log.info("handed over", extra={"rung_fields": {"requests": handed,
                                                           "group": self.group}})
        return handed
