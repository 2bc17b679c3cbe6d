"""``rung demo``: the main job on embedded defaults, on this machine.

Exports the shipped demo model (``models/edge-tiny``, trained by rung) with ``rung
export``'s defaults (fp16 KV on the fused graph; its trained FFN gates kept, measured: the
model without them answers otherwise and worse, docs/benchmarks/ffn-and-defaults.md,
"Defaults measured") once into the cache directory, starts a private mosquitto on a free
loopback port and ``rung serve`` on it, and sends held-out requests of each built-in task
over MQTT: a Structured Text POU (rendered, parsed, identifiers checked), a fault tree (cut sets and
top-event probability) and a diagnosis. It prints the validated replies and the daemon's
metrics. A simulated PLC (a pymodbus server with a press's register map) then raises a
diagnosis request over the Modbus handshake, and a second one (an asyncua server with a
mixer's node map) over OPC UA; the demo shows the snapshots, the diagnoses published on MQTT
and the result codes written back. Then SIGTERM stops the daemon. The
model and the register map are package data (``rung.models``, ``rung.configs``), in a
checkout and in a wheel alike; where the model is missing, a small random-weight model
stands in and the text is noise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from rung.engines.errors import RungError

# package data, a folder on disk in a checkout and in an installed wheel alike
SHIPPED = Path(str(resources.files("rung.models") / "edge-tiny"))
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("st_code", {"description": "Write a function block for a conveyor motor: start and "
                                "stop push buttons, an emergency stop interlock and an "
                                "overload trip that latches until reset.",
                 "pou_type": "FUNCTION_BLOCK"}),
    ("fault_tree", {"top_event": "Hydraulic unit loses system pressure",
                    "system": "Hydraulic power unit of press 1, line 3",
                    "points": [{"name": "oil_temp", "value": 82.5, "unit": "degC"},
                               {"name": "pressure", "value": 61.0, "unit": "bar"},
                               {"name": "pump_current", "value": 14.2, "unit": "A"}]}),
    ("diagnosis", {"asset": "Centrifugal pump P-101",
                   "points": [{"name": "bearing_temp", "value": 78.0, "unit": "degC",
                               "limits": {"alert": 70, "alarm": 85}},
                              {"name": "vibration_rms", "value": 7.4, "unit": "mm/s",
                               "limits": {"alert": 4.5, "alarm": 7.1}},
                              {"name": "flow", "value": 41.0, "unit": "m3/h",
                               "limits": {"low_alert": 35, "low_alarm": 25}}]}),
]


ATTEMPTS = 5
BASE = "v1/demo/plant1/press-line/rung/node1"


def _requests() -> dict[str, list[dict[str, Any]]]:
    """Per task, held-out instructions from the corpus generator (a seed training never
    used: the demo model knows these plants' point names), else the hand-written one."""
    try:
        from rung.tools.corpus import generate
    except ModuleNotFoundError as e:   # the corpus generator is not installed (a wheel)
        if e.name not in ("rung.tools", "rung.tools.corpus"):
            raise   # a module the generator needs: a broken install, said as it is
        return {task: [data] for task, data in REQUESTS}
    picked: dict[str, list[dict[str, Any]]] = {task: [] for task, _ in REQUESTS}
    for sample in generate(3 * ATTEMPTS, seed=4242):
        picked[sample["task"]].append(sample["input"])
    return picked


def cache_dir() -> Path:
    root = os.environ.get("RUNG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rung")
    return Path(root)


def _engine_dir() -> tuple[Path, str]:
    """Export (once) the shipped model, or a random stand-in; returns (dir, what)."""
    try:
        from rung.export.exporter import ExportOptions, export
        from rung.export.presets import make_random_checkpoint
    except ImportError as e:
        raise RungError(f"the demo exports its model with the [export] extra ({e.name} is "
                        "missing)", "run `make demo`, or pip install 'rung[export]'") from e
    from rung.engines.errors import ManifestError
    from rung.engines.manifest import FORMAT_VERSION, load_manifest, sha256_file
    from rung.export.exporter import RUNG_VERSION

    if (SHIPPED / "model.safetensors").is_file():
        # one export per model content, rung version and export defaults: a retrained
        # model, a new exporter or changed defaults get a fresh engine, never a stale one
        defaults = hashlib.sha256(repr(ExportOptions()).encode()).hexdigest()[:8]
        key = f"{sha256_file(SHIPPED / 'model.safetensors')[:12]}-{defaults}"
        engine = cache_dir() / "edge-tiny" / f"{key}-v{RUNG_VERSION}-f{FORMAT_VERSION}"
        try:
            load_manifest(engine)
        except ManifestError:
            export(SHIPPED, engine, ExportOptions())   # the defaults, as `rung export`
        return engine, f"shipped demo model {SHIPPED}"
    ckpt, engine = cache_dir() / "demo-tiny" / "hf", cache_dir() / "demo-tiny" / "engine"
    if not (ckpt / "model.safetensors").is_file():
        make_random_checkpoint("demo-tiny", ckpt, seed=0, std=0.2)
    try:
        load_manifest(engine)
    except ManifestError:
        export(ckpt, engine, ExportOptions(max_seq=1024))
    return engine, "random-weight stand-in (no models/edge-tiny here): answers are noise"


def _summary(task: str, output: Any, validation: dict[str, Any]) -> str:
    if task == "st_code":
        return str(validation.get("pou_text", ""))
    if task == "fault_tree":
        ft = validation.get("fault_tree") or {}
        return (json.dumps(output, indent=2, ensure_ascii=False) + f"\ntop event "
                f"{output.get('top')}: P = {ft.get('top_probability')}; minimal cut sets: "
                f"{ft.get('minimal_cut_sets')}")
    return json.dumps(output, indent=2, ensure_ascii=False)


def _write_config(work: Path, engine_dir: Path, port: int, metrics_port: int,
                  plc_map: Path, *more_maps: Path) -> Path:
    import yaml

    cfg = {"engine": {"path": str(engine_dir)}, "plcs": [str(plc_map), *map(str, more_maps)],
           "modbus": {"reconnect_min_s": 0.2, "reconnect_max_s": 2.0},
           "mqtt": {"host": "127.0.0.1", "port": port, "base_topic": BASE,
                    "client_id": "rung-demo", "reconnect_min_s": 0.2},
           "queue": {"max_pending": 32},
           "metrics": {"port": metrics_port},
           "state_dir": str(cache_dir() / "demo-state"),
           "kv": {"ram_mb": 64, "disk_mb": 256}}
    path = work / "rung.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if '"msg": "ready"' in line:
                return
        if proc.poll() is not None:
            raise RungError(f"rung serve exited with {proc.returncode}: "
                            f"{log.read_text(errors='replace')[-1500:]}")
        time.sleep(0.1)
    raise RungError(f"rung serve was not ready in {timeout:.0f} s (log: {log})")


async def _ask_all(cfg: Any, inputs: dict[str, list[dict[str, Any]]],
                   max_tokens: int | None) -> dict[str, list[dict[str, Any]]]:
    from rung.daemon.mqtt.ask import ask

    jobs = [(task, ask(cfg.mqtt, task, data, 600.0, max_tokens=max_tokens))
            for task, datas in inputs.items() for data in datas]
    replies = await asyncio.gather(*(job for _, job in jobs))
    out: dict[str, list[dict[str, Any]]] = {task: [] for task in inputs}
    for (task, _), reply in zip(jobs, replies, strict=True):
        out[task].append(reply)
    return out


def _verdict(answer: dict[str, Any]) -> str:
    """How the demo states one answer from a PLC's request: every check a plant engineer
    would apply passed (the checks gate: an answer that fails one is retried, then refused)."""
    if answer.get("ok"):
        return "right (every check passed)"
    return f"not valid: {answer.get('error')}"


def _show(task: str, inputs: list[dict[str, Any]], replies: list[dict[str, Any]]) -> None:
    from rung.daemon.tasks.quality import Tally, judge
    from rung.daemon.tasks.task import load_tasks

    shown = next((r for r in replies if r.get("ok")), replies[0])
    data = inputs[replies.index(shown)]
    print(f"\n=== {task}: {next(iter(data.values()))}")
    if shown.get("ok"):
        print(_summary(task, shown["output"], shown["validation"]))
        print("--- right (every check passed)")
    else:
        err = shown.get("error") or {}
        print(f"--- not valid: {err.get('code')}: {err.get('message')}")
    tally, kind = Tally(), load_tasks()[task].kind   # the demo serves the built-in tasks
    for r in replies:
        tally.add(task, judge(kind, r.get("validation"),
                              error=(r.get("error") or {}).get("message")))
    print(f"--- held-out {task} instructions: {tally.right[task]} of {len(replies)} answers "
          f"right (every check passed), {tally.valid[task]} of {len(replies)} valid")
    usage = shown.get("usage")
    if usage:
        print(f"    {usage['prompt_tokens']} prompt tokens ({usage['cached_tokens']} from the "
              f"KV cache) + {usage['completion_tokens']} answer tokens, ttft "
              f"{usage['ttft_ms']:.0f} ms, total {usage['total_ms']:.0f} ms", file=sys.stderr)


def _metrics(port: int) -> str:
    import urllib.request

    from rung.daemon.metrics import summarize_text

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        summary = summarize_text(resp.read().decode())
    lines = ["\n=== metrics (from the daemon's /metrics endpoint)"]
    for task, t in sorted(summary["tasks"].items()):
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(t["outcomes"].items()))
        ttft = f"{t['mean_ttft_s'] * 1000:.0f} ms" if t["mean_ttft_s"] is not None else "-"
        total = f"{t['mean_request_s']:.2f} s" if t["mean_request_s"] is not None else "-"
        lines.append(f"  {task:<11} {t['requests']} requests ({outcomes}); mean ttft {ttft}, "
                     f"mean total {total}; {t['completion_tokens']} tokens generated, "
                     f"{t['cached_tokens']} prompt tokens from the KV cache")
    lines.append(f"  queue depth {summary['queue_depth']}, mqtt reconnects "
                 f"{summary['mqtt_reconnects']}, journal pending {summary['journal_pending']}")
    return "\n".join(lines)


