"""The link layer to PLCs: Modbus TCP and Modbus RTU through pymodbus (3.16.1, pinned).

A :class:`Link` is one PLC's connection. Over TCP it owns one client; over RTU every PLC on a
serial bus shares one client (one port can be opened once) and takes turns under the bus's
lock, so two PLCs' frames never interleave on the wire.

Every failure leaves here as a :class:`ModbusConfigError` (the request or the map is wrong:
retrying cannot help) or a :class:`ModbusTransientError` (the PLC or the path to it is down
or busy: the caller retries with backoff). A Link never sleeps and never retries by itself:
a call makes at most one connection attempt and one request, each bounded by the transport's
``timeout_s``; the next call after a lost connection reconnects once. A request in flight
when the connection drops fails at its timeout (pymodbus does not fail it sooner).

pymodbus's own reconnect task is off (``reconnect_delay=0``: ``connection_lost`` schedules
it only for a non-zero delay, and the async client's ``execute`` raises "Not connected"
rather than connecting), and its retries are off (``retries=0``): both would hide a dead PLC
behind minutes of silent waiting, and the retry policy belongs to the caller's loop.

Link states (``on_state(state, detail)`` on every change):

* ``connected``: the PLC answers (an exception response is an answer too);
* ``disconnected``: no connection (never opened, closed, refused, lost);
* ``error``: the connection is open but the PLC gave no usable answer in time. Over TCP the
  socket is then dropped, so a late answer cannot be taken for the next request's, and the
  next call reconnects; over RTU the port stays open for the other PLCs on the bus.
"""

from __future__ import annotations

import asyncio
import functools
import termios
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from pymodbus.client import AsyncModbusSerialClient, AsyncModbusTcpClient
from pymodbus.client.base import ModbusBaseClient
from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException
from pymodbus.framer import FramerType
from pymodbus.pdu import ModbusPDU

from rung.daemon.regmap import (
    TABLES,
    PlcMap,
    ReadBlock,
    RtuTransport,
    WriteRefused,
    values_from_block,
)
from rung.engines.errors import RungError

OnState = Callable[[str, str | None], None]  # (state, detail): see the module docstring


