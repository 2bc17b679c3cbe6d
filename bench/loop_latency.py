"""The event loop's latency under load: a refused request's round trip through the broker.

    .venv/bin/python bench/loop_latency.py [--engine DIR] [--probes 300] [--inflight 12]
        [--max-tokens 24] [--max-batch 4] [--threads 1] [--tag TAG] [--diagnose] [--out DIR]

A private mosquitto on loopback (``rung.daemon.demo.localbroker``) and ``rung serve`` on the
demo model (models/edge-tiny exported as the tests and ``rung demo`` export it, cached like
the demo's; ``--engine`` reuses an export), ``engine.max_batch`` ``--max-batch``, ``--threads``
ONNX Runtime threads, the state directory on this machine's disk. A probe is a malformed
request (payload ``{not json``, MQTT v5 Response Topic and Correlation Data) that rung
answers ``bad_json`` without the model: recorded in the journal, acknowledged, parsed,
answered, published. Its round trip is two hops through the broker, the journal's durable
writes it needs, and whatever the event loop makes it wait for.
Probes go one at a time, 20 to 50 ms apart (random, seeded), from their own client:

* ``idle``: nothing else running;
* ``load``: a second client keeps ``--inflight`` model requests in flight (st_code,
  fault_tree and diagnosis in turn, the demo's inputs, ``--max-tokens`` 24 each by default,
  ``0`` for each task's own up to 1024; every answer is followed by the next request), so
  the engine thread prepares (grammars), decodes and answers the whole time, and every
  request is recorded, started, answered and delivered in the journal.

Prints P50/P99/max of both phases and writes ``<out>/<date>-loop-latency[-TAG].{json,md}``.
``--diagnose`` runs the daemon under ``bench/loop_probe.py`` (loop-lag probe, asyncio's
slow-callback report, timers on the journal's SQLite calls, gc pauses, stack samples while
the loop is late) and adds its report to the JSON; the instrumentation costs time itself,
so the headline numbers are those of a run without it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import report
import yaml
from machine import machine_info
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rung.daemon.demo.localbroker import LocalBroker
from rung.daemon.demo.run import REQUESTS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BASE = "v1/bench/plant/line/rung/node1"
PROBE = b"{not json"


def engine_dir(given: Path | None) -> Path:
    """``--engine``, else models/edge-tiny exported once into the demo's cache (the export
    ``tests/conftest.py``'s ``edge_engine`` makes: FFN gates as trained)."""
    if given is not None:
        return given
    from rung.daemon.demo.run import _engine_dir

    return _engine_dir()[0]


class Daemon:
    def __init__(self, root: Path, engine: Path, port: int, args: argparse.Namespace) -> None:
        cfg = {"engine": {"path": str(engine), "threads": args.threads,
                          "max_batch": args.max_batch},
               "mqtt": {"host": "127.0.0.1", "port": port, "base_topic": BASE,
                        "client_id": "rung-bench", "reconnect_min_s": 0.2},
               "queue": {"max_pending": max(16, args.inflight + 4),
                         "request_timeout_s": 3600},
               "state_dir": str(root / "state"), "kv": {"ram_mb": 64, "disk_mb": 256},
               "log": {"level": "info"}}
        (root / "rung.yaml").write_text(yaml.safe_dump(cfg))
        self.log = root / "daemon.log"
        self.report = root / "loop-probe.json"
        cmd = ([sys.executable, str(Path(__file__).resolve().parent / "loop_probe.py"),
                str(root / "rung.yaml"), str(self.report)] if args.diagnose else
               [sys.executable, "-m", "rung.daemon", "serve", "--config",
                str(root / "rung.yaml")])
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if '"msg": "ready"' in self.log.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"rung serve exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError("rung serve not ready")

    def stop(self) -> dict[str, Any] | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.report.is_file():
            return dict(json.loads(self.report.read_text()))
        return None

    def answered(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line)
                if rec.get("msg") == "answered":
                    out.append(rec)
        return out


def _client(port: int, on_message: Any, name: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5,
                    client_id=f"{name}-{uuid.uuid4().hex[:8]}")
    c.on_message = on_message
    subscribed = threading.Event()
    c.on_subscribe = lambda *_: subscribed.set()
    c.connect("127.0.0.1", port, keepalive=60)
    sock = c.socket()
    if isinstance(sock, socket.socket):   # as a latency-minded client would
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.loop_start()
    return c, subscribed   # type: ignore[return-value]