def _start_plc(work: Path) -> tuple[Any, Path]:
    """The simulated press PLC (a pymodbus server) with a plant snapshot in its registers,
    and its register map (configs/plcs/press1.yaml, pointed at the simulator)."""
    import yaml

    from rung.daemon.demo.plcsim import SimPlcThread
    from rung.daemon.modbus.regmap import encode_words

    source = resources.files("rung.configs") / "plcs" / "press1.yaml"
    plc = SimPlcThread()
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    doc["transport"]["port"] = plc.sim.port
    doc["handshake"]["poll_s"] = 0.1
    path = work / "press1.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    plc.regs[200] = 862                                   # oil_temp 86.2 degC: alarm
    plc.regs[201] = 4480                                  # motor_current 44.8 A: alert
    plc.regs[202:204] = encode_words(11873, "uint32")     # running_hours
    plc.regs[210] = 2100                                  # setpoint 210.0 bar
    plc.sim.input[10:12] = encode_words(94.0, "float32", "CDAB")   # pressure: low alert
    plc.sim.input[12:14] = encode_words(3.2, "float32", "ABCD")    # vibration
    plc.sim.coil[5] = True
    plc.sim.discrete[0] = True
    return plc, path


async def _watch(cfg: Any, topic: str, started: asyncio.Event,
                 timeout: float = 600) -> dict[str, Any]:
    import aiomqtt

    from rung.daemon.mqtt.link import connect_args

    async with aiomqtt.Client(**connect_args(cfg.mqtt), identifier="rung-demo-watch") as c:
        await c.subscribe(topic, qos=1)
        started.set()
        async with asyncio.timeout(timeout):
            async for message in c.messages:
                if isinstance(message.payload, bytes):
                    doc: dict[str, Any] = json.loads(message.payload)
                    return doc
    raise RungError(f"no message on {topic}")


