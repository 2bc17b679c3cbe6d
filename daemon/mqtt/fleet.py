"""A rung fleet: several nodes behind one broker, each request taken by one of them.

The nodes of a group share ``mqtt.base_topic`` and ``mqtt.shared_group``; each keeps its own
client id, persistent session, journal, cold KV tier and status topic (docs/mqtt.md,
"Fleet")::

    $share/{group}/{base}/req/#   requests: the broker hands each one to one node
    {base}/fleet/{client_id}      the node's status, retained: birth, updates, Last Will

A status says the node's engine, tasks, queue depth and the PLCs it drives; it is
republished every ``mqtt.fleet_update_s`` while the queue changes, and every quarter of
``mqtt.fleet_lease_s`` in any case (the claim's renewal). ``rung fleet`` lists the statuses
(``fleet_view.py``). A node reads the others' statuses only while it settles its claims and
while it leaves (subscribed to ``{base}/fleet/+`` for those moments), and the statuses of
the nodes that keep it off a PLC, so the updates of N nodes cost the broker N messages plus
one per watcher, not N x N deliveries. It always reads its own status topic.

**One writer per PLC.** A node claims the PLCs of its config by listing them in its status.
Claims are ordered by the broker, which hands every publish to every subscriber in the order
it took them: a node subscribes to ``{base}/fleet/+`` before it publishes its birth, so by
the time its own birth comes back it has seen every status published before it. A PLC that
another online node lists there belongs to that node, and this node refuses it (log line
``plc refused``, its status, ``rung check``); the other node sees this claim only after its
own and keeps the PLC. A claim ends with its node: the Last Will and the offline status of
a clean stop list no PLCs. A node that finds after a reconnection that another node claimed
one of its PLCs meanwhile stops driving it.

**Claims are leased, and tied to a live process.** Every status carries the process's
session id (``boot``, random per process), its number ``n``, ``lease_s`` and ``expires``;
the node renews it every ``lease_s / 4``. Anybody allowed to publish under
``{base}/fleet/`` could otherwise keep a PLC from every node for ever with one retained
``{"online": true, "plcs": [...]}``, or end a live node's claim with a retained
``{"online": false}``. So:

- a node that refuses a PLC watches the claimant's status. The claim ends for it when the
  claimant, online, no longer lists the PLC (a live node withdrew it), or when the claim
  stayed unchanged for a whole lease while this node was connected and this node never
  saw that session renew it (no live rung keeps that claim: a forged or orphaned status).
  Then this node contends for the PLC as at start (``plc claim ended``, then ``plc
  claimed`` or ``plc refused``). Time is this node's monotonic clock: no clock has to agree
  with another. A claimant that goes offline (its Last Will: the broker's word, not its
  own) keeps the PLC refused here until this node restarts, as before: a node cut off from
  the broker may still be driving it. ``mqtt.fleet_lease_s`` is at least 3 x
  ``mqtt.keepalive_s`` (``config.py``), so a live node whose renewals stop is declared
  offline by its Last Will before its lease runs out (renewal due after lease/4 + lease/8,
  Will after 1.5 x keepalive);
- a node reads its own status topic all the time. A status there that it did not publish
  (another session, an offline status while it runs, anything else) means some client
  speaks for it: it stops driving its PLCs at once (``fleet status overwritten``, ``plc
  lost``), so that a node that took the forged status for the end of its claim cannot write
  beside it, republishes its real status (at most once a second) and only then contends
  again for PLCs it refused. The node (``fleet_node.FleetNode``) cannot restart a PLC
  agent it stopped, so the PLCs given up this way stay given up (``refused``, owner
  ``(status overwritten)``) until the node restarts; a node that refused them takes them
  over.

The broker's ACL (docs/mqtt.md, "Access control") is what keeps other clients from
writing there at all; the lease and the self-check bound what one that can does.

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
import hashlib
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
from rung.daemon.journal.store import Entry, Journal, JournalError
from rung.daemon.mqtt.link import MQTTLink
from rung.daemon.mqtt.oversize import Oversize
from rung.daemon.wallclock import from_iso, iso

log = logging.getLogger("rung.fleet")

ECHO_TIMEOUT_S = 10.0   # a status published and not back by then: the broker went away
LEAVE_TIMEOUT_S = 5.0
RENEWALS = 4            # a claim is renewed this often per lease ...
TICKS = 8               # ... and due renewals and ended claims are looked at this often
LEASE_TRUST = 10        # a status's own lease_s is honoured up to this many of ours
RESTORE_MIN_S = 1.0     # an overwritten status is republished at most this often
MAX_STATUS_BYTES = 65536   # a status is < 2 KiB; larger ones are refused unparsed
MINE = 64               # digests of this process's latest statuses, to know its echoes
OVERWRITTEN = "(status overwritten)"   # refused[plc] of a PLC given up on an overwrite

Claims = Callable[[set[str], dict[str, str]], None]   # PLCs to drive; refused PLC -> owner


def nodes_filter(base: str) -> str:
    """Every node's status topic in a fleet under ``base``."""
    return f"{base}/fleet/+"


