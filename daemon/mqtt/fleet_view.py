"""The fleet seen from outside: every node's retained status (``rung fleet``) and who drives
each PLC (``rung check``).

The statuses are read on a connection of its own (a client id of its own, the config's
credentials): subscribe ``{base}/fleet/+``, then a private fence topic, then publish to the
fence; the broker sends the retained statuses before the fence comes back, so the reader
knows when it has all of them without waiting on a clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

import aiomqtt

from rung.daemon.config import MQTTConfig
from rung.daemon.mqtt.fleet import NodeStatus, nodes_filter, parse_status
from rung.daemon.mqtt.link import connect_args
from rung.engines.errors import RungError


class FleetError(RungError):
    """The fleet's statuses could not be read (broker unreachable, refused, too slow)."""


async def read_statuses(cfg: MQTTConfig, timeout_s: float = 10.0) -> dict[str, NodeStatus]:
    """Every node's retained status under ``cfg.base_topic`` (online or not), by client id.

    Raises:
        FleetError: the broker refused or could not be reached, or the fence did not come
            back within ``timeout_s``.
    """
    token = uuid.uuid4().hex[:12]
    me = f"{cfg.client_id}-view-{os.getpid()}-{token[:6]}"
    fence = f"{cfg.base_topic}/fleet/{me}/fence"
    nodes: dict[str, NodeStatus] = {}
    try:
        client = aiomqtt.Client(**connect_args(cfg), identifier=me,
                                timeout=min(10.0, timeout_s))
        async with client:
            await client.subscribe(nodes_filter(cfg.base_topic), qos=1)
            await client.subscribe(fence, qos=1)
            await client.publish(fence, token, qos=1)
            async with asyncio.timeout(timeout_s):
                async for message in client.messages:
                    topic = str(message.topic)
                    if topic == fence:
                        return nodes
                    payload = message.payload
                    status = parse_status(topic, bytes(payload) if isinstance(
                        payload, bytes | bytearray) else b"")
                    if status is not None:
                        nodes[status.client_id] = status
    except aiomqtt.MqttError as e:
        raise FleetError(f"broker {cfg.host}:{cfg.port}: {e}",
                         "check mqtt.host/port and that the broker runs") from e
    except TimeoutError as e:
        raise FleetError(f"the broker did not send the fleet's statuses within "
                         f"{timeout_s:g} s") from e
    raise FleetError("the broker closed the connection before the statuses came")


def plc_owners(statuses: Mapping[str, NodeStatus]) -> dict[str, str]:
    """PLC id -> the online node that claims it (the first by name if several still do)."""
    out: dict[str, str] = {}
    for name in sorted(statuses):
        s = statuses[name]
        for plc in s.plcs if s.online else ():
            out.setdefault(plc, name)
    return out


def _queue(doc: Mapping[str, Any]) -> tuple[str, str]:
    q = doc.get("queue")
    q = q if isinstance(q, dict) else {}

    def part(a: str, b: str) -> str:
        return f"{q.get(a, '?')}/{q.get(b, '?')}"

    return part("depth", "max_pending"), part("inflight", "max_batch")


def table(statuses: Mapping[str, NodeStatus]) -> str:
    """The ``rung fleet`` listing: online nodes first, one line each."""
    rows = [("NODE", "STATE", "ENGINE", "QUEUE", "IN FLIGHT", "PLCS", "SINCE")]
    order = sorted(statuses.values(), key=lambda s: (not s.online, s.client_id))
    for s in order:
        d = s.doc
        state = "leaving" if s.leaving else ("online" if s.online else "offline")
        queue, inflight = _queue(d) if s.online else ("-", "-")
        refused = d.get("refused") if s.online else None
        plcs = list(s.plcs) + ([f"refused {p} (driven by {o})"
                                for p, o in sorted(refused.items())]
                               if isinstance(refused, dict) else [])
        rows.append((s.client_id, state, str(d.get("engine", "-")) if s.online else "-",
                     queue, inflight, ", ".join(plcs) or "-",
                     str(d.get("since", "-")) if s.online else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  "
                     + r[-1] for r in rows)


def as_json(cfg: MQTTConfig, statuses: Mapping[str, NodeStatus]) -> str:
    """``rung fleet --json``: one object, the statuses as the nodes published them."""
    return json.dumps({"group": cfg.shared_group, "base_topic": cfg.base_topic,
                       "nodes": [dict(statuses[n].doc, client_id=n)
                                 for n in sorted(statuses)]}, ensure_ascii=False)