def _props(reply: str, corr: str) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    p.ResponseTopic, p.CorrelationData = reply, corr.encode()
    return p


class Prober:
    """Sends one malformed request at a time and times its answer."""

    def __init__(self, port: int) -> None:
        self.reply = f"{BASE}/res/probe-{uuid.uuid4().hex[:8]}"
        self.got: dict[str, tuple[float, dict[str, Any]]] = {}
        self.cond = threading.Condition()
        self.c, subscribed = _client(port, self._on_message, "probe")  # type: ignore[misc]
        self.c.subscribe(self.reply, qos=1)
        if not subscribed.wait(10):
            raise TimeoutError("no SUBACK")

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        t = time.perf_counter()
        corr = bytes(getattr(msg.properties, "CorrelationData", b"")).decode()
        with self.cond:
            self.got[corr] = (t, json.loads(msg.payload))
            self.cond.notify_all()

    def probe(self, tag: str) -> float:
        """One round trip, ms."""
        t0 = time.perf_counter()
        self.c.publish(f"{BASE}/req/st_code", PROBE, qos=1, properties=_props(self.reply, tag))
        with self.cond:
            if not self.cond.wait_for(lambda: tag in self.got, 30):
                raise TimeoutError(f"no answer to probe {tag}")
            t1, body = self.got.pop(tag)
        code = (body.get("error") or {}).get("code")
        if code != "bad_json":
            raise RuntimeError(f"probe {tag} answered {body}")
        return (t1 - t0) * 1000

    def run(self, n: int, rng: random.Random, phase: str) -> list[float]:
        out = []
        for i in range(n):
            out.append(self.probe(f"{phase}-{i}"))
            time.sleep(rng.uniform(0.020, 0.050))
        return out

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


class Loader:
    """Keeps ``inflight`` model requests in flight: each answer sends the next request."""

    def __init__(self, port: int, inflight: int, max_tokens: int | None = None) -> None:
        self.inflight, self.max_tokens = inflight, max_tokens
        self.reply = f"{BASE}/res/load-{uuid.uuid4().hex[:8]}"
        self.lock = threading.Lock()
        self.codes: dict[str, int] = {}
        self.answered = 0
        self.running = False
        self.seq = itertools.count()
        self.c, subscribed = _client(port, self._on_message, "load")  # type: ignore[misc]
        self.c.subscribe(self.reply, qos=1)
        if not subscribed.wait(10):
            raise TimeoutError("no SUBACK")

    def send(self) -> None:
        i = next(self.seq)
        task, data = REQUESTS[i % len(REQUESTS)]
        data = dict(data)
        key = "description" if task == "st_code" else ("asset" if task == "diagnosis"
                                                       else "system")
        data[key] = f"{data[key]} (unit {i})"
        doc: dict[str, Any] = {"input": data, "id": f"load-{i}"}
        if self.max_tokens:   # else the task's own
            doc["max_tokens"] = self.max_tokens
        body = json.dumps(doc).encode()
        self.c.publish(f"{BASE}/req/{task}", body, qos=1,
                       properties=_props(self.reply, f"load-{i}"))

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        body = json.loads(msg.payload)
        code = "ok" if body.get("ok") else (body.get("error") or {}).get("code", "?")
        with self.lock:
            self.answered += 1
            self.codes[code] = self.codes.get(code, 0) + 1
            again = self.running
        if again:
            self.send()

    def start(self) -> None:
        self.running = True
        for _ in range(self.inflight):
            self.send()

    def stop(self) -> None:
        with self.lock:
            self.running = False

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def summary(ms: list[float]) -> dict[str, Any]:
    s = sorted(ms)
    return {"n": len(s), "p50_ms": round(statistics.median(s), 2),
            "p90_ms": round(s[int(0.90 * (len(s) - 1))], 2),
            "p99_ms": round(s[int(0.99 * (len(s) - 1))], 2),
            "max_ms": round(s[-1], 2), "mean_ms": round(statistics.fmean(s), 2),
            "over_100ms": sum(1 for x in s if x > 100), "times_ms": [round(x, 2) for x in ms]}


