"""The parts of a PLC map every protocol shares: the point model's checks (names, ids,
limits, how many), the kept history, and THE handshake block (its eight values, who writes
which, its pacing). A Modbus register map (``daemon/modbus/regmap.py``) places the block in
holding registers, an OPC UA node map (``daemon/opcua/nodemap.py``) in nodes; both check it
here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from rung.daemon import keyed

# The diagnosis task's input schema takes these limits, in engineering units, and the state
# bands only make sense in this order: low_alarm <= low_alert <= alert <= alarm.
LIMIT_KEYS = ("low_alarm", "low_alert", "alert", "alarm")
MAX_POINTS = 100  # the diagnosis task takes at most 100 points
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the id becomes an MQTT topic level
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# the diagnosis task takes at most 300 samples of a point's history: the kept snapshots and
# the request's own
HISTORY_MAX = 299

# The handshake block: eight values, the first two the PLC's, the other six rung's.
HANDSHAKE_VALUES = ("req", "req_seq", "ack_seq", "busy", "done", "err", "result", "heartbeat")
PLC_WRITES = HANDSHAKE_VALUES[:2]
RUNG_WRITES = HANDSHAKE_VALUES[2:]
PACING = ("poll_s", "heartbeat_s", "watchdog_s")
_POSITIVE = keyed.number(lambda v: v > 0, "a number > 0")


@dataclass(frozen=True)
class History:
    """The snapshots rung keeps of a PLC for its points' trends: the last ``keep``, one
    read every ``every_s`` seconds besides each request's own; a diagnosis gets them as
    each numeric point's ``history`` (its prognosis, docs/tasks.md)."""

    keep: int
    every_s: float = 60.0


class Paced:
    """Mixed into a map's handshake block (a frozen dataclass with these three fields):
    ``poll_s`` the cycle, ``heartbeat_s`` how often the heartbeat moves, ``watchdog_s`` how
    long the PLC program lets it stand still before it takes rung for down."""

    poll_s: float
    heartbeat_s: float
    watchdog_s: float

    @property
    def retry_max_s(self) -> float:
        """The longest rung waits between two attempts of anything the heartbeat depends on
        (reconnecting, the handshake read, the heartbeat write), and of its other handshake
        writes: ``(watchdog_s - heartbeat_s) / 2``. A fault that clears within this long
        never trips the PLC's watchdog; after a longer one the heartbeat moves again within
        this long (plus ``timeout_s`` when the PLC is silent rather than refusing)."""
        return max(self.poll_s, (self.watchdog_s - self.heartbeat_s) / 2)


def handshake_keys(place: keyed.Key) -> dict[str, keyed.Key]:
    """The handshake section's keys: each of the eight values where ``place`` says, and
    the pacing."""
    return {name: place for name in HANDSHAKE_VALUES} | {name: _POSITIVE for name in PACING}


def check_distinct(values: Mapping[str, Any], key: str, hint: str,
                   ident: Callable[[Any], str] = str) -> None:
    """Every handshake value in its own place (``ident``: the place as text).

    Raises:
        keyed.Invalid: at the second value of a place.
    """
    seen: dict[str, str] = {}
    for name in HANDSHAKE_VALUES:
        text = ident(values[name])
        if text in seen:
            raise keyed.Invalid(f"{key}.{name}", f"{text} is also {key}.{seen[text]}", hint)
        seen[text] = name


def check_watchdog(hs: Paced, key: str, hint: str) -> None:
    """The PLC's watchdog leaves the heartbeat time to move: at worst it moves every
    ``heartbeat_s + poll_s``.

    Raises:
        keyed.Invalid: ``watchdog_s`` is below ``heartbeat_s + 2 x poll_s``.
    """
    least = hs.heartbeat_s + 2 * hs.poll_s
    if hs.watchdog_s < least:
        raise keyed.Invalid(f"{key}.watchdog_s",
                            f"expected >= {key}.heartbeat_s + 2 x {key}.poll_s "
                            f"({least:g}), got {hs.watchdog_s:g}", hint)


def point_limits(values: dict[str, Any], key: str) -> dict[str, float] | None:
    """A point's limits, in order (``LIMIT_KEYS``), or None: one rule for register and
    node maps (one point model)."""
    given = [(name, values[name]) for name in LIMIT_KEYS if name in values]
    for (low, a), (high, b) in pairwise(given):
        if b < a:
            raise keyed.Invalid(f"{key}.{high}", f"expected >= {key}.{low} ({a:g}), got {b:g}",
                                f"limits go {' <= '.join(LIMIT_KEYS)}")
    return dict(given) or None


HISTORY_KEY = keyed.section(lambda values, key: History(**values),
                            {"keep": keyed.integer(1, HISTORY_MAX), "every_s": _POSITIVE},
                            ("keep",), nullable=True)
FAULT_TREE_KEY = keyed.section(lambda values, key: values,
                               {"top_event": keyed.text(300), "system": keyed.text(2000)},
                               ("top_event",), nullable=True)
