"""The MQTT connection of rung's Sparkplug B edge node (``daemon/sparkplug/node.py``).

Sparkplug needs a connection of its own beside the request link (``daemon/mqtt/link.py``): a
clean session (v5: clean start, session expiry 0; 3.1.1: clean session), and its own Will,
the NDEATH with a new bdSeq on every CONNECT, where the request link keeps a persistent
session and has ``{base}/status`` as its Will. Same broker settings (``connect_args``),
another client id.

:class:`SparkplugLink` connects, subscribes, publishes the births, answers NCMD rebirths and
the primary host's STATE, and publishes what :meth:`diagnosis` and :meth:`plc_link` produce,
in order, from one writer; it reconnects with backoff until :meth:`stop`, which publishes
the NDEATH before a clean DISCONNECT. The reconnect loop is the request link's
(``link.keep_connected``: ``mqtt.reconnect_min_s`` doubling to ``mqtt.reconnect_max_s``);
what is Sparkplug's own is the client (clean session, the NDEATH Will with the next bdSeq,
made anew for every CONNECT) and the session (births, commands, NDEATH). A bug in the
session is not caught there: it ends :meth:`run` for its supervisor to restart.

**Inbound size.** Anyone who may publish on the NCMD or STATE topic can send a payload of
any size (mosquitto's default ``max_packet_size`` is the MQTT maximum, 256 MiB). A message
over ``mqtt.max_payload_bytes`` (default 64 KiB; a rebirth command is ~50 bytes) is refused
before it is parsed (counted in :attr:`SparkplugLink.oversize`, logged for the 1st, 10th,
100th, ... of each kind); what passes is decoded in a worker thread, so the event loop never
waits on protobuf or JSON. Under MQTT 5 the CONNECT also says Maximum Packet Size (the
limit plus room for the topic and properties): the broker then drops a larger message for
this client without sending it, so it never reaches this process's memory. MQTT 3.1.1 has
no such field: paho reads the whole packet before the check refuses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiomqtt
import paho.mqtt.client as paho_mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rung.daemon.config import MQTTConfig
from rung.daemon.mqtt.link import connect_args, keep_connected, no_delay
from rung.daemon.mqtt.oversize import Oversize
from rung.daemon.sparkplug.node import NAMESPACE, EdgeNode, Message

__all__ = ["SparkplugLink"]

log = logging.getLogger("rung.sparkplug")

# Maximum Packet Size (MQTT 5) = the payload limit + this: a topic (at most 65,535 bytes
# and its length), the fixed header and a few properties
PACKET_ROOM = 65536 + 1024
MQTT_MAX_PACKET = 268435455


def maximum_packet_size(max_payload_bytes: int) -> int:
    """The MQTT 5 CONNECT Maximum Packet Size for a payload limit."""
    return min(max_payload_bytes + PACKET_ROOM, MQTT_MAX_PACKET)


def _kind(topic: str) -> str:
    """NCMD, DCMD, STATE or "other": what the refusal counts go by."""
    parts = topic.split("/")
    return parts[1] if topic.startswith(f"{NAMESPACE}/STATE/") else (
        parts[2] if len(parts) > 2 and parts[2] in ("NCMD", "DCMD") else "other")


class SparkplugLink:
    """``node`` on the broker of ``mqtt`` as ``client_id`` (not the request link's id)."""

    def __init__(self, node: EdgeNode, mqtt: MQTTConfig, client_id: str) -> None:
        self.node, self.cfg, self.client_id = node, mqtt, client_id
        self.v5 = str(mqtt.protocol) == "5"
        self.connections = 0
        self.oversize = Oversize(log, mqtt.max_payload_bytes, "sparkplug")
        self._out: asyncio.Queue[Message] = asyncio.Queue()
        self._stop = asyncio.Event()

    # --- what the daemon calls (from the event loop) -----------------------------------

    def diagnosis(self, plc: str, event: Mapping[str, Any], request_id: str | None = None) -> None:
        """Publish a PLC's answered request as DDATA (dropped while not connected: the
        next DBIRTH carries it)."""
        self._queue(self.node.diagnosis(plc, event, request_id))

    def plc_link(self, plc: str, up: bool) -> None:
        """A PLC's Modbus link went up (DBIRTH) or down (DDEATH)."""
        self._queue(self.node.device_online(plc) if up else self.node.device_offline(plc))

    def stop(self) -> None:
        """End ``run``: NDEATH, DISCONNECT."""
        self._stop.set()

    # --- the connection ----------------------------------------------------------------

    def _queue(self, messages: list[Message]) -> None:
        for m in messages:
            self._out.put_nowait(m)

    def _client(self) -> aiomqtt.Client:
        will = self.node.will()
        props = None
        if self.v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0
            props.MaximumPacketSize = maximum_packet_size(self.cfg.max_payload_bytes)
        return aiomqtt.Client(
            **connect_args(self.cfg), identifier=self.client_id,
            clean_session=None if self.v5 else True,
            clean_start=True if self.v5 else paho_mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props, keepalive=self.cfg.keepalive_s, timeout=10,
            will=aiomqtt.Will(will.topic, will.payload, qos=will.qos, retain=will.retain))

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff (the request link's loop), until
        ``stop``."""
        await keep_connected(self.cfg, self._client, self._serve, self._stop,
                             self.node.disconnected, logger=log, label="sparkplug: ",
                             survive_bugs=False)

    async def _serve(self, client: aiomqtt.Client) -> None:
        no_delay(client)
        while not self._out.empty():  # numbered for a session that is gone
            self._out.get_nowait()
        for topic, qos in self.node.subscriptions():
            await client.subscribe(topic, qos=qos)
        self._queue(self.node.connected())
        self.connections += 1
        log.info("sparkplug: edge node %s/%s connected (bdSeq %s)", self.node.group_id,
                 self.node.edge_node_id, self.node.bd_seq)
        tasks = {asyncio.ensure_future(self._read(client)),
                 asyncio.ensure_future(self._write(client)),
                 asyncio.ensure_future(self._stop.wait())}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
        for t in done:
            t.result()  # raises the MqttError that ended the connection
        if self._stop.is_set():  # a clean stop: the NDEATH, then DISCONNECT drops the Will
            death = self.node.death()
            try:
                await client.publish(death.topic, death.payload, qos=death.qos,
                                     retain=death.retain, timeout=5)
            except aiomqtt.MqttError as e:
                log.warning("sparkplug: could not publish NDEATH: %s", e)

    async def _read(self, client: aiomqtt.Client) -> None:
        """Until a message asks for a new session (the primary host went offline). A
        payload over the limit is refused unparsed; the others are decoded in a worker
        thread, one at a time (their order is kept)."""
        async for message in client.messages:
            topic, raw = str(message.topic), message.payload
            payload = bytes(raw) if isinstance(raw, bytes | bytearray) else b""
            if self.oversize.refuse(_kind(topic), topic, len(payload)):
                continue
            command = await asyncio.to_thread(self.node.decode, topic, payload)
            reaction = self.node.apply(command)
            self._queue(reaction.messages)
            if reaction.reconnect:
                await self._out.join()
                return

    async def _write(self, client: aiomqtt.Client) -> None:
        while True:
            m = await self._out.get()
            try:
                await client.publish(m.topic, m.payload, qos=m.qos, retain=m.retain)
            finally:
                self._out.task_done()
