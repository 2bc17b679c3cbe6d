"""Plant load against the seed SLAs: P99 time to first token <= 120 ms, peak RSS <= 1.8 GB,
engine load <= 800 ms.

    .venv/bin/python bench/plant_load.py [--engine demo|smollm2|q05-int4|q05-int4-default|DIR]
        [--build]
        [--plcs 2] [--plc-per-min 1] [--rate 12] [--duration 240] [--sweep 6,12,24,48,96]
        [--mix diagnosis=50,st_code=30,fault_tree=20] [--max-batch 1] [--threads 0]
        [--memory-budget-mb 4096] [--seed 0] [--quick] [--tag TAG] [--out bench/results]

``rung serve`` (a child process, as systemd runs it) on a private mosquitto
(``rung.daemon.demo.localbroker``) with ``--plcs`` simulated PLCs (``rung demo``'s press:
a pymodbus server, the shipped register map ``configs/plcs/press1.yaml`` under its own id,
so each trigger asks for a diagnosis and the map's fault tree). Each PLC raises ``req`` at
Poisson times (``--plc-per-min``, seeded), waits for ``done`` and clears ``req``, as a PLC
program does. An MQTT client sends ``--rate`` requests per minute, open loop (Poisson
arrivals, seeded), each task drawn by ``--mix`` and its input taken from the corpus
generator (``rung.tools.corpus.generate``, seed ``--seed``); each task's own ``max_tokens``.
After the daemon is ready, one untimed request per task; then ``--duration`` seconds of load,
and the answers still owed are waited for.

Per MQTT request, from the answer's ``usage``: ``first_token_ms`` (the request's receipt to
its first token: queue, grammar and prefill; the SLA's TTFT), ``ttft_ms`` (the engine's
part: row joined to first token) and ``total_ms`` (receipt to answer); the client's round
trip besides. Per PLC trigger: ``req`` raised to ``done`` seen by the PLC. Queue depth and
rows in flight from ``/metrics`` every 0.5 s; peak RSS of the daemon (``VmHWM``); engine
load: ``load_engine`` with the daemon's options timed in three fresh processes (median),
and the daemon's own ``engine loaded`` line (engine, tokenizer, tasks). ``--sweep`` runs the
MQTT rates in turn on one daemon and stops after the first whose P99 TTFT is over 120 ms.

The default (the demo model, 2 PLCs at 1/min, 12 requests/min, 240 s) takes about 5
minutes; ``--quick`` (1 PLC, 40 s) about one. ``smollm2`` exports SmolLM2-135M-Instruct
(tests/real_checkpoint.py's GGUF) with ``rung export``'s defaults once; ``q05-int4`` is
bench/artifacts.py's 0.5B-shape int4 engine (fp32 KV, max_seq 2048) and ``q05-int4-default``
its default int4 export (``rung export --weights int4``: fp16 KV, max_seq 4096), each built
only with ``--build`` (slow on 2 cores).
Writes ``<out>/<date>-plant-load[-TAG].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import artifacts
import paho.mqtt.client as mqtt
import report
import yaml
from loop_latency import _props, engine_dir
from machine import machine_info
from prometheus_client.parser import text_string_to_metric_families

from rung.daemon.demo.localbroker import LocalBroker, free_port
from rung.daemon.demo.run import _start_plc, _wait_ready

RESULTS = Path(__file__).resolve().parent / "results"
BASE = "v1/bench/plant/line/rung/node1"
SLA = {"p99_ttft_ms": 120.0, "peak_rss_gb": 1.8, "load_ms": 800.0}   # GB = 1e9 bytes
HS = {"req": 100, "req_seq": 101, "done": 112, "err": 113}   # configs/plcs/press1.yaml
LOAD_CHILD = """
import json, sys, time
from rung.engines import engine_options, load_engine
t0 = time.perf_counter()
e = load_engine(sys.argv[1], "onnx", engine_options("onnx", None, int(sys.argv[2]), None,
                int(sys.argv[3]), "auto", 0, int(sys.argv[4])))
