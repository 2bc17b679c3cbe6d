"""A Sparkplug host for the tests: a paho client on ``spBv1.0/#`` that decodes every payload,
sends NCMD rebirths, and a TCP relay that cuts the edge node's connection without a
DISCONNECT (the broker then publishes its Will)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from rung.daemon.sparkplug.pb import DataType, Payload


@dataclass
class Seen:
    topic: str
    kind: str  # NBIRTH, DBIRTH, DDATA, ...
    payload: Any  # the decoded Payload
    qos: int
    retain: bool

    @property
    def seq(self) -> int | None:
        return int(self.payload.seq) if self.payload.HasField("seq") else None

    def metrics(self) -> dict[str, Any]:
        """name -> value (None for null)."""
        out = {}
        for m in self.payload.metrics:
            which = m.WhichOneof("value")
            out[m.name] = None if m.is_null or which is None else getattr(m, which)
        return out

    def datatypes(self) -> dict[str, int]:
        return {m.name: m.datatype for m in self.payload.metrics}


class Host:
    """Collects every Sparkplug message (decoded) in arrival order."""

    def __init__(self, port: int) -> None:
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"host-{uuid.uuid4().hex[:8]}",
                                  protocol=mqtt.MQTTv5)
        ready = threading.Event()
        self.client.on_subscribe = lambda *_: ready.set()
        # no local: the host's own NCMD are not what the node sent
        self.client.on_connect = lambda c, *_: c.subscribe(
            "spBv1.0/#", options=SubscribeOptions(qos=1, noLocal=True))
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not ready.wait(10):
            raise TimeoutError("host did not subscribe")

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        kind = msg.topic.split("/")[2]
        payload = Payload.FromString(msg.payload) if kind != "STATE" else msg.payload
        with self.lock:
            self.seen.append(Seen(msg.topic, kind, payload, msg.qos, bool(msg.retain)))

    def since(self, start: int = 0) -> list[Seen]:
        with self.lock:
            return list(self.seen[start:])

    def wait(self, what: str, cond: Callable[[list[Seen]], bool], start: int = 0,
             timeout: float = 15) -> list[Seen]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.since(start)
            if cond(got):
                return got
            time.sleep(0.02)
        raise TimeoutError(f"{what}: saw {[(s.kind, s.seq) for s in self.since(start)]}")

    def wait_kinds(self, kinds: list[str], start: int = 0, timeout: float = 15) -> list[Seen]:
        """The first ``len(kinds)`` messages from ``start``, which must be of those kinds."""
        got = self.wait(f"{kinds}", lambda s: len(s) >= len(kinds), start, timeout)
        assert [s.kind for s in got[:len(kinds)]] == kinds, [(s.kind, s.seq) for s in got]
        return got[:len(kinds)]

    def command(self, topic: str, rebirth: bool) -> None:
        """An NCMD ``Node Control/Rebirth`` (QoS 0, not retained, no seq)."""
        p = Payload(timestamp=int(time.time() * 1000))
        p.metrics.add(name="Node Control/Rebirth", datatype=DataType.BOOLEAN,
                      boolean_value=rebirth)
        self.client.publish(topic, p.SerializeToString(), qos=0).wait_for_publish(5)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Relay:
    """TCP relay to the broker; ``cut()`` aborts every relayed connection (RST, no MQTT
    DISCONNECT), new connections are relayed again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.handlers.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.links.append((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()

    def cut(self) -> None:
        for down, up in self.links:
            up.transport.abort()
            down.transport.abort()
        self.links.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await asyncio.gather(*self.handlers, return_exceptions=True)
            await self.server.wait_closed()
