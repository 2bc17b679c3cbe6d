"""A PLC's link state on MQTT: each change published retained on ``{base}/plc/{plc}/link``,
said again after a reconnection, up/down told to the plant once per change, nothing said
for a PLC another node drives; and the agent owns its link's state."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rung.daemon.modbus.agent import PlcAgent
from rung.daemon.modbus.link import Link
from rung.daemon.modbus.regmap import parse_map
from rung.daemon.plc.link_state import LinkState
from tests.daemon.plc_rig import map_doc

TOPIC = "t/rung/plc/press1/link"


class Sink:
    """The publisher and the plant, recorded; ``wait`` returns once ``n`` docs came."""

    def __init__(self) -> None:
        self.docs: list[tuple[str, dict[str, Any], bool]] = []
        self.ups: list[tuple[str, bool]] = []
        self._more = asyncio.Event()

    async def publish(self, topic: str, doc: dict[str, Any], retain: bool) -> bool:
        self.docs.append((topic, doc, retain))
        self._more.set()
        return True

    def plc_link(self, plc: str, up: bool) -> None:
        self.ups.append((plc, up))

    def diagnosis(self, plc: str, event: Any) -> None:
        pass

    async def wait(self, n: int) -> list[tuple[str, dict[str, Any], bool]]:
        while len(self.docs) < n:
            self._more.clear()
            await self._more.wait()
        return self.docs


def run(scenario: Any) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await scenario()
    asyncio.run(bounded())


def test_every_change_is_published_retained_and_the_plant_told_up_and_down() -> None:
    async def scenario() -> None:
        sink = Sink()
        state = LinkState("press1", "t/rung", sink.publish, sink.plc_link)
        for s, detail in [("connected", None), ("degraded", "ack write: refused"),
                          ("disconnected", "refused"), ("error", "no answer"),
                          ("connected", None)]:
            state.changed(s, detail)
        docs = await sink.wait(5)
        assert all(topic == TOPIC and retain for topic, _, retain in docs)
        assert [(d["plc"], d["state"], d["detail"]) for _, d, _ in docs] == [
            ("press1", "connected", None), ("press1", "degraded", "ack write: refused"),
            ("press1", "disconnected", "refused"), ("press1", "error", "no answer"),
            ("press1", "connected", None)]
        assert all(d["since"].endswith("Z") for _, d, _ in docs)
        # degraded is still up, error is still down: one call per change of up
        assert sink.ups == [("press1", True), ("press1", False), ("press1", True)]
    run(scenario)


def test_the_latest_state_is_said_again_after_a_reconnection() -> None:
    async def scenario() -> None:
        sink = Sink()
        state = LinkState("press1", "t/rung", sink.publish)
        state.republish()   # nothing said yet: nothing to repeat
        state.changed("connected", None)
        state.changed("disconnected", "lost")
        state.republish()
        docs = await sink.wait(3)
        assert [d["state"] for _, d, _ in docs] == ["connected", "disconnected", "disconnected"]
        assert docs[2][1] == docs[1][1]
    run(scenario)


def test_a_plc_another_node_drives_is_not_spoken_for() -> None:
    async def scenario() -> None:
        sink = Sink()
        state = LinkState("press1", "t/rung", sink.publish, sink.plc_link)
        state.changed("connected", None)
        await sink.wait(1)
        state.silence()
        state.changed("disconnected", "closed")   # the agent stopping
        state.republish()
        state.changed("connected", None)
        other = LinkState("press2", "t/rung", sink.publish)
        other.changed("connected", None)   # published after anything spawned before it
        docs = await sink.wait(2)
        assert [d["plc"] for _, d, _ in docs] == ["press1", "press2"]
        assert sink.ups == [("press1", True)]
    run(scenario)


def test_the_agent_publishes_its_own_link_state() -> None:
    async def scenario() -> None:
        sink = Sink()
        plc = parse_map(map_doc(port=1502), Path("press1.yaml"))
        link = Link(plc)
        agent = PlcAgent(plc, link, lambda r: None, sink.publish, "t/rung", 1.0, plant=sink)
        assert link.on_state is not None
        link.on_state("connected", None)
        ((topic, doc, retain),) = await sink.wait(1)
        assert (topic, doc["state"], retain) == (TOPIC, "connected", True)
        assert agent.link_state.doc == doc and sink.ups == [("press1", True)]
    run(scenario)
