"""The OPC UA rig for in-process tests: the simulated PLC (a real asyncua server) behind a
TCP proxy, the real scheduler on the demo model, and the agent driving the PLC's handshake
over the shipped node map (configs/plcs/mixer2-opcua.yaml) at fast pacing. The publisher is
the agent's interface, recorded."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rung.daemon.demo.opcsim import SimOpcPlc
from rung.daemon.metrics import Metrics
from rung.daemon.opcua.agent import OpcUaAgent
from rung.daemon.opcua.link import NodeLink
from rung.daemon.opcua.nodemap import parse_node_map
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer, Scheduler
from rung.daemon.tasks.runner import TaskRunner
from tests.daemon.opcua.tcp_proxy import TcpProxy

T = TypeVar("T")
MAP = Path(__file__).resolve().parents[3] / "configs" / "plcs" / "mixer2-opcua.yaml"
# poll 50 ms, heartbeat 0.2 s, the PLC's watchdog 1.5 s: retries at least every 0.65 s
HANDSHAKE = {"poll_s": 0.05, "heartbeat_s": 0.2, "watchdog_s": 1.5}


def map_doc(endpoint: str, **server: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MAP.read_text())
    doc["server"].update(endpoint=endpoint, timeout_s=0.5, **server)
    doc["handshake"].update(HANDSHAKE)
    return doc


@dataclass
class Plant:
    sim: SimOpcPlc
    proxy: TcpProxy
    scheduler: Scheduler
    state_dir: Path
    metrics: Metrics = field(default_factory=Metrics)
    submitted: list[Request] = field(default_factory=list)
    published: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def submit(self, req: Request) -> asyncio.Future[Answer] | None:
        self.submitted.append(req)
        return self.scheduler.submit(req)

    async def publish(self, topic: str, doc: dict[str, Any], retain: bool) -> bool:
        self.published.append((topic, doc))
        return True

    def events(self) -> list[dict[str, Any]]:
        return [doc for topic, doc in self.published if topic.endswith("/event")]

    def links(self) -> list[dict[str, Any]]:
        return [doc for topic, doc in self.published if topic.endswith("/link")]

    def agent(self, doc: dict[str, Any] | None = None, source: Path | None = None
              ) -> OpcUaAgent:
        doc = copy.deepcopy(doc) if doc is not None else map_doc(self.proxy.endpoint)
        plc = parse_node_map(doc, source or MAP)
        return OpcUaAgent(plc, NodeLink(plc), self.submit, self.publish, "t/rung", 60.0, 0.1,
                          30.0, metrics=self.metrics, state_dir=self.state_dir)

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"plc": "mixer2", **labels})
        return 0.0 if value is None else value

    async def get(self, name: str) -> Any:
        return await self.sim.get(name)

    async def until(self, what: str, cond: Callable[[], Awaitable[bool] | bool],
                    timeout: float = 60) -> None:
        """Check ``cond`` every 20 ms until it holds; TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if await got if isinstance(got, Awaitable) else got:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"never {what}: links {self.links()[-3:]}")

    async def beat_moves(self, timeout: float = 10) -> None:
        beat = await self.get("heartbeat")

        async def moved() -> bool:
            return bool(await self.get("heartbeat") != beat)
        await self.until("the heartbeat moving", moved, timeout)

    async def answered(self, seq: int, timeout: float = 60) -> None:
        async def done() -> bool:
            return bool(await self.get("done")) and await self.get("ack_seq") == seq
        await self.until(f"request {seq} done", done, timeout)

    async def link(self, state: str, timeout: float = 30) -> dict[str, Any]:
        await self.until(f"link {state}",
                         lambda: bool(self.links()) and self.links()[-1]["state"] == state,
                         timeout)
        return self.links()[-1]


@asynccontextmanager
async def plant(runner: TaskRunner, state_dir: Path, **sim: Any) -> AsyncIterator[Plant]:
    s = SimOpcPlc(**sim)
    await s.start()
    proxy = TcpProxy(s.port)
    await proxy.start()
    scheduler = Scheduler(runner, lambda a: None, 8)
    scheduler.start()
    try:
        yield Plant(s, proxy, scheduler, state_dir)
    finally:
        await scheduler.stop(5)
        await proxy.stop()
        await s.stop()


async def running(agent: OpcUaAgent, body: Callable[[], Awaitable[T]]) -> T:
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        return await body()
    finally:
        await agent.stop()
        await task


def run(scenario: Callable[[], Awaitable[T]], seconds: float = 120) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(seconds):
            return await scenario()
    return asyncio.run(bounded())
