"""``rung serve`` as a node of a fleet (``mqtt.shared_group``): the fleet's part of the
daemon, kept out of ``serve.Service``.

:class:`FleetNode` owns this node's :class:`~rung.daemon.mqtt.fleet.Fleet` (the status, the
PLC claims, leaving, handing requests over, ``fleet.py``) and what the daemon does with it:

- the status is the request link's birth (and is republished by the fleet's part);
- after every connection the claims are settled again (``Fleet.connected``);
- the PLC agents run only for the PLCs this node won, each under the supervisor, and stop
  when another node takes one (``_claims``);
- on a clean stop the scheduler stops taking requests first, the node leaves its group when
  others stay, and what it recorded and did not answer is handed over to them (``stop``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rung.daemon.config import Config
from rung.daemon.journal.store import Journal
from rung.daemon.mqtt.fleet import Fleet
from rung.daemon.mqtt.intake import MqttIntake
from rung.daemon.mqtt.link import MQTTLink
from rung.daemon.scheduler import Scheduler
from rung.daemon.supervise import Supervisor, spawn


class _Plc(Protocol):
    @property
    def id(self) -> str: ...


class _LinkState(Protocol):
    def silence(self) -> None: ...


class Agent(Protocol):
    """What the fleet needs of a PLC agent (``plc.handshake.HandshakeAgent``)."""

    @property
    def plc(self) -> _Plc: ...
    @property
    def link_state(self) -> _LinkState: ...
    async def run(self) -> None: ...
    async def stop(self) -> None: ...


class FleetNode:
    """This node's part in its fleet, wired into the daemon's parts.

    Args:
        cfg: the daemon's config (``mqtt`` for the fleet, ``queue`` and ``engine`` for the
            queue state in the status, ``queue.request_timeout_s`` for the hand-over).
        link: the request link: the node's status becomes its birth.
        birth: the node's own fields (engine, tasks, ...), in every status.
        scheduler: its queue state goes into the status; stopped first on a clean stop.
        intake: holds what arrives once the node leaves; answers ``expired`` the requests
            too old to hand over.
        journal: the requests recorded and not answered, handed over on leaving.
        agents: the PLC agents of the config; started for the PLCs won.
        supervisor: runs the fleet's part and the agents it starts.
    """

    def __init__(self, cfg: Config, link: MQTTLink,
                 birth: Callable[[], dict[str, Any]], scheduler: Scheduler,
                 intake: MqttIntake, journal: Journal, agents: Sequence[Agent],
                 supervisor: Supervisor) -> None:
        self.cfg, self.link, self.scheduler = cfg, link, scheduler
        self.intake, self.journal, self.supervisor = intake, journal, supervisor
        self.agents = list(agents)
        self.fleet = Fleet(cfg.mqtt, link, birth, self.queue_state,
                           [a.plc.id for a in self.agents], self._claims)
        link.birth = self.fleet.doc   # the status replaces the plain birth
        link.on_connected(self.fleet.connected)   # PLC claims settled once the birth is back
        self._agent_tasks: dict[str, asyncio.Task[Any]] = {}   # the PLCs this node won
        self._spawned: set[asyncio.Task[Any]] = set()

    def queue_state(self) -> dict[str, int]:
        """The queue, as the status says it."""
        return {"depth": self.scheduler.depth, "inflight": self.scheduler.inflight,
                "max_pending": self.cfg.queue.max_pending,
                "max_batch": self.cfg.engine.max_batch}

    def start(self) -> None:
        """Run the fleet's part (status renewals, claims contended again); the agents
        start as their PLCs are won."""
        self.supervisor.start("fleet", self.fleet.run)

    def _claims(self, drive: set[str], refused: dict[str, str]) -> None:
        """Drive the PLCs this node claimed; stop driving one another node took meanwhile
        (refused PLCs never start). A refused PLC's link state is the other node's to say."""
        for agent in self.agents:
            plc = agent.plc.id
            if plc in drive and plc not in self._agent_tasks:
                self._agent_tasks[plc] = self.supervisor.start(f"plc-{plc}", agent.run)
            elif plc in refused:
                agent.link_state.silence()
                if plc in self._agent_tasks:
                    stop = agent.stop()
                    spawn(stop, getattr(stop, "__qualname__", "task"), self._spawned)

    async def stop(self, grace_s: float) -> int:
        """A clean stop (the PLC agents stopped already): start nothing new, finish the
        batch in progress, meanwhile leave the group when other nodes stay, and hand them
        what this node recorded and did not answer. Returns the requests left for the
        restart."""
        # the scheduler stops first: what the node holds goes to the nodes staying, or
        # waits for its restart
        stopped = asyncio.get_running_loop().create_task(self.scheduler.stop(grace_s))
        # from here on what still arrives stays pending: handed over, or run after the
        # restart
        self.intake.holding = True
        left_group = await self.fleet.leave()
        self.link.accepting = False
        left = await stopped
        if left_group:
            left = max(0, left - await self.fleet.hand_over(
                self.journal, self.cfg.queue.request_timeout_s, self.intake.expire))
        return left

    def close(self) -> None:
        """Claims still settling are cancelled (after the stop)."""
        self.fleet.close()
