"""``rung serve``: config -> engine -> journal -> scheduler + MQTT link, under systemd.

Start-up: load and check everything (config, tasks, engine, grammars, journal), warm the
task prompt prefixes, re-queue requests the journal holds from before a restart, connect,
and only then tell systemd ``READY=1``. The watchdog pings from the event loop after
checking the scheduler. ``SIGTERM``/``SIGINT``: stop taking messages (unacknowledged ones
come back from the broker after the restart), finish the batch in progress (queued
requests stay pending in the journal), publish every recorded answer, say offline, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from rung.daemon.config import Config, ConfigError
from rung.daemon.journal.store import Journal, JournalError
from rung.daemon.metrics import Metrics
from rung.daemon.modbus.agent import PlcAgent
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import PlcMap
from rung.daemon.mqtt.fleet_node import FleetNode
from rung.daemon.mqtt.intake import MqttIntake
from rung.daemon.mqtt.link import MQTTLink
from rung.daemon.mqtt.outbox import Outbox
from rung.daemon.plc.handshake import HandshakeAgent
from rung.daemon.plcmaps import load_plc_map
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.sdnotify import Notifier, watchdog_interval, watchdog_loop
from rung.daemon.supervise import Fatal, Supervisor
from rung.daemon.tasks.runner import RetryPolicy, TaskRunner, fast_decoding
from rung.daemon.wallclock import iso
from rung.engines.errors import RungError

if TYPE_CHECKING:
    from rung.daemon.opcua.nodemap import NodeMap
    from rung.daemon.opcua.server import RungServer
    from rung.daemon.sparkplug.link import SparkplugLink

log = logging.getLogger("rung.serve")
VERSION = "0.1.0"
# a stop after the grace: answers drained (5 s), offline said (5 s), Sparkplug's NDEATH
# (5 s); systemd/rung.service's TimeoutStopSec covers queue.stop_grace_s plus this
STOP_TAIL_S = 15.0
STORAGE_CHECK_S = 1.0   # how often the storage check stats the journal's files


def build_runner(cfg: Config) -> TaskRunner:
    """Engine, tokenizer, tasks (grammars compiled) and the prefix cache of a config."""
    from rung.daemon.tasks.task import load_tasks
    from rung.engines import engine_options, load_engine
    from rung.engines.kv_store import ColdStore
    from rung.engines.prefix_cache import PrefixCache
    from rung.engines.tokenizer import Tokenizer

    e = cfg.engine
    engine = load_engine(e.path, e.backend, engine_options(e.backend, e.provider, e.threads,
                                                           e.prepack, e.max_batch, e.decode,
                                                           e.load_parts, e.memory_budget_mb))
    m = engine.manifest
    tok = Tokenizer.load(cfg.engine.path, m.tokenizer)
    store = ColdStore(m.engine_id, int(cfg.kv.ram_mb * 2**20),
                      state_dir=cfg.state_dir if cfg.kv.disk_mb > 0 else None,
                      disk_budget_bytes=int(cfg.kv.disk_mb * 2**20))
    return TaskRunner(engine, tok, load_tasks(cfg.tasks_dir), cfg.engine.path,
                      prefix=PrefixCache(store, m.engine_id),
                      fast=fast_decoding(cfg.engine.decode, engine))


def load_plcs(cfg: Config) -> list[PlcMap | NodeMap]:
    """The register and node maps of ``plcs``; every PLC's id its own."""
    plcs = [load_plc_map(path) for path in cfg.plcs]
    ids = [p.id for p in plcs]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise ConfigError(f"plcs: two register maps use the id {dup!r}",
                          "give every PLC its own id (it names its MQTT topics)")
    return plcs