def _plc_round(cfg: Any, plc: Any) -> None:
    """The PLC raises a request; rung diagnoses; the PLC reads the answer and clears."""
    hs = {"req": 100, "req_seq": 101, "ack_seq": 110, "busy": 111, "done": 112, "err": 113,
          "result": 114, "heartbeat": 115}

    async def round_trip() -> dict[str, Any]:
        started = asyncio.Event()
        watch = asyncio.ensure_future(_watch(cfg, f"{BASE}/diag/press1/event", started))
        await started.wait()
        seq = plc.trigger(hs["req"], hs["req_seq"])
        print(f"\n=== PLC press1 raises request {seq} (holding 100 req = 1, 101 req_seq = "
              f"{seq}) over Modbus TCP", file=sys.stderr)
        await asyncio.to_thread(plc.wait, "ack", lambda: plc.regs[hs["ack_seq"]] == seq)
        print(f"    rung acknowledged: ack_seq = {seq}, busy = {plc.regs[hs['busy']]}",
              file=sys.stderr)
        return await watch

    from rung.daemon.modbus.agent import ERR_CODES

    event = asyncio.run(round_trip())
    plc.wait("done", lambda: plc.regs[hs["done"]] == 1, 600)
    err, result = plc.regs[hs["err"]], plc.regs[hs["result"]]
    print(f"\n=== press1: diagnosis triggered by the PLC (request {event['req_seq']})")
    print(f"    trigger to answer {event['ms']} ms", file=sys.stderr)
    print("snapshot read over Modbus: " + ", ".join(
        f"{k} = {v}" for k, v in event["snapshot"].items()))
    diag = event.get("diagnosis") or {}
    if diag.get("output") is not None:
        print(json.dumps(diag["output"], indent=2, ensure_ascii=False))
    print(f"--- {_verdict(diag)}")
    ft = event.get("fault_tree")
    if ft is not None:
        print(f"--- fault tree: {'right' if ft.get('ok') else 'not valid'}"
              + (f", top event P = {ft['validation']['fault_tree'].get('top_probability')}"
                 if ft.get("ok") else f" ({(ft.get('error') or {}).get('message')})"))
    print(f"--- handed back to the PLC: err = {err} ({ERR_CODES.get(err, '?')}), result = "
          f"{result} (advisory priority), done = 1, busy = {plc.regs[hs['busy']]}")
    plc.regs[hs["req"]] = 0
    plc.wait("done cleared", lambda: plc.regs[hs["done"]] == 0, 30)
    print(f"    PLC cleared req, rung cleared done; heartbeat at {plc.regs[hs['heartbeat']]}",
          file=sys.stderr)