ms = (time.perf_counter() - t0) * 1000
p = e.packing
print(json.dumps({"ms": ms, "packed": p.packed, "chosen_by": p.chosen_by, "reason": p.reason}))
"""


def resolve_engine(kind: str, build: bool) -> Path:
    """The engine directory ``--engine`` names (exported or built where allowed)."""
    if kind == "demo":
        return engine_dir(None)
    if kind in ("q05-int4", "q05-int4-default"):
        built = kind.replace("q05-", "rung-")   # bench/artifacts.py's kind
        art = artifacts.locate("qwen2.5-0.5b")
        if not artifacts.is_built(art, built) and not build:
            sys.exit(f"{art.path(built)} is not built: add --build (slow)")
        art, errors = artifacts.ensure("qwen2.5-0.5b", (built,))
        if errors:
            sys.exit(f"building {built} failed: {errors}")
        return art.path(built)
    if kind == "smollm2":
        out = artifacts.cache_root() / "smollm2-135m" / "plant-default"
        if not (out / "manifest.json").is_file():
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.real_checkpoint import gguf_path

            tmp = out.with_name(out.name + ".tmp")
            subprocess.run([sys.executable, "-m", "rung.daemon", "export", str(gguf_path()),
                            "-o", str(tmp)], check=True)
            tmp.rename(out)
        return out
    return Path(kind)


def load_time(engine: Path, args: argparse.Namespace, runs: int = 3) -> dict[str, Any]:
    """``load_engine`` with the daemon's options, each run a fresh process (page cache warm)."""
    out = [json.loads(subprocess.run(
        [sys.executable, "-c", LOAD_CHILD, str(engine), str(args.threads), str(args.max_batch),
         str(args.memory_budget_mb)], capture_output=True, text=True, check=True)
        .stdout.splitlines()[-1]) for _ in range(runs)]
    return {**out[0], "ms": round(statistics.median(r["ms"] for r in out), 1),
            "runs_ms": [round(r["ms"], 1) for r in out]}


def start_plcs(n: int, work: Path) -> tuple[list[Any], list[Path]]:
    """``n`` simulated presses, each with the shipped map under its own id."""
    plcs, maps = [], []
    for i in range(n):
        (work / f"plc{i}").mkdir()
        plc, path = _start_plc(work / f"plc{i}")
        doc = yaml.safe_load(path.read_text())
        doc["id"] = f"press{i + 1}"
        path.write_text(yaml.safe_dump(doc))
        plcs.append(plc)
        maps.append(path)
    return plcs, maps


def start_daemon(work: Path, engine: Path, port: int, metrics_port: int, maps: list[Path],
                 args: argparse.Namespace) -> subprocess.Popen[bytes]:
    cfg = {"engine": {"path": str(engine), "threads": args.threads,
                      "max_batch": args.max_batch, "memory_budget_mb": args.memory_budget_mb},
           "plcs": [str(p) for p in maps],
           "modbus": {"reconnect_min_s": 0.2, "reconnect_max_s": 2.0, "job_timeout_s": 600},
           "mqtt": {"host": "127.0.0.1", "port": port, "base_topic": BASE,
                    "client_id": "rung-plant-load", "reconnect_min_s": 0.2},
           "queue": {"max_pending": 256, "request_timeout_s": 900},
           "metrics": {"port": metrics_port}, "state_dir": str(work / "state"),
           "kv": {"ram_mb": 64, "disk_mb": 0}, "log": {"level": "info"}}
    (work / "rung.yaml").write_text(yaml.safe_dump(cfg))
    with (work / "daemon.log").open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "rung.daemon", "serve", "--config",
                                 str(work / "rung.yaml")], stdout=out, stderr=subprocess.STDOUT)


