"""Throughput of a rung fleet with 1, 2 and 3 nodes behind one mosquitto, on this machine.

    .venv/bin/python bench/fleet.py [--engine DIR] [--nodes 1,2,3] [--short 600] [--long 90]

Each node is ``rung serve`` on the demo engine (models/edge-tiny exported as the daemon
serves it; ``--engine`` reuses an export), one ONNX Runtime thread, ``engine.max_batch`` 1,
all nodes in group ``bench`` (``mqtt.shared_group``). A private mosquitto on loopback, a
fresh one per fleet size. A paho client publishes every request at once (QoS 1, v5 Response
Topic and Correlation Data) and times the first publish to the last answer; nothing is
refused (``queue.max_pending`` holds them all). Two workloads:

* ``short``: st_code, ``max_tokens`` 3 (answered ``truncated``): the cost of a request
  around the model (journal, parse, prompt prefix from the cold tier, a short prefill);
* ``long``: st_code, ``max_tokens`` 48: mostly decoding.

Per fleet size: requests per second, each node's share and rate, and the CPU seconds the
broker and the nodes spent (from /proc), so the broker's cost per request is measured here
too. Writes ``bench/results/<date>-fleet.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BASE = "v1/bench/plant/line/rung"
ST = {"description": "Pump P1 runs while the level is below 2 m; stop it on a high level "
      "alarm.", "name": "P_Pump", "pou_type": "PROGRAM"}
WORKLOADS = {"short": 3, "long": 48}   # max_tokens


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Node:
    def __init__(self, root: Path, engine: Path, port: int, name: str, pending: int) -> None:
        root.mkdir(parents=True)
        cfg = {"engine": {"path": str(engine), "threads": 1, "max_batch": 1},
               "mqtt": {"port": port, "base_topic": BASE, "client_id": name,
                        "shared_group": "bench", "reconnect_min_s": 0.2},
               "queue": {"max_pending": pending, "request_timeout_s": 3600},
               "state_dir": str(root / "state"), "kv": {"ram_mb": 64, "disk_mb": 0},
               "log": {"level": "info"}}
        (root / "rung.yaml").write_text(yaml.safe_dump(cfg))
        self.log = root / "daemon.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "rung.daemon", "serve",
                                          "--config", str(root / "rung.yaml")],
                                         stdout=out, stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(r.get("msg") == "ready" for r in self.lines()):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"rung serve exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError("rung serve not ready")

    def answered(self) -> int:
        return sum(1 for r in self.lines() if r.get("msg") == "answered")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


class Client:
    """Publishes requests at QoS 1 and counts the answers on its own reply topic."""

    def __init__(self, port: int) -> None:
        self.reply = f"{BASE}/res/bench-{uuid.uuid4().hex[:8]}"
        self.got: set[str] = set()
        self.last = 0.0
        self.cond = threading.Condition()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5,
                             client_id=f"bench-{uuid.uuid4().hex[:8]}")
        self.c.on_message = self._on_message
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *_: subscribed.set()
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.c.subscribe(self.reply, qos=1)
        if not subscribed.wait(10):
            raise TimeoutError("no SUBACK from the broker")

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        corr = getattr(msg.properties, "CorrelationData", b"")
        with self.cond:
            self.got.add(bytes(corr).decode())
            self.last = time.perf_counter()
            self.cond.notify_all()

    def run(self, n: int, max_tokens: int, tag: str, timeout: float = 1800) -> float:
        """Publish ``n`` requests at once; seconds until the last answer."""
        ids = [f"{tag}-{i}" for i in range(n)]
        body = json.dumps({"input": ST, "max_tokens": max_tokens})
        t0 = time.perf_counter()
        for rid in ids:
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic, props.CorrelationData = self.reply, rid.encode()
            self.c.publish(f"{BASE}/req/st_code", body, qos=1, properties=props)
        with self.cond:
            if not self.cond.wait_for(lambda: set(ids) <= self.got, timeout):
                raise TimeoutError(f"{len(set(ids) & self.got)} of {n} answers")
        return self.last - t0

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def measure(engine: Path, nodes: int, counts: dict[str, int], tmp: Path) -> dict[str, Any]:
    broker = LocalBroker(tmp / f"broker-{nodes}")
    broker.start()
    assert broker.proc is not None
    fleet = [Node(tmp / f"n{nodes}-{i}", engine, broker.port, f"bench-{nodes}-{i}",
                  max(counts.values()) + 10) for i in range(nodes)]
    out: dict[str, Any] = {}
    try:
        for node in fleet:
            node.wait_ready()
        client = Client(broker.port)
        client.run(4 * nodes, 3, "warm")   # task prompts from the cold tier on every node
        for name, n in counts.items():
            before = [node.answered() for node in fleet]
            cpu0 = (cpu_s(broker.proc.pid), [cpu_s(node.proc.pid) for node in fleet])
            seconds = client.run(n, WORKLOADS[name], name)
            shares = [node.answered() - b for node, b in zip(fleet, before, strict=True)]
            broker_cpu = cpu_s(broker.proc.pid) - cpu0[0]
            node_cpu = [cpu_s(node.proc.pid) - c for node, c in zip(fleet, cpu0[1],
                                                                    strict=True)]
            out[name] = {"requests": n, "max_tokens": WORKLOADS[name], "seconds": seconds,
                         "req_s": n / seconds, "per_node": shares,
                         "per_node_req_s": [s / seconds for s in shares],
                         "broker_cpu_s": broker_cpu, "node_cpu_s": node_cpu,
                         "broker_cpu_ms_per_request": 1000 * broker_cpu / n}
            print(f"{nodes} node(s), {name}: {n / seconds:.1f} req/s, shares {shares}",
                  file=sys.stderr)
        client.close()
    finally:
        for node in fleet:
            node.stop()
        broker.stop()
    return out


def markdown(record: dict[str, Any]) -> list[str]:
    res, cores = record["results"], record["machine"]["cpus_usable"]
    lines = [f"# rung fleet on one machine ({record['stamp']})", "",
             f"`{record['command']}`", "",
             f"{cores} usable cores (1-minute load average {record['loadavg_1min']['before']:.1f} "
             f"before the run, {record['loadavg_1min']['after']:.1f} after); each node one ONNX "
             "Runtime thread, batch 1; one mosquitto 2.0 on loopback; all requests published "
             "at once.", "",
             "| workload | nodes | req/s | vs 1 node | per node (req/s) | answered per node | "
             "cores busy (nodes) | broker CPU ms/request |", "|---|---|---|---|---|---|---|---|"]
    for name in WORKLOADS:
        one = res.get("1", {}).get(name, {}).get("req_s")
        for n, r in res.items():
            w = r[name]
            ratio = f"{w['req_s'] / one:.2f}x" if one else "-"
            lines.append(f"| {name} (max_tokens {w['max_tokens']}) | {n} | {w['req_s']:.1f} | "
                         f"{ratio} | {', '.join(f'{x:.1f}' for x in w['per_node_req_s'])} | "
                         f"{', '.join(map(str, w['per_node']))} | "
                         f"{sum(w['node_cpu_s']) / w['seconds']:.2f} | "
                         f"{w['broker_cpu_ms_per_request']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, help="an export of models/edge-tiny (default: "
                    "exported now into a temporary folder)")
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--short", type=int, default=600, help="requests of the short workload")
    ap.add_argument("--long", type=int, default=90, help="requests of the long workload")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    counts = {"short": args.short, "long": args.long}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        engine = args.engine
        if engine is None:
            from rung.export.exporter import ExportOptions, export

            engine = Path(tmp) / "engine"
            export(ROOT / "models" / "edge-tiny", engine, ExportOptions())
        results = {n: measure(engine, int(n), counts, Path(tmp))
                   for n in args.nodes.split(",")}
    record = {"stamp": time.strftime("%Y-%m-%d") + "-fleet",
              "command": shlex.join(["python", *sys.orig_argv[1:]]),
              "machine": machine_info(), "results": results,
              "loadavg_1min": {"before": load_before[0], "after": os.getloadavg()[0]}}
    report.publish(args.out, record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
