"""The Modbus link layer against real pymodbus servers (rung.daemon.demo.plcsim): Modbus
TCP on loopback and Modbus RTU over a pty pair."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rung.daemon.demo.plcsim import Access, SimPlc
from rung.daemon.modbus import link as modbus
from rung.daemon.modbus.link import (
    EXCEPTION_CODES,
    Link,
    ModbusConfigError,
    ModbusTransientError,
)
from rung.daemon.modbus.regmap import PlcMap, encode_words, parse_map
from tests.daemon.modbus_proxy import ModbusProxy

T = TypeVar("T")

POINTS = [
    {"name": "speed", "table": "holding", "address": 200},
    {"name": "temp", "table": "holding", "address": 201, "type": "int16"},
    {"name": "pressure", "table": "holding", "address": 210, "type": "float32"},
    {"name": "count", "table": "holding", "address": 300, "type": "uint32"},
    {"name": "level", "table": "input", "address": 0, "scale": 0.1},
    {"name": "running", "table": "coil", "address": 5},
    {"name": "door_open", "table": "discrete", "address": 7},
]


def plc_map(transport: dict[str, Any], plc_id: str = "press1") -> PlcMap:
    """A map with handshake registers at holding 100..107 and two writable entries."""
    handshake = dict(zip(("req", "req_seq", "ack_seq", "busy", "done", "err", "result",
                          "heartbeat"), range(100, 108), strict=True))
    return parse_map({"id": plc_id, "transport": transport, "handshake": handshake,
                      "points": POINTS,
                      "writable": [{"table": "holding", "address": 400, "count": 2},
                                   {"table": "coil", "address": 20}]},
                     Path(f"{plc_id}.yaml"))


# "fails fast" is shown against a control, not a clock: with the link's timeout this long,
# a failure that comes in under half of it did not wait for the timeout (on any machine)
FAR_S = 20.0


def _fast(started: float) -> bool:
    return time.monotonic() - started < FAR_S / 2


def tcp_map(sim: SimPlc, timeout_s: float = 0.5) -> PlcMap:
    return plc_map({"kind": "tcp", "host": sim.host, "port": sim.port, "timeout_s": timeout_s})


def rtu_map(sim: SimPlc, unit_id: int = 1, plc_id: str = "press1", baud: int = 19200
            ) -> PlcMap:
    # parity N: Linux ptys refuse parity settings (see rung.daemon.demo.plcsim)
    return plc_map({"kind": "rtu", "port": sim.serial_port, "baud": baud, "parity": "N",
                    "unit_id": unit_id, "timeout_s": 0.5}, plc_id)


def run(scenario: Callable[[], Awaitable[T]], seconds: float = 10) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(seconds):
            return await scenario()
    return asyncio.run(bounded())


def test_exception_codes_are_classified() -> None:
    assert {c for c, (_, transient) in EXCEPTION_CODES.items() if not transient} == {1, 2, 3, 7}
    assert {4, 5, 6, 10, 11} <= {c for c, (_, transient) in EXCEPTION_CODES.items()
                                 if transient}


def test_tcp_reads_each_table() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            sim.holding[200:203] = [1, 2, 65535]
            sim.input[0:2] = [17, 18]
            sim.coil[3:8] = [False, True, False, True, True]
            sim.discrete[7] = True
            link = Link(tcp_map(sim))
            try:
                await link.connect()
                assert link.state == "connected"
                assert await link.read("holding", 200, 3) == [1, 2, 65535]
                assert await link.read("input", 0, 2) == [17, 18]
                assert await link.read("coil", 3, 5) == [False, True, False, True, True]
                assert await link.read("discrete", 6, 3) == [False, True, False]
                assert sim.requests() == [Access(3, 200, 3, 1), Access(4, 0, 2, 1),
                                          Access(1, 3, 5, 1), Access(2, 6, 3, 1)]
            finally:
                await link.close()
            assert link.state == "disconnected"
    run(scenario)


def test_snapshot_reads_one_request_per_planned_block() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            sim.holding[200:202] = [1200, 0xFFF6]  # temp is int16: -10
            sim.holding[210:212] = encode_words(2.5, "float32")
            sim.holding[300:302] = encode_words(70000, "uint32")
            sim.input[0] = 456
            sim.coil[5] = True
            plc = tcp_map(sim)
            link = Link(plc)
            try:
                values = await link.read_snapshot()
            finally:
                await link.close()
            assert values == {"speed": 1200, "temp": -10, "pressure": 2.5, "count": 70000,
                              "level": pytest.approx(45.6), "running": True,
                              "door_open": False}
            function = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}
            assert sim.requests() == [Access(function[b.table], b.address, b.count, 1)
                                      for b in plc.plan()]
            assert len(sim.log) == len(plc.plan()) == 5
    run(scenario)


def test_writes_use_function_16_even_for_one_register() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            link = Link(tcp_map(sim))
            try:
                await link.write_registers(400, [7])
                await link.write_registers(400, [8, 9])
                await link.write_registers(104, [1])   # a handshake register rung owns
                await link.write_coil(20, True)
            finally:
                await link.close()
            assert sim.requests(6, 16) == [Access(16, 400, 1, 1), Access(16, 400, 2, 1),
                                           Access(16, 104, 1, 1)]
            assert sim.requests(5) == [Access(5, 20, 1, 1)]
            assert sim.holding[400:402] == [8, 9] and sim.holding[104] == 1
            assert sim.coil[20] is True
    run(scenario)


def test_refused_writes_never_reach_the_wire() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            link = Link(tcp_map(sim))
            try:
                cases: list[Callable[[], Awaitable[None]]] = [
                    lambda: link.write_registers(402, [1]),     # past the writable entry
                    lambda: link.write_registers(399, [1, 2]),  # straddles its start
                    lambda: link.write_registers(100, [1]),     # handshake.req: the PLC's
                    lambda: link.write_coil(21, True),
                    lambda: link.write_registers(400, [70000]),  # allowed, but not a word
                ]
                for attempt in cases:
                    with pytest.raises(ModbusConfigError) as info:
                        await attempt()
                    assert not info.value.transient and info.value.plc == "press1"
                    assert str(info.value).startswith("plc press1: write ")
                await link.read("holding", 0, 1)
                with pytest.raises(ModbusConfigError, match="1..125 values"):
                    await link.read("holding", 0, 126)
                with pytest.raises(ModbusConfigError, match="no table"):
                    await link.read("register", 0, 1)
            finally:
                await link.close()
            assert sim.requests() == [Access(3, 0, 1, 1)]  # the one legal read, no write
    run(scenario)


def test_illegal_address_is_a_config_error() -> None:
    async def scenario() -> None:
        async with SimPlc(size=1024) as sim:
            sim.fail_addresses("holding", range(210, 212), 2)
            link = Link(tcp_map(sim))
            try:
                with pytest.raises(ModbusConfigError) as info:
                    await link.read_snapshot()
                assert info.value.code == 2 and not info.value.transient
                assert "plc press1: read holding 200+12" in str(info.value)
                assert "illegal data address" in str(info.value)
                with pytest.raises(ModbusConfigError) as info:
                    await link.read("holding", 1020, 10)   # past the PLC's own image
                assert info.value.code == 2
                assert link.state == "connected"   # the PLC answered; the link is fine
                assert link.last_error is not None and "exception 2" in link.last_error
                await link.read("holding", 0, 1)
                assert link.last_error is None
            finally:
                await link.close()
    run(scenario)


def test_device_busy_is_transient() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            sim.holding[200] = 5
            link = Link(tcp_map(sim))
            try:
                sim.fail_next(6)
                with pytest.raises(ModbusTransientError) as info:
                    await link.read("holding", 200, 1)
                assert info.value.code == 6 and info.value.transient
                assert "server device busy" in str(info.value)
                assert await link.read("holding", 200, 1) == [5]
            finally:
                await link.close()
    run(scenario)


def test_server_stop_fails_fast_and_restart_reconnects() -> None:
    async def scenario() -> None:
        states: list[tuple[str, str | None]] = []
        sim = SimPlc()
        await sim.start()
        link = Link(tcp_map(sim, timeout_s=FAR_S),
                    on_state=lambda s, d: states.append((s, d)))
        try:
            sim.holding[200] = 42
            assert await link.read("holding", 200, 1) == [42]
            await sim.stop()
            started = time.monotonic()
            with pytest.raises(ModbusTransientError) as info:
                await link.read("holding", 200, 1)
            assert _fast(started)
            assert info.value.code is None and "plc press1: read holding 200+1" in str(info.value)
            assert link.state == "disconnected"
            assert [s for s, _ in states] == ["connected", "disconnected"]
            with pytest.raises(ModbusTransientError):   # still down: fails again, as fast
                await link.connect()
            assert _fast(started)

            await sim.start()   # same port
            assert await link.read("holding", 200, 1) == [42]
            assert link.state == "connected" and link.last_error is None
            assert [s for s, _ in states] == ["connected", "disconnected", "connected"]
        finally:
            await link.close()
            await sim.close()
    run(scenario)


def test_rtu_over_a_pty_reads_and_writes() -> None:
    async def scenario() -> None:
        async with SimPlc(kind="rtu") as sim:
            sim.holding[200:202] = [3, 4]
            sim.coil[5] = True
            link = Link(rtu_map(sim))
            try:
                assert await link.read("holding", 200, 2) == [3, 4]
                assert await link.read("coil", 5, 1) == [True]
                await link.write_registers(400, [11, 12])
                await link.write_coil(20, True)
                assert sim.holding[400:402] == [11, 12] and sim.coil[20] is True
                assert sim.requests(16) == [Access(16, 400, 2, 1)]

                await sim.stop()   # the bus stays open; the PLC falls silent
                with pytest.raises(ModbusTransientError, match="no .*answer"):
                    await link.read("holding", 200, 1)
                assert link.state == "error"
                await sim.start()
                assert await link.read("holding", 200, 1) == [3]
                assert link.state == "connected"
            finally:
                await link.close()
    run(scenario)


def test_rtu_bus_is_shared_and_serialized() -> None:
    async def scenario() -> None:
        async with SimPlc(kind="rtu", unit_ids=(1, 2)) as sim:
            sim.holding[200:203] = [1, 2, 3]
            sim.holding[300:303] = [7, 8, 9]
            a, b = Link(rtu_map(sim, 1, "press1")), Link(rtu_map(sim, 2, "press2"))
            try:
                await a.connect()
                await b.connect()
                bus = modbus._BUSES[sim.serial_port]
                assert bus.links == {a, b} and a._client is b._client is bus.client
                results = await asyncio.gather(
                    *(link.read("holding", start, 3)
                      for _ in range(8) for link, start in ((a, 200), (b, 300))))
                assert results == [[1, 2, 3], [7, 8, 9]] * 8
                assert sorted(x.unit for x in sim.log) == [1] * 8 + [2] * 8

                other = Link(rtu_map(sim, 3, "press3", baud=9600))
                with pytest.raises(ModbusConfigError, match="same settings"):
                    await other.connect()
                await a.close()
                assert bus.links == {b} and await b.read("holding", 300, 1) == [7]
            finally:
                await a.close()
                await b.close()
            assert sim.serial_port not in modbus._BUSES
    run(scenario)


def test_nothing_listening_is_transient() -> None:
    async def scenario() -> None:
        sim = SimPlc()   # never started: its port refuses connections
        states: list[str] = []
        link = Link(tcp_map(sim, timeout_s=FAR_S), on_state=lambda s, d: states.append(s))
        started = time.monotonic()
        with pytest.raises(ModbusTransientError, match="plc press1: read holding 0\\+1: cannot"):
            await link.read("holding", 0, 1)
        assert _fast(started)
        assert link.state == "disconnected" and link.last_error is not None
        assert states == []   # it never left "disconnected"
        await link.close()
    run(scenario)


# --- faults through a fault-injecting proxy (tests/daemon/modbus_proxy.py) -----------------

async def _proxied(sim: SimPlc, timeout_s: float = 0.5) -> tuple[ModbusProxy, PlcMap]:
    proxy = ModbusProxy((sim.host, sim.port))
    await proxy.start()
    return proxy, plc_map({"kind": "tcp", "host": proxy.host, "port": proxy.port,
                           "timeout_s": timeout_s})


def test_replies_to_one_request_are_not_connection_failures() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            sim.holding[100:116] = list(range(16))
            proxy, plc = await _proxied(sim)
            link = Link(plc)
            try:
                proxy.inject("exception", 16, range(104, 105), arg=3, times=1)
                with pytest.raises(ModbusConfigError) as info:
                    await link.write_registers(104, [4])
                assert info.value.code == 3 and not info.value.connection
                await link.write_registers(104, [4])
                with pytest.raises(ModbusConfigError) as info:
                    await link.write_registers(100, [1])    # allowlist: never sent
                assert not info.value.connection
                proxy.inject("exception", 3, range(100, 116), arg=2, times=1)
                with pytest.raises(ModbusConfigError) as info:
                    await link.read("holding", 100, 16)
                assert info.value.code == 2 and not info.value.connection
                proxy.inject("short", 3, range(100, 116), arg=1, times=1)
                with pytest.raises(ModbusConfigError, match="holds 15 values") as info:
                    await link.read("holding", 100, 16)
                assert not info.value.connection
                proxy.inject("exception", 3, range(100, 116), arg=10, times=1)
                with pytest.raises(ModbusTransientError) as t_info:
                    await link.read("holding", 100, 16)
                assert t_info.value.code == 10 and not t_info.value.connection
                assert link.state == "connected" and proxy.connections == 1
                assert await link.read("holding", 100, 16) == list(range(16))
            finally:
                await link.close()
                await proxy.pause()
    run(scenario)


@pytest.mark.parametrize("frame", ["tid", "pid", "length", "garbage"])
@pytest.mark.slow
def test_bad_frames_are_never_taken_for_an_answer(frame: str) -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            sim.holding[100:116] = [0] * 16
            proxy, plc = await _proxied(sim, timeout_s=0.3)
            link = Link(plc)
            try:
                # a reply that would raise req with req_seq 77 if rung took it
                proxy.inject(frame, 3, range(100, 116), times=1, values=[1, 77] + [0] * 14)
                with pytest.raises(ModbusTransientError) as info:
                    await link.read("holding", 100, 16)
                assert info.value.connection   # dropped, never taken (some by the timeout)
                assert await link.read("holding", 100, 16) == [0] * 16   # a fresh connection
                assert link.state == "connected"
            finally:
                await link.close()
                await proxy.pause()
    run(scenario)


def test_a_plc_closing_after_each_response_gets_a_connection_per_request() -> None:
    async def scenario() -> None:
        states: list[str] = []
        async with SimPlc() as sim:
            sim.holding[100:116] = list(range(16))
            proxy, plc = await _proxied(sim, timeout_s=FAR_S)
            link = Link(plc, on_state=lambda s, d: states.append(s))
            try:
                proxy.inject("close")
                started = time.monotonic()
                for i in range(10):   # back to back: each races the PLC's close
                    assert await link.read("holding", 100, 4) == [0, 1, 2, 3]
                    await link.write_registers(104, [i])
                assert _fast(started)   # no request waits for its timeout
                assert link.per_transaction and states == ["connected"]
                assert sim.holding[104] == 9
                seen = proxy.requests()
                assert len(seen) == 20 and len({s.conn for s in seen}) == 20
            finally:
                await link.close()
                await proxy.pause()
    run(scenario)


def test_a_connection_lost_under_a_request_fails_it_at_once() -> None:
    async def scenario() -> None:
        async with SimPlc() as sim:
            proxy, plc = await _proxied(sim, timeout_s=FAR_S)
            link = Link(plc)
            try:
                await link.read("holding", 100, 1)
                proxy.inject("silent")
                read = asyncio.ensure_future(link.read("holding", 100, 1))
                await proxy.until("the silent request", lambda: len(proxy.requests()) == 2, 5)
                started = time.monotonic()
                await proxy.pause()
                with pytest.raises(ModbusTransientError) as info:
                    await read
                assert info.value.connection and _fast(started)
                assert link.state == "disconnected"
            finally:
                await link.close()
                await proxy.pause()
    run(scenario)


def test_set_fault_shows_degraded_while_connected() -> None:
    async def scenario() -> None:
        shown: list[tuple[str, str | None]] = []
        async with SimPlc() as sim:
            link = Link(tcp_map(sim), on_state=lambda s, d: shown.append((s, d)))
            try:
                link.set_fault("answer write", "refused")
                assert shown == []                       # not connected: nothing to add
                await link.read("holding", 0, 1)
                assert shown == [("degraded", "answer write: refused")]
                link.set_fault("heartbeat write", "refused too")
                link.set_fault("answer write", None)
                link.set_fault("heartbeat write", None)
                assert [s for s, _ in shown] == ["degraded", "degraded", "degraded",
                                                 "connected"]
                assert shown[-2] == ("degraded", "heartbeat write: refused too")
                assert link.state == "connected"
            finally:
                await link.close()
    run(scenario)