@dataclass(frozen=True)
class NodeStatus:
    """One node's retained status as read from the broker (``doc`` is all of it)."""

    client_id: str
    online: bool
    leaving: bool = False
    plcs: tuple[str, ...] = ()    # claimed: an offline node claims nothing
    doc: Mapping[str, Any] = field(default_factory=dict)
    session: str | None = None    # ``boot``: random per process
    n: int | None = None          # the publication's number in its session
    lease_s: float | None = None  # the claim's lease as the node states it
    expires: float | None = None  # its end by the node's clock (``expires``)
    note: str | None = None       # why the payload is not a status (``doc`` is then empty)


def _lease(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf
    return float(v) if ok else None


def parse_status(topic: str, payload: bytes,
                 max_bytes: int = MAX_STATUS_BYTES) -> NodeStatus | None:
    """The status on ``{base}/fleet/{client_id}``; None when cleared (empty). A payload
    over ``max_bytes`` (not parsed), not JSON, or not an object with ``online`` true or
    false is an offline status with a ``note``. The client id is the topic's, whatever the
    payload says."""
    name = topic.rpartition("/")[2]
    if not payload:
        return None
    if len(payload) > max_bytes:
        return NodeStatus(name, False, note=f"{len(payload)} bytes, over the limit of "
                                            f"{max_bytes}: not read")
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return NodeStatus(name, False, note="not JSON")
    if not isinstance(doc, dict) or not isinstance(doc.get("online"), bool):
        return NodeStatus(name, False, note="not a rung status (a JSON object whose "
                                            "online is true or false)")
    online = doc["online"]
    plcs = doc.get("plcs")
    claimed = tuple(p for p in plcs if isinstance(p, str)) if isinstance(plcs, list) else ()
    boot, n = doc.get("boot"), doc.get("n")
    return NodeStatus(name, online, online and doc.get("leaving") is True,
                      claimed if online else (), doc,
                      session=boot if isinstance(boot, str) else None,
                      n=n if isinstance(n, int) and not isinstance(n, bool) else None,
                      lease_s=_lease(doc.get("lease_s")), expires=from_iso(doc.get("expires")))


def _payload(message: aiomqtt.Message) -> bytes:
    p = message.payload
    return bytes(p) if isinstance(p, bytes | bytearray) else str(p or "").encode()


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class Fleet:
    """This node's part in its group: status, PLC claims, leaving, handing requests over.

    ``birth`` gives the node's own fields (engine, tasks, ...), ``queue`` its queue depth;
    ``on_claims`` is told which configured PLCs to drive (and which are refused) after every
    connection, and whenever that changes.
    """

    def __init__(self, cfg: MQTTConfig, link: MQTTLink, birth: Callable[[], dict[str, Any]],
                 queue: Callable[[], dict[str, int]], plcs: Sequence[str],
                 on_claims: Claims) -> None:
        self.cfg, self.link, self.birth, self.queue = cfg, link, birth, queue
        self.group = cfg.shared_group
        self.plcs, self.on_claims = tuple(plcs), on_claims
        self.lease_s = cfg.fleet_lease_s
        self.max_status_bytes = min(cfg.max_payload_bytes, MAX_STATUS_BYTES)
        self.oversize = Oversize(log, self.max_status_bytes, "fleet")
        self.nodes: dict[str, NodeStatus] = {}   # the other nodes, as last seen
        self.driving: set[str] = set()
        self.refused: dict[str, str] = {}        # PLC -> the node that drives it
        self.given_up: set[str] = set()          # stopped here: not driven again by this run
        self.leaving = False
        self.boot = uuid.uuid4().hex[:12]        # this process's statuses carry it
        self._n = 0                              # statuses numbered, to recognise their echo
        self._echoed = 0
        self._birth_n = 0                        # this connection's birth
        self._settled = False                    # claims settled on this connection
        self._echo = asyncio.Event()
        self._mine: dict[bytes, int] = {}        # digest -> n of this process's statuses
        self._foreign: bytes | None = None       # the last status here that was not ours
        self._seen: dict[str, tuple[bytes, float]] = {}   # node -> (digest, since: monotonic)
        self._renewing: dict[str, str] = {}      # owner -> a session seen renewing its claim
        self._watching: set[str] = set()         # owners' status topics subscribed
        self._published_queue: dict[str, int] | None = None
        self._published_at = -math.inf
        self._restored_at = -math.inf
        self._settling: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None
        link.watch(nodes_filter(cfg.base_topic), self._on_status)
        link.watch(link.status_topic, self._on_status)

    # -- the node's status ---------------------------------------------------------------

    @property
    def claims(self) -> list[str]:
        return sorted(p for p in self.plcs if p not in self.refused)

    def doc(self) -> dict[str, Any]:
        """The status to publish now (also the link's birth), numbered; its claim leased
        for ``mqtt.fleet_lease_s`` from now."""
        self._n += 1
        self._published_queue = self.queue()
        self._published_at, now = time.monotonic(), time.time()
        doc = {**self.birth(), "group": self.group, "queue": self._published_queue,
               "plcs": self.claims, "refused": dict(sorted(self.refused.items())),
               "leaving": self.leaving, "boot": self.boot, "n": self._n,
               "lease_s": self.lease_s, "updated": iso(now),
               "expires": iso(now + self.lease_s)}
        self._mine[_digest(json.dumps(doc).encode())] = self._n
        while len(self._mine) > MINE:
            del self._mine[next(iter(self._mine))]
        return doc

    async def publish(self) -> int | None:
        """Publish the status (retained); its number once the broker has it, else None."""
        if not self.link.connected:
            return None
        doc = self.doc()
        ok = await self.link.publish(self.link.status_topic, json.dumps(doc).encode(),
                                     retain=True)
        return int(doc["n"]) if ok else None

    async def run(self) -> None:
        """Renew the claim every ``lease_s / 4``, republish the status when the queue
        changed (looked at every ``mqtt.fleet_update_s``), and contend again for a refused
        PLC once the claim that kept this node off it has ended."""
        tick = min(self.cfg.fleet_update_s, self.lease_s / TICKS)
        while True:
            await asyncio.sleep(tick)
            if not self.link.connected:
                continue
            due = time.monotonic() - self._published_at >= self.lease_s / RENEWALS
            if due or self.queue() != self._published_queue:
                await self.publish()
            self._retry_refused()

    def close(self) -> None:
        for task in (self._settling, self._restoring):
            if task is not None:
                task.cancel()

    def _on_status(self, message: aiomqtt.Message) -> None:
        topic, payload = str(message.topic), _payload(message)
        self.oversize.refuse("status", topic, len(payload))
        if topic == self.link.status_topic:
            self._on_own(payload)
        else:
            self._on_other(topic, payload)

    def _on_own(self, payload: bytes) -> None:
        """This node's own topic: its statuses coming back, or somebody else's (reacted to
        once, though two subscriptions may bring it)."""
        small = len(payload) <= self.max_status_bytes
        digest = _digest(payload) if small else b"over the limit"
        n = self._mine.get(digest)
        if n is not None:
            self._echoed = max(self._echoed, n)
            self._foreign = None
            self._echo.set()
        elif self._echoed >= self._birth_n > 0 and digest != self._foreign:
            self._foreign = digest
            self._overwritten(payload)
        # else: retained or queued from before this connection's birth (an earlier run's
        # status, this node's Last Will): no competitor, and the birth replaced it

    def _on_other(self, topic: str, payload: bytes) -> None:
        """Another node's status: kept, with when it last changed and whether its session
        was seen renewing a claim that keeps this node off a PLC."""
        status = parse_status(topic, payload, self.max_status_bytes)
        name = topic.rpartition("/")[2]
        if status is None:
            self.nodes.pop(name, None)
            self._seen.pop(name, None)
            return
        prev = self.nodes.get(name)
        if (prev is not None and name in self.refused.values() and status.session
                and prev.session == status.session and (status.n or 0) > (prev.n or 0)):
            self._renewing[name] = status.session
        key = _digest(payload) if status.note is None else status.note.encode()
        if self._seen.get(name, (b"",))[0] != key:
            self._seen[name] = (key, time.monotonic())
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
        new subscription brings every retained one again, before the birth, and a lease
        is only watched while connected (nobody can renew one while the broker is away)."""
        self.nodes.clear()
        self._seen.clear()
        self._birth_n, self._settled = self._n, False
        if self._settling is not None:
            self._settling.cancel()
        self._settling = asyncio.get_running_loop().create_task(self._settle(self._n))

    async def _settle(self, n: int, only: set[str] | None = None) -> None:
        """Once status ``n`` is back, decide the claims (``only`` those PLCs: a contest
        while connected), withdraw the lost ones, watch the owners of refused PLCs."""
        if not await self._wait_echo(n, ECHO_TIMEOUT_S):
            log.warning("fleet: the birth did not come back in %g s; PLC claims are "
                        "settled on the next connection", ECHO_TIMEOUT_S)
            return
        if self._decide(only):
            await self.publish()   # the claim withdrawn
        self._settled = True
        await self.link.watching(nodes_filter(self.cfg.base_topic), False)
        await self._watch_owners()

    def _decide(self, only: set[str] | None) -> bool:
        """Refuse each claimed PLC (of ``only``) that another live claim holds; drive the
        rest. True when a claim was lost."""
        lost: dict[str, str] = {}
        for plc in self.claims:
            owner = self.owner(plc) if only is None or plc in only else None
            if owner is not None:
                lost[plc] = owner
        for plc, owner in lost.items():
            self.refused[plc] = owner
            was = plc in self.driving
            if was:
                self.given_up.add(plc)
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
        return bool(lost)

    def owner(self, plc: str) -> str | None:
        """Another online node whose claim of ``plc`` holds (first by name when several
        do)."""
        return next((s.client_id for _, s in sorted(self.nodes.items())
                     if s.client_id != self.cfg.client_id and s.online and plc in s.plcs
                     and self.alive(s)), None)

    def lease_for(self, s: NodeStatus) -> float:
        """The lease this node grants ``s``'s claim: ours, or the node's own if longer (up
        to ``LEASE_TRUST`` times ours: a forged lease cannot be endless)."""
        return max(self.lease_s, min(s.lease_s or 0.0, LEASE_TRUST * self.lease_s))

    def alive(self, s: NodeStatus) -> bool:
        """Whether ``s``'s claim holds. It does unless this node, connected, saw it
        unchanged for a whole lease and never saw its session renew it."""
        if s.session is not None and self._renewing.get(s.client_id) == s.session:
            return True
        seen = self._seen.get(s.client_id)
        return seen is None or time.monotonic() - seen[1] < self.lease_for(s)

    async def _watch_owners(self) -> None:
        """Read the statuses of the nodes that keep this node off a PLC (anew on every
        connection), and no others."""
        base = self.cfg.base_topic
        want = {f"{base}/fleet/{owner}" for plc, owner in self.refused.items()
                if plc not in self.given_up}
        for topic in sorted(want):
            await self.link.watching(topic, True)
        for topic in sorted(self._watching - want):
            await self.link.watching(topic, False)
        self._watching = want

    def _claim_ended(self, plc: str, owner: str) -> str | None:
        """Why the claim of ``owner`` that keeps this node off ``plc`` has ended, or None
        while it holds. An owner gone offline is the broker's word, not its own: it may be
        cut off and still driving, so its PLC stays refused until this node restarts."""
        s = self.nodes.get(owner)
        if s is None or not s.online:
            return None
        if plc not in s.plcs:
            return f"{owner} withdrew its claim (its status no longer lists {plc})"
        if not self.alive(s):
            return (f"the claim of {owner} stayed unchanged for its lease "
                    f"({self.lease_for(s):g} s) and was never renewed: no live node holds "
                    "it (a forged or orphaned status)")
        return None

    def _retry_refused(self) -> None:
        """Contend again for each refused PLC whose claim ended (not while settling,
        leaving, or for PLCs given up)."""
        busy = self._settling is not None and not self._settling.done()
        if busy or self.leaving or not self._settled or not self.link.connected:
            return
        ended: set[str] = set()
        for plc, owner in sorted(self.refused.items()):
            why = None if plc in self.given_up else self._claim_ended(plc, owner)
            if why is not None:
                ended.add(plc)
                log.info("plc claim ended", extra={"rung_fields": {
                    "plc": plc, "owner": owner, "group": self.group, "why": why}})
        if ended:
            for plc in ended:
                del self.refused[plc]
            self._settling = asyncio.get_running_loop().create_task(self._contend(ended))

    async def _contend(self, plcs: set[str]) -> None:
        """Claim ``plcs`` as at start: read every status, publish the claim, decide once
        it comes back. Should the broker go away, the next connection settles them."""
        if not await self.link.watching(nodes_filter(self.cfg.base_topic), True):
            return
        n = await self.publish()
        if n is not None:
            await self._settle(n, only=plcs)

    # -- a status this node did not publish ----------------------------------------------

    def _overwritten(self, payload: bytes) -> None:
        """Some client published on this node's status topic: stop driving every PLC at
        once (another node may have taken the forged status for the end of the claim),
        then republish the real status."""
        status = parse_status(self.link.status_topic, payload, self.max_status_bytes)
        what = ("cleared it" if status is None else status.note or (
            f"an online status of session {status.session}" if status.online
            else "an offline status"))
        stopped = sorted(self.driving)
        log.error("fleet status overwritten", extra={"rung_fields": {
            "topic": self.link.status_topic, "group": self.group, "by": what,
            "stopped": stopped,
            "why": f"a client that is not this process published on its status topic "
                   f"({what}): this node stops driving its PLCs and republishes its "
                   "status; keep other clients off {base}/fleet/ (broker ACL, "
                   "docs/mqtt.md)"}})
        for plc in stopped:
            self.refused[plc] = OVERWRITTEN
            self.given_up.add(plc)
            log.error("plc lost", extra={"rung_fields": {
                "plc": plc, "owner": OVERWRITTEN, "group": self.group,
                "why": f"this node's claim of {plc} was overwritten: it stops driving it at "
                       "once (a node that believed the claim ended may take it); it drives "
                       f"{plc} again after a restart"}})
        if stopped:
            self.driving.clear()
            self.on_claims(set(), dict(self.refused))
        if self._restoring is None or self._restoring.done():
            self._restoring = asyncio.get_running_loop().create_task(self._restore())

    async def _restore(self) -> None:
        """Republish the status (at most once per ``RESTORE_MIN_S``); once it is back,
        contend again for refused PLCs whose claim ended."""
        wait = self._restored_at + RESTORE_MIN_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._restored_at = time.monotonic()
        n = await self.publish()
        if n is not None and await self._wait_echo(n, ECHO_TIMEOUT_S):
            log.info("fleet status restored", extra={"rung_fields": {
                "topic": self.link.status_topic, "n": n}})
            self._retry_refused()

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
