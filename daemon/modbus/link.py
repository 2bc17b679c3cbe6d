"""The link layer to PLCs: Modbus TCP and Modbus RTU through pymodbus (3.16.1, pinned).

A :class:`Link` is one PLC's connection. Over TCP it owns one client; over RTU every PLC on a
serial bus shares one client (one port can be opened once) and takes turns under the bus's
lock, so two PLCs' frames never interleave on the wire.

Every failure leaves here as a :class:`ModbusConfigError` (the request or the map is wrong:
retrying cannot help) or a :class:`ModbusTransientError` (the PLC or the path to it is down
or busy: the caller retries with backoff). Orthogonal to that, ``error.connection`` tells a
failure of the connection (refused, lost, no usable answer in time) from a reply the PLC
gave to this one request (an exception, a short reply): callers back off the whole link only
for the former. A Link never sleeps and never retries by itself, with one exception: a
request whose reused TCP connection closes under it is sent once more on a fresh connection
(the PLC closed it after the previous response, and the close crossed this request on the
wire; rung's requests are reads and writes of absolute values, so repeating one the PLC did
read is harmless). A call makes at most two connection attempts and two requests, each
bounded by the transport's ``timeout_s``. A request in flight when the connection drops
fails at once, not at its timeout.

Some gateways and small PLCs close the connection after every response. A Link notices it
(two connections in a row closed by the PLC right after their first response) and from then
on opens a connection per request and closes it after the response itself
(``per_transaction``); the link state stays ``connected`` throughout.

pymodbus's own reconnect task is off (``reconnect_delay=0``: ``connection_lost`` schedules
it only for a non-zero delay; a Link connects before each request, so the one connection
attempt pymodbus 3.16's ``execute`` makes on a missing transport only happens when the
connection drops in between), and its retries are off (``retries=0``): both would hide a
dead PLC behind minutes of silent waiting, and the retry policy belongs to the caller's
loop.

Link states (``on_state(state, detail)`` on every change):

* ``connected``: the PLC answers (an exception response is an answer too);
* ``degraded``: the PLC answers, but an operation of the caller's keeps failing
  (:meth:`Link.set_fault`); ``detail`` names each one and why;
* ``disconnected``: no connection (never opened, closed, refused, lost under a request); a
  connection the PLC closes between requests is reopened by the next request, and only a
  failed reopening reads ``disconnected``;
* ``error``: the connection is open but the PLC gave no usable answer in time. Over TCP the
  socket is then dropped, so a late answer cannot be taken for the next request's, and the
  next call reconnects; over RTU the port stays open for the other PLCs on the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import termios
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from pymodbus.client import AsyncModbusSerialClient, AsyncModbusTcpClient
from pymodbus.client.base import ModbusBaseClient
from pymodbus.exceptions import ConnectionException, ModbusException
from pymodbus.framer import FramerType
from pymodbus.pdu import ModbusPDU

from rung.daemon.modbus.errors import (
    ERRORS,
    EXCEPTION_CODES,
    FAILURES,
    HINTS,
    ModbusConfigError,
    ModbusError,
    ModbusTransientError,
)
from rung.daemon.modbus.regmap import (
    TABLES,
    PlcMap,
    ReadBlock,
    RtuTransport,
    WriteRefused,
    values_from_block,
)
from rung.daemon.plc.shown import ShowsState

__all__ = ["EXCEPTION_CODES", "Link", "ModbusConfigError", "ModbusError",
           "ModbusTransientError", "OnState"]

OnState = Callable[[str, str | None], None]  # (state, detail): see the module docstring
log = logging.getLogger("rung.modbus")


ReadCall = Callable[[ModbusBaseClient, int, int, int], Awaitable[ModbusPDU]]
# Table -> (function code, call(client, address, count, unit)).
_READS: dict[str, tuple[int, ReadCall]] = {
    "coil": (1, lambda c, a, n, u: c.read_coils(a, count=n, device_id=u)),
    "discrete": (2, lambda c, a, n, u: c.read_discrete_inputs(a, count=n, device_id=u)),
    "holding": (3, lambda c, a, n, u: c.read_holding_registers(a, count=n, device_id=u)),
    "input": (4, lambda c, a, n, u: c.read_input_registers(a, count=n, device_id=u)),
}
_GUARD = 1.5  # x timeout_s: a backstop around each pymodbus call, which times out by itself
_STRIKES = 2  # connections in a row closed by the PLC after one response: per_transaction
_CLOSED_REUSED, _CLOSED_FRESH = "closed reused", "closed fresh"   # _send outcomes


@dataclass
class _Bus:
    """One serial port's client, shared by every Link on that bus; ``links`` is the bus's
    reference count (the client closes when the last Link leaves)."""

    client: AsyncModbusSerialClient
    lock: asyncio.Lock
    settings: tuple[int, str, int, int]  # baud, parity, stopbits, bytesize
    loop: asyncio.AbstractEventLoop
    links: set[Link] = field(default_factory=set)


# Serial port path -> its bus. Module-level: every Link in the process shares it.
_BUSES: dict[str, _Bus] = {}


async def _unless(call: Awaitable[ModbusPDU], lost: asyncio.Event) -> ModbusPDU | None:
    """The call's response, or None as soon as ``lost`` is set (the call is cancelled)."""
    task = asyncio.ensure_future(call)
    waiter = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ModbusException, OSError):
                await task
    return task.result() if not task.cancelled() else None