class Requester:
    """Sends mixed task requests (MQTT v5, QoS 1) and keeps each answer with its times."""

    def __init__(self, port: int, pool: dict[str, list[dict[str, Any]]]) -> None:
        self.pool, self.next = pool, dict.fromkeys(pool, 0)
        self.reply = f"{BASE}/res/load-{uuid.uuid4().hex[:8]}"
        self.sent: dict[str, tuple[str, float]] = {}
        self.got: dict[str, tuple[float, dict[str, Any]]] = {}
        self.cond = threading.Condition()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5,
                             client_id=f"plant-load-{uuid.uuid4().hex[:8]}")
        self.c.on_message = self._on_message
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *_: subscribed.set()
        self.c.connect("127.0.0.1", port, keepalive=60)
        self.c.loop_start()
        self.c.subscribe(self.reply, qos=1)
        if not subscribed.wait(10):
            raise TimeoutError("no SUBACK from the broker")

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        rid = bytes(getattr(msg.properties, "CorrelationData", b"")).decode()
        with self.cond:
            self.got[rid] = (time.perf_counter(), json.loads(msg.payload))
            self.cond.notify_all()

    def send(self, task: str, rid: str) -> None:
        inputs = self.pool[task]
        data, self.next[task] = inputs[self.next[task] % len(inputs)], self.next[task] + 1
        with self.cond:
            self.sent[rid] = (task, time.perf_counter())
        self.c.publish(f"{BASE}/req/{task}", json.dumps({"input": data, "id": rid}), qos=1,
                       properties=_props(self.reply, rid))

    def wait(self, ids: list[str], timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: all(i in self.got for i in ids), timeout)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def plc_loop(plc: Any, rng: random.Random, per_min: float, stop: threading.Event,
             out: list[dict[str, Any]]) -> None:
    """A PLC program: raise ``req`` at Poisson times, wait for ``done``, clear ``req``."""
    while not stop.wait(rng.expovariate(per_min / 60)):
        t0 = time.perf_counter()
        plc.trigger(HS["req"], HS["req_seq"])
        try:
            plc.wait("done", lambda: plc.regs[HS["done"]] == 1, 900)
            out.append({"ms": (time.perf_counter() - t0) * 1000, "err": plc.regs[HS["err"]]})
        finally:
            plc.regs[HS["req"]] = 0
        plc.wait("done cleared", lambda: plc.regs[HS["done"]] == 0, 60)


