"""End to end: ``rung serve`` (a child process, real mosquitto) with a Modbus-free config
listing an OPC UA node map written as docs/opcua.md says, beside rung's own OPC UA server:
the PLC raises ``req``, the diagnosis comes back in its nodes and on MQTT with the link
state; a SCADA client calls ``Diagnose`` on rung's server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from asyncua import ua
from asyncua.client.client import Client

from rung.daemon.demo.localbroker import free_port
from rung.daemon.demo.opcsim import SimOpcPlcThread
from tests.daemon.harness import BASE, Broker, Daemon, Requester, write_config
from tests.daemon.opcua.rig import map_doc

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_rung_serve_answers_a_plc_over_opcua(tmp_path: Path, edge_engine: Path) -> None:
    plc = SimOpcPlcThread()
    broker = Broker(tmp_path / "broker")
    broker.start()
    node_map = tmp_path / "mixer2.yaml"
    node_map.write_text(yaml.safe_dump(map_doc(plc.sim.endpoint)))
    endpoint = f"opc.tcp://127.0.0.1:{free_port()}/rung/"
    daemon = Daemon(write_config(tmp_path, edge_engine, broker.port, plcs=[str(node_map)],
                                 modbus={"reconnect_min_s": 0.1},
                                 opcua_server={"enabled": True, "endpoint": endpoint}))
    watcher = Requester(broker.port, topics=(f"{BASE}/diag/#", f"{BASE}/plc/#"))
    try:
        daemon.start()

        def topic(suffix: str) -> list[dict[str, object]]:
            return [r.body for r in watcher.snapshot() if r.topic.endswith(suffix)]

        plc.wait("the link connected", lambda: any(
            d.get("state") == "connected" for d in topic("/plc/mixer2/link")), 60)
        beat = plc.get("heartbeat")
        plc.wait("the heartbeat", lambda: plc.get("heartbeat") != beat, 30)
        seq = plc.trigger()
        plc.wait("done", lambda: plc.get("done") is True and plc.get("ack_seq") == seq, 120)
        (event,) = topic("/diag/mixer2/event")
        assert event["req_seq"] == seq and event["snapshot"]["bearing_temp"] == 81.5
        assert (plc.get("err"), plc.get("result")) == (event["err"], event["result"])
        plc.set("req", 0)
        plc.wait("done cleared", lambda: plc.get("done") is False, 30)

        async def scada() -> dict[str, object]:
            client = Client(endpoint, timeout=120, watchdog_intervall=600)
            async with client:
                rung = await client.nodes.objects.get_child(["2:rung"])
                ready = await (await rung.get_child(["2:Status", "2:Ready"])).read_value()
                assert ready is True
                answer = await rung.call_method("2:Diagnose", ua.Variant(json.dumps(
                    {"asset": "Pump P-7", "points": [{"name": "temp", "value": 99.0,
                                                       "limits": {"alarm": 90}}]}),
                    ua.VariantType.String))
                doc: dict[str, object] = json.loads(answer)
                return doc

        answer = asyncio.run(scada())
        assert answer["task"] == "diagnosis" and "ok" in answer
        assert daemon.terminate() == 0
    finally:
        watcher.close()
        daemon.stop()
        broker.stop()
        plc.close()
