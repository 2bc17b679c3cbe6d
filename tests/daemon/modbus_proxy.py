"""A fault-injecting Modbus TCP proxy for tests: rung connects to it, it forwards every frame
to a real pymodbus PLC (rung.daemon.demo.plcsim) and records every request on the way.

Faults are rules matched per request (function code, an address range the request
overlaps or the exact start address ``at``, how many times):

* ``exception``: answer exception ``arg`` instead of forwarding;
* ``short``: forward, then cut ``arg`` registers off a read reply (a well-formed frame
  that holds fewer values than asked for);
* ``delay``: forward, answer ``arg`` seconds late;
* ``close``: forward, answer, then close the connection (a gateway or small PLC that closes
  after every transaction);
* ``silent``: forward, never answer;
* bad frames instead of the PLC's reply: ``tid`` (another transaction id), ``pid`` (protocol
  id 1), ``length`` (an MBAP length that does not match), ``garbage`` (bytes that are no
  Modbus frame). ``values`` puts register values into the bad frame (a reply that would
  raise ``req`` if rung took it).

Runs on any event loop (``await proxy.start()``); rules are set and records read from any
thread. ``pause``/``start`` stop and resume listening on the same port with every
connection dropped, as a PLC that goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rung.daemon.demo.localbroker import free_port

ACTIONS = ("exception", "short", "delay", "close", "silent", "tid", "pid", "length", "garbage")
READS, WRITES = (1, 2, 3, 4), (5, 6, 15, 16)


@dataclass(frozen=True)
class Seen:
    """One request as the proxy received it."""

    conn: int                 # connection number, from 1
    t: float                  # time.monotonic() at arrival
    function: int
    address: int
    count: int
    values: tuple[int, ...]   # registers written (FC6, FC16), else ()
    fault: str | None = None  # the rule's action applied to it


@dataclass
class Rule:
    action: str
    function: int | None = None
    addresses: range | None = None
    arg: float = 0
    times: int | None = None          # None: until cleared
    values: tuple[int, ...] = ()
    at: int | None = None             # the request's start address, exactly
    hits: int = 0

    def matches(self, function: int, address: int, count: int) -> bool:
        if self.function is not None and function != self.function:
            return False
        if self.at is not None and address != self.at:
            return False
        return self.addresses is None or (address < self.addresses.stop
                                          and self.addresses.start < address + count)


def parse_request(pdu: bytes) -> tuple[int, int, int, tuple[int, ...]]:
    """(function, address, count, written registers) of a request PDU."""
    function = pdu[0]
    if function in READS or function == 15:
        address, count = struct.unpack(">HH", pdu[1:5])
        return function, address, count, ()
    if function in (5, 6):
        address, value = struct.unpack(">HH", pdu[1:5])
        return function, address, 1, (value,) if function == 6 else ()
    if function == 16:
        address, count = struct.unpack(">HH", pdu[1:5])
        return function, address, count, struct.unpack(f">{count}H", pdu[6:6 + 2 * count])
    return function, 0, 0, ()


def frame(tid: int, unit: int, pdu: bytes, pid: int = 0, extra_length: int = 0) -> bytes:
    return struct.pack(">HHHB", tid, pid, len(pdu) + 1 + extra_length, unit) + pdu


@dataclass
class ModbusProxy:
    """Listens on ``host:port``, forwards to ``upstream`` (the PLC)."""

    upstream: tuple[str, int]
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    connections: int = 0
    _rules: list[Rule] = field(default_factory=list)
    _log: list[Seen] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _server: asyncio.Server | None = None
    _open: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    # --- control, from any thread -------------------------------------------------------
    def inject(self, action: str, function: int | None = None,
               addresses: range | Sequence[int] | None = None, arg: float = 0,
               times: int | None = None, values: Sequence[int] = (),
               at: int | None = None) -> Rule:
        """Add a fault rule (first matching rule wins, in the order added)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        span = None if addresses is None else range(min(addresses), max(addresses) + 1)
        rule = Rule(action, function, span, arg, times, tuple(values), at)
        with self._cond:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Forward everything unchanged again."""
        with self._cond:
            self._rules.clear()

    def requests(self, function: int | None = None, address: int | None = None,
                 since: float = 0.0) -> list[Seen]:
        """Recorded requests, optionally of one function, starting at one address, after
        ``since`` (a time.monotonic() value)."""
        with self._cond:
            return [s for s in self._log if (function is None or s.function == function)
                    and (address is None or s.address == address) and s.t >= since]

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 30) -> None:
        """Block until ``cond()`` holds, re-checked on every request and at least every
        0.05 s; TimeoutError naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not cond():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: not within {timeout} s")
                self._cond.wait(min(left, 0.05))

    async def until(self, what: str, cond: Callable[[], bool], timeout: float = 30) -> None:
        """``wait`` for code on the proxy's own event loop (waits in a worker thread)."""
        await asyncio.get_running_loop().run_in_executor(None, self.wait, what, cond, timeout)

    # --- server ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def pause(self) -> None:
        """Stop listening and drop every connection (``start`` listens again)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._open):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        self._open.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            up = await asyncio.open_connection(*self.upstream)
            while await self._one(conn, reader, writer, *up):
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass   # a leaf task: ending it quietly is all a cancellation asks here
        finally:
            self._open.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            for w in (writer, up[1] if up else None):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError):
                        await w.wait_closed()

    async def _one(self, conn: int, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
                   up_writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is to be closed."""
        head = await reader.readexactly(7)
        tid, pid, length, unit = struct.unpack(">HHHB", head)
        pdu = await reader.readexactly(length - 1)
        function, address, count, values = parse_request(pdu)
        with self._cond:
            rule = next((r for r in self._rules if r.matches(function, address, count)), None)
            if rule is not None:
                rule.hits += 1
                if rule.times is not None and rule.hits >= rule.times:
                    self._rules.remove(rule)
            self._log.append(Seen(conn, time.monotonic(), function, address, count, values,
                                  rule.action if rule else None))
            self._cond.notify_all()
        if rule is not None and rule.action == "exception":
            writer.write(frame(tid, unit, bytes([function | 0x80, int(rule.arg)])))
            await writer.drain()
            return True
        up_writer.write(head + pdu)
        await up_writer.drain()
        up_head = await up_reader.readexactly(7)
        reply = up_head + await up_reader.readexactly(struct.unpack(">H", up_head[4:6])[0] - 1)
        action = rule.action if rule is not None else None
        if action == "silent":
            return True
        if action == "delay":
            await asyncio.sleep(rule.arg if rule else 0)
        elif action == "short" and function in (3, 4) and rule is not None:
            data = reply[9:][:max(0, len(reply) - 9 - 2 * int(rule.arg))]
            reply = frame(tid, unit, bytes([function, len(data)]) + data)
        elif action in ("tid", "pid", "length", "garbage") and rule is not None:
            reply = _bad(action, tid, unit, reply[7:], function, rule.values)
        writer.write(reply)
        await writer.drain()
        return action != "close"


def _bad(action: str, tid: int, unit: int, pdu: bytes, function: int,
         values: tuple[int, ...]) -> bytes:
    if values and function in (3, 4):
        pdu = bytes([function, 2 * len(values)]) + struct.pack(f">{len(values)}H", *values)
    if action == "tid":
        return frame((tid + 1) & 0xFFFF, unit, pdu)
    if action == "pid":
        return frame(tid, unit, pdu, pid=1)
    if action == "length":
        return frame(tid, unit, pdu, extra_length=4)
    return bytes(range(0xF0, 0x100)) + b"\x00\x13garbage"
