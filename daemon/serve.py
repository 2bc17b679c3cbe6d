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
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rung.daemon.config import Config, ConfigError
from rung.daemon.metrics import Metrics
from rung.daemon.modbus.agent import PlcAgent
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import load_map
from rung.daemon.mqtt import requests as rq
from rung.daemon.mqtt.fleet import Fleet
from rung.daemon.mqtt.journal import Entry, Incoming, Journal, JournalError
from rung.daemon.mqtt.link import MQTTLink
from rung.daemon.mqtt.outbox import Outbox
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.sdnotify import Notifier, watchdog_interval, watchdog_loop
from rung.daemon.tasks.runner import RetryPolicy, TaskRunner, fast_decoding
from rung.engines.errors import RungError

if TYPE_CHECKING:
    from rung.daemon.plant.sparkplug_link import SparkplugLink

log = logging.getLogger("rung.serve")
VERSION = "0.1.0"
USAGE_CORE = ("prompt_tokens", "completion_tokens", "cached_tokens", "ttft_ms")
# fast decoding: decode steps, draft tokens offered, of them grammar-forced, confirmed
USAGE_KEYS = (*USAGE_CORE, "steps", "drafted_tokens", "forced_tokens", "accepted_tokens")


def build_runner(cfg: Config) -> TaskRunner:
    """Engine, tokenizer, tasks (grammars compiled) and the prefix cache of a config."""
    from rung.daemon.tasks.task import load_tasks
    from rung.engines import engine_options, load_engine
    from rung.engines.kv_store import ColdStore
    from rung.engines.prefix_cache import PrefixCache
    from rung.engines.tokenizer import Tokenizer

    e = cfg.engine
    engine = load_engine(e.path, e.backend, engine_options(e.backend, e.provider, e.threads,
                                                           e.prepack, e.max_batch))
    m = engine.manifest
    tok = Tokenizer.load(cfg.engine.path, m.tokenizer)
    store = ColdStore(m.engine_id, int(cfg.kv.ram_mb * 2**20),
                      state_dir=cfg.state_dir if cfg.kv.disk_mb > 0 else None,
                      disk_budget_bytes=int(cfg.kv.disk_mb * 2**20))
    return TaskRunner(engine, tok, load_tasks(cfg.tasks_dir), cfg.engine.path,
                      prefix=PrefixCache(store, m.engine_id),
                      fast=fast_decoding(cfg.engine.decode, engine))


