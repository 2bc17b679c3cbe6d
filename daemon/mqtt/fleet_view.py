"""The fleet seen from outside: every node's retained status (``rung fleet``) and who drives
each PLC (``rung check``).

The statuses are read on a connection of its own (a client id of its own, the config's
credentials): subscribe ``{base}/fleet/+``, then a private fence topic (one level under the
config's own status topic, ``{base}/fleet/{client_id}/view-...``, so the fleet ACL's
per-node write line covers it), then publish to the fence; the broker sends the retained
statuses before the fence comes back, so the reader knows when it has all of them without
waiting on a clock.

Anything may sit under ``{base}/fleet/``, so what is shown is bounded: a status over the
size limit is not parsed, one that is no rung status is listed as a one-line note instead
of a row, every cell and JSON string is cut, lists and objects are capped, at most
``MAX_NODES`` statuses are kept. Under MQTT 5 the broker sends nothing over
``VIEW_MAX_PACKET`` at all (CONNECT Maximum Packet Size).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rung.daemon.config import MQTTConfig
from rung.daemon.mqtt.fleet import MAX_STATUS_BYTES, NodeStatus, nodes_filter, parse_status
from rung.daemon.mqtt.link import connect_args
from rung.engines.errors import RungError

MAX_NODES = 1000          # statuses kept; more are counted
VIEW_MAX_PACKET = 16 * 2**20   # MQTT 5: the broker withholds larger messages
CELL = 48                 # characters of one table cell
PLCS_SHOWN = 8            # PLCs listed per node in the table
NOTES_SHOWN = 10          # ignored statuses listed one per line
TEXT = 256                # characters of a string in --json
ITEMS = 64                # items of a list or object in --json
DEPTH = 6                 # nesting in --json


class FleetError(RungError):
    """The fleet's statuses could not be read (broker unreachable, refused, too slow)."""


class Statuses(dict[str, NodeStatus]):
    """The statuses by client id; ``more``: those past ``MAX_NODES``, not kept."""

    more = 0


async def read_statuses(cfg: MQTTConfig, timeout_s: float = 10.0) -> Statuses:
    """Every node's retained status under ``cfg.base_topic`` (online or not), by client id;
    a payload that is no status is kept with its ``note``.

    Raises:
        FleetError: the broker refused or could not be reached, or the fence did not come
            back within ``timeout_s``.
    """
    token = uuid.uuid4().hex[:12]
    me = f"{cfg.client_id}-view-{os.getpid()}-{token[:6]}"
    fence = f"{cfg.base_topic}/fleet/{cfg.client_id}/view-{os.getpid()}-{token[:6]}"
    limit = min(cfg.max_payload_bytes, MAX_STATUS_BYTES)
    nodes = Statuses()
    props = None
    if str(cfg.protocol) == "5":
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.MaximumPacketSize = VIEW_MAX_PACKET
    try:
        client = aiomqtt.Client(**connect_args(cfg), identifier=me, properties=props,
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
                        payload, bytes | bytearray) else b"", limit)
                    if status is None:
                        nodes.pop(topic.rpartition("/")[2], None)
                    elif status.client_id in nodes or len(nodes) < MAX_NODES:
                        nodes[status.client_id] = status
                    else:
                        nodes.more += 1
    except aiomqtt.MqttError as e:
        raise FleetError(f"broker {cfg.host}:{cfg.port}: {e}",
                         "check mqtt.host/port and that the broker runs") from e
    except TimeoutError as e:
        raise FleetError(f"the broker did not send the fleet's statuses within "
                         f"{timeout_s:g} s") from e
    raise FleetError("the broker closed the connection before the statuses came")


def lease_live(s: NodeStatus, now: float | None = None) -> bool:
    """An online status whose claim's lease (``expires``, by the node's clock) has not run
    out by this clock, allowing one more lease for clocks that disagree. Advisory (the
    nodes judge leases by what they watch, not by clocks): a status without a lease, or
    one that ran out long ago, claims nothing here."""
    if not s.online or s.expires is None:
        return False
    return (time.time() if now is None else now) <= s.expires + min(s.lease_s or 0.0, 86400.0)


def plc_owners(statuses: Mapping[str, NodeStatus]) -> dict[str, str]:
    """PLC id -> the online node that claims it under a live lease (the first by name if
    several still do)."""
    out: dict[str, str] = {}
    now = time.time()
    for name in sorted(statuses):
        s = statuses[name]
        for plc in s.plcs if lease_live(s, now) else ():
            out.setdefault(plc, name)
    return out


def _cut(text: str, n: int = CELL) -> str:
    """``text`` on one line of at most ``n`` printable characters (a status could carry
    terminal escapes)."""
    flat = " ".join(text[:4 * n].split())
    flat = "".join(c if c.isprintable() else "?" for c in _text(flat))
    return flat if len(flat) <= n and len(text) <= 4 * n else flat[:n - 1] + "…"


