"""The real parts for daemon tests: a private mosquitto on a free loopback port, ``rung
serve`` as a child process, and a paho requester that collects replies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rung.daemon.demo.localbroker import LocalBroker

BASE = "v1/test/plant/line/rung/node1"


Broker = LocalBroker


def write_config(root: Path, engine_dir: Path, port: int, **sections: Any) -> Path:
    cfg: dict[str, Any] = {
        "engine": {"path": str(engine_dir), "threads": 1},
        "mqtt": {"host": "127.0.0.1", "port": port, "base_topic": BASE,
                 "client_id": f"rung-test-{uuid.uuid4().hex[:8]}", "reconnect_min_s": 0.2,
                 "reconnect_max_s": 1.0},
        "queue": {"max_pending": 8, "request_timeout_s": 120},
        "state_dir": str(root / "state"),
        "kv": {"ram_mb": 32, "disk_mb": 64},
        "log": {"level": "info"},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(name, {}).update(values)
        else:
            cfg[name] = values
    path = root / "rung.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Daemon:
    """``rung serve --config`` as a child process; its JSON log lines in ``root/daemon.log``."""

    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log_path = config.parent / "daemon.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: bool = True, timeout: float = 90) -> None:
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rung.daemon", "serve", "--config", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        if wait_ready:
            self.wait_log("ready", timeout)

    def lines(self) -> list[dict[str, Any]]:
        out = []
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        for line in text[self._offset:].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"msg": line})
        return out

    def wait_log(self, msg: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.lines():
                if rec.get("msg") == msg:
                    return rec
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"rung serve exited {self.proc.returncode}: "
                                   f"{self.tail()}")
            time.sleep(0.05)
        raise TimeoutError(f"no {msg!r} log line in {timeout} s: {self.tail()}")

    def tail(self) -> str:
        return "\n".join(json.dumps(r) for r in self.lines()[-20:])

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Reply:
    topic: str
    body: dict[str, Any]
    correlation: bytes | None


class Requester:
    """A paho client that sends requests and collects every reply under ``{base}/res/#``
    and its own reply topic."""

    def __init__(self, port: int, v5: bool = True, persistent: bool = False,
                 client_id: str | None = None, topics: tuple[str, ...] = (),
                 no_delay: bool = False) -> None:
        self.topics = topics
        self.v5 = v5
        self.replies: list[Reply] = []
        self.lock = threading.Lock()
        self.reply_topic = f"{BASE}/res/t-{uuid.uuid4().hex[:8]}"
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id or f"req-{uuid.uuid4().hex[:8]}",
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  clean_session=None if v5 else not persistent)
        self.client.on_message = self._on_message
        self.subscribed = threading.Event()
        self.client.on_connect = self._on_connect
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600 if persistent else 0
        self.client.connect("127.0.0.1", port, keepalive=30,
                            clean_start=not persistent if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                            properties=props)
        if no_delay:   # as a latency-minded client would
            import socket

            sock = self.client.socket()
            assert isinstance(sock, socket.socket)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.loop_start()
        if not self.subscribed.wait(10):
            raise TimeoutError("requester did not connect")

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        client.subscribe([(f"{BASE}/res/#", 1), (f"{BASE}/status", 1),
                          *((t, 1) for t in self.topics)])
        time.sleep(0.05)
        self.subscribed.set()

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == f"{BASE}/status":
            return
        corr = getattr(msg.properties, "CorrelationData", None) if self.v5 else None
        try:
            body = json.loads(msg.payload)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {"unparseable": msg.payload.decode("latin-1")}
        with self.lock:
            self.replies.append(Reply(msg.topic, body, corr))

    def send(self, task: str, body: dict[str, Any] | bytes, correlation: str | None = None,
             response_topic: str | None = None, expiry: int | None = None,
             topic: str | None = None, retain: bool = False, wait: bool = True) -> None:
        props = None
        if self.v5:
            props = Properties(PacketTypes.PUBLISH)
            if correlation is not None:
                props.CorrelationData = correlation.encode()
            if response_topic is not None:
                props.ResponseTopic = response_topic
            if expiry is not None:
                props.MessageExpiryInterval = expiry
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        info = self.client.publish(topic or f"{BASE}/req/{task}", payload, qos=1,
                                   retain=retain, properties=props)
        if wait:   # else a burst: publishes go out back to back, acknowledged later
            info.wait_for_publish(10)

    def wait(self, n: int, timeout: float = 120) -> list[Reply]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.replies) >= n:
                    return list(self.replies)
            time.sleep(0.05)
        with self.lock:
            raise TimeoutError(f"{len(self.replies)} of {n} replies in {timeout} s")

    def wait_settled(self, n: int, timeout: float = 120) -> list[Reply]:
        """At least ``n`` replies, then everything rung sends before the answer to a
        request published after them (a duplicate answer would be among it)."""
        self.wait(n, timeout)
        return self.fence(timeout)

    def fence(self, timeout: float = 60) -> list[Reply]:
        """All replies rung sends before it answers a request published now: rung takes
        requests in order and publishes answers in the order it recorded them (retained
        replays and redeliveries included), so once the fence's own answer is here,
        nothing that came before it is still on its way. The fence's answer is not kept."""
        fid = f"fence-{uuid.uuid4().hex[:8]}"
        self.send("st_code", {"id": fid, "input": {}, "fence": True})   # refused at once
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if any(r.body.get("id") == fid for r in self.replies):
                    self.replies = [r for r in self.replies if r.body.get("id") != fid]
                    return list(self.replies)
            time.sleep(0.01)
        raise TimeoutError(f"no answer to the fence request in {timeout} s")

    def snapshot(self) -> list[Reply]:
        """The replies so far."""
        with self.lock:
            return list(self.replies)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def retained_status(port: int, timeout: float = 5) -> dict[str, Any] | None:
    got: list[dict[str, Any]] = []
    done = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"st-{uuid.uuid4().hex[:8]}")

    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        got.append(json.loads(msg.payload))
        done.set()

    c.on_message = on_message
    c.on_connect = lambda client, *_: client.subscribe(f"{BASE}/status", 1)
    c.connect("127.0.0.1", port)
    c.loop_start()
    done.wait(timeout)
    c.disconnect()
    c.loop_stop()
    return got[0] if got else None