def _bus_traced(port: str, connected: bool) -> None:
    """pymodbus's trace_connect for a bus client: the port failed under every Link on it."""
    if not connected and (bus := _BUSES.get(port)) is not None:
        for link in list(bus.links):
            link._set_state("disconnected", f"serial port {port} lost")


class Link(ShowsState):
    """One persistent connection to one PLC (TCP), or a share of one serial bus (RTU: one
    client per port path shared by every PLC on that bus, access serialized by a per-bus
    ``asyncio.Lock``). The bus's serial settings and client timeout come from the first map
    that opens it; later maps must name the same settings; each Link still bounds its calls
    by its own ``timeout_s``.
    """

    def __init__(self, plc: PlcMap, on_state: OnState | None = None) -> None:
        super().__init__()
        self.plc = plc
        self.state = "disconnected"   # of the connection; on_state may say "degraded"
        self.last_error: str | None = None
        self.per_transaction = False   # learned: the PLC closes after every response
        self.on_state = on_state   # told every change of the state shown
        self._detail: str | None = None
        self._served = 0    # responses on the current TCP connection
        self._strikes = 0   # connections in a row the PLC closed after their first response
        self._peer_closed = False
        self._lost: asyncio.Event | None = None   # set when the connection drops under a call
        self._client: ModbusBaseClient | None = None
        self._lock = asyncio.Lock()  # TCP; an RTU Link uses its bus's lock instead
        self._bus: _Bus | None = None
        t = plc.transport
        self.where = t.port if isinstance(t, RtuTransport) else f"{t.host}:{t.port}"

    # --- public API -----------------------------------------------------------------------
    async def connect(self) -> None:
        """Open the connection (or join the bus) unless it is open.

        Raises:
            ModbusTransientError: the PLC (or the port) cannot be reached.
            ModbusConfigError: the port refuses the map's serial settings, or the bus is
                already open with other settings.
        """
        client, lock = self._attach()
        async with lock:
            await self._ensure(client, f"connect {self.where}")

    async def close(self) -> None:
        """Close the connection (RTU: leave the bus; the last Link out closes the port)."""
        bus, client, self._bus, self._client = self._bus, self._client, None, None
        if bus is not None:
            bus.links.discard(self)
            if not bus.links:
                bus.client.close()
                if _BUSES.get(self.where) is bus:
                    del _BUSES[self.where]
        elif client is not None:
            client.close()
        self._served = 0
        self._set_state("disconnected", None)

    async def read(self, table: str, address: int, count: int) -> list[int] | list[bool]:
        """Read ``count`` values of ``table`` (coil, discrete, holding, input) from
        ``address`` in one request: registers as ints, bits as bools."""
        op = f"read {table} {address}+{count}"
        if table not in _READS:
            raise self._config(op, f"no table {table!r}; expected one of {', '.join(_READS)}")
        self._check_span(op, address, count, TABLES[table].max_read)
        function, call = _READS[table]
        unit = self.plc.transport.unit_id
        response = await self._call(op, function, lambda c: call(c, address, count, unit))
        if TABLES[table].bits:
            bits = list(response.bits)
            if len(bits) < count:  # bit reads come back padded to whole bytes, never short
                raise self._config(op, f"the response holds {len(bits)} values")
            return bits[:count]
        if len(response.registers) != count:
            raise self._config(op, f"the response holds {len(response.registers)} values")
        return list(response.registers)

    async def read_block(self, block: ReadBlock) -> dict[str, float | int | bool]:
        """Read one planned block and decode its points (point name -> value)."""
        return values_from_block(block, await self.read(block.table, block.address,
                                                        block.count))

    async def read_snapshot(self) -> dict[str, float | int | bool]:
        """Every point of the map: one request per block of ``plc.plan()``."""
        values: dict[str, float | int | bool] = {}
        for block in self.plc.plan():
            values.update(await self.read_block(block))
        return values

    async def write_registers(self, address: int, values: Sequence[int]) -> None:
        """Write holding registers from ``address`` in one "write multiple registers"
        request (function 16, even for one value: some PLCs serve no function 6). The map's
        allowlist is checked first: a refused write never reaches the wire."""
        op = f"write holding {address}+{len(values)}"
        self._allowed(op, "holding", address, len(values))
        self._check_span(op, address, len(values), TABLES["holding"].max_write)
        if any(not isinstance(v, int) or not 0 <= v <= 0xFFFF for v in values):
            raise self._config(op, "register values must be integers 0..65535")
        unit, words = self.plc.transport.unit_id, list(values)
        response = await self._call(
            op, 16, lambda c: c.write_registers(address, words, device_id=unit))
        if (response.address, response.count) != (address, len(words)):
            raise self._config(op, f"the response echoes {response.address}+{response.count}")

    async def write_coil(self, address: int, value: bool) -> None:
        """Write one coil (function 5), after the map's allowlist check."""
        op = f"write coil {address}"
        self._allowed(op, "coil", address, 1)
        self._check_span(op, address, 1, TABLES["coil"].max_write)
        unit = self.plc.transport.unit_id
        response = await self._call(
            op, 5, lambda c: c.write_coil(address, bool(value), device_id=unit))
        if response.address != address:
            raise self._config(op, f"the response echoes address {response.address}")

    # --- connection -----------------------------------------------------------------------
    def _attach(self) -> tuple[ModbusBaseClient, asyncio.Lock]:
        """This Link's client and lock, made on first use (pymodbus clients need the
        running loop)."""
        if self._client is not None:
            return self._client, self._bus.lock if self._bus else self._lock
        t = self.plc.transport
        if not isinstance(t, RtuTransport):
            self._client = AsyncModbusTcpClient(
                t.host, port=t.port, name=f"rung-{self.plc.id}", timeout=t.timeout_s,
                retries=0, reconnect_delay=0, trace_connect=self._traced)
            return self._client, self._lock
        settings = (t.baud, t.parity, t.stopbits, t.bytesize)
        loop = asyncio.get_running_loop()
        bus = _BUSES.get(t.port)
        if bus is not None and bus.loop is not loop:
            bus = None  # left open by an event loop that has ended: unusable, replace it
        if bus is None:
            bus = _Bus(AsyncModbusSerialClient(
                t.port, framer=FramerType.RTU, baudrate=t.baud, parity=t.parity,
                stopbits=t.stopbits, bytesize=t.bytesize, name=f"rung-{t.port}",
                timeout=t.timeout_s, retries=0, reconnect_delay=0,
                trace_connect=functools.partial(_bus_traced, t.port)),
                asyncio.Lock(), settings, loop)
            _BUSES[t.port] = bus
        elif bus.settings != settings:
            raise self._config(f"connect {t.port}", f"the bus is already open with baud, "
                               f"parity, stopbits, bytesize {bus.settings}, not {settings}",
                               "every map on one serial port needs the same settings")
        bus.links.add(self)
        self._bus, self._client = bus, bus.client
        return bus.client, bus.lock

    def _traced(self, connected: bool) -> None:
        """pymodbus's trace_connect (TCP): the peer closed or the socket failed (never
        called for rung's own close). Between requests it changes nothing (the next request
        reconnects); under a request it fails that request at once."""
        if connected:
            return
        self._peer_closed = True
        if self._lost is not None:
            self._lost.set()

    def _count_close(self) -> None:
        """Before reconnecting after the PLC closed the connection: did it close after the
        first response (the close may cross that response on the wire)?"""
        self._strikes = self._strikes + 1 if self._served == 1 else 0
        self._peer_closed = False
        if self._strikes >= _STRIKES and not self.per_transaction:
            self.per_transaction = True
            log.warning("plc %s at %s closes the connection after every response: one "
                        "connection per request from now on", self.plc.id, self.where)

    async def _ensure(self, client: ModbusBaseClient, op: str) -> None:
        """Connect once if not connected (called under the lock)."""
        if client.connected:
            if self.state == "disconnected":
                self._set_state("connected", None)
            return
        if self._peer_closed:
            self._count_close()
        timeout = self.plc.transport.timeout_s
        try:
            async with asyncio.timeout(timeout * _GUARD):
                ok = await client.connect()
        except (termios.error, ValueError) as e:  # pyserial: the port refuses the settings
            self._set_state("disconnected", str(e))
            raise self._config(op, f"the serial port refuses the settings ({e})") from e
        except (ModbusException, OSError) as e:
            ok, reason = False, str(e) or type(e).__name__
        else:
            reason = f"refused or no answer within {timeout:g} s"
        if not ok:
            error = self._error(op, f"cannot reach the PLC: {reason}", True, connection=True)
            self._set_state("disconnected", error.message)
            raise error
        self._served = 0
        self._set_state("connected", None)

    async def _call(self, op: str, function: int,
                    call: Callable[[ModbusBaseClient], Awaitable[ModbusPDU]]) -> ModbusPDU:
        """One request: connect if needed, send, translate every failure."""
        client, lock = self._attach()
        async with lock:
            response = await self._send(op, client, call)
            if response is _CLOSED_REUSED:   # the PLC closed it before reading: once more
                response = await self._send(op, client, call)
            if not isinstance(response, ModbusPDU):
                raise self._failed(op, client,
                                   ConnectionException("the PLC closed the connection"))
        if response.isError():
            code = getattr(response, "exception_code", 0)
            name, transient = EXCEPTION_CODES.get(code, (f"exception code {code}", False))
            error = self._error(op, f"the PLC answered exception {code} ({name})", transient,
                                code, HINTS.get(code))
            self._set_state("connected", None)  # the PLC answered: the link itself is fine
            raise error
        if response.function_code != function:
            raise self._config(op, f"the response is for function {response.function_code}")
        self.last_error = None
        self._set_state("connected", None)
        return response

    async def _send(self, op: str, client: ModbusBaseClient,
                    call: Callable[[ModbusBaseClient], Awaitable[ModbusPDU]]
                    ) -> ModbusPDU | str:
        """Send one request (under the lock) and wait for its answer or the connection's
        end: the response, or ``_CLOSED_REUSED`` / ``_CLOSED_FRESH`` when the connection
        closed under the request (only a reused one is worth sending the request again)."""
        await self._ensure(client, op)
        reused, lost = self._served > 0, asyncio.Event()
        self._lost = lost if self._bus is None else None
        try:
            async with asyncio.timeout(self.plc.transport.timeout_s * _GUARD):
                response = await _unless(call(client), lost)
        except (ModbusException, OSError) as e:
            raise self._failed(op, client, e) from e
        finally:
            self._lost = None
        if response is None:
            client.close()   # pymodbus may still hold the half-closed transport
            return _CLOSED_REUSED if reused else _CLOSED_FRESH
        self._served += 1
        if self.per_transaction and self._bus is None:
            client.close()   # before the PLC does: the next request reconnects
        return response

    def _failed(self, op: str, client: ModbusBaseClient, exc: Exception) -> ModbusError:
        what, transient, state = next((w, t, s) for kind, w, t, s in FAILURES
                                      if isinstance(exc, kind))
        error = self._error(op, f"{what} ({exc or type(exc).__name__})", transient,
                            connection=state is not None)
        if state == "error" and not client.connected:
            state = "disconnected"  # the connection went away under the request
        # Drop the connection: TCP after any failure, so the next call gets a fresh socket
        # and no late answer; RTU only when the port itself failed (others share it).
        if state == "disconnected" or (state == "error" and self._bus is None):
            client.close()
        # A failed port fails every Link on the bus; anything else concerns this Link only.
        links = list(self._bus.links) if self._bus and state == "disconnected" else [self]
        if state is not None:
            for link in links:
                link._set_state(state, error.message)
        return error

    # --- helpers --------------------------------------------------------------------------
    def _allowed(self, op: str, table: str, address: int, count: int) -> None:
        try:
            self.plc.check_write(table, address, count)
        except WriteRefused as e:
            raise ModbusConfigError(f"plc {self.plc.id}: {op}: refused: {e.message}",
                                    plc=self.plc.id, hint=e.hint) from e

    def _check_span(self, op: str, address: int, count: int, most: int) -> None:
        if not 1 <= count <= most:
            raise self._config(op, f"one request carries 1..{most} values, not {count}")
        if address < 0 or address + count > 0x10000:
            raise self._config(op, "addresses run 0..65535")

    def _error(self, op: str, detail: str, transient: bool, code: int | None = None,
               hint: str | None = None, connection: bool = False) -> ModbusError:
        message = f"plc {self.plc.id}: {op}: {detail}"
        self.last_error = message
        return ERRORS[transient](message, plc=self.plc.id, code=code, hint=hint,
                                  connection=connection)

    def _config(self, op: str, detail: str, hint: str | None = None) -> ModbusError:
        return self._error(op, detail, False, hint=hint)

    # --- state ----------------------------------------------------------------------------
    def _set_state(self, state: str, detail: str | None) -> None:
        if state != self.state:
            self.state, self._detail = state, detail
            self._show()

    def __repr__(self) -> str:
        return f"Link({self.plc.id!r}, {self.where}, {self.state})"