def _start_opc_plc(work: Path) -> tuple[Any, Path]:
    """The second simulated PLC, a mixer over OPC UA (an asyncua server), and its node map
    (configs/plcs/mixer2-opcua.yaml, pointed at the simulator)."""
    import yaml

    from rung.daemon.demo.opcsim import SimOpcPlcThread

    source = resources.files("rung.configs") / "plcs" / "mixer2-opcua.yaml"
    plc = SimOpcPlcThread()
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    doc["server"]["endpoint"] = plc.sim.endpoint
    path = work / "mixer2-opcua.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return plc, path


def _opc_round(cfg: Any, plc: Any) -> None:
    """The OPC UA PLC raises a request (rung sees it through its subscription)."""
    async def round_trip() -> dict[str, Any]:
        started = asyncio.Event()
        watch = asyncio.ensure_future(_watch(cfg, f"{BASE}/diag/mixer2/event", started))
        await started.wait()
        seq = await asyncio.to_thread(plc.trigger)
        print(f"\n=== PLC mixer2 raises request {seq} over OPC UA (Mixer2.Rung.req = 1, "
              f"req_seq = {seq}; {plc.sim.endpoint})", file=sys.stderr)
        return await watch

    from rung.daemon.modbus.agent import ERR_CODES

    event = asyncio.run(round_trip())
    plc.wait("done", lambda: plc.get("done") is True, 600)
    err, result = plc.get("err"), plc.get("result")
    print(f"\n=== mixer2: diagnosis triggered over OPC UA (request {event['req_seq']})")
    print("snapshot read in one OPC UA Read: " + ", ".join(
        f"{k} = {v}" for k, v in event["snapshot"].items()))
    diag = event.get("diagnosis") or {}
    if diag.get("output") is not None:
        print(json.dumps(diag["output"], indent=2, ensure_ascii=False))
    print(f"--- {_verdict(diag)}")
    print(f"--- handed back to the PLC: err = {err} ({ERR_CODES.get(err, '?')}), result = "
          f"{result}, done = TRUE, busy = {plc.get('busy')}")
    plc.set("req", 0)
    plc.wait("done cleared", lambda: plc.get("done") is False, 30)


