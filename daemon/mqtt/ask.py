"""``rung ask``: one MQTT request to a running ``rung serve``, the reply printed as JSON.

MQTT v5 (the config's protocol): the request carries a Response Topic and Correlation Data
and a Message Expiry of ``--timeout``; v3.1.1: ``id`` and ``reply_to`` in the payload. The
reply topic is private to this call (``{base}/res/ask-<random>``), subscribed before the
request is published.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rung.daemon.config import MQTTConfig
from rung.daemon.mqtt.link import connect_args, no_delay
from rung.engines.errors import RungError


class AskError(RungError):
    """No reply: broker unreachable or the daemon did not answer in time."""


async def ask(cfg: MQTTConfig, task: str, data: dict[str, Any], timeout_s: float = 60.0,
              **fields: Any) -> dict[str, Any]:
    """Send one request and return the parsed reply (``ok`` true or false).

    Raises:
        AskError: the broker refused or could not be reached, or no reply came in time.
    """
    v5 = str(cfg.protocol) == "5"
    token = uuid.uuid4().hex
    reply_topic = f"{cfg.base_topic}/res/ask-{token[:12]}"
    body: dict[str, Any] = {"input": data,
                            **{k: v for k, v in fields.items() if v is not None}}
    props = None
    if v5:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = reply_topic
        props.CorrelationData = token.encode()
        props.MessageExpiryInterval = max(1, int(timeout_s))
    else:
        body.update(id=token, reply_to=reply_topic)
    client = aiomqtt.Client(**connect_args(cfg),
                            identifier=f"{cfg.client_id}-ask-{os.getpid()}-{token[:6]}",
                            timeout=min(10.0, timeout_s))
    try:
        async with client:
            no_delay(client)
            await client.subscribe(reply_topic, qos=1)
            await client.publish(f"{cfg.base_topic}/req/{task}", json.dumps(body), qos=1,
                                 properties=props)
            async with asyncio.timeout(timeout_s):
                async for message in client.messages:
                    reply = _match(message, token, v5)
                    if reply is not None:
                        return reply
    except aiomqtt.MqttError as e:
        raise AskError(f"broker {cfg.host}:{cfg.port}: {e}",
                       "check mqtt.host/port and that the broker runs") from e
    except TimeoutError as e:
        raise AskError(f"no reply within {timeout_s:g} s on {reply_topic}",
                       f"is rung serve running and subscribed to {cfg.base_topic}/req/# ? "
                       f"(its retained status: {cfg.base_topic}/status)") from e
    raise AskError("the broker closed the connection before a reply came")


def _match(message: aiomqtt.Message, token: str, v5: bool) -> dict[str, Any] | None:
    if not isinstance(message.payload, bytes):
        return None
    try:
        reply = json.loads(message.payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(reply, dict):
        return None
    if v5:
        corr = getattr(message.properties, "CorrelationData", None)
        if corr is not None and bytes(corr) != token.encode():
            return None
    elif reply.get("id") != token:
        return None
    return reply
