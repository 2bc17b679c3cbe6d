"""What the handshake needs from a PLC and from the link to it, whatever the protocol.

A :class:`Transport` moves the handshake's eight values by name (``req``, ``req_seq``,
``ack_seq``, ``busy``, ``done``, ``err``, ``result``, ``heartbeat``) and reads the snapshot
as named points in engineering units; how they sit in the PLC (holding registers, OPC UA
nodes) is the transport's business. Every failure leaves a transport as a
:class:`~rung.daemon.plc.errors.PlcError`. A :class:`PlcSpec` is a checked map (a Modbus
register map, an OPC UA node map): the PLC's id, description, points with units and
limits, the handshake's pacing, and what else to ask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

OnState = Callable[[str, str | None], None]   # (state, detail): see daemon/modbus/link.py
Values = dict[str, float | int | bool]        # point name -> value in engineering units


class PointSpec(Protocol):
    """One point of a snapshot: the same model for every protocol."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def unit(self) -> str | None: ...
    @property
    def limits(self) -> dict[str, float] | None: ...


class Pacing(Protocol):
    """The handshake's timing: the cycle, the heartbeat, and the longest wait between
    retries of anything the heartbeat depends on (the PLC's watchdog sets it)."""

    @property
    def poll_s(self) -> float: ...
    @property
    def heartbeat_s(self) -> float: ...
    @property
    def retry_max_s(self) -> float: ...


class HistorySpec(Protocol):
    @property
    def keep(self) -> int: ...
    @property
    def every_s(self) -> float: ...


class PlcSpec(Protocol):
    """A checked map of one PLC, as the handshake and the diagnosis use it."""

    @property
    def id(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def points(self) -> Sequence[PointSpec]: ...
    @property
    def handshake(self) -> Pacing: ...
    @property
    def fault_tree(self) -> dict[str, Any] | None: ...
    @property
    def history(self) -> HistorySpec | None: ...


class Snapshots(Protocol):
    async def read_snapshot(self) -> Values:
        """Every point of the map, in engineering units."""
        ...


class Transport(Snapshots, Protocol):
    """One PLC's link as the handshake drives it. ``on_state`` is told every change of the
    link state (connected, degraded, disconnected, error); ``on_request`` is called when the
    PLC may have raised or changed a request (a protocol with subscriptions calls it on a
    data change of req/req_seq, so the handshake reads at once instead of at its next
    cycle); ``per_transaction``: the link opens a connection per request."""

    on_state: OnState | None
    on_request: Callable[[], None] | None

    @property
    def per_transaction(self) -> bool: ...

    async def read_handshake(self) -> dict[str, int]:
        """All eight handshake values by name, in one read."""
        ...

    async def write(self, values: Mapping[str, int]) -> None:
        """Write handshake values by name (rung's six only; the map's allowlist is checked
        before anything goes out)."""
        ...

    def set_fault(self, what: str, detail: str | None) -> None:
        """The handshake's operation ``what`` keeps failing (``detail`` says why), or works
        again (None): a connected link reads ``degraded`` while any fails."""
        ...

    async def close(self) -> None: ...
