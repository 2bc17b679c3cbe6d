"""The Modbus handshake with one PLC: the handshake of ``daemon/plc/handshake.py`` over a
register map's holding registers.

docs/contract.md, per PLC, in holding registers named by the register map::

    PLC: req_seq += 1, req = 1
    rung: ack_seq = req_seq, busy = 1          (the PLC sees its request taken)
    rung: snapshot -> diagnosis (+ fault tree) -> MQTT {base}/diag/{plc}/event and /last
    rung: result, err; then done = 1, busy = 0
    PLC: reads result/err, req = 0
    rung: done = 0
    rung: heartbeat += 1 every heartbeat_s, in a poll that read the handshake

:class:`RegisterTransport` is the Modbus side of it: the eight registers in one FC3 read of
their span, rung's writes as FC16, one request when the addresses are adjacent, else one
per register in address order. The loop, the per-operation faults and the kept answer are
the shared :class:`~rung.daemon.plc.handshake.HandshakeAgent`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from rung.daemon.metrics import Metrics
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import PlcMap
from rung.daemon.plc.handshake import HandshakeAgent, Plant, Trends
from rung.daemon.plc.job import Submit, err_codes
from rung.daemon.plc.link_state import Publish
from rung.daemon.plc.transport import OnState, Values

__all__ = ["ERR_CODES", "Plant", "PlcAgent", "Publish", "RegisterTransport", "Submit",
           "Trends"]


VIA = "Modbus"
ERR_CODES = err_codes(VIA)   # what the err register's values mean (docs/modbus.md)


class RegisterTransport:
    """The handshake's values as one PLC's holding registers, over its :class:`Link`."""

    on_request: Callable[[], None] | None = None   # Modbus has no subscriptions: polled

    def __init__(self, plc: PlcMap, link: Link) -> None:
        self.plc, self.link = plc, link

    @property
    def on_state(self) -> OnState | None:
        return self.link.on_state

    @on_state.setter
    def on_state(self, value: OnState | None) -> None:
        self.link.on_state = value

    @property
    def per_transaction(self) -> bool:
        return self.link.per_transaction

    async def read_handshake(self) -> dict[str, int]:
        start, count = self.plc.handshake.read_span()
        raw = [int(v) for v in await self.link.read("holding", start, count)]
        return {name: raw[addr - start]
                for name, addr in self.plc.handshake.registers.items()}

    async def write(self, values: Mapping[str, int]) -> None:
        """Write handshake registers by name: one request when their addresses are
        adjacent, else one per register in address order."""
        registers = self.plc.handshake.registers
        writes = sorted((registers[name], v) for name, v in values.items())
        if all(b[0] == a[0] + 1 for a, b in zip(writes, writes[1:], strict=False)):
            await self.link.write_registers(writes[0][0], [v for _, v in writes])
            return
        for address, value in writes:
            await self.link.write_registers(address, [value])

    async def read_snapshot(self) -> Values:
        return await self.link.read_snapshot()

    def set_fault(self, what: str, detail: str | None) -> None:
        self.link.set_fault(what, detail)

    async def close(self) -> None:
        await self.link.close()


class PlcAgent(HandshakeAgent):
    """Polls one PLC's handshake registers, runs its requests through the shared
    scheduler, answers; publishes its diagnoses and its link's state (``link_state``) under
    ``base_topic``.

    ``metrics``: the daemon's (its ``plc`` series); ``state_dir``: where the answer waiting
    for delivery is kept (``{state_dir}/{plc id}.json``); None keeps it in memory only;
    ``plant``: told every diagnosis and link change too (Sparkplug B), or None. The
    link's ``on_state`` is the agent's from here on.
    """

    def __init__(self, plc: PlcMap, link: Link, submit: Submit, publish: Publish,
                 base_topic: str, timeout_s: float, reconnect_min_s: float = 0.5,
                 reconnect_max_s: float = 30.0, metrics: Metrics | None = None,
                 state_dir: Path | None = None, plant: Plant | None = None) -> None:
        self.link = link
        super().__init__(plc, RegisterTransport(plc, link), submit, publish, base_topic,
                         timeout_s, reconnect_min_s, reconnect_max_s, metrics=metrics,
                         state_dir=state_dir, plant=plant, via=VIA)
