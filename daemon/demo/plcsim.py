"""A simulated PLC (``rung demo`` and the tests): a real pymodbus server (Modbus TCP on a free
loopback port, or Modbus RTU on one end of a pseudo-terminal pair) over a register image the
caller reads and writes directly, as the PLC program would.

Built on pymodbus's own simulator API (``SimDevice``/``SimData``, pymodbus 3.16), not the
``ModbusDeviceContext`` datastore that pymodbus will remove in v4:

* the image lives here, in plain lists (``holding``, ``input``, ``coil``, ``discrete``); the
  device's ``action`` callback sees every access and copies the image into the device's
  registers before pymodbus answers, and copies written values back, so a test's direct edits
  are seen by the next request and a client's writes land in the image;
* the same callback answers injected exception codes (``fail_next``, ``fail_addresses``);
* the server's ``trace_pdu`` hook logs every request as it arrives (``log``): function code,
  address, count and unit id, exactly as the client sent them.

The action callback reports a bit request's span in 16-bit words, not bits, so for coil and
discrete requests the exact bit count is taken from the request just logged.

Usable from code that runs ``asyncio.run(...)``: ``async with SimPlc() as plc: ...`` (or
``await plc.start()`` / ``await plc.stop()``); ``stop`` drops every client connection and a
later ``start`` listens again on the same port (TCP) or the same pty (RTU).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
import tty
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from pymodbus.constants import ExcCodes
from pymodbus.framer import FramerType
from pymodbus.pdu import ModbusPDU
from pymodbus.server import ModbusSerialServer, ModbusTcpServer
from pymodbus.simulator import DataType, SimData, SimDevice

from rung.daemon.demo.localbroker import free_port

T = TypeVar("T")

# Function code -> image table (reads and writes alike).
TABLE_OF_FUNCTION = {1: "coil", 5: "coil", 15: "coil", 2: "discrete",
                     3: "holding", 6: "holding", 16: "holding", 23: "holding", 4: "input"}
BIT_TABLES = frozenset({"coil", "discrete"})


@dataclass(frozen=True)
class Access:
    """One request as the server received it."""

    function: int
    address: int
    count: int
    unit: int


@dataclass
class _Failure:
    table: str | None          # None: any table
    addresses: range | None    # None: any address
    code: int
    remaining: int | None      # None: for ever


class PtyPair:
    """Two pseudo-terminals bridged back to back, a null-modem cable without external tools:
    bytes written to ``path_a`` are read from ``path_b`` and back. A thread copies between the
    two master ends; the slave ends stay open here so the masters never see EIO while no
    program has a port open."""

    def __init__(self) -> None:
        self._master_a, self._slave_a = os.openpty()
        self._master_b, self._slave_b = os.openpty()
        for fd in (self._slave_a, self._slave_b):
            tty.setraw(fd)   # no echo, no line discipline: Modbus RTU frames are binary
        self.path_a = os.ttyname(self._slave_a)
        self.path_b = os.ttyname(self._slave_b)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._bridge, name="pty-bridge", daemon=True)
        self._thread.start()

    def _bridge(self) -> None:
        peer = {self._master_a: self._master_b, self._master_b: self._master_a}
        while True:
            ready, _, _ = select.select([self._master_a, self._master_b, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            for fd in ready:
                with contextlib.suppress(OSError):
                    os.write(peer[fd], os.read(fd, 4096))

    def close(self) -> None:
        """Stop the bridge and close every descriptor."""
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        for fd in (self._master_a, self._slave_a, self._master_b, self._slave_b,
                   self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class SimPlc:
    """A PLC answering every unit id in ``unit_ids`` from one register image of ``size``
    addresses per table (0..size-1; anything past it answers "illegal data address").

    ``kind`` is "tcp" (``host``/``port``: where to connect) or "rtu" (``serial_port``: the
    pty end the client opens; the server holds the other end at 19200 baud, 8N1: Linux ptys
    refuse parity, tcsetattr answers EINVAL for PARENB, so clients must use parity "N")."""

    kind: str = "tcp"
    unit_ids: tuple[int, ...] = (1,)
    size: int = 1024
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    holding: list[int] = field(init=False)
    input: list[int] = field(init=False)
    coil: list[bool] = field(init=False)
    discrete: list[bool] = field(init=False)
    log: list[Access] = field(init=False, default_factory=list)
    _failures: list[_Failure] = field(init=False, default_factory=list)
    _server: ModbusTcpServer | ModbusSerialServer | None = field(init=False, default=None)
    _pty: PtyPair | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.holding = [0] * self.size
        self.input = [0] * self.size
        self.coil = [False] * self.size
        self.discrete = [False] * self.size
        if self.kind == "rtu":
            self._pty = PtyPair()

    @property
    def serial_port(self) -> str:
        """The pty path a Modbus RTU client opens (RTU only)."""
        if self._pty is None:
            raise RuntimeError("serial_port: this SimPlc speaks Modbus TCP")
        return self._pty.path_b

    # --- failure injection -------------------------------------------------------------
    def fail_next(self, code: int, times: int = 1) -> None:
        """Answer the next ``times`` requests (any table, any address) with exception ``code``."""
        self._failures.append(_Failure(None, None, code, times))

    def fail_addresses(self, table: str, addresses: range, code: int) -> None:
        """Answer exception ``code`` to every request on ``table`` touching ``addresses``,
        until ``clear_failures``."""
        self._failures.append(_Failure(table, addresses, code, None))

    def clear_failures(self) -> None:
        """Answer normally again."""
        self._failures.clear()

    def requests(self, *functions: int) -> list[Access]:
        """The logged requests with one of ``functions`` (all of them when none is given)."""
        return [a for a in self.log if not functions or a.function in functions]

    # --- server ---------------------------------------------------------------------------
    def _device(self, unit: int) -> SimDevice:
        bits = [SimData(0, values=[False] * self.size, datatype=DataType.BITS)]
        regs = [SimData(0, count=self.size, values=0, datatype=DataType.REGISTERS)]
        # Separate tables (coils, discrete, holding, input), bit-addressed coils.
        return SimDevice(unit, simdata=(list(bits), list(bits), list(regs), list(regs)),
                         action=self._action)

    async def start(self) -> None:
        """Listen (TCP) or open the pty end (RTU); a no-op when already running."""
        if self._server is not None:
            return
        devices = [self._device(unit) for unit in self.unit_ids]
        server: ModbusTcpServer | ModbusSerialServer
        if self._pty is None:
            server = ModbusTcpServer(devices, address=(self.host, self.port),
                                     trace_pdu=self._trace)
        else:
            server = ModbusSerialServer(devices, framer=FramerType.RTU, port=self._pty.path_a,
                                        baudrate=19200, parity="N", stopbits=1, bytesize=8,
                                        timeout=1, trace_pdu=self._trace)
        await server.serve_forever(background=True)
        self._server = server

    async def stop(self) -> None:
        """Stop answering: connected clients see the connection drop (TCP)."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.shutdown()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        """Stop and release the pty pair (RTU)."""
        await self.stop()
        if self._pty is not None:
            self._pty.close()
            self._pty = None

    async def __aenter__(self) -> SimPlc:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    # --- pymodbus hooks -------------------------------------------------------------------
    def _trace(self, sending: bool, pdu: ModbusPDU) -> ModbusPDU:
        if not sending:
            count = pdu.count or len(pdu.bits) or len(pdu.registers)
            self.log.append(Access(pdu.function_code, pdu.address, count, pdu.dev_id))
        return pdu

    def _request_count(self, function: int, address: int, words: int) -> int:
        """A request's count in its own units: bit requests reach the action in words."""
        if TABLE_OF_FUNCTION[function] not in BIT_TABLES:
            return words
        for access in reversed(self.log):
            if (access.function, access.address) == (function, address):
                return access.count
        return words * 16

    def _injected(self, function: int, address: int, count: int) -> int | None:
        table = TABLE_OF_FUNCTION[function]
        span = range(address, address + count)
        for failure in self._failures:
            if failure.table not in (None, table):
                continue
            if failure.addresses is not None and not (
                    span.start < failure.addresses.stop and failure.addresses.start < span.stop):
                continue
            if failure.remaining is not None:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self._failures.remove(failure)
            return failure.code
        return None

    async def _action(self, function: int, start: int, address: int, words: int,
                      registers: list[int], values: list[int] | list[bool] | None
                      ) -> ExcCodes | None:
        """Called by pymodbus on every access, before it answers from ``registers``."""
        count = len(values) if values is not None else self._request_count(function, address,
                                                                            words)
        if (code := self._injected(function, address, count)) is not None:
            return ExcCodes(code)
        table = TABLE_OF_FUNCTION[function]
        image: list[int] | list[bool] = getattr(self, table)
        if values is not None:
            image[address:address + len(values)] = values  # type: ignore[assignment]
        if table in BIT_TABLES:
            # The device packs bits 16 to a word, bit 0 first; ``start`` is in words.
            for word in range(len(registers) - 1):   # the last word is pymodbus's end marker
                base = (start + word) * 16
                chunk = image[base:base + 16]
                registers[word] = sum(1 << i for i, bit in enumerate(chunk) if bit)
        else:
            registers[:self.size] = [int(v) for v in image]
        return None


class SimPlcThread:
    """A ``SimPlc`` served from an event loop in a thread of its own, for synchronous callers
    (``rung demo``, tests driving a ``rung serve`` child process): the register image is read
    and written directly, as the PLC program would."""

    def __init__(self, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="sim-plc")
        self.thread.start()
        self.sim = SimPlc(**kwargs)
        self.call(self.sim.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the simulator (``sim.stop()``, ``sim.start()``) to its end."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def close(self) -> None:
        self.call(self.sim.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    @property
    def regs(self) -> list[int]:
        """The holding registers."""
        return self.sim.holding

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 120) -> None:
        """Poll ``cond`` until it holds; TimeoutError naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.05)
        raise TimeoutError(f"the PLC never saw {what}")

    def trigger(self, req: int, req_seq: int) -> int:
        """The PLC program raising a request: ``req_seq += 1``, ``req = 1``."""
        self.regs[req_seq] = (self.regs[req_seq] + 1) & 0xFFFF
        self.regs[req] = 1
        return self.regs[req_seq]