class ModbusError(RungError):
    """A Modbus request failed. ``plc``: the map's id; ``code``: the Modbus exception code
    when the PLC answered with one; ``transient``: whether retrying later may succeed."""

    transient = False

    def __init__(self, message: str, *, plc: str, code: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.plc = plc
        self.code = code


class ModbusConfigError(ModbusError):
    """The request cannot succeed as asked (function, address, value, allowlist, response
    shape): fix the map or the PLC program, do not retry."""

    transient = False


class ModbusTransientError(ModbusError):
    """The PLC or the path to it is down, busy or silent: retry with backoff."""

    transient = True


# Modbus exception code -> (name in the Modbus specification, transient). Transient means the
# PLC may answer later: 4 is a fault inside the device (a module fault, a CPU in STOP), which
# clears without any change on rung's side; 5 (acknowledge: accepted, still working) and 6
# (busy) say "ask again later"; 8 is a device memory fault like 4; 10 and 11 come from a
# gateway whose serial side is down. 1, 2, 3 and 7 reject the request itself. Codes outside
# the table are treated as not transient: an unknown answer goes to a person, not a retry loop.
EXCEPTION_CODES: dict[int, tuple[str, bool]] = {
    1: ("illegal function", False),
    2: ("illegal data address", False),
    3: ("illegal data value", False),
    4: ("server device failure", True),
    5: ("acknowledge", True),
    6: ("server device busy", True),
    7: ("negative acknowledge", False),
    8: ("memory parity error", True),
    10: ("gateway path unavailable", True),
    11: ("gateway target device failed to respond", True),
}
_HINTS = {
    1: "the PLC does not serve this table with this function; check the point's table",
    2: "the PLC has no such address; check the map's addresses (0-based) against the PLC",
    3: "the PLC refused the count or the value; check the map against the PLC program",
}
_ERRORS: dict[bool, type[ModbusError]] = {False: ModbusConfigError,
                                          True: ModbusTransientError}

# A foreign failure -> (what happened, transient, link state after it). First match wins:
# the pymodbus classes derive from ModbusException, and TimeoutError derives from OSError.
# A bare ModbusException (e.g. ParameterException) rejects the request and leaves the state.
_FAILURES: tuple[tuple[type[Exception], str, bool, str | None], ...] = (
    (ConnectionException, "connection failed", True, "disconnected"),
    (ModbusIOException, "no valid answer", True, "error"),
    (TimeoutError, "no answer in time", True, "error"),
    (OSError, "connection failed", True, "disconnected"),
    (ModbusException, "request refused by the client", False, None),
)

ReadCall = Callable[[ModbusBaseClient, int, int, int], Awaitable[ModbusPDU]]
# Table -> (function code, call(client, address, count, unit)).
_READS: dict[str, tuple[int, ReadCall]] = {
    "coil": (1, lambda c, a, n, u: c.read_coils(a, count=n, device_id=u)),
    "discrete": (2, lambda c, a, n, u: c.read_discrete_inputs(a, count=n, device_id=u)),
    "holding": (3, lambda c, a, n, u: c.read_holding_registers(a, count=n, device_id=u)),
    "input": (4, lambda c, a, n, u: c.read_input_registers(a, count=n, device_id=u)),
}
_GUARD = 1.5  # x timeout_s: a backstop around each pymodbus call, which times out by itself


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


def _bus_traced(port: str, connected: bool) -> None:
    """pymodbus's trace_connect for a bus client: the port failed under every Link on it."""
    if not connected and (bus := _BUSES.get(port)) is not None:
        for link in list(bus.links):
            link._set_state("disconnected", f"serial port {port} lost")


class Link:
    """One persistent connection to one PLC (TCP), or a share of one serial bus (RTU: one
    client per port path shared by every PLC on that bus, access serialized by a per-bus
    ``asyncio.Lock``). The bus's serial settings and client timeout come from the first map
    that opens it; later maps must name the same settings; each Link still bounds its calls
    by its own ``timeout_s``.
    """

    def __init__(self, plc: PlcMap, on_state: OnState | None = None) -> None:
        self.plc = plc
        self.state = "disconnected"
        self.last_error: str | None = None
        self._on_state = on_state
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
        """pymodbus's trace_connect (TCP): the peer closed or the socket failed."""
        if not connected:
            self._set_state("disconnected", f"connection to {self.where} lost")

    async def _ensure(self, client: ModbusBaseClient, op: str) -> None:
        """Connect once if not connected (called under the lock)."""
        if client.connected:
            if self.state == "disconnected":
                self._set_state("connected", None)
            return
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
            error = self._error(op, f"cannot reach the PLC: {reason}", True)
            self._set_state("disconnected", error.message)
            raise error
        self._set_state("connected", None)

    async def _call(self, op: str, function: int,
                    call: Callable[[ModbusBaseClient], Awaitable[ModbusPDU]]) -> ModbusPDU:
        """One request: connect if needed, send, translate every failure."""
        client, lock = self._attach()
        async with lock:
            await self._ensure(client, op)
            try:
                async with asyncio.timeout(self.plc.transport.timeout_s * _GUARD):
                    response = await call(client)
            except (ModbusException, OSError) as e:
                raise self._failed(op, client, e) from e
        if response.isError():
            code = getattr(response, "exception_code", 0)
            name, transient = EXCEPTION_CODES.get(code, (f"exception code {code}", False))
            error = self._error(op, f"the PLC answered exception {code} ({name})", transient,
                                code, _HINTS.get(code))
            self._set_state("connected", None)  # the PLC answered: the link itself is fine
            raise error
        if response.function_code != function:
            raise self._config(op, f"the response is for function {response.function_code}")
        self.last_error = None
        self._set_state("connected", None)
        return response

    def _failed(self, op: str, client: ModbusBaseClient, exc: Exception) -> ModbusError:
        what, transient, state = next((w, t, s) for kind, w, t, s in _FAILURES
                                      if isinstance(exc, kind))
        error = self._error(op, f"{what} ({exc or type(exc).__name__})", transient)
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
               hint: str | None = None) -> ModbusError:
        message = f"plc {self.plc.id}: {op}: {detail}"
        self.last_error = message
        return _ERRORS[transient](message, plc=self.plc.id, code=code, hint=hint)

    def _config(self, op: str, detail: str, hint: str | None = None) -> ModbusError:
        return self._error(op, detail, False, hint=hint)

    def _set_state(self, state: str, detail: str | None) -> None:
        if state != self.state:
            self.state = state
            if self._on_state is not None:
                self._on_state(state, detail)

    def __repr__(self) -> str:
        return f"Link({self.plc.id!r}, {self.where}, {self.state})"