def sample(metrics_port: int, pid: int, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    """Queue depth and rows in flight from /metrics, the daemon's RSS from /proc, each 0.5 s."""
    t0 = time.perf_counter()
    while not stop.wait(0.5):
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        got = {s.name: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name in ("rung_queue_depth", "rung_inflight")}
        out.append({"t": round(time.perf_counter() - t0, 1), "depth": got.get("rung_queue_depth"),
                    "inflight": got.get("rung_inflight"), "rss_mb": proc_kb(pid, "VmRSS") / 1024})


def summary(ms: list[float]) -> dict[str, Any]:
    """P50/P90/P99 (nearest rank), max and mean of ``ms``, and the values as measured."""
    s = sorted(ms)

    def rank(q: float) -> float:
        return round(s[max(0, math.ceil(q * len(s)) - 1)], 1)

    return {"n": len(s), "p50_ms": rank(0.5), "p90_ms": rank(0.9), "p99_ms": rank(0.99),
            "max_ms": round(s[-1], 1), "mean_ms": round(statistics.fmean(s), 1),
            "values_ms": [round(x, 1) for x in ms]}


def proc_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def run_level(req: Requester, rate: float, args: argparse.Namespace, plcs: list[Any],
              ctx: dict[str, Any]) -> dict[str, Any]:
    """``args.duration`` s of open-loop MQTT requests at ``rate``/min beside the PLCs."""
    rng = random.Random(f"{args.seed}-{rate}")
    tasks, weights = zip(*args.mix.items(), strict=True)
    stop = threading.Event()
    plc_out: list[list[dict[str, Any]]] = [[] for _ in plcs]
    samples: list[dict[str, Any]] = []
    threads = [threading.Thread(target=plc_loop, args=(p, random.Random(f"{args.seed}-plc{i}"),
                                                       args.plc_per_min, stop, plc_out[i]))
               for i, p in enumerate(plcs)]
    threads.append(threading.Thread(target=sample, args=(ctx["metrics_port"], ctx["pid"], stop,
                                                         samples)))
    for t in threads:
        t.start()
    ids: list[str] = []
    t0, at = time.perf_counter(), 0.0
    while (at := at + rng.expovariate(rate / 60)) < args.duration:
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        ids.append(f"r{rate:g}-{len(ids)}")
        req.send(rng.choices(tasks, weights)[0], ids[-1])
    time.sleep(max(0.0, t0 + args.duration - time.perf_counter()))
    req.wait(ids, 900)
    stop.set()
    for t in threads:
        t.join()
    answers = [(req.sent[i], req.got[i]) for i in ids if i in req.got]
    usage = [a[1][1].get("usage") or {} for a in answers]
    pick = {k: [u[k] for u in usage if isinstance(u.get(k), int | float)]
            for k in ("first_token_ms", "ttft_ms", "total_ms")}
    codes: dict[str, int] = {}
    for _, (_, body) in answers:
        code = "ok" if body.get("ok") else (body.get("error") or {}).get("code", "?")
        codes[code] = codes.get(code, 0) + 1
    plc = [r for rs in plc_out for r in rs]
    depth = [s["depth"] for s in samples if s["depth"] is not None]
    return {"rate_per_min": rate, "sent": len(ids), "answered": len(answers), "codes": codes,
            **{k: summary(v) if v else None for k, v in pick.items()},
            "round_trip_ms": summary([(got[0] - sent[1]) * 1000 for sent, got in answers])
            if answers else None,
            "plc": {"triggers": len(plc), "errors": sum(1 for r in plc if r["err"]),
                    "answer_ms": summary([r["ms"] for r in plc]) if plc else None},
            "queue_depth": {"max": max(depth, default=0),
                            "mean": round(statistics.fmean(depth), 2) if depth else 0},
            "samples": samples}


def measure(args: argparse.Namespace, engine: Path, work: Path) -> dict[str, Any]:
    from rung.tools.corpus import generate

    pool = {t: [s["input"] for s in generate(200, seed=args.seed, tasks=(t,))] for t in args.mix}
    broker = LocalBroker(work / "broker")
    broker.start()
    plcs, maps = start_plcs(args.plcs, work)
    metrics_port = free_port()
    proc = start_daemon(work, engine, broker.port, metrics_port, maps, args)
    out: dict[str, Any] = {"levels": []}
    try:
        _wait_ready(proc, work / "daemon.log", 300)
        req = Requester(broker.port, pool)
        warm = [f"warm-{t}" for t in args.mix]
        for rid, task in zip(warm, args.mix, strict=True):
            req.send(task, rid)
        req.wait(warm, 600)
        ctx = {"metrics_port": metrics_port, "pid": proc.pid}
        for rate in args.rates:
            level = run_level(req, rate, args, plcs, ctx)
            out["levels"].append(level)
            print(f"{rate:g}/min: {fmt(level)}", file=sys.stderr, flush=True)
            if len(args.rates) > 1 and p99(level) > SLA["p99_ttft_ms"]:
                break
        req.close()
        out["peak_rss_mb"] = proc_kb(proc.pid, "VmHWM") / 1024
        for line in (work / "daemon.log").read_text(errors="replace").splitlines():
            if '"msg": "engine loaded"' in line:
                out["daemon_engine_loaded"] = json.loads(line)
    finally:
        proc.terminate()
        proc.wait(120)
        broker.stop()
        for plc in plcs:
            plc.close()
    return out


def p99(level: dict[str, Any]) -> float:
    s = level.get("first_token_ms")
    return math.inf if s is None else float(s["p99_ms"])


def fmt(level: dict[str, Any]) -> str:
    f, e = level["first_token_ms"] or {}, level["ttft_ms"] or {}
    return (f"TTFT P50 {f.get('p50_ms')} / P99 {f.get('p99_ms')} ms (engine P99 "
            f"{e.get('p99_ms')} ms), {level['answered']}/{level['sent']} answered "
            f"{level['codes']}, queue max {level['queue_depth']['max']}, PLC triggers "
            f"{level['plc']['triggers']}")


def markdown(rec: dict[str, Any]) -> list[str]:
    r, m, c, v = rec["results"], rec["machine"], rec["config"], rec["verdict"]
    lines = [f"# Plant load against the seed SLAs ({rec['stamp']})", "", f"`{rec['command']}`",
             "", f"{m['cpu_model']} ({', '.join(m['simd'])}), {m['cpus_usable']} usable cores; "
             f"engine `{c['engine']}` ({rec['load']['reason']}), max_batch {c['max_batch']}, "
             f"threads {c['threads'] or 'default'}; {c['plcs']} PLC(s) at {c['plc_per_min']}"
             f"/min each; mix {c['mix']}; {c['duration_s']} s per load level.", "",
             "| MQTT req/min | answered | TTFT P50 ms | TTFT P99 ms | engine TTFT P99 ms | "
             "answer P50 ms | answer P99 ms | queue max / mean | PLC answer P50 / P99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for lv in r["levels"]:
        f, e, t = (lv[k] or {} for k in ("first_token_ms", "ttft_ms", "total_ms"))
        p = lv["plc"]["answer_ms"] or {}
        lines.append(f"| {lv['rate_per_min']:g} | {lv['answered']}/{lv['sent']} | "
                     f"{f.get('p50_ms')} | {f.get('p99_ms')} | {e.get('p99_ms')} | "
                     f"{t.get('p50_ms')} | {t.get('p99_ms')} | {lv['queue_depth']['max']} / "
                     f"{lv['queue_depth']['mean']} | {p.get('p50_ms')} / {p.get('p99_ms')} |")
    lines += ["", f"- P99 TTFT <= {SLA['p99_ttft_ms']:g} ms: {v['ttft']}",
              f"- peak RSS {r['peak_rss_mb'] / 1024:.2f} GiB "
              f"({r['peak_rss_mb'] * 2**20 / 1e9:.2f} GB) <= {SLA['peak_rss_gb']} GB: {v['rss']}",
              f"- engine load {rec['load']['ms']} ms (median of {rec['load']['runs_ms']}) <= "
              f"{SLA['load_ms']:g} ms: {v['load']}; the daemon's `engine loaded` (with "
              f"tokenizer and tasks): {r.get('daemon_engine_loaded', {}).get('ms')} ms"]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="demo",
                    help="demo | smollm2 | q05-int4 | q05-int4-default | a directory")
    ap.add_argument("--build", action="store_true",
                    help="build a missing q05-int4 / q05-int4-default engine")
    ap.add_argument("--plcs", type=int, help="simulated PLCs (2; --quick 1)")
    ap.add_argument("--plc-per-min", type=float, default=1.0, help="triggers per PLC a minute")
    ap.add_argument("--rate", type=float, default=12.0, help="MQTT requests a minute")
    ap.add_argument("--sweep", help="MQTT rates a minute in turn, e.g. 6,12,24,48,96")
    ap.add_argument("--duration", type=float, help="seconds per load level (240; --quick 40)")
    ap.add_argument("--mix", default="diagnosis=50,st_code=30,fault_tree=20")
    ap.add_argument("--max-batch", type=int, default=1, help="engine.max_batch")
    ap.add_argument("--threads", type=int, default=0, help="engine.threads")
    ap.add_argument("--memory-budget-mb", type=int, default=4096, help="engine.memory_budget_mb")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1 PLC, 40 s: a one-minute check "
                    "(explicit options still win)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.plcs = (1 if args.quick else 2) if args.plcs is None else args.plcs
    args.duration = (40.0 if args.quick else 240.0) if args.duration is None else args.duration
    args.mix = {k: float(v) for k, v in (p.split("=") for p in args.mix.split(","))}
    args.rates = [float(x) for x in args.sweep.split(",")] if args.sweep else [args.rate]
    engine = resolve_engine(args.engine, args.build)
    load = load_time(engine, args)
    with tempfile.TemporaryDirectory(prefix="rung-plant-") as tmp:
        results = measure(args, engine, Path(tmp))
    crossed = next((lv["rate_per_min"] for lv in results["levels"]
                    if p99(lv) > SLA["p99_ttft_ms"]), None)
    verdict = {"ttft": "met at every level" if crossed is None else
               f"crossed at {crossed:g} MQTT requests/min",
               "rss": "met" if results["peak_rss_mb"] * 2**20 <= SLA["peak_rss_gb"] * 1e9
               else "missed",
               "load": "met" if load["ms"] <= SLA["load_ms"] else "missed",
               "ttft_crossed_at_per_min": crossed}
    stamp = time.strftime("%Y-%m-%d") + "-plant-load" + (f"-{args.tag}" if args.tag else "")
    rec = {"stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
           "machine": machine_info(), "sla": SLA, "load": load, "verdict": verdict,
           "config": {"engine": str(engine), "plcs": args.plcs, "plc_per_min": args.plc_per_min,
                      "rates_per_min": args.rates, "duration_s": args.duration,
                      "mix": args.mix, "max_batch": args.max_batch, "threads": args.threads,
                      "memory_budget_mb": args.memory_budget_mb, "seed": args.seed},
           "results": results}
    report.publish(args.out, rec, markdown(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
