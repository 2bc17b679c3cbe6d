"""rung's answers where plant engineers work, through the running daemon: an st_code
answer as a PLCopen XML project on request (checked against the official TC6 XML 2.01
schema), and rung as a Sparkplug B edge node whose devices are its PLCs (a decoding host
on a real mosquitto sees the births, the diagnosis a PLC triggers, and the death)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import xmlschema
import yaml

from rung.daemon.plant.plcopen import from_plcopen_xml
from tests.daemon.harness import Broker, Daemon, Requester
from tests.daemon.plc_rig import Rig, rig_factory  # noqa: F401  (fixture)
from tests.daemon.sparkplug_host import Host
from tests.daemon.test_serve import ST_INPUT, by_id, served  # noqa: F401  (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
XSD = Path(__file__).resolve().parents[2] / "data" / "tc6_xml_v201.xsd"


def test_an_st_answer_as_plcopen_xml_on_request(served: tuple[Broker, Daemon]) -> None:  # noqa: F811
    broker, _ = served
    req = Requester(broker.port)
    try:
        req.send("st_code", {"input": ST_INPUT, "output_formats": ["plcopen_xml"]},
                 correlation="xml", response_topic=req.reply_topic)
        req.send("st_code", {"input": ST_INPUT}, correlation="plain",
                 response_topic=req.reply_topic)
        req.send("diagnosis", {"input": {"asset": "a", "points": [{"name": "x", "value": 1}]},
                               "output_formats": ["plcopen_xml"]},
                 correlation="wrong-task", response_topic=req.reply_topic)
        replies = by_id(req.wait(3, 120))
    finally:
        req.close()
    xml_answer = replies["xml"][0].body
    assert xml_answer["ok"], xml_answer
    xml = xml_answer["output_formats"]["plcopen_xml"]
    xmlschema.XMLSchema(str(XSD)).validate(xml)
    assert from_plcopen_xml(xml) == xml_answer["output"]      # the same POU, back
    assert "output_formats" not in replies["plain"][0].body
    wrong = replies["wrong-task"][0].body["error"]
    assert wrong["code"] == "bad_request" and "output_formats" in wrong["message"]


def test_sparkplug_node_in_the_daemon(rig_factory: Callable[..., Rig]) -> None:  # noqa: F811
    rig = rig_factory(config={"sparkplug": {"enabled": True, "group_id": "Plant1"}})
    node = yaml.safe_load(rig.daemon.config.read_text())["mqtt"]["client_id"]
    host = Host(rig.broker.port)
    try:
        # births happened before the host subscribed: ask for them again
        host.command(f"spBv1.0/Plant1/NCMD/{node}", rebirth=True)
        born = host.wait_kinds(["NBIRTH", "DBIRTH"])
        assert born[1].topic == f"spBv1.0/Plant1/DBIRTH/{node}/press1"
        start = len(host.since())
        rig.trigger()
        rig.wait_event(1)
        got = host.wait("DDATA", lambda s: any(m.kind == "DDATA" for m in s), start)
        ddata = next(m for m in got if m.kind == "DDATA")
        assert ddata.topic == f"spBv1.0/Plant1/DDATA/{node}/press1"
        metrics = ddata.metrics()
        assert "Diagnosis/Err" in metrics and "Diagnosis/Request Id" in metrics
        assert metrics["Diagnosis/Err"] == rig.events()[-1]["err"]
        start = len(host.since())
        assert rig.daemon.terminate() == 0
        dead = host.wait("NDEATH", lambda s: any(m.kind == "NDEATH" for m in s), start)
        death = next(m for m in dead if m.kind == "NDEATH")
        assert death.metrics()["bdSeq"] == born[0].metrics()["bdSeq"]
    finally:
        host.close()
