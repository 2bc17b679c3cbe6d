"""What a connection per Modbus request costs, against a persistent connection.

    .venv/bin/python bench/modbus_reconnect.py [--requests 2000]

Some gateways and small PLCs close the TCP connection after every response; rung's Link
notices and from then on opens a connection per request and closes it after the response
(``Link.per_transaction``). Measured here on loopback against the pymodbus PLC rung's tests
use (rung.daemon.demo.plcsim), for the request rung makes most, the handshake read (FC3, 16
registers), one after another:

* ``persistent``: one connection for all requests;
* ``per request``: ``per_transaction`` set, a connect + request + close each;
* through the tests' Modbus proxy (tests/daemon/modbus_proxy.py), which adds a hop:
  ``proxy, persistent`` and ``proxy, PLC closes``: the proxy closes after each response and
  the Link finds out by itself (its first requests are counted too).

Writes ``bench/results/<date>-modbus-reconnect.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import machine
import report

from rung.daemon.demo.plcsim import SimPlc
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import PlcMap, parse_map

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))   # the tests' proxy
from tests.daemon.modbus_proxy import ModbusProxy  # noqa: E402

RESULTS = REPO / "bench" / "results"
HANDSHAKE = {"req": 100, "req_seq": 101, "ack_seq": 110, "busy": 111, "done": 112,
             "err": 113, "result": 114, "heartbeat": 115}


def _map(port: int) -> PlcMap:
    return parse_map({"id": "bench", "transport": {"kind": "tcp", "host": "127.0.0.1",
                                                   "port": port, "timeout_s": 1.0},
                      "handshake": HANDSHAKE,
                      "points": [{"name": "x", "table": "holding", "address": 200}]},
                     Path("bench.yaml"))


async def _time(link: Link, n: int) -> dict[str, Any]:
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        await link.read("holding", 100, 16)
        ms.append((time.perf_counter() - t0) * 1000)
    await link.close()
    q = statistics.quantiles(ms, n=100)
    return {"requests": n, "mean_ms": statistics.fmean(ms), "p50_ms": q[49],
            "p99_ms": q[98], "max_ms": max(ms), "per_transaction": link.per_transaction}


async def measure(n: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    async with SimPlc() as sim:
        out["persistent"] = await _time(Link(_map(sim.port)), n)
        per_request = Link(_map(sim.port))
        per_request.per_transaction = True
        out["per request"] = await _time(per_request, n)
        proxy = ModbusProxy((sim.host, sim.port))
        await proxy.start()
        try:
            out["proxy, persistent"] = await _time(Link(_map(proxy.port)), n)
            proxy.inject("close")
            out["proxy, PLC closes"] = await _time(Link(_map(proxy.port)), n)
        finally:
            await proxy.pause()
    return out


def markdown(record: dict[str, Any]) -> str:
    res = record["results"]
    lines = [f"# Modbus TCP: a connection per request ({record['stamp']})", "",
             f"`{record['command']}`", "",
             "| link | requests | mean ms | p50 ms | p99 ms | max ms | per_transaction |",
             "|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | {r['requests']} | {r['mean_ms']:.3f} | {r['p50_ms']:.3f} | "
                     f"{r['p99_ms']:.3f} | {r['max_ms']:.3f} | {r['per_transaction']} |")
    extra = res["per request"]["mean_ms"] - res["persistent"]["mean_ms"]
    lines += ["", f"A connection per request adds {extra:.3f} ms per request (mean, "
              "loopback, no proxy)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    record: dict[str, Any] = {"stamp": time.strftime("%Y-%m-%d") + "-modbus-reconnect",
                              "command": shlex.join(sys.orig_argv),
                              "machine": machine.machine_info(),
                              "results": asyncio.run(measure(args.requests))}
    report.publish(args.out, record, markdown(record).splitlines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
