"""rung as a Sparkplug B edge node: births, deaths and diagnosis data for SCADA hosts.

:class:`EdgeNode` holds the Sparkplug state (bdSeq, seq, which devices were born, the latest
diagnosis per PLC) and turns events into MQTT messages; it owns no connection. Whoever owns
the link (its own MQTT client: Sparkplug wants a clean session and its own Will, see
``docs/plant.md``) does, per connection::

    will = node.will()                  # before each CONNECT: the NDEATH Will (bdSeq + 1)
    ... connect with clean start, session expiry 0, Will = will ...
    subscribe node.subscriptions()      # NCMD (and the primary host's STATE), QoS 1
    publish node.connected()            # NBIRTH + one DBIRTH per PLC, in order
    on a message: r = node.handle(topic, payload); publish r.messages; reconnect if asked
                  (or node.apply(node.decode(topic, payload)), decode off the event loop)
    on a diagnosis: publish node.diagnosis(plc, event)    # DDATA
    on a PLC link change: publish node.device_offline(plc) / node.device_online(plc)
    clean stop: publish node.death(), then DISCONNECT;  link lost: node.disconnected()

Topics: ``spBv1.0/{group_id}/{NBIRTH|NDEATH|NCMD}/{edge_node_id}`` and
``spBv1.0/{group_id}/{DBIRTH|DDATA|DDEATH}/{edge_node_id}/{plc}``. Every message but the
Will and a STATE reply goes out at QoS 0, never retained (Sparkplug 3.0, 6.4.19-6.4.26).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rung.daemon.sparkplug.metrics import Device, device_metrics, node_metrics
from rung.daemon.sparkplug.pb import DataType, Payload
from rung.engines.errors import RungError

__all__ = ["NAMESPACE", "REBIRTH", "Command", "Device", "EdgeNode", "Message", "Reaction",
           "SparkplugError"]

log = logging.getLogger("rung.sparkplug")

NAMESPACE = "spBv1.0"
REBIRTH = "Node Control/Rebirth"
_RESERVED = set("+/#")


class SparkplugError(RungError):
    """A Sparkplug setting or call rung cannot honour."""


@dataclass(frozen=True)
class Message:
    """One MQTT publish."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False


@dataclass(frozen=True)
class Reaction:
    """What to do about an incoming message: publish ``messages`` in order; with
    ``reconnect``, then disconnect and connect again (a new Will: call ``will()``)."""

    messages: list[Message] = field(default_factory=list)
    reconnect: bool = False


@dataclass(frozen=True)
class Command:
    """An incoming message, decoded (:meth:`EdgeNode.decode`): an NCMD asking for a
    rebirth or not, the primary host's STATE ``(online, timestamp)`` (None: not one), or
    neither (``kind`` empty: a topic the node does not act on)."""

    kind: str = ""                           # "NCMD", "STATE" or ""
    rebirth: bool = False
    state: tuple[bool, int] | None = None


def _check_id(kind: str, value: str) -> str:
    if not value or _RESERVED & set(value) or not value.isprintable():
        raise SparkplugError(f"sparkplug {kind} {value!r}: needs at least one character, "
                             "none of + / # and no control characters")
    return value