class Service:
    """The running daemon: owns the journal, the scheduler and the MQTT link."""

    def __init__(self, cfg: Config, runner: TaskRunner, metrics: Metrics | None = None,
                 notifier: Notifier | None = None) -> None:
        self.cfg, self.runner = cfg, runner
        self.metrics = metrics or Metrics()
        self.notifier = notifier or Notifier()
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(cfg.state_dir / "journal.db", cfg.journal.retention_s)
        if self.journal.wal_damage is not None:
            self.metrics.journal_wal_damaged.set(1)
        r = cfg.retries
        unknown = sorted(set(r.per_task) - set(runner.tasks))
        if unknown:
            raise ConfigError(f"retries.per_task.{unknown[0]}: no task named {unknown[0]!r}",
                              f"tasks: {', '.join(sorted(runner.tasks))}")
        self.scheduler = Scheduler(runner, self._observe, cfg.queue.max_pending,
                                   cfg.engine.max_batch,
                                   stuck_after_s=max(120.0, 2 * cfg.queue.request_timeout_s),
                                   on_start=self._started,
                                   retry=RetryPolicy(r.attempts, r.budget_s, r.temperature,
                                                     dict(r.per_task)))
        self.link = MQTTLink(cfg.mqtt, self._on_message, self._status, self._on_connect,
                             self.metrics)
        self.outbox = Outbox(self.journal, self.link, self.metrics)
        self._links: dict[str, dict[str, Any]] = {}   # PLC link states, retained on MQTT
        self._plc_up: dict[str, bool] = {}
        self._spawned: set[asyncio.Task[Any]] = set()
        self.agents = [self._agent(path) for path in cfg.plcs]
        self.sparkplug = self._sparkplug() if cfg.sparkplug.enabled else None
        ids = [a.plc.id for a in self.agents]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup is not None:
            raise ConfigError(f"plcs: two register maps use the id {dup!r}",
                              "give every PLC its own id (it names its MQTT topics)")
        self._agent_tasks: dict[str, asyncio.Task[None]] = {}   # PLCs a fleet node won
        self.fleet = self._fleet() if cfg.mqtt.shared_group else None
        self.started = time.time()
        self._stopping = asyncio.Event()
        self._link_task: asyncio.Task[None] | None = None
        self.exit_code = 0
        m = runner.engine.manifest
        self.metrics.set_info(version=VERSION, engine=m.engine_id, kv_dtype=m.kv.dtype)

    # -- PLCs ----------------------------------------------------------------------------

    def _agent(self, path: Path) -> PlcAgent:
        plc = load_map(path)
        link = Link(plc, on_state=lambda state, detail: self._link_state(plc.id, state, detail))
        m = self.cfg.modbus

        async def publish(topic: str, doc: dict[str, Any], retain: bool) -> bool:
            if self.sparkplug is not None and topic.endswith("/event"):
                self.sparkplug.diagnosis(plc.id, doc)
            return await self.outbox.publish_json(topic, doc, retain)

        return PlcAgent(plc, link, self.scheduler.submit, publish,
                        self.cfg.mqtt.base_topic, m.job_timeout_s, m.reconnect_min_s,
                        m.reconnect_max_s, metrics=self.metrics,
                        state_dir=self.cfg.state_dir / "plc")

    def _sparkplug(self) -> SparkplugLink:
        """The Sparkplug B edge node: each PLC a device (its own MQTT client)."""
        from rung.daemon.plant.sparkplug import EdgeNode
        from rung.daemon.plant.sparkplug_link import SparkplugLink
        from rung.daemon.plant.sparkplug_metrics import Device

        s, m = self.cfg.sparkplug, self.runner.engine.manifest
        node = EdgeNode(s.group_id or "", s.edge_node_id or self.cfg.mqtt.client_id,
                        [Device.from_map(a.plc) for a in self.agents],
                        node_info={"Version": VERSION, "Engine": m.engine_id},
                        primary_host_id=s.primary_host_id,
                        bd_seq_path=self.cfg.state_dir / "sparkplug-bdseq")
        return SparkplugLink(node, self.cfg.mqtt,
                             s.client_id or f"{self.cfg.mqtt.client_id}-spb")

    def _link_state(self, plc_id: str, state: str, detail: str | None) -> None:
        if self.fleet is not None and plc_id in self.fleet.refused:
            return   # another node drives it now: its link state is that node's to say
        up = state in ("connected", "degraded")   # the PLC answers
        if self.sparkplug is not None and self._plc_up.get(plc_id) != up:
            self.sparkplug.plc_link(plc_id, up=up)   # DBIRTH / DDEATH on a change only
        self._plc_up[plc_id] = up
        doc = {"plc": plc_id, "state": state, "detail": detail, "since": _iso(time.time())}
        self._links[plc_id] = doc
        log.info("plc link", extra={"rung_fields": doc})
        self._spawn(self.outbox.publish_json(f"{self.cfg.mqtt.base_topic}/plc/{plc_id}/link", doc,
                                       True))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def _on_connect(self) -> None:
        """After every (re)connection: answers left over, held PLC events, link states."""
        self.outbox.wake()
        if self.fleet is not None:
            self.fleet.connected()   # PLC claims settled once the birth comes back
        self._spawn(self.outbox.flush_held())
        for plc_id, doc in self._links.items():
            self._spawn(self.outbox.publish_json(f"{self.cfg.mqtt.base_topic}/plc/{plc_id}/link",
                                           doc, True))

    # -- intake --------------------------------------------------------------------------

    def _on_message(self, msg: Incoming) -> bool:
        """Record, then route; True once the message is durable (the link acknowledges)."""
        if msg.retained:
            # a retained request replayed at subscribe time (MQTT 3.1.1; v5 subscribes with
            # Retain Handling 2 and never gets these): it was answered when it was
            # published, and would otherwise run again after every reconnect
            log.warning("retained request on %s ignored: publish requests with retain off",
                        msg.topic)
            self.metrics.observe_request(None, "retained_replay")
            return True
        limit = self.cfg.mqtt.max_payload_bytes
        msg = replace(msg, claimed_id=rq.claimed_id(msg.payload, limit))
        try:
            entry = self.journal.record(msg)
        except JournalError as e:
            self.metrics.set_storage(False)
            self._unrecorded(msg, e)
            return True
        self.metrics.set_storage(True)
        if entry is None:
            self.metrics.observe_request(None, "duplicate")
            return True
        try:
            self._route(entry)
        except Exception as e:   # a bug in routing answers this request, nothing else
            log.exception("request %d could not be routed", entry.seq)
            self.outbox.answer_error(entry.seq, rq.reply_address(entry, self.cfg.mqtt.base_topic,
                                                             self.cfg.mqtt.client_id, {}),
                                 None, "internal", f"{type(e).__name__}: {e}", entry.received)
        return True

    def _unrecorded(self, msg: Incoming, err: JournalError) -> None:
        """A request the journal cannot hold (a full or failing ``state_dir``): answered
        ``unavailable`` at once, straight from memory, and acknowledged, so the broker's
        window never fills with requests rung can neither run nor refuse; intake works
        again with the first write that succeeds."""
        entry = Entry(0, msg.topic, msg.payload, msg.response_topic, msg.correlation,
                      time.time(), None)
        reply = rq.reply_address(entry, self.cfg.mqtt.base_topic, self.cfg.mqtt.client_id,
                                 rq.peek(msg.payload, self.cfg.mqtt.max_payload_bytes))
        task = msg.topic.rpartition("/")[2] or None
        payload = rq.error_response(reply, task, "unavailable", f"request not accepted: "
                                    f"{err.message}; retry later")
        self.metrics.observe_request(None, "unavailable")
        self.outbox.direct(reply, payload)

    def _started(self, req: rq.Request) -> None:
        """Count the attempt before the model starts (a poison message is recognised)."""
        if req.reply is None or req.seq <= 0:
            return   # Modbus jobs live in the PLC's registers, not in the journal
        try:
            self.journal.started(req.seq)
        except JournalError:
            self.metrics.set_storage(False)

    def _route(self, entry: Entry, recovered: bool = False) -> None:
        req = rq.parse(entry, self.cfg.mqtt.base_topic, self.cfg.mqtt.client_id,
                       self.runner.tasks, self.cfg.mqtt.max_payload_bytes,
                       self.cfg.queue.request_timeout_s)
        if recovered and entry.attempts >= self.cfg.journal.max_attempts:
            self._quarantine(entry, req)
            return
        if isinstance(req, rq.Failure):
            self.outbox.answer_error(req.seq, req.reply, req.task, req.code, req.message,
                                 entry.received)
            self.metrics.observe_request(req.task if req.task in self.runner.tasks else None,
                                         req.code, total_s=time.time() - entry.received)
        elif self.fleet is not None and self.fleet.leaving:
            pass   # stays pending: handed over to the group, or run after the restart
        elif (future := self.scheduler.submit(req, recovered)) is not None:
            future.add_done_callback(lambda f: self._answer(f.result()))
        else:
            busy = Answer(req, False, "busy", f"queue full ({self.cfg.queue.max_pending} "
                          "pending); retry later")
            self._answer(busy)
            self._observe(busy)
        self.metrics.set_queue(self.scheduler.depth, self.scheduler.inflight)

    def _quarantine(self, entry: Entry, req: rq.Request | rq.Failure) -> None:
        """A request the daemon died on ``attempts`` times: answered, never run again."""
        why = (f"quarantined: the daemon stopped {entry.attempts} times while this request "
               f"was in flight (journal.max_attempts = {self.cfg.journal.max_attempts}); "
               "it is not run again")
        log.error("request %d %s", entry.seq, why)
        self.metrics.quarantined.inc()
        task = req.task if isinstance(req, rq.Request) else None
        reply = req.reply or rq.reply_address(entry, self.cfg.mqtt.base_topic,
                                              self.cfg.mqtt.client_id, {})
        self.outbox.answer_error(entry.seq, reply, task, "internal", why, entry.received,
                             note=why)
        self.metrics.observe_request(task, "internal", total_s=time.time() - entry.received)

    # -- answers -------------------------------------------------------------------------

    def _answer(self, a: Answer) -> None:
        """An MQTT request's answer: recorded, then published by the outbox."""
        req = a.request
        assert req.reply is not None   # every MQTT request has its reply address
        usage = {k: a.usage.get(k) for k in USAGE_KEYS if k in a.usage or k in USAGE_CORE}
        usage["total_ms"] = round((time.time() - req.received) * 1000, 1)
        if a.ok:
            payload = rq.ok_response(req.reply, req.task, a.output, a.validation, usage,
                                     {"attempts": a.attempts, **(self._formats(req, a.output)
                                                                 or {})})
            self.outbox.record(req.seq, req.reply, payload)
            log.info("answered", extra={"rung_fields": {
                "seq": req.seq, "task": req.task, "ok": True, "id": req.reply.id,
                "session": req.session, **usage}})
        else:
            # an answer that failed a semantic check comes with the output and the
            # validation, so the engineer sees why it is not trusted (ok stays false)
            extra: dict[str, Any] = ({"output": a.output, "validation": a.validation}
                                     if a.code == "invalid_output" else {})
            if a.usage:   # it reached the model (truncated, invalid_output, internal)
                extra["usage"] = usage
                extra["attempts"] = a.attempts
            self.outbox.answer_error(req.seq, req.reply, req.task, a.code or "internal",
                                 a.message, req.received, extra, req.session)

    def _formats(self, req: rq.Request, output: Any) -> dict[str, Any] | None:
        """The extra forms of an answer the request asked for (``output_formats``)."""
        if "plcopen_xml" not in req.output_formats:
            return None
        from rung.daemon.plant.plcopen import to_plcopen_xml

        try:
            xml = to_plcopen_xml(output, self.cfg.st.edition)
        except RungError as e:   # the answer stands; the extra form says why it is missing
            return {"output_formats": {"plcopen_xml": None, "error": e.message}}
        return {"output_formats": {"plcopen_xml": xml}}

    def _observe(self, a: Answer) -> None:
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

    # -- fleet (mqtt.shared_group: docs/mqtt.md, "Fleet") --------------------------------

    def _fleet(self) -> Fleet:
        return Fleet(self.cfg.mqtt, self.link, self._birth, self._queue_state,
                     [a.plc.id for a in self.agents], self._claims)

    def _status(self) -> dict[str, Any]:
        """The retained status of every connection: the birth, or a fleet node's status."""
        return self.fleet.doc() if self.fleet is not None else self._birth()

    def _queue_state(self) -> dict[str, int]:
        return {"depth": self.scheduler.depth, "inflight": self.scheduler.inflight,
                "max_pending": self.cfg.queue.max_pending,
                "max_batch": self.cfg.engine.max_batch}

    def _claims(self, drive: set[str], refused: dict[str, str]) -> None:
        """Drive the PLCs this node claimed; stop driving one another node took meanwhile
        (refused PLCs never start)."""
        for agent in self.agents:
            plc = agent.plc.id
            if plc in drive and plc not in self._agent_tasks:
                self._agent_tasks[plc] = asyncio.get_running_loop().create_task(
                    agent.run(), name=f"plc-{plc}")
            elif plc in refused and plc in self._agent_tasks:
                self._links.pop(plc, None)
                self._spawn(agent.stop())

    def _stop_scheduler_first(self, grace_s: float) -> asyncio.Task[int] | None:
        """A fleet node starts nothing new once it stops (the batch in progress finishes):
        what it holds goes to the nodes staying, or waits for its restart."""
        if self.fleet is None:
            return None
        return asyncio.get_running_loop().create_task(self.scheduler.stop(grace_s))

    async def _leave_fleet(self) -> bool:
        """Stop taking requests when other nodes stay (True: then hand over)."""
        return self.fleet is not None and await self.fleet.leave()

    async def _hand_over(self) -> int:
        assert self.fleet is not None
        return await self.fleet.hand_over(self.journal, self.cfg.queue.request_timeout_s,
                                          self._expire)

    def _expire(self, e: Entry) -> None:
        reply = rq.reply_address(e, self.cfg.mqtt.base_topic, self.cfg.mqtt.client_id,
                                 rq.peek(e.payload, self.cfg.mqtt.max_payload_bytes))
        self.outbox.answer_error(e.seq, reply, e.topic.rpartition("/")[2] or None, "expired",
                             "deadline passed before the request was started (message "
                             "expiry or queue.request_timeout_s)", e.received)

    # -- lifecycle -----------------------------------------------------------------------

    def _birth(self) -> dict[str, Any]:
        m = self.runner.engine.manifest
        return {"online": True, "client_id": self.cfg.mqtt.client_id, "version": VERSION,
                "engine": m.engine_id, "model": m.dims.hf_architecture,
                "tasks": sorted(self.runner.tasks), "since": _iso(self.started),
                "request_topic": f"{self.cfg.mqtt.base_topic}/req/{{task}}"}

    def recover(self) -> int:
        """Re-queue requests recorded before a restart; answers left unpublished go out
        once connected. Returns the requests re-queued."""
        pending = self.journal.pending()
        for e in pending:
            try:
                self._route(e, recovered=True)
            except Exception as err:   # answered, so it is not recovered again and again
                log.exception("recovered request %d could not be routed", e.seq)
                self.outbox.answer_error(e.seq, rq.reply_address(
                    e, self.cfg.mqtt.base_topic, self.cfg.mqtt.client_id, {}), None,
                    "internal", f"{type(err).__name__}: {err}", e.received)
        if pending:
            log.info("recovered %d requests from the journal", len(pending))
        return len(pending)

    def liveness(self) -> str | None:
        return self.scheduler.liveness()

    def status_line(self) -> str:
        return (f"serving {len(self.runner.tasks)} tasks; queue {self.scheduler.depth}/"
                f"{self.cfg.queue.max_pending}, in flight {self.scheduler.inflight}; broker "
                f"{'connected' if self.link.connected else 'disconnected'}")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        self.notifier.status("warming task prompts")
        pinned = await loop.run_in_executor(None, self.runner.warm)
        log.info("task prompts pinned in the KV cache", extra={"rung_fields": pinned})
        self.journal.prune()
        self.recover()
        self._link_task = loop.create_task(self.link.run(), name="mqtt")
        engine_loop = self.scheduler.start()
        engine_loop.add_done_callback(self._scheduler_ended)
        tasks = [engine_loop, loop.create_task(self.outbox.run(), name="outbox"),
                 self._link_task]
        if self.fleet is None:
            tasks += [loop.create_task(a.run(), name=f"plc-{a.plc.id}") for a in self.agents]
        else:   # a fleet node drives the PLCs it claimed (_claims)
            tasks.append(loop.create_task(self.fleet.run(), name="fleet"))
        spb = (loop.create_task(self.sparkplug.run(), name="sparkplug")
               if self.sparkplug is not None else None)
        if self.cfg.metrics.port:
            self.metrics.serve(self.cfg.metrics.port, self.cfg.metrics.host)
        self.outbox.wake()
        self.notifier.status("connecting to the broker")
        while not self.link.connected and not self._stopping.is_set():
            await asyncio.sleep(0.05)
        if self.link.connected:
            self.notifier.ready(self.status_line())
            log.info("ready", extra={"rung_fields": {"status": self.status_line()}})
        interval = watchdog_interval()
        if interval:
            tasks.append(loop.create_task(watchdog_loop(self.notifier, interval,
                                                        self.liveness)))
        status = loop.create_task(self._status_loop())
        await self._stopping.wait()
        status.cancel()   # the stopping status must stay visible
        await self.shutdown()
        if spb is not None:
            try:   # the node publishes its NDEATH and disconnects
                await asyncio.wait_for(asyncio.shield(spb), 5)
            except TimeoutError:
                log.warning("Sparkplug link did not close in 5 s")
            tasks.append(spb)
        if self.fleet is not None:
            self.fleet.close()
            tasks += self._agent_tasks.values()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return self.exit_code

    def _scheduler_ended(self, task: asyncio.Task[None]) -> None:
        """The engine loop ended without being asked to: never silent. ``rung_up`` drops,
        the watchdog stops (liveness fails) and the daemon exits 70 for systemd to restart
        it; the requests it held stay pending in the journal (a poison one is quarantined
        after ``journal.max_attempts``)."""
        if self._stopping.is_set():
            return
        err = None if task.cancelled() else task.exception()
        log.critical("the scheduler loop has stopped: exiting for a restart",
                     exc_info=(type(err), err, err.__traceback__) if err else None)
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
        log.info("stopping")
        for agent in self.agents:   # a trigger in progress stays raised in the PLC
            await agent.stop()
        stopped = self._stop_scheduler_first(grace_s)
        left_group = await self._leave_fleet()
        self.link.accepting = False
        left = await (stopped or self.scheduler.stop(grace_s))
        if left_group:
            left = max(0, left - await self._hand_over())
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


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def serve(cfg: Config) -> int:
    """Run the daemon until SIGTERM; 0 on a clean stop."""
    from rung.daemon.logs import setup_logging

    setup_logging(cfg.log.level)
    notifier = Notifier()
    notifier.status("loading engine")
    t0 = time.perf_counter()
    runner = build_runner(cfg)
    log.info("engine loaded", extra={"rung_fields": {
        "engine": str(cfg.engine.path), "ms": round((time.perf_counter() - t0) * 1000),
        "tasks": sorted(runner.tasks)}})

    async def main() -> int:
        service = Service(cfg, runner, notifier=notifier)
        try:
            return await service.run()
        finally:
            await asyncio.sleep(0)

    return asyncio.run(main())

