"""The MQTT adapter: one persistent-session connection to the broker, reconnecting with
backoff, QoS 1 acknowledged only after the journal has the request.

aiomqtt drives the connection. It acknowledges QoS 1 messages on arrival, before rung has
seen them, so ``_paho`` reaches the paho-mqtt client underneath (aiomqtt 2.5.1, paho-mqtt
2.2.0, both pinned) to switch on paho's manual acknowledgement before connecting; ``ack``
sends PUBACK once ``on_message`` says the message is recorded. A message rung could not
record stays unacknowledged, and the broker redelivers it on the next connection (clean
start off, session expiry from config).

``on_message`` may answer with a future instead of a bool (the journal writing off the event
loop): the link reads on meanwhile and acknowledges each message once its future says True,
in the order the messages came; a message whose future is still open when the connection
ends is not acknowledged (the broker redelivers it). Messages of watched topics (the
fleet's statuses) are handed on only after every request message before them is recorded,
so a node's own status coming back still fences what the broker sent before it. ``hold``
(the journal's ``settled``) is awaited before every publish.

Every foreign error becomes ``aiomqtt.MqttError`` handling here: the reconnect policy lives
in one loop, :func:`keep_connected`, which the Sparkplug link (``sparkplug/link.py``)
runs too with its own client and session.

In a fleet (``mqtt.shared_group``) the link takes requests through the shared subscription
``$share/{group}/{base}/req/#`` and says online/offline on the node's own topic
``{base}/fleet/{client_id}`` instead of ``{base}/status`` (``fleet.py``); the fleet's
topics are subscribed before the birth goes out, so the birth's own copy arrives after
every status retained before it (claims are ordered by it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiomqtt
import paho.mqtt.client as paho_mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from rung.daemon.backoff import Backoff
from rung.daemon.config import MQTTConfig
from rung.daemon.journal.store import Incoming
from rung.daemon.metrics import Metrics

log = logging.getLogger("rung.mqtt")

# True: recorded (acknowledge), False: leave it; or a future of that (acknowledged once done)
OnMessage = Callable[[Incoming], "bool | asyncio.Future[bool]"]
OnSide = Callable[[aiomqtt.Message], None]   # a watched topic's message (acknowledged at once)


def request_filter(cfg: MQTTConfig) -> str:
    """The subscription requests come through: shared by the group in a fleet."""
    own = f"{cfg.base_topic}/req/#"
    return f"$share/{cfg.shared_group}/{own}" if cfg.shared_group else own


def status_topic(cfg: MQTTConfig) -> str:
    """Where the node's birth and Last Will go: ``{base}/status``, or in a fleet its own
    ``{base}/fleet/{client_id}`` (several nodes share ``{base}``)."""
    if cfg.shared_group:
        return f"{cfg.base_topic}/fleet/{cfg.client_id}"
    return f"{cfg.base_topic}/status"


def offline_doc(cfg: MQTTConfig) -> dict[str, Any]:
    """The Last Will, also published on a clean stop."""
    doc: dict[str, Any] = {"online": False, "client_id": cfg.client_id}
    if cfg.shared_group:
        doc["group"] = cfg.shared_group
    return doc


def _paho(client: aiomqtt.Client) -> paho_mqtt.Client:
    """The paho client inside an aiomqtt client: the one place rung touches a private
    attribute (tests/daemon/test_serve.py would fail at once without it: no request would
    ever be acknowledged)."""
    inner = getattr(client, "_client", None)
    if not isinstance(inner, paho_mqtt.Client):
        raise RuntimeError("aiomqtt no longer exposes its paho client as _client: manual "
                           "QoS 1 acknowledgement is unavailable (check the pinned versions)")
    return inner


def manual_acks(client: aiomqtt.Client) -> paho_mqtt.Client:
    """Switch on manual QoS 1 acknowledgement (before connecting: messages queued in the
    session arrive right after CONNACK); returns the paho client whose ``ack(mid, qos)``
    sends each PUBACK."""
    paho = _paho(client)
    paho.manual_ack_set(True)
    return paho


def no_delay(client: aiomqtt.Client) -> None:
    """Nagle's algorithm off on the connection (plain or TLS): paho leaves it on, and an
    answer would wait ~40 ms in the send buffer for the broker's delayed ACK."""
    sock = _paho(client).socket()
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect_args(cfg: MQTTConfig) -> dict[str, Any]:
    """The aiomqtt.Client arguments every rung client shares: broker, protocol, credentials,
    TLS (``rung serve``, ``rung ask`` and ``rung check`` connect the same way)."""
    tls = None
    if cfg.tls is not None:
        tls = aiomqtt.TLSParameters(
            ca_certs=str(cfg.tls.ca_file) if cfg.tls.ca_file else None,
            certfile=str(cfg.tls.cert_file) if cfg.tls.cert_file else None,
            keyfile=str(cfg.tls.key_file) if cfg.tls.key_file else None,
            cert_reqs=ssl.CERT_REQUIRED, tls_version=ssl.PROTOCOL_TLS_CLIENT)
    return {"hostname": cfg.host, "port": cfg.port, "username": cfg.username,
            "password": cfg.password,
            "protocol": aiomqtt.ProtocolVersion.V5 if str(cfg.protocol) == "5"
            else aiomqtt.ProtocolVersion.V311,
            "tls_params": tls, "tls_insecure": cfg.tls.insecure if cfg.tls else None}