def measure(args: argparse.Namespace, engine: Path, tmp: Path) -> dict[str, Any]:
    broker = LocalBroker(tmp / "broker")
    broker.start()
    daemon = Daemon(tmp, engine, broker.port, args)
    rng = random.Random(args.seed)
    out: dict[str, Any] = {}
    try:
        daemon.wait_ready()
        prober, loader = Prober(broker.port), Loader(broker.port, args.inflight, args.max_tokens)
        prober.run(10, rng, "warm")   # untimed
        out["idle"] = summary(prober.run(args.probes, rng, "idle"))
        print(f"idle: {fmt(out['idle'])}", file=sys.stderr, flush=True)
        loader.start()
        while loader.answered < args.inflight:   # every task's prompt prefix warm
            time.sleep(0.1)
        t0, answered0 = time.monotonic(), loader.answered
        out["load"] = summary(prober.run(args.probes, rng, "load"))
        seconds = time.monotonic() - t0
        out["load"]["model_answers"] = loader.answered - answered0
        out["load"]["model_answers_per_s"] = round((loader.answered - answered0) / seconds, 2)
        out["load"]["answer_codes"] = dict(loader.codes)
        loader.stop()
        print(f"load: {fmt(out['load'])}", file=sys.stderr, flush=True)
        prober.close()
        loader.close()
    finally:
        diag = daemon.stop()
        broker.stop()
    if diag is not None:
        out["diagnosis"] = diag
    return out


def fmt(s: dict[str, Any]) -> str:
    return (f"P50 {s['p50_ms']:.1f} ms, P99 {s['p99_ms']:.1f} ms, max {s['max_ms']:.1f} ms "
            f"({s['n']} probes)")


def markdown(record: dict[str, Any]) -> list[str]:
    r, m, c = record["results"], record["machine"], record["config"]
    lines = [f"# A refusal's round trip through the broker ({record['stamp']})", "",
             f"`{record['command']}`", "",
             f"{m['cpu_model']}, {m['cpus_usable']} usable cores; engine.max_batch "
             f"{c['max_batch']}, {c['threads']} ONNX Runtime thread(s); under load "
             f"{c['inflight']} model requests in flight (max_tokens "
             f"{c.get('max_tokens') or 'of each task'})"
             f"{' (instrumented: --diagnose)' if c['diagnose'] else ''}.", "",
             "| phase | probes | P50 ms | P90 ms | P99 ms | max ms | over 100 ms | "
             "model answers/s |", "|---|---|---|---|---|---|---|---|"]
    for phase in ("idle", "load"):
        s = r[phase]
        lines.append(f"| {phase} | {s['n']} | {s['p50_ms']:.1f} | {s['p90_ms']:.1f} | "
                     f"{s['p99_ms']:.1f} | {s['max_ms']:.1f} | {s['over_100ms']} | "
                     f"{s.get('model_answers_per_s', '-')} |")
    d = r.get("diagnosis")
    if d:
        lag = d["lag_ms"]
        lines += ["", f"Loop lag (2 ms ticks): P50 {lag['p50']} ms, P99 {lag['p99']} ms, "
                  f"max {lag['max']} ms; over 50 ms: {lag['over_50ms']}.", "",
                  "| journal call @ thread | n | total ms | P50 ms | P99 ms | max ms |",
                  "|---|---|---|---|---|---|"]
        for name, j in d["journal_calls"].items():
            lines.append(f"| {name} | {j['n']} | {j['total_ms']} | {j['p50_ms']} | "
                         f"{j['p99_ms']} | {j['max_ms']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, help="an export of models/edge-tiny")
    ap.add_argument("--probes", type=int, default=300, help="probes per phase")
    ap.add_argument("--inflight", type=int, default=12, help="model requests in flight")
    ap.add_argument("--max-tokens", type=int, default=24,
                    help="max_tokens of the model requests (0: each task's own, up to 1024: "
                    "a few long answers; the default: many short requests, each recorded, "
                    "started, prepared, answered and delivered)")
    ap.add_argument("--max-batch", type=int, default=4, help="engine.max_batch")
    ap.add_argument("--threads", type=int, default=1, help="engine.threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    ap.add_argument("--diagnose", action="store_true",
                    help="run the daemon under bench/loop_probe.py (instrumented)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    engine = engine_dir(args.engine)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:   # on this machine's disk
        results = measure(args, engine, Path(tmp))
    stamp = time.strftime("%Y-%m-%d") + "-loop-latency" + (f"-{args.tag}" if args.tag else "")
    record = {"stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
              "machine": machine_info(),
              "config": {"inflight": args.inflight, "max_tokens": args.max_tokens,
                         "max_batch": args.max_batch,
                         "threads": args.threads, "probes": args.probes,
                         "diagnose": args.diagnose, "engine": str(engine)},
              "loadavg_1min": {"before": load_before, "after": os.getloadavg()[0]},
              "results": results}
    report.publish(args.out, record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