def plc_agent(cfg: Config, plc: PlcMap | NodeMap, scheduler: Scheduler, outbox: Outbox,
              metrics: Metrics, plant: SparkplugLink | None) -> HandshakeAgent:
    """The handshake agent of one PLC, over Modbus or OPC UA: its requests through the
    scheduler, its events and link states out through the outbox (and to Sparkplug)."""
    m = cfg.modbus
    if not isinstance(plc, PlcMap):   # an OPC UA node map (asyncua imported only then)
        from rung.daemon.opcua.agent import OpcUaAgent
        from rung.daemon.opcua.link import NodeLink

        return OpcUaAgent(plc, NodeLink(plc), scheduler.submit, outbox.publish_json,
                          cfg.mqtt.base_topic, m.job_timeout_s, m.reconnect_min_s,
                          m.reconnect_max_s, metrics=metrics, state_dir=cfg.state_dir / "plc",
                          plant=plant)
    return PlcAgent(plc, Link(plc), scheduler.submit, outbox.publish_json,
                    cfg.mqtt.base_topic, m.job_timeout_s, m.reconnect_min_s,
                    m.reconnect_max_s, metrics=metrics, state_dir=cfg.state_dir / "plc",
                    plant=plant)


def sparkplug_link(cfg: Config, runner: TaskRunner,
                   plcs: list[PlcMap | NodeMap]) -> SparkplugLink:
    """The Sparkplug B edge node: each PLC a device (its own MQTT client)."""
    from rung.daemon.sparkplug.link import SparkplugLink
    from rung.daemon.sparkplug.metrics import Device
    from rung.daemon.sparkplug.node import EdgeNode

    s, m = cfg.sparkplug, runner.engine.manifest
    node = EdgeNode(s.group_id or "", s.edge_node_id or cfg.mqtt.client_id,
                    [Device.from_map(plc) for plc in plcs],
                    node_info={"Version": VERSION, "Engine": m.engine_id},
                    primary_host_id=s.primary_host_id,
                    bd_seq_path=cfg.state_dir / "sparkplug-bdseq")
    return SparkplugLink(node, cfg.mqtt, s.client_id or f"{cfg.mqtt.client_id}-spb")