async def keep_connected(cfg: MQTTConfig, connect: Callable[[], AbstractAsyncContextManager[
                             aiomqtt.Client]],
                         serve: Callable[[aiomqtt.Client], Awaitable[None]],
                         stop: asyncio.Event, ended: Callable[[], None], *,
                         logger: logging.Logger = log, label: str = "",
                         survive_bugs: bool = True) -> None:
    """The reconnect loop of rung's MQTT clients (the request link, the Sparkplug edge
    node): connect (``connect()``, a new client each time), ``serve`` the connection until
    it ends, ``ended()`` after every connection, then wait before the next try, from
    ``mqtt.reconnect_min_s`` doubling to ``mqtt.reconnect_max_s`` (from the start again
    after a connection that held for ten times the longest wait), until ``stop`` is set.

    A broker error (``aiomqtt.MqttError``) is one warning, ``label`` before it. Any other
    exception is a bug: with ``survive_bugs`` it is logged with its traceback and the loop
    backs off as for a broker error; without it, it ends the loop (the part's supervisor
    restarts it)."""
    backoff = Backoff(cfg.reconnect_min_s, cfg.reconnect_max_s)
    while not stop.is_set():
        started = time.monotonic()
        try:
            async with connect() as client:
                await serve(client)
        except aiomqtt.MqttError as e:
            logger.warning("%sbroker %s:%d: %s", label, cfg.host, cfg.port, e)
        except Exception:   # a bug here must not end the link for good: log, back off
            if not survive_bugs:
                raise
            logger.exception("%sMQTT link failed", label)
        finally:
            ended()
        if stop.is_set():
            break
        if time.monotonic() - started > 10 * cfg.reconnect_max_s:
            backoff.reset()   # it was a working connection
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.next())


def incoming(message: aiomqtt.Message, claimed_id: str | None = None) -> Incoming:
    """An aiomqtt message as rung's ``Incoming`` (v5 properties read when present)."""
    props = message.properties
    response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
    correlation = getattr(props, "CorrelationData", None) if props is not None else None
    expiry = getattr(props, "MessageExpiryInterval", None) if props is not None else None
    payload = message.payload if isinstance(message.payload, bytes) else (
        str(message.payload).encode() if message.payload is not None else b"")
    return Incoming(topic=str(message.topic), payload=payload,
                    response_topic=response_topic or None,
                    correlation=bytes(correlation) if correlation is not None else None,
                    expiry_s=float(expiry) if expiry is not None else None,
                    mid=message.mid, claimed_id=claimed_id, retained=bool(message.retain))