def _text(text: str) -> str:
    """``text`` with lone surrogates (JSON allows ``\\ud800``) replaced: printable."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _queue(doc: Mapping[str, Any]) -> tuple[str, str]:
    q = doc.get("queue")
    q = q if isinstance(q, dict) else {}

    def part(a: str, b: str) -> str:
        return _cut(f"{q.get(a, '?')}/{q.get(b, '?')}", 16)

    return part("depth", "max_pending"), part("inflight", "max_batch")


def _plcs(s: NodeStatus) -> str:
    """The PLCs a node drives and refuses, capped at ``PLCS_SHOWN`` names."""
    refused = s.doc.get("refused") if s.online else None
    items = [_cut(p, 24) for p in s.plcs]
    if isinstance(refused, dict):
        items += [f"refused {_cut(str(p), 24)} "
                  + (f"({_cut(str(o), 24)})" if str(o).startswith("(") else
                     f"(driven by {_cut(str(o), 24)})")
                  for p, o in sorted(refused.items(), key=lambda kv: str(kv[0]))]
    shown = ", ".join(items[:PLCS_SHOWN])
    return shown + (f", +{len(items) - PLCS_SHOWN} more" if len(items) > PLCS_SHOWN else "")


def _state(s: NodeStatus, now: float) -> str:
    if not s.online:
        return "offline"
    if not lease_live(s, now):
        return "stale"   # online, but no lease, or one that ran out: nobody renews it
    return "leaving" if s.leaving else "online"


def table(statuses: Mapping[str, NodeStatus]) -> str:
    """The ``rung fleet`` listing: online nodes first, one line each; then one line per
    payload that is no status (at most ``NOTES_SHOWN``)."""
    rows = [("NODE", "STATE", "ENGINE", "QUEUE", "IN FLIGHT", "PLCS", "SINCE")]
    shown = [s for s in statuses.values() if s.note is None]
    now = time.time()
    for s in sorted(shown, key=lambda s: (not s.online, s.client_id)):
        d = s.doc
        queue, inflight = _queue(d) if s.online else ("-", "-")
        rows.append((_cut(s.client_id), _state(s, now),
                     _cut(str(d.get("engine", "-"))) if s.online else "-",
                     queue, inflight, _plcs(s) or "-",
                     _cut(str(d.get("since", "-"))) if s.online else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
             for r in rows]
    return "\n".join(lines + _notes(statuses))


def _notes(statuses: Mapping[str, NodeStatus]) -> list[str]:
    bad = sorted((s for s in statuses.values() if s.note is not None),
                 key=lambda s: s.client_id)
    out = [f"ignored {_cut(s.client_id)}: {_cut(s.note or '', 120)}"
           for s in bad[:NOTES_SHOWN]]
    if len(bad) > NOTES_SHOWN:
        out.append(f"ignored {len(bad) - NOTES_SHOWN} more payloads that are no status")
    more = getattr(statuses, "more", 0)
    if more:
        out.append(f"not shown: {more} more statuses (at most {MAX_NODES} are read)")
    return out


def bounded(value: Any, depth: int = DEPTH) -> Any:
    """A JSON value with strings cut to ``TEXT`` characters, lists and objects to ``ITEMS``
    entries, and nesting to ``depth`` levels (deeper values become "…")."""
    if isinstance(value, str):
        return _text(value if len(value) <= TEXT else value[:TEXT - 1] + "…")
    if isinstance(value, list | dict) and depth <= 0:
        return "…"
    if isinstance(value, list):
        return [bounded(v, depth - 1) for v in value[:ITEMS]] + (
            [f"… {len(value) - ITEMS} more"] if len(value) > ITEMS else [])
    if isinstance(value, dict):
        items = list(value.items())
        out = {bounded(str(k)): bounded(v, depth - 1) for k, v in items[:ITEMS]}
        if len(items) > ITEMS:
            out["…"] = f"{len(items) - ITEMS} more"
        return out
    return value


def as_json(cfg: MQTTConfig, statuses: Mapping[str, NodeStatus]) -> str:
    """``rung fleet --json``: one object, the statuses as the nodes published them (bounded:
    :func:`bounded`), and the payloads that are no status under ``ignored``."""
    nodes = [dict(bounded(dict(statuses[n].doc)), client_id=bounded(n))
             for n in sorted(statuses) if statuses[n].note is None]
    ignored = [{"client_id": bounded(n), "why": statuses[n].note}
               for n in sorted(statuses) if statuses[n].note is not None]
    out: dict[str, Any] = {"group": cfg.shared_group, "base_topic": cfg.base_topic,
                           "nodes": nodes}
    if ignored:
        out["ignored"] = ignored[:ITEMS]
    return json.dumps(out, ensure_ascii=False)