def run(max_tokens: int | None = None) -> int:
    """The whole loop on this machine: a private mosquitto, ``rung serve`` on the demo
    model, requests over MQTT through ``rung ask``'s client, the validated answers and the
    daemon's metrics; then SIGTERM and the retained offline status. 0 unless something
    failed outside the model's answers."""
    from rung.daemon.config import load_config
    from rung.daemon.demo.localbroker import LocalBroker, free_port
    from rung.engines.manifest import load_manifest

    engine_dir, what = _engine_dir()
    m = load_manifest(engine_dir)
    print(f"rung demo: {what}\n  {m.dims.hf_architecture}, {m.dims.num_layers} layers, "
          f"{m.weights} weights, KV {m.kv.dtype} {m.kv.bytes_per_token(m.dims)} bytes/token, "
          f"FFN gates {'on' if m.ffn_gate else 'off'}", file=sys.stderr)
    if m.parity is not None:
        print(f"  export verified: max logit error {m.parity.max_abs_logit_diff:.1e}, greedy "
              f"agreement {m.parity.greedy_agreement:.2f}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="rung-demo-") as tmp:
        work = Path(tmp)
        broker = LocalBroker(work / "broker")
        broker.start()
        plc, plc_map = _start_plc(work)
        opc_plc, node_map = _start_opc_plc(work)
        metrics_port = free_port()
        config = _write_config(work, engine_dir, broker.port, metrics_port, plc_map, node_map)
        log = work / "rung.log"
        print(f"  mosquitto on 127.0.0.1:{broker.port}; simulated PLC press1 (Modbus TCP) on "
              f"127.0.0.1:{plc.sim.port}; simulated PLC mixer2 (OPC UA) at "
              f"{opc_plc.sim.endpoint}; rung serve --config {config}", file=sys.stderr)
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "rung.daemon", "serve",
                                     "--config", str(config)], stdout=out,
                                    stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, log)
            print(f"  daemon ready; requests go to {BASE}/req/<task>", file=sys.stderr)
            inputs = _requests()
            cfg = load_config(config)
            replies = asyncio.run(_ask_all(cfg, inputs, max_tokens))
            for task, task_inputs in inputs.items():
                _show(task, task_inputs, replies[task])
            _plc_round(cfg, plc)
            _opc_round(cfg, opc_plc)
            print(_metrics(metrics_port), file=sys.stderr)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
            print(f"  rung serve stopped on SIGTERM (exit {code})", file=sys.stderr)
            return 0 if code == 0 else 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            broker.stop()
            plc.close()
            opc_plc.close()