class Service:
    """The running daemon: builds the parts (journal, scheduler, MQTT link, outbox and
    intake, PLC agents, Sparkplug, a fleet node's part), starts and stops them in order, and
    tells systemd how they are. Requests and answers flow between the parts, not through
    here; a fleet's coordination is ``mqtt.fleet_node.FleetNode``'s."""

    def __init__(self, cfg: Config, runner: TaskRunner, metrics: Metrics | None = None,
                 notifier: Notifier | None = None) -> None:
        self.cfg, self.runner = cfg, runner
        self.metrics = metrics or Metrics()
        self.notifier = notifier or Notifier()
        self.started = time.time()
        self._stopping = asyncio.Event()
        self.supervisor = Supervisor(self._part_dead, metrics=self.metrics)
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(cfg.state_dir / "journal.db", cfg.journal.retention_s)
        if self.journal.wal_damage is not None:
            self.metrics.journal_wal_damaged.set(1)
        r = cfg.retries
        unknown = sorted(set(r.per_task) - set(runner.tasks))
        if unknown:
            raise ConfigError(f"retries.per_task.{unknown[0]}: no task named {unknown[0]!r}",
                              f"tasks: {', '.join(sorted(runner.tasks))}")
        # the parts in the order they depend on each other: each is handed parts built
        # before it, never one built later
        self.scheduler = Scheduler(runner, self._observe, cfg.queue.max_pending,
                                   cfg.engine.max_batch,
                                   stuck_after_s=max(120.0, 2 * cfg.queue.request_timeout_s),
                                   retry=RetryPolicy(r.attempts, r.budget_s, r.temperature,
                                                     dict(r.per_task), mode=r.mode))
        self.link = MQTTLink(cfg.mqtt, None, self._birth, metrics=self.metrics)
        self.outbox = Outbox(self.journal, self.link, self.metrics)
        self.link.on_connected(self.outbox.connected)   # answers left over, held events
        self.intake = MqttIntake(cfg, runner.tasks, self.journal, self.scheduler, self.outbox,
                                 self.metrics)
        self.link.on_message = self.intake.on_message   # the link's request messages
        plcs = load_plcs(cfg)
        self.sparkplug = (sparkplug_link(cfg, runner, plcs) if cfg.sparkplug.enabled
                          else None)
        self.agents = [plc_agent(cfg, plc, self.scheduler, self.outbox, self.metrics,
                                 self.sparkplug) for plc in plcs]
        self.fleet_node = (FleetNode(cfg, self.link, self._birth, self.scheduler, self.intake,
                                     self.journal, self.agents, self.supervisor)
                           if cfg.mqtt.shared_group else None)
        self.fleet = None if self.fleet_node is None else self.fleet_node.fleet
        for agent in self.agents:   # PLC link states said again on every connection
            self.link.on_connected(agent.link_state.republish)
        self.opcua_server = self._opcua_server() if cfg.opcua_server.enabled else None
        for part in (self.fleet, self.sparkplug):
            if part is not None:
                part.oversize.observe = self.metrics.payload_refused
        self._link_task: asyncio.Task[Any] | None = None
        self._sparkplug_task: asyncio.Task[Any] | None = None
        self.exit_code = 0
        m = runner.engine.manifest
        packing = getattr(runner.engine, "packing", None)   # the ONNX engine's choice
        self.metrics.set_info(version=VERSION, engine=m.engine_id, kv_dtype=m.kv.dtype,
                              weights_packed="-" if packing is None
                              else str(packing.packed).lower())

    def _opcua_server(self) -> RungServer:
        """rung as an OPC UA server: its methods answered through the scheduler."""
        from rung.daemon.opcua.server import RungServer

        def status() -> dict[str, Any]:
            return {"ready": self.liveness() is None and not self._stopping.is_set(),
                    "queue_depth": self.scheduler.depth, "inflight": self.scheduler.inflight,
                    "engine": self.runner.engine.manifest.engine_id,
                    "tasks": sorted(self.runner.tasks)}

        c = self.cfg
        return RungServer(c.opcua_server, self.runner.tasks, self.scheduler.submit, status,
                          c.mqtt.client_id, c.queue.request_timeout_s,
                          self.journal, c.journal.max_attempts, metrics=self.metrics,
                          st_edition=c.st.edition)

    def _observe(self, a: Answer) -> None:
        """Every answer the scheduler gives (MQTT and PLC requests alike), in the metrics."""
        req, u = a.request, a.usage
        ttft = u.get("ttft_ms")
        if a.usage:
            self.metrics.observe_attempts(req.task, a.attempts, a.failed_checks)
        self.metrics.observe_request(
            req.task, "ok" if a.ok else (a.code or "internal"),
            total_s=time.time() - req.received,
            ttft_s=ttft / 1000 if isinstance(ttft, int | float) else None,
            decode_tok_s=u.get("decode_tok_s") or None,
            prompt_tokens=u.get("prompt_tokens") or 0,
            completion_tokens=u.get("completion_tokens") or 0,
            cached_tokens=u.get("cached_tokens") or 0, ffn_skip_ratio=u.get("ffn_skip_ratio"))
        self.metrics.set_queue(self.scheduler.depth, self.scheduler.inflight)
        if self.runner.prefix is not None:
            self.metrics.set_kv(self.runner.prefix.store.stats())

    # -- lifecycle -----------------------------------------------------------------------

    def _birth(self) -> dict[str, Any]:
        """The retained status of every connection (a fleet node's status carries it)."""
        m = self.runner.engine.manifest
        return {"online": True, "client_id": self.cfg.mqtt.client_id, "version": VERSION,
                "engine": m.engine_id, "model": m.dims.hf_architecture,
                "tasks": sorted(self.runner.tasks), "since": iso(self.started),
                "request_topic": f"{self.cfg.mqtt.base_topic}/req/{{task}}"}

    def liveness(self) -> str | None:
        """None while healthy: the engine loop steps and every part runs (the watchdog's
        check)."""
        return self.supervisor.liveness() or self.scheduler.liveness()

    def status_line(self) -> str:
        return (f"serving {len(self.runner.tasks)} tasks; queue {self.scheduler.depth}/"
                f"{self.cfg.queue.max_pending}, in flight {self.scheduler.inflight}; broker "
                f"{'connected' if self.link.connected else 'disconnected'}")

    async def run(self) -> int:
        """Warm, recover, start the parts, READY once connected; on SIGTERM stop in order."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        if self.cfg.metrics.port:   # first: a port in use stops rung before anything runs
            try:
                self.metrics.serve(self.cfg.metrics.port, self.cfg.metrics.host)
            except RungError as e:
                log.critical("%s", e.message, extra={"rung_fields": {"part": "metrics"}})
                self.metrics.set_down()
                self.journal.close()
                return 70
        self.notifier.status("warming task prompts")
        pinned = await loop.run_in_executor(None, self.runner.warm)
        log.info("task prompts pinned in the KV cache", extra={"rung_fields": pinned})
        self.journal.prune()
        self.intake.recover()
        if self.opcua_server is not None:   # its calls recorded before the restart
            self.opcua_server.recover()
        elif self.journal.pending(opcua=True):
            log.warning("the journal holds OPC UA calls not answered: they run once "
                        "opcua_server is enabled again")
        self._start()
        self.notifier.status("connecting to the broker")
        while not self.link.connected and not self._stopping.is_set():
            await asyncio.sleep(0.05)
        if self.link.connected:
            self.notifier.ready(self.status_line())
            log.info("ready", extra={"rung_fields": {"status": self.status_line()}})
        interval = watchdog_interval()
        if interval:
            self.supervisor.start("watchdog", lambda: watchdog_loop(self.notifier, interval,
                                                                    self.liveness))
        self.supervisor.start("status", self._status_loop)
        await self._stopping.wait()
        await self.supervisor.stop(["status"])   # the stopping status must stay visible
        await self.shutdown(self.cfg.queue.stop_grace_s)
        await self._end()
        return self.exit_code

    def _start(self) -> None:
        """Start the parts, each under the supervisor: the MQTT link, the engine loop, the
        outbox, the PLC agents (a fleet node: its fleet part, which starts those it claims),
        Sparkplug, the metrics endpoint, the storage check."""
        sup = self.supervisor
        self._link_task = sup.start("mqtt", self.link.run)
        sup.watch("scheduler", self.scheduler.start())
        sup.start("outbox", self.outbox.run)
        if self.fleet_node is None:
            for a in self.agents:
                sup.start(f"plc-{a.plc.id}", a.run)
        else:
            self.fleet_node.start()
        if self.sparkplug is not None:
            self._sparkplug_task = sup.start("sparkplug", self.sparkplug.run)
        if self.opcua_server is not None:
            sup.start("opcua-server", self.opcua_server.run)
        if self.cfg.metrics.port:   # serving since ``run`` began
            sup.start("metrics", lambda: self.metrics.keep_serving(self.cfg.metrics.port,
                                                                   self.cfg.metrics.host))
        sup.start("storage", self._storage_check)
        self.outbox.wake()

    async def _end(self) -> None:
        """After ``shutdown``: Sparkplug's NDEATH, then every part's task ended."""
        spb = self._sparkplug_task
        if spb is not None:
            try:   # the node publishes its NDEATH and disconnects
                await asyncio.wait_for(asyncio.shield(spb), 5)
            except TimeoutError:
                log.warning("Sparkplug link did not close in 5 s")
        if self.fleet_node is not None:
            self.fleet_node.close()
        await self.supervisor.stop()

    async def _storage_check(self) -> None:
        """The journal's files stay those it opened (``Journal.check_files``, every
        ``STORAGE_CHECK_S``): one deleted or replaced under the daemon (its writes go on into
        an unlinked file, lost at the next restart) ends this part ``Fatal``: one critical
        line, ``rung_storage_ok`` 0 and exit 70. Meanwhile the journal refuses every write
        itself (requests are answered ``unavailable``)."""
        while True:
            why = await asyncio.to_thread(self.journal.check_files)
            if why is not None:
                self.metrics.set_storage(False)
                raise Fatal(why)
            await asyncio.sleep(STORAGE_CHECK_S)

    def _part_dead(self, name: str, why: str) -> None:
        """A part stopped for good (the engine loop ended, or a part kept failing): never
        silent. ``rung_up`` drops, the watchdog stops (liveness fails) and the daemon exits
        70 for systemd to restart it; the requests it held stay pending in the journal (a
        poison one is quarantined after ``journal.max_attempts``). The supervisor's
        critical line says which part and why; this one only that rung exits."""
        if self._stopping.is_set():
            return
        log.error("%s has stopped: exiting 70 for a restart", name,
                  extra={"rung_fields": {"part": name, "why": why}})
        self.metrics.set_down()
        self.exit_code = 70
        self._stopping.set()

    async def _status_loop(self) -> None:
        """STATUS= every 5 s (READY=1 again after a broker outage); the journal pruned
        hourly, so months of answered ids do not pile up."""
        was_connected = self.link.connected
        pruned = time.monotonic()
        while True:
            await asyncio.sleep(5)
            if time.monotonic() - pruned > 3600:
                pruned = time.monotonic()
                try:
                    self.journal.prune()
                except JournalError as e:
                    log.error("%s", e)
            if self.link.connected and not was_connected:
                self.notifier.ready(self.status_line())   # READY again after an outage
            was_connected = self.link.connected
            self.notifier.status(self.status_line())

    async def shutdown(self, grace_s: float = 40.0) -> None:
        """Stop intake, finish the batch in progress, publish answers, say offline."""
        self.notifier.stopping("stopping: finishing the request in progress")
        log.info("stopping", extra={"rung_fields": {"grace_s": grace_s}})
        self.supervisor.stopping = True   # parts end now: a failure is not restarted
        for agent in self.agents:   # a trigger in progress stays raised in the PLC
            await agent.stop()
        if self.fleet_node is not None:   # leaves its group, hands requests over
            left = await self.fleet_node.stop(grace_s)
        else:
            self.link.accepting = False
            left = await self.scheduler.stop(grace_s)
        if self.link.connected and not await self.outbox.drain(5):
            log.warning("answers still unpublished at shutdown: sent after the restart")
        if self.sparkplug is not None:   # NDEATH, then DISCONNECT
            self.sparkplug.stop()
        self.link.stop()
        if self._link_task is not None:
            try:   # the link says offline and disconnects
                await asyncio.wait_for(asyncio.shield(self._link_task), 5)
            except TimeoutError:
                log.warning("broker link did not close in 5 s")
        self.journal.close()
        self.metrics.close()
        log.info("stopped", extra={"rung_fields": {"queued_for_restart": left}})




def serve(cfg: Config) -> int:
    """Run the daemon until SIGTERM; 0 on a clean stop."""
    from rung.daemon.logs import setup_logging

    setup_logging(cfg.log.level)
    notifier = Notifier()
    notifier.status("loading engine")
    t0 = time.perf_counter()
    runner = build_runner(cfg)
    packing = getattr(runner.engine, "packing", None)   # the ONNX engine's choice
    log.info("engine loaded", extra={"rung_fields": {
        "engine": str(cfg.engine.path), "ms": round((time.perf_counter() - t0) * 1000),
        "tasks": sorted(runner.tasks),
        "weights_packed": None if packing is None else packing.packed,
        "packing": None if packing is None else packing.reason}})

    async def main() -> int:
        service = Service(cfg, runner, notifier=notifier)
        try:
            return await service.run()
        finally:
            await asyncio.sleep(0)

    return asyncio.run(main())