class EdgeNode:
    """The Sparkplug B edge node ``{group_id}/{edge_node_id}`` with one device per PLC.

    ``bd_seq_path``: a file that keeps the last bdSeq across restarts (so a host never
    pairs a late NDEATH of the previous process with the new session); ``primary_host_id``:
    publish births only while that host's STATE says online. ``clock``: seconds since the
    epoch (UTC), for timestamps.
    """

    def __init__(self, group_id: str, edge_node_id: str, devices: Sequence[Device], *,
                 node_info: Mapping[str, str] | None = None, primary_host_id: str | None = None,
                 bd_seq_path: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.group_id = _check_id("group_id", group_id)
        self.edge_node_id = _check_id("edge_node_id", edge_node_id)
        self.devices = {_check_id("device id", d.id): d for d in devices}
        if len(self.devices) != len(devices):
            raise SparkplugError("sparkplug devices: two PLCs share an id")
        self.node_info = dict(node_info or {})
        self.primary_host_id = (None if primary_host_id is None
                                else _check_id("primary_host_id", primary_host_id))
        self.bd_seq_path, self.clock = bd_seq_path, clock
        self.bd_seq: int | None = None  # of the current (or next) connection's Will
        self.seq = 0
        self.born = False  # NBIRTH sent in this MQTT session
        self.online: set[str] = set(self.devices)  # devices whose PLC link is up
        self.latest: dict[str, tuple[Mapping[str, Any], str]] = {}  # plc -> (event, id)
        self._host_online = primary_host_id is None
        self._host_stamp = -1
        self._last_bd_seq = self._load_bd_seq()

    # --- topics -------------------------------------------------------------------------

    def topic(self, kind: str, device: str | None = None) -> str:
        """``spBv1.0/{group}/{kind}/{edge node}[/{device}]``."""
        base = f"{NAMESPACE}/{self.group_id}/{kind}/{self.edge_node_id}"
        return base if device is None else f"{base}/{device}"

    def subscriptions(self) -> list[tuple[str, int]]:
        """Topic filters (QoS 1) to subscribe after each CONNECT, before ``connected()``."""
        subs = [(self.topic("NCMD"), 1)]
        if self.primary_host_id is not None:
            subs.append((f"{NAMESPACE}/STATE/{self.primary_host_id}", 1))
        return subs

    # --- session ------------------------------------------------------------------------

    def will(self) -> Message:
        """The NDEATH to register as the Will of the next CONNECT (QoS 1, not retained).
        Each call is a new connection attempt: bdSeq goes up by one (255 wraps to 0)."""
        self.bd_seq = 0 if self._last_bd_seq is None else (self._last_bd_seq + 1) % 256
        self._last_bd_seq = self.bd_seq
        self._save_bd_seq(self.bd_seq)
        self.born = False
        return self._death_message()

    def connected(self) -> list[Message]:
        """After CONNACK and ``subscriptions()``: NBIRTH then each PLC's DBIRTH (or DDEATH
        for a PLC whose link is down); nothing while a primary host is awaited."""
        if self.bd_seq is None:
            raise SparkplugError("sparkplug: connected() before will(): the CONNECT had no "
                                 "NDEATH Will")
        if not self._host_online:
            return []
        return self._births()

    def disconnected(self) -> None:
        """The link dropped: nothing is published until the next ``connected()``."""
        self.born = False

    def death(self) -> Message:
        """The NDEATH to publish before a clean DISCONNECT (the broker drops the Will then);
        with MQTT 5 a DISCONNECT with reason 0x04 (with Will) does the same."""
        if self.bd_seq is None:
            raise SparkplugError("sparkplug: death() before will()")
        self.born = False
        return self._death_message()

    def handle(self, topic: str, payload: bytes) -> Reaction:
        """An incoming message on a subscribed topic: NCMD ``Node Control/Rebirth`` = true
        republishes the births; the primary host's STATE starts or ends the session."""
        return self.apply(self.decode(topic, payload))

    def decode(self, topic: str, payload: bytes) -> Command:
        """Parse an incoming message; reads no state that changes, so it may run in a
        worker thread (``link.py`` decodes there: a payload may be large)."""
        if topic == self.topic("NCMD"):
            return Command("NCMD", rebirth=_rebirth(payload))
        if self.primary_host_id is not None and topic == f"{NAMESPACE}/STATE/" \
                f"{self.primary_host_id}":
            return Command("STATE", state=_state(payload))
        return Command()

    def apply(self, command: Command) -> Reaction:
        """What a decoded message does (on the event loop: it changes the session)."""
        if command.kind == "NCMD":
            return Reaction(self._births() if self.born and command.rebirth else [])
        if command.kind == "STATE" and command.state is not None:
            return self._host_state(*command.state)
        return Reaction()

    # --- data ---------------------------------------------------------------------------

    def diagnosis(self, plc: str, event: Mapping[str, Any],
                  request_id: str | None = None) -> list[Message]:
        """DDATA for a PLC's answered request (the ``{base}/diag/{plc}/event`` object):
        advisory priority, state and value per point, top suspected fault, remaining useful
        life, err code, rung's request id (default ``{plc}-{req_seq}-diagnosis``, the id the
        PLC job gives its diagnosis). Kept for the next DBIRTH; [] while not born."""
        device = self._device(plc)
        rid = request_id if request_id is not None else f"{plc}-{event.get('req_seq')}-diagnosis"
        self.latest[plc] = (event, rid)
        if not self.born or plc not in self.online:
            return []
        return [self._publish("DDATA", device, device_metrics(device, event, rid, birth=False))]

    def device_offline(self, plc: str) -> list[Message]:
        """DDEATH when the PLC's link goes down (once)."""
        device = self._device(plc)
        was = plc in self.online
        self.online.discard(plc)
        return [self._publish("DDEATH", device, [])] if was and self.born else []

    def device_online(self, plc: str) -> list[Message]:
        """DBIRTH when the PLC's link comes back (once), with the latest diagnosis."""
        device = self._device(plc)
        was = plc in self.online
        self.online.add(plc)
        return [self._dbirth(device)] if not was and self.born else []

    # --- internals ----------------------------------------------------------------------

    def _device(self, plc: str) -> Device:
        try:
            return self.devices[plc]
        except KeyError:
            raise SparkplugError(f"sparkplug: no device for PLC {plc!r} (devices: "
                                 f"{', '.join(self.devices) or 'none'})") from None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _payload(self, metrics: list[dict[str, Any]], seq: int | None) -> bytes:
        p = Payload(timestamp=self._now_ms())
        if seq is not None:
            p.seq = seq
        for m in metrics:
            _add_metric(p, m, self._now_ms())
        data: bytes = p.SerializeToString()
        return data

    def _publish(self, kind: str, device: Device | None, metrics: list[dict[str, Any]]) -> Message:
        """A numbered message: seq counts 0..255 from the NBIRTH on."""
        self.seq = 0 if kind == "NBIRTH" else (self.seq + 1) % 256
        topic = self.topic(kind, None if device is None else device.id)
        return Message(topic, self._payload(metrics, self.seq))

    def _death_message(self) -> Message:
        bd = {"name": "bdSeq", "type": DataType.INT64, "value": self.bd_seq}
        return Message(self.topic("NDEATH"), self._payload([bd], None), qos=1, retain=False)

    def _dbirth(self, device: Device) -> Message:
        event, rid = self.latest.get(device.id, ({}, ""))
        return self._publish("DBIRTH", device, device_metrics(device, event, rid, birth=True))

    def _births(self) -> list[Message]:
        self.born = True
        out = [self._publish("NBIRTH", None, node_metrics(self.bd_seq or 0, self.node_info))]
        for device in self.devices.values():
            out.append(self._dbirth(device))
            if device.id not in self.online:  # born, then declared dead: hosts see it
                out.append(self._publish("DDEATH", device, []))
        return out

    def _host_state(self, online: bool, stamp: int) -> Reaction:
        if stamp < self._host_stamp:
            return Reaction()  # an older STATE than the one acted on
        self._host_stamp, self._host_online = stamp, online
        if online:
            return Reaction(self._births() if not self.born and self.bd_seq is not None
                            else [])
        if self.born:  # the host went away: NDEATH, then a new session (3.0, 5.5)
            return Reaction([self.death()], reconnect=True)
        return Reaction()

    def _load_bd_seq(self) -> int | None:
        if self.bd_seq_path is None:
            return None
        try:
            value = int(self.bd_seq_path.read_text(encoding="ascii").strip())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("sparkplug: %s unreadable (%s): bdSeq starts again at 0",
                        self.bd_seq_path, e)
            return None
        return value if 0 <= value <= 255 else None

    def _save_bd_seq(self, value: int) -> None:
        if self.bd_seq_path is None:
            return
        tmp = self.bd_seq_path.with_name(self.bd_seq_path.name + ".tmp")
        try:
            tmp.write_text(f"{value}\n", encoding="ascii")
            os.replace(tmp, self.bd_seq_path)
        except OSError as e:
            log.warning("sparkplug: cannot keep bdSeq in %s: %s", self.bd_seq_path, e)


def _rebirth(payload: bytes) -> bool:
    """True when an NCMD payload sets ``Node Control/Rebirth`` to true."""
    try:
        p = Payload.FromString(payload)
    except Exception as e:  # noqa: BLE001 -- protobuf's DecodeError, any garbage
        log.warning("sparkplug: NCMD payload is not a Sparkplug B payload: %s", e)
        return False
    return any(m.name == REBIRTH and m.WhichOneof("value") == "boolean_value"
               and m.boolean_value for m in p.metrics)


def _state(payload: bytes) -> tuple[bool, int] | None:
    """A primary host's STATE ``{"online": bool, "timestamp": int}``, or None."""
    try:
        state = json.loads(payload)
        online, stamp = state["online"], int(state.get("timestamp", 0))
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as e:
        log.warning("sparkplug: primary host STATE is not {online, timestamp}: %s", e)
        return None
    return (online, stamp) if isinstance(online, bool) else None


_VALUE_FIELD = {DataType.INT8: "int_value", DataType.INT16: "int_value",
                DataType.INT32: "int_value", DataType.UINT8: "int_value",
                DataType.UINT16: "int_value", DataType.UINT32: "int_value",
                DataType.INT64: "long_value", DataType.UINT64: "long_value",
                DataType.DATETIME: "long_value", DataType.FLOAT: "float_value",
                DataType.DOUBLE: "double_value", DataType.BOOLEAN: "boolean_value",
                DataType.STRING: "string_value", DataType.TEXT: "string_value"}


def _add_metric(p: Any, m: Mapping[str, Any], now_ms: int) -> None:
    """One metric ``{"name", "type", "value", "timestamp"?, "unit"?}``; value None is null."""
    metric = p.metrics.add(name=m["name"], datatype=int(m["type"]),
                           timestamp=int(m.get("timestamp") or now_ms))
    value = m.get("value")
    if value is None:
        metric.is_null = True
    else:
        fname = _VALUE_FIELD[DataType(m["type"])]
        if fname in ("int_value", "long_value") and value < 0:  # two's complement on the wire
            value += 1 << (32 if fname == "int_value" else 64)
        setattr(metric, fname, value)
    if m.get("unit"):
        metric.properties.keys.append("engUnit")
        metric.properties.values.add(type=DataType.STRING, string_value=str(m["unit"]))
