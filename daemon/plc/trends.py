"""The snapshots kept of a PLC for its points' trends (a map's ``history: {keep,
every_s}``): each diagnosis request gets them as its numeric points' ``history``, so its
prognosis comes from a trend fitted by code (docs/tasks.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from rung.daemon.plc.transport import HistorySpec


class Trends:
    """The last ``spec.keep`` snapshots of one PLC, newest last, handed to a diagnosis as
    each numeric point's ``history`` (``[[t, value], ...]``, unix seconds, increasing; the
    request's own value the newest sample)."""

    def __init__(self, spec: HistorySpec) -> None:
        self.spec = spec
        self.snapshots: deque[tuple[float, dict[str, Any]]] = deque(maxlen=spec.keep)

    def add(self, t: float, snapshot: Mapping[str, Any]) -> None:
        if not self.snapshots or t > self.snapshots[-1][0]:
            self.snapshots.append((t, dict(snapshot)))

    def attach(self, data: Mapping[str, Any], now: float) -> dict[str, Any]:
        """``data`` (a diagnosis input) with the history of each numeric point; its values
        are kept as a snapshot too."""
        points = []
        for p in data.get("points") or []:
            value = p.get("value") if isinstance(p, Mapping) else None
            if _numeric(value):
                past = [[round(t, 3), s[p["name"]]] for t, s in self.snapshots
                        if round(t, 3) < round(now, 3) and _numeric(s.get(p["name"]))]
                if past:
                    p = {**p, "history": [*past, [round(now, 3), value]]}
            points.append(p)
        self.add(now, {p["name"]: p.get("value") for p in points
                       if isinstance(p, Mapping) and "name" in p})
        return {**data, "points": points}


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
