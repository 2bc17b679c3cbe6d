"""``rung fleet --drain``: the requests a node's broker session holds while the node is down,
handed to the nodes that are online.

mosquitto 2.0 keeps a member's share of the requests in its persistent session while the
member is away: those it received without acknowledging, and a share of every request
published since (docs/mqtt.md, "Fleet"). They wait for that node's restart. When it will not
be back soon, ``--drain`` (run with that node's config: its client id, its credentials)
connects under its client id, unsubscribes the session from the requests, and republishes
every request the session held, with its properties, acknowledging each once the broker has
the copy; the nodes online answer them. A fence published after the UNSUBACK comes back
after the last of them.

Requests the node had already recorded and acknowledged are in its journal, not in the
broker: they are answered when it (or its ``state_dir`` on another box) comes back. Should
the node come back during the drain, it takes its session over; a request republished and
not yet acknowledged then reaches it too, and is answered twice (same id).
"""

from __future__ import annotations

import asyncio
import os
import uuid

import aiomqtt
import paho.mqtt.client as paho_mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rung.daemon.config import MQTTConfig
from rung.daemon.mqtt.fleet_view import FleetError, read_statuses
from rung.daemon.mqtt.link import connect_args, manual_acks, request_filter


async def drain(cfg: MQTTConfig, timeout_s: float = 60.0) -> tuple[int, list[str]]:
    """Hand the requests queued for node ``cfg.client_id`` to the nodes online.

    Returns the requests republished and the nodes online that take them.

    Raises:
        FleetError: the node is online or unknown, no other node is online, or the broker
            failed or was too slow.
    """
    me, base = cfg.client_id, cfg.base_topic
    statuses = await read_statuses(cfg)
    own = statuses.get(me)
    if own is None:
        raise FleetError(f"no status of {me} under {base}/fleet/: not a node of this fleet",
                         "check mqtt.client_id and mqtt.base_topic (use that node's config)")
    if own.online:
        raise FleetError(f"{me} is online: it answers its own requests",
                         "drain only a node whose status says offline")
    staying = sorted(n for n, s in statuses.items() if n != me and s.online and not s.leaving)
    if not staying:
        raise FleetError(f"no other node of group {cfg.shared_group} is online to take the "
                         f"requests of {me}", f"start a node, or restart {me}")
    v5 = str(cfg.protocol) == "5"
    props = None
    if v5:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = cfg.session_expiry_s
    client = aiomqtt.Client(**connect_args(cfg), identifier=me,
                            clean_session=None if v5 else False,
                            clean_start=False if v5 else paho_mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                            properties=props, timeout=10)
    paho = manual_acks(client)
    fence = f"{base}/fleet/{me}/drain-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    moved = 0
    try:
        async with client:
            await client.unsubscribe(request_filter(cfg))
            await client.subscribe(fence, qos=1)
            await client.publish(fence, b"fence", qos=1)
            async with asyncio.timeout(timeout_s):
                async for message in client.messages:
                    if str(message.topic) == fence:
                        paho.ack(message.mid, message.qos)
                        break
                    if message.topic.matches(f"{base}/req/#"):
                        await client.publish(str(message.topic), message.payload, qos=1,
                                             properties=_forwarded(message) if v5 else None)
                        moved += 1
                    if message.qos > 0:
                        paho.ack(message.mid, message.qos)
            await client.unsubscribe(fence)
    except aiomqtt.MqttError as e:
        raise FleetError(f"broker {cfg.host}:{cfg.port}: {e} ({moved} requests handed over "
                         "before it)", f"run it again once {me}'s session is free") from e
    except TimeoutError as e:
        raise FleetError(f"the session of {me} was not drained within {timeout_s:g} s "
                         f"({moved} requests handed over)", "run it again") from e
    return moved, staying


def _forwarded(message: aiomqtt.Message) -> Properties:
    """The request's own v5 properties for its copy (the expiry as much as is left)."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    src = message.properties
    for name in ("ResponseTopic", "CorrelationData", "MessageExpiryInterval", "ContentType"):
        value = getattr(src, name, None) if src is not None else None
        if value is not None:
            setattr(props, name, value)
    return props