class MQTTLink:
    """Connects, subscribes to ``{base}/req/#``, feeds ``on_message``, publishes answers.

    ``birth`` gives the retained status payload published on every connection (the Last
    Will publishes ``{"online": false}`` when rung vanishes; a fleet node's status replaces
    it, ``fleet_node.py``); ``watch`` adds topics whose messages go elsewhere (the fleet's
    statuses). ``on_message`` may be given later (the intake is built after the outbox
    that publishes through this link), before ``run``: until then a request message is
    left unacknowledged. ``on_connect`` and every hook added with :meth:`on_connected` are
    called after every connection, in the order given.
    """

    def __init__(self, cfg: MQTTConfig, on_message: OnMessage | None,
                 birth: Callable[[], dict[str, Any]],
                 on_connect: Callable[[], None] | None = None,
                 metrics: Metrics | None = None) -> None:
        self.cfg, self.on_message, self.birth = cfg, on_message, birth
        self.metrics = metrics
        self._on_connect: list[Callable[[], None]] = [] if on_connect is None else [on_connect]
        self.v5 = str(cfg.protocol) == "5"
        self.status_topic = status_topic(cfg)
        self.request_filter = request_filter(cfg)
        self.accepting = True         # False: messages are left unacknowledged
        # awaited before every publish (the journal's ``settled``: answers go out only once
        # recorded)
        self.hold: Callable[[], Awaitable[None]] | None = None
        self.take_requests = True     # False once the node left its group: not resubscribed
        self._watched: list[tuple[str, OnSide]] = []
        self.connections = 0
        self._client: aiomqtt.Client | None = None
        self._stop = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _new_client(self) -> aiomqtt.Client:
        c = self.cfg
        props = None
        if self.v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = c.session_expiry_s
        will = aiomqtt.Will(self.status_topic, json.dumps(offline_doc(c)), qos=1, retain=True)
        client = aiomqtt.Client(
            **connect_args(c), identifier=c.client_id,
            # v5: clean start off; 3.1.1: clean session off (paho refuses clean_start there)
            clean_session=None if self.v5 else False,
            clean_start=False if self.v5 else paho_mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props, will=will, keepalive=c.keepalive_s, timeout=10)
        client.pending_calls_threshold = 1000   # answers are published back to back
        manual_acks(client)
        return client

    def on_connected(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` after every connection (subscribed, birth out), after the hooks
        added before it. Call before ``run``."""
        self._on_connect.append(hook)

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, until ``stop``."""
        await keep_connected(self.cfg, self._new_client, self._serve, self._stop,
                             self._disconnected)

    def _disconnected(self) -> None:
        self._client = None
        if self.metrics is not None:
            self.metrics.set_mqtt(False)

    def watch(self, topic_filter: str, handler: OnSide) -> None:
        """Subscribe ``topic_filter`` (QoS 1, retained messages sent) on every connection,
        before the birth; its messages go to ``handler``, never to ``on_message``. Call
        before ``run``."""
        self._watched.append((topic_filter, handler))

    async def _serve(self, client: aiomqtt.Client) -> None:
        no_delay(client)
        for topic_filter, _ in self._watched:
            await client.subscribe(topic_filter, qos=1)
        await client.publish(self.status_topic, json.dumps(self.birth()), qos=1, retain=True)
        if self.take_requests:
            # v5: no retained requests replayed at subscribe (each reconnect would re-run
            # them)
            options = (SubscribeOptions(qos=1,
                                        retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
                       if self.v5 else None)
            await client.subscribe(self.request_filter, qos=0 if options else 1,
                                   options=options)
        self._client = client
        self.connections += 1
        if self.metrics is not None:
            self.metrics.set_mqtt(True)
            if self.connections > 1:
                self.metrics.mqtt_reconnected()
        log.info("connected to %s:%d as %s", self.cfg.host, self.cfg.port, self.cfg.client_id)
        for hook in self._on_connect:
            hook()
        reader = asyncio.ensure_future(self._read(client))
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not reader.done():
                reader.cancel()
        if reader.done() and not reader.cancelled():
            reader.result()   # raises the MqttError that ended the connection
            return
        # a clean disconnect sends no Last Will: say offline ourselves
        self._client = None
        try:
            await client.publish(self.status_topic, json.dumps(offline_doc(self.cfg)), qos=1,
                                 retain=True, timeout=5)
        except aiomqtt.MqttError as e:
            log.warning("could not publish offline status: %s", e)

    async def _read(self, client: aiomqtt.Client) -> None:
        paho = _paho(client)
        # messages whose recording is in flight, in arrival order: (future, mid, qos)
        recording: deque[tuple[asyncio.Future[bool], int, int]] = deque()

        def acknowledge(_: object = None) -> None:
            """PUBACK the recorded messages at the head of the line, in arrival order
            (only on the connection they came on)."""
            while recording and recording[0][0].done():
                future, mid, qos = recording.popleft()
                if (self._client is client and not future.cancelled()
                        and future.exception() is None and future.result() and qos > 0):
                    paho.ack(mid, qos)

        async for message in client.messages:
            handler = next((h for f, h in self._watched if message.topic.matches(f)), None)
            if handler is not None:
                if recording:   # what came before it is recorded first
                    await asyncio.wait([f for f, _, _ in recording])
                try:
                    handler(message)
                finally:
                    if message.qos > 0:
                        paho.ack(message.mid, message.qos)
                continue
            if self.metrics is not None:
                self.metrics.mqtt_message("in")
            if not self.accepting or self.on_message is None:
                continue   # unacknowledged: redelivered after the restart
            taken = self.on_message(incoming(message))
            if isinstance(taken, asyncio.Future):
                recording.append((taken, message.mid, message.qos))
                taken.add_done_callback(acknowledge)
            elif taken and message.qos > 0 and not recording:
                paho.ack(message.mid, message.qos)
            elif taken:   # behind messages still being recorded: acknowledged in order
                done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                done.set_result(True)
                recording.append((done, message.mid, message.qos))
                acknowledge()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False,
                      correlation: bytes | None = None, response_topic: str | None = None,
                      expiry_s: int | None = None,
                      content_type: str | None = "application/json") -> bool:
        """Publish at QoS 1 and wait for the broker's PUBACK; False when not connected or
        the publish failed (the caller keeps the message and retries after reconnect).
        The v5 properties (ignored under 3.1.1): Correlation Data, Response Topic, Message
        Expiry Interval, Content Type."""
        if self.hold is not None:
            await self.hold()
        client = self._client
        if client is None:
            return False
        props = None
        if self.v5:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if content_type is not None:
                props.ContentType = content_type
            if correlation is not None:
                props.CorrelationData = correlation
            if response_topic is not None:
                props.ResponseTopic = response_topic
            if expiry_s is not None:
                props.MessageExpiryInterval = expiry_s
        try:
            await client.publish(topic, payload, qos=1, retain=retain, properties=props,
                                 timeout=10)
        except aiomqtt.MqttError as e:
            log.warning("publish to %s failed: %s", topic, e)
            return False
        if self.metrics is not None:
            self.metrics.mqtt_message("out")
        return True

    async def watching(self, topic_filter: str, on: bool) -> bool:
        """Subscribe (``on``) or unsubscribe a watched filter on the current connection;
        every new connection subscribes it again. True once the broker acknowledged."""
        client = self._client
        if client is None:
            return False
        try:
            if on:
                await client.subscribe(topic_filter, qos=1, timeout=5)
            else:
                await client.unsubscribe(topic_filter, timeout=5)
        except aiomqtt.MqttError as e:
            log.warning("could not %s %s: %s", "subscribe" if on else "unsubscribe",
                        topic_filter, e)
            return False
        return True

    async def leave_requests(self) -> bool:
        """Stop taking requests: UNSUBSCRIBE the request filter (a fleet node leaving its
        group, so the broker hands requests to the others), and do not subscribe it again
        on a later connection. True once the broker acknowledged it."""
        self.take_requests = False
        client = self._client
        if client is None:
            return False
        try:
            await client.unsubscribe(self.request_filter, timeout=5)
        except aiomqtt.MqttError as e:
            log.warning("could not unsubscribe %s: %s", self.request_filter, e)
            return False
        return True

    def stop(self) -> None:
        """Leave: publish offline status and disconnect (``run`` returns)."""
        self._stop.set()
