"""The rig for PLC fault tests: a pymodbus PLC (in a thread of its own) behind the
fault-injecting proxy, real mosquitto, and ``rung serve`` as a child process on the demo
model, reaching the PLC through the proxy only.

Every rig checks at teardown that rung wrote nothing but FC16 to the handshake registers
it owns (110..115 of press1), whatever the faults were.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon.harness import BASE, Broker, Daemon, Requester, write_config
from tests.daemon.modbus.test_plc import (
    ACK_SEQ,
    BUSY,
    DONE,
    ERR,
    HEARTBEAT,
    REQ,
    REQ_SEQ,
    RESULT,
    PlcThread,
    _plant,
)
from tests.daemon.modbus_proxy import ModbusProxy, Seen

__all__ = ["ACK_SEQ", "BUSY", "DONE", "ERR", "HEARTBEAT", "REQ", "REQ_SEQ", "RESULT", "Rig",
           "rig_factory"]

MAP = Path(__file__).resolve().parents[2] / "configs" / "plcs" / "press1.yaml"
# Fast pacing: poll 50 ms, heartbeat 0.2 s, the PLC's watchdog 1.5 s, so rung retries
# anything the heartbeat depends on at least every (1.5 - 0.2) / 2 = 0.65 s.
HANDSHAKE = {"poll_s": 0.05, "heartbeat_s": 0.2, "watchdog_s": 1.5}
RETRY_MAX_S = 0.65
TIMEOUT_S = 0.5
LANDED = (None, "close", "delay")   # faults after which the PLC still took the request


@dataclass
class Rig:
    plc: PlcThread
    proxy: ModbusProxy
    broker: Broker
    daemon: Daemon
    watcher: Requester
    maps: list[Path] = field(default_factory=list)

    def trigger(self) -> int:
        return self.plc.trigger()

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
        self.plc.wait(what, cond, timeout)

    def topic(self, suffix: str) -> list[dict[str, Any]]:
        return [r.body for r in self.watcher.snapshot() if r.topic.endswith(suffix)]

    def events(self, plc: str = "press1") -> list[dict[str, Any]]:
        return self.topic(f"/diag/{plc}/event")

    def links(self, plc: str = "press1") -> list[dict[str, Any]]:
        return self.topic(f"/plc/{plc}/link")

    def wait_link(self, what: str, cond: Callable[[dict[str, Any]], bool],
                  plc: str = "press1", timeout: float = 30) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def latest() -> bool:
            states = self.links(plc)
            found[:] = states[-1:]
            return bool(states) and cond(states[-1])

        self.wait(what, latest, timeout)
        return found[0]

    def wait_event(self, n: int = 1, timeout: float = 60) -> list[dict[str, Any]]:
        self.wait(f"{n} diagnosis events", lambda: len(self.events()) >= n, timeout)
        return self.events()

    def logged(self, *parts: str) -> list[dict[str, Any]]:
        """The daemon's log lines whose message holds every one of ``parts``."""
        return [r for r in self.daemon.lines()
                if all(p in str(r.get("msg", "")) for p in parts)]

    def attempts(self, function: int, at: int, since: float = 0.0) -> list[Seen]:
        return self.proxy.requests(function, at, since)

    def wait_attempts(self, function: int, at: int, n: int, since: float = 0.0,
                      timeout: float = 30) -> list[Seen]:
        self.proxy.wait(f"{n} requests FC{function} at {at}",
                        lambda: len(self.attempts(function, at, since)) >= n, timeout)
        return self.attempts(function, at, since)

    def beats_after(self, t: float) -> list[Seen]:
        """Heartbeat writes that landed after ``t``."""
        return [s for s in self.attempts(16, HEARTBEAT, t) if s.fault in LANDED]


def map_doc(plc_id: str = "press1", port: int = 0, **handshake: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MAP.read_text())
    doc["id"] = plc_id
    doc["transport"].update(port=port, timeout_s=TIMEOUT_S)
    doc["handshake"].update({**HANDSHAKE, **handshake})
    doc.pop("fault_tree")   # one diagnosis per request keeps the tests short
    return doc


@pytest.fixture
def rig_factory(tmp_path: Path, edge_engine: Path) -> Iterator[Callable[..., Rig]]:
    """``rig_factory(extra_maps=[...], config={section: {...}}, **modbus)`` -> a started
    :class:`Rig`. The
    press1 map always comes first; ``extra_maps`` are further map documents (their
    ``transport.port`` is set to the proxy's)."""
    made: list[Rig] = []

    def make(extra_maps: tuple[dict[str, Any], ...] = (),
             config: dict[str, Any] | None = None, **modbus: Any) -> Rig:
        plc = PlcThread()
        _plant(plc)
        proxy = ModbusProxy((plc.sim.host, plc.sim.port))
        plc.call(proxy.start())
        maps = []
        for doc in (map_doc(port=proxy.port), *extra_maps):
            doc = copy.deepcopy(doc)
            doc["transport"]["port"] = proxy.port
            path = tmp_path / f"{doc['id']}.yaml"
            path.write_text(yaml.safe_dump(doc))
            maps.append(path)
        broker = Broker(tmp_path / "broker")
        broker.start()
        daemon = Daemon(write_config(tmp_path, edge_engine, broker.port,
                                     plcs=[str(p) for p in maps],
                                     modbus={"reconnect_min_s": 0.1, **modbus},
                                     **(config or {})))
        watcher = Requester(broker.port, topics=(f"{BASE}/diag/#", f"{BASE}/plc/#"))
        rig = Rig(plc, proxy, broker, daemon, watcher, maps)
        made.append(rig)
        daemon.start()
        return rig

    yield make
    for rig in made:
        rig.watcher.close()
        rig.daemon.stop()
        rig.broker.stop()
        rig.plc.call(rig.proxy.pause())
        rig.plc.close()
        owned = set()
        for path in rig.maps:
            hs = yaml.safe_load(path.read_text())["handshake"]
            owned |= {hs[n] for n in ("ack_seq", "busy", "done", "err", "result", "heartbeat")}
        writes = [s for s in rig.proxy.requests() if s.function in (5, 6, 15, 16)]
        outside = [s for s in writes if s.function != 16
                   or not set(range(s.address, s.address + s.count)) <= owned]
        assert writes and not outside, f"writes outside the handshake: {outside[:5]}"


def gaps(seen: list[Seen]) -> list[float]:
    return [b.t - a.t for a, b in zip(seen, seen[1:], strict=False)]


def wait_quiet(rig: Rig, seconds: float) -> None:
    """Let ``seconds`` of polling pass, measured by the PLC's own request log (the
    handshake reads), so a claim of "nothing else happened" covers that many polls."""
    since = time.monotonic()
    polls = int(seconds / HANDSHAKE["poll_s"] / 2)   # at least half the polls came through
    rig.proxy.wait(f"{polls} polls", lambda: len(rig.attempts(3, 100, since)) >= polls,
                   seconds * 4 + 10)
