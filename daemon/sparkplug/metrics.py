"""The metrics rung's Sparkplug B node and devices declare, as a table, and their values.

Node (NBIRTH): ``bdSeq``, ``Node Control/Rebirth`` and ``Properties/{key}`` strings (version,
engine, ...). Device = one PLC (DBIRTH declares every metric, DDATA repeats them with the
latest diagnosis; a value not known yet is sent as null):

==================================  ========  ===========================================
metric                              datatype  from the diagnosis event
==================================  ========  ===========================================
Diagnosis/Request Id                String    rung's request id of the diagnosis
Diagnosis/Err                       Int32     the PLC's ``err`` code (0 = success)
Diagnosis/Err Text                  String    what ``err`` means
Diagnosis/Priority                  String    advisory priority: low, medium, high, critical
Diagnosis/Priority Code             Int32     the ``result`` register: 0 none, 1 low .. 4
Diagnosis/Actions                   String    advisory actions, one per line
Diagnosis/Top Fault                 String    suspected fault with the highest confidence
Diagnosis/Top Fault Component       String    its component
Diagnosis/Top Fault Confidence      Double    its confidence, 0..1
Diagnosis/Prognosis                 String    ``assessed`` or ``not_assessed``
Diagnosis/Remaining Useful Life     Double    hours (engUnit h); null when not assessed
Points/{point}/State                String    normal, alert or alarm (state detection)
Points/{point}/Value                Double    the snapshot value (Boolean for bool points)
==================================  ========  ===========================================

Metric timestamps are the job's start (``time`` in the event) for diagnosis values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from rung.daemon.sparkplug.pb import DataType

__all__ = ["Device", "Point", "device_metrics", "node_metrics"]

Metric = dict[str, Any]  # {"name", "type", "value", "timestamp"?, "unit"?}


@dataclass(frozen=True)
class Point:
    """A PLC point as a device metric: ``bool`` points are Boolean, the rest Double."""

    name: str
    kind: str = "number"  # "bool" or "number"
    unit: str | None = None


class _MapPoint(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def unit(self) -> str | None: ...


class _PlcMap(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def description(self) -> str: ...

    @property
    def points(self) -> Sequence[_MapPoint]: ...


@dataclass(frozen=True)
class Device:
    """One Sparkplug device: a PLC (``id`` is the register map's id) and its points."""

    id: str
    description: str = ""
    points: tuple[Point, ...] = ()

    @classmethod
    def from_map(cls, plc: _PlcMap) -> Device:
        """The device of a register map (``daemon/modbus/regmap.py``'s ``PlcMap``)."""
        return cls(plc.id, plc.description,
                   tuple(Point(p.name, "bool" if p.type == "bool" else "number", p.unit)
                         for p in plc.points))


def node_metrics(bd_seq: int, info: Mapping[str, str]) -> list[Metric]:
    """NBIRTH metrics: bdSeq, the rebirth control (false), ``Properties/*`` strings."""
    return [{"name": "bdSeq", "type": DataType.INT64, "value": bd_seq},
            {"name": "Node Control/Rebirth", "type": DataType.BOOLEAN, "value": False},
            *({"name": f"Properties/{k}", "type": DataType.STRING, "value": str(v)}
              for k, v in info.items())]


def _top_fault(out: Mapping[str, Any]) -> Mapping[str, Any]:
    faults = [h for h in out.get("health_assessment") or [] if isinstance(h, Mapping)]
    return max(faults, key=lambda h: _typed(DataType.DOUBLE, h.get("confidence")) or 0.0,
               default={})


def _rul(out: Mapping[str, Any]) -> float | None:
    prognosis = out.get("prognosis") or {}
    value = prognosis.get("remaining_useful_life_h")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


# name -> (datatype, value from (trusted diagnosis output, event), unit)
Getter = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
DIAGNOSIS: dict[str, tuple[DataType, Getter, str | None]] = {
    "Diagnosis/Err": (DataType.INT32, lambda o, e: e.get("err"), None),
    "Diagnosis/Err Text": (DataType.STRING, lambda o, e: e.get("err_text"), None),
    "Diagnosis/Priority": (DataType.STRING,
                           lambda o, e: (o.get("advisory") or {}).get("priority"), None),
    "Diagnosis/Priority Code": (DataType.INT32, lambda o, e: e.get("result"), None),
    "Diagnosis/Actions": (DataType.STRING, lambda o, e: "\n".join(
        (o.get("advisory") or {}).get("actions") or []) if o else None, None),
    "Diagnosis/Top Fault": (DataType.STRING, lambda o, e: _top_fault(o).get("fault"), None),
    "Diagnosis/Top Fault Component": (DataType.STRING,
                                      lambda o, e: _top_fault(o).get("component"), None),
    "Diagnosis/Top Fault Confidence": (DataType.DOUBLE,
                                       lambda o, e: _top_fault(o).get("confidence"), None),
    "Diagnosis/Prognosis": (DataType.STRING,
                            lambda o, e: (o.get("prognosis") or {}).get("status"), None),
    "Diagnosis/Remaining Useful Life": (DataType.DOUBLE, lambda o, e: _rul(o), "h"),
}


def _event_ms(event: Mapping[str, Any]) -> int | None:
    try:
        return int(datetime.fromisoformat(str(event["time"])).timestamp() * 1000)
    except (KeyError, ValueError):
        return None


def _typed(kind: DataType, value: Any) -> Any:
    """``value`` as the datatype carries it; None (null) when it does not fit."""
    if value is None or isinstance(value, bool) != (kind == DataType.BOOLEAN):
        return None
    if kind == DataType.BOOLEAN:
        return value
    if kind == DataType.STRING:
        return str(value)
    if kind == DataType.INT32:
        return int(value) if isinstance(value, int) else None
    return float(value) if isinstance(value, int | float) else None


def device_metrics(device: Device, event: Mapping[str, Any], request_id: str,
                   birth: bool) -> list[Metric]:
    """A PLC's metrics from its latest diagnosis event (``{}``: none yet, all null). The
    diagnosis output counts only when it passed validation (``diagnosis.ok``)."""
    diag = event.get("diagnosis") or {}
    out = (diag.get("output") or {}) if diag.get("ok") else {}
    stamp = _event_ms(event)
    metrics: list[Metric] = [{"name": "Diagnosis/Request Id", "type": DataType.STRING,
                              "value": request_id or None, "timestamp": stamp}]
    for name, (kind, get, unit) in DIAGNOSIS.items():
        metrics.append({"name": name, "type": kind, "value": _typed(kind, get(out, event)),
                        "timestamp": stamp, "unit": unit if birth else None})
    states = {s.get("point"): s.get("state") for s in out.get("state_detection") or []
              if isinstance(s, Mapping)}
    snapshot = event.get("snapshot") or {}
    for p in device.points:
        kind = DataType.BOOLEAN if p.kind == "bool" else DataType.DOUBLE
        metrics += [{"name": f"Points/{p.name}/State", "type": DataType.STRING,
                     "value": _typed(DataType.STRING, states.get(p.name)), "timestamp": stamp},
                    {"name": f"Points/{p.name}/Value", "type": kind,
                     "value": _typed(kind, snapshot.get(p.name)), "timestamp": stamp,
                     "unit": p.unit if birth else None}]
    if birth and device.description:
        metrics.append({"name": "Properties/Description", "type": DataType.STRING,
                        "value": device.description})
    return metrics
