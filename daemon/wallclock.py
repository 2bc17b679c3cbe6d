"""Wall-clock times on the wire (statuses, claims, diagnoses): UTC ISO 8601 to the second,
``2025-03-04T06:15:02Z``, and back."""

from __future__ import annotations

import calendar
import time
from typing import Any

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def iso(t: float) -> str:
    """Seconds since the epoch as UTC ISO 8601 (``2025-03-04T06:15:02Z``)."""
    return time.strftime(FORMAT, time.gmtime(t))


def from_iso(v: Any) -> float | None:
    """Seconds since the epoch of an :func:`iso` time, else None."""
    if not isinstance(v, str) or len(v) != 20:
        return None
    try:
        return float(calendar.timegm(time.strptime(v, FORMAT)))
    except ValueError:
        return None
