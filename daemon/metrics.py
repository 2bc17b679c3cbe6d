"""Prometheus metrics for ``rung serve``.

Every :class:`Metrics` owns its own ``CollectorRegistry``: the process-wide default registry
would make two daemons (or two tests) in one process collide on metric names. All series are
prefixed ``rung_``; the HTTP endpoint listens on loopback only.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import re
import socket
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from rung.engines.errors import RungError

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                   300.0, 600.0)
DECODE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)

# Task names can come straight from a request (an unknown_task answer), so label values are
# capped per label: past the cap they fold into "other" instead of growing the series set.
_MAX_LABEL_VALUES = 64
_OTHER = "other"
_DIRECTIONS = ("in", "out")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class MetricsError(RungError):
    """The endpoint cannot listen where ``metrics.host``/``metrics.port`` say."""


def listen_error(host: str, port: int, e: OSError) -> MetricsError:
    """What an ``OSError`` from binding ``host:port`` means, naming the part, the address
    and the key to change (``rung serve`` and ``rung check`` say the same)."""
    if e.errno == errno.EADDRINUSE:
        why, key = "is in use", "metrics.port"
        more = "another program listens there: stop it, or choose a free port"
    elif e.errno == errno.EADDRNOTAVAIL or isinstance(e, socket.gaierror):
        why, key = f"cannot be listened on ({e.strerror or e})", "metrics.host"
        more = "name a loopback address of this box"
    else:
        why, key = f"cannot be listened on ({e.strerror or e})", "metrics.port"
        more = "choose a port above 1023, or one this user may bind"
    return MetricsError(f"metrics: {host}:{port} {why} ({key}): {more}")


class Metrics:
    """The daemon's metrics, in a registry of their own; thread-safe like prometheus_client."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("rung_requests", "Requests answered, by task and outcome",
                                ["task", "outcome"], registry=r)
        self.queue_depth = Gauge("rung_queue_depth", "Requests waiting", registry=r)
        self.inflight = Gauge("rung_inflight", "Requests being generated", registry=r)
        self.ttft = Histogram("rung_ttft_seconds", "Time to first token", ["task"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.request_seconds = Histogram("rung_request_seconds", "Receive to answer",
                                         ["task"], buckets=REQUEST_BUCKETS, registry=r)
        self.decode_rate = Histogram("rung_decode_tokens_per_second", "Decode speed",
                                     ["task"], buckets=DECODE_BUCKETS, registry=r)
        self.prompt_tokens = Counter("rung_prompt_tokens", "Prompt tokens", ["task"],
                                     registry=r)
        self.completion_tokens = Counter("rung_completion_tokens", "Completion tokens",
                                         ["task"], registry=r)
        self.cached_tokens = Counter("rung_cached_tokens", "Prompt tokens served from cache",
                                     ["task"], registry=r)
        self.ffn_skip_ratio = Gauge("rung_ffn_skip_ratio", "Last observed FFN skip ratio",
                                    registry=r)
        self.mqtt_connected = Gauge("rung_mqtt_connected", "1 while the broker link is up",
                                    registry=r)
        self.mqtt_reconnects = Counter("rung_mqtt_reconnects", "Broker reconnects", registry=r)
        self.mqtt_messages = Counter("rung_mqtt_messages", "MQTT messages", ["direction"],
                                     registry=r)
        self.journal_pending = Gauge("rung_journal_pending", "Journal entries not yet answered",
                                     registry=r)
        self.up = Gauge("rung_up", "1 while the daemon runs", registry=r)
        self.up.set(1)
        self.storage_ok = Gauge("rung_storage_ok", "1 while journal writes in state_dir work",
                                registry=r)
        self.storage_ok.set(1)
        self.journal_wal_damaged = Gauge("rung_journal_wal_damaged", "1 when the journal's "
                                         "write-ahead log ended in a damaged tail at start-up",
                                         registry=r)
        self.dead_letters = Counter("rung_answers_dead_lettered", "Answers the broker kept "
                                    "refusing, given up on (journal state dead)", registry=r)
        self.attempts = Counter("rung_answer_attempts", "Tries of requests that reached the "
                                "model (verified retries included), by task", ["task"],
                                registry=r)
        self.check_failures = Counter("rung_validation_failures", "Tries whose answer failed "
                                      "a check, by task and the first failed check",
                                      ["task", "check"], registry=r)
        self.quarantined = Counter("rung_requests_quarantined", "Requests answered internal "
                                   "after they were in flight at too many daemon deaths",
                                   registry=r)
        self.payloads_refused = Counter("rung_payloads_refused", "Inbound MQTT payloads "
                                        "refused unparsed for their size, by part and kind",
                                        ["part", "kind"], registry=r)
        self.part_up = Gauge("rung_part_up", "1 while a long-lived part of the daemon runs "
                             "(or is being restarted), 0 once it is dead", ["part"],
                             registry=r)
        self.part_restarts = Counter("rung_part_restarts", "Restarts of a failed part by its "
                                     "supervisor", ["part"], registry=r)
        self.info = Info("rung", "Version and engine of this daemon", registry=r)
        self._kv: dict[str, Gauge] = {}
        self._labels: dict[str, set[str]] = {"task": set(), "outcome": set()}
        self._lock = threading.Lock()
        self._server: tuple[WSGIServer, threading.Thread] | None = None

    def _label(self, kind: str, value: str) -> str:
        with self._lock:
            seen = self._labels[kind]
            if value in seen:
                return value
            if len(seen) < _MAX_LABEL_VALUES:
                seen.add(value)
                return value
            return _OTHER

    def observe_request(self, task: str | None, outcome: str, total_s: float | None = None,
                        ttft_s: float | None = None, decode_tok_s: float | None = None,
                        prompt_tokens: int = 0, completion_tokens: int = 0,
                        cached_tokens: int = 0, ffn_skip_ratio: float | None = None) -> None:
        """Records one answered request; ``task`` None (unparseable request) is labelled "-"."""
        t = self._label("task", task if task is not None else "-")
        self.requests.labels(task=t, outcome=self._label("outcome", outcome)).inc()
        if total_s is not None:
            self.request_seconds.labels(task=t).observe(total_s)
        if ttft_s is not None:
            self.ttft.labels(task=t).observe(ttft_s)
        if decode_tok_s is not None:
            self.decode_rate.labels(task=t).observe(decode_tok_s)
        # counters refuse negative increments; a zero needs no series
        for counter, n in ((self.prompt_tokens, prompt_tokens),
                           (self.completion_tokens, completion_tokens),
                           (self.cached_tokens, cached_tokens)):
            if n > 0:
                counter.labels(task=t).inc(n)
        if ffn_skip_ratio is not None:
            self.ffn_skip_ratio.set(ffn_skip_ratio)

    def set_queue(self, depth: int, inflight: int) -> None:
        """Current queue depth and number of requests being generated."""
        self.queue_depth.set(depth)
        self.inflight.set(inflight)

    def set_kv(self, stats: Mapping[str, float | int]) -> None:
        """One gauge ``rung_kv_cold_<key>`` per numeric entry of the cold KV cache's stats."""
        for key, value in stats.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            name = re.sub(r"_+", "_", re.sub(r"[^a-z0-9_]", "_", str(key).lower())).strip("_")
            if not name:
                continue
            with self._lock:
                gauge = self._kv.get(name)
                if gauge is None:
                    gauge = Gauge(f"rung_kv_cold_{name}", f"Cold KV cache: {name}",
                                  registry=self.registry)
                    self._kv[name] = gauge
            gauge.set(value)

    def set_mqtt(self, connected: bool) -> None:
        """Broker link state."""
        self.mqtt_connected.set(1 if connected else 0)

    def mqtt_reconnected(self) -> None:
        """Counts one reconnect to the broker."""
        self.mqtt_reconnects.inc()

    def mqtt_message(self, direction: str) -> None:
        """Counts one MQTT message; ``direction`` is "in" or "out"."""
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be 'in' or 'out', not {direction!r}")
        self.mqtt_messages.labels(direction=direction).inc()

    def set_journal_pending(self, n: int) -> None:
        """Journal entries received but not yet answered."""
        self.journal_pending.set(n)

    def observe_attempts(self, task: str, attempts: int, failed: tuple[str, ...]) -> None:
        """A request's tries, and the first failed check of each failed one."""
        t = self._label("task", task)
        self.attempts.labels(task=t).inc(attempts)
        for check in failed:
            self.check_failures.labels(task=t, check=check).inc()

    def set_storage(self, ok: bool) -> None:
        """Whether the journal can write in ``state_dir`` (0: requests are refused
        ``unavailable`` until it can again)."""
        self.storage_ok.set(1 if ok else 0)

    def payload_refused(self, part: str, kind: str) -> None:
        """Counts one inbound payload refused for its size (``mqtt.max_payload_bytes``)."""
        self.payloads_refused.labels(part=part, kind=kind).inc()

    def set_part(self, name: str, up: bool) -> None:
        """A supervised part's state (``daemon.supervise``)."""
        self.part_up.labels(part=name).set(1 if up else 0)

    def part_restarted(self, name: str) -> None:
        """Counts one restart of a failed part."""
        self.part_restarts.labels(part=name).inc()

    def set_down(self) -> None:
        """The daemon cannot serve any more (it is about to exit for a restart)."""
        self.up.set(0)

    def set_info(self, **labels: str) -> None:
        """Sets ``rung_info`` labels, e.g. version, engine, kv_dtype (replaces earlier ones)."""
        self.info.info({k: str(v) for k, v in labels.items()})

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)

    def summary(self) -> dict[str, Any]:
        """A compact view for humans: per-task counts, tokens and mean latencies; queue; MQTT."""
        return summarize(self.registry.collect())

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serves ``/metrics`` from a daemon thread; returns the bound port (``port`` 0: any free
        one). Loopback hosts only: the endpoint has no authentication. A port in use (or
        any address that cannot be bound) raises ``MetricsError`` naming it and its key."""
        if not _loopback(host):
            raise ValueError(f"metrics endpoint must listen on loopback, not {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"metrics port must be an integer in 0..65535, not {port!r}")
        if self._server is not None:
            raise RuntimeError("metrics endpoint already serving")
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:   # a port in use, a host that is not this box's
            raise listen_error(host, port, e) from e
        self._server = (server, thread)
        return int(server.server_port)

    async def keep_serving(self, port: int, host: str = "127.0.0.1",
                           check_s: float = 5.0) -> None:
        """The endpoint as a supervised part: serve (unless serving), then raise once its
        thread has ended, so the supervisor restarts it."""
        if self._server is None:
            self.serve(port, host)
        while True:
            server = self._server
            if server is None or not server[1].is_alive():
                self.close()
                raise RuntimeError("the metrics endpoint's thread has ended")
            await asyncio.sleep(check_s)

    def close(self) -> None:
        """Stops the HTTP endpoint, if started; safe to call twice."""
        if self._server is None:
            return
        server, thread = self._server
        self._server = None
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    # ---- PLC side (daemon/modbus/agent.py) -------------------------------------------------------
    @property
    def plc(self) -> PlcMetrics:
        """The PLC agents' series (``rung_plc_*``), registered on first use."""
        if getattr(self, "_plc", None) is None:
            self._plc = PlcMetrics(self.registry)
        return self._plc


PLC_OPS = ("link", "handshake read", "heartbeat write", "ack write", "answer write",
           "done write", "clear write", "snapshot read")
PLC_LINK_STATES = ("connected", "degraded", "disconnected", "error")
PLC_ERRS = range(7)   # the err register's codes (daemon/plc/job.py)


class PlcMetrics:
    """Series of the PLC agents, labelled by the register map's id (``plc``) and, where an
    operation is meant, by its name (``op``, one of :data:`PLC_OPS`). :meth:`add` makes
    every series of a PLC at 0, so dashboards and alerts see it before the first fault."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.retries = Counter("rung_plc_retries", "Failed Modbus operations, each retried "
                               "with backoff, by PLC and operation", ["plc", "op"], registry=r)
        self.failing = Gauge("rung_plc_failing", "Failed attempts in a row of an operation, "
                             "0 while it works: what is stuck", ["plc", "op"], registry=r)
        self.serving = Gauge("rung_plc_serving", "1 while rung reads the PLC's handshake "
                             "(and moves its heartbeat)", ["plc"], registry=r)
        self.per_transaction = Gauge("rung_plc_per_transaction", "1 when the PLC closes the "
                                     "connection after each response (a connection per "
                                     "request)", ["plc"], registry=r)
        self.jobs = Counter("rung_plc_jobs", "PLC requests answered, by err code",
                            ["plc", "err"], registry=r)
        self.link = Gauge("rung_plc_link", "1 for the PLC link's state now (connected, "
                          "degraded, disconnected, error), 0 for the others", ["plc", "state"],
                          registry=r)

    def add(self, plc: str) -> None:
        """Every series of PLC ``plc``, at 0."""
        for op in PLC_OPS:
            self.retries.labels(plc=plc, op=op)
            self.failing.labels(plc=plc, op=op).set(0)
        for err in PLC_ERRS:
            self.jobs.labels(plc=plc, err=str(err))
        self.set_link(plc, False, False)
        self.set_state(plc, "disconnected")

    def set_state(self, plc: str, state: str) -> None:
        """The PLC link's state (``daemon/modbus/link.py``, ``daemon/opcua/link.py``)."""
        for s in PLC_LINK_STATES:
            self.link.labels(plc=plc, state=s).set(1 if s == state else 0)

    def failed(self, plc: str, op: str, in_a_row: int) -> None:
        """One failed attempt of ``op``, the ``in_a_row``-th since it last worked."""
        self.retries.labels(plc=plc, op=op).inc()
        self.failing.labels(plc=plc, op=op).set(in_a_row)

    def worked(self, plc: str, op: str) -> None:
        """``op`` worked (or is no longer wanted)."""
        self.failing.labels(plc=plc, op=op).set(0)

    def set_link(self, plc: str, serving: bool, per_transaction: bool) -> None:
        """Whether the handshake is read, and whether the link reconnects per request."""
        self.serving.labels(plc=plc).set(1 if serving else 0)
        self.per_transaction.labels(plc=plc).set(1 if per_transaction else 0)

    def job(self, plc: str, err: int) -> None:
        """One request answered with ``err``."""
        self.jobs.labels(plc=plc, err=str(err)).inc()
    # ---- end of the PLC side ------------------------------------------------------------


def summarize(families: Iterable[Metric]) -> dict[str, Any]:
    """``Metrics.summary`` over any metric families: a registry's, or those parsed from a
    scraped ``/metrics`` page (``summarize_text``)."""
    tasks: dict[str, dict[str, Any]] = {}

    def entry(task: str) -> dict[str, Any]:
        return tasks.setdefault(task, {
            "requests": 0, "outcomes": {}, "prompt_tokens": 0, "completion_tokens": 0,
            "cached_tokens": 0, "mean_ttft_s": None, "mean_request_s": None})

    sums: dict[tuple[str, str], float] = {}
    plain: dict[str, float] = {}
    for family in families:
        for s in family.samples:
            task = s.labels.get("task")
            if task is None:
                if not s.labels:
                    plain[s.name] = s.value
                continue
            if s.name == "rung_requests_total":
                e = entry(task)
                e["outcomes"][s.labels["outcome"]] = int(s.value)
                e["requests"] += int(s.value)
            elif s.name.endswith("_tokens_total"):
                entry(task)[s.name[len("rung_"):-len("_total")]] = int(s.value)
            elif s.name in ("rung_ttft_seconds_sum", "rung_ttft_seconds_count",
                            "rung_request_seconds_sum", "rung_request_seconds_count"):
                sums[(task, s.name)] = s.value
    for task, e in tasks.items():
        for key, metric in (("mean_ttft_s", "rung_ttft_seconds"),
                            ("mean_request_s", "rung_request_seconds")):
            count = sums.get((task, metric + "_count"), 0.0)
            if count:
                e[key] = sums[(task, metric + "_sum")] / count
    return {"tasks": tasks,
            "queue_depth": int(plain.get("rung_queue_depth", 0)),
            "inflight": int(plain.get("rung_inflight", 0)),
            "mqtt_connected": bool(plain.get("rung_mqtt_connected", 0)),
            "mqtt_reconnects": int(plain.get("rung_mqtt_reconnects_total", 0)),
            "journal_pending": int(plain.get("rung_journal_pending", 0))}


def summarize_text(text: str) -> dict[str, Any]:
    """The summary of a scraped ``/metrics`` page (``rung demo`` reads the daemon's)."""
    return summarize(text_string_to_metric_families(text))
