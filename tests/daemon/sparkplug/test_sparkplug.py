"""rung's Sparkplug B edge node against real mosquitto: births, the NDEATH Will when the
connection dies, bdSeq and seq numbering, diagnosis data, rebirth on NCMD, the primary host;
payloads decoded by a host with the Sparkplug B message definitions, and once by hand."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.config import MQTTConfig
from rung.daemon.demo.localbroker import LocalBroker
from rung.daemon.modbus.regmap import load_map
from rung.daemon.sparkplug import node as sparkplug_module
from rung.daemon.sparkplug.link import SparkplugLink
from rung.daemon.sparkplug.metrics import Point, device_metrics
from rung.daemon.sparkplug.node import REBIRTH, Device, EdgeNode, SparkplugError
from rung.daemon.sparkplug.pb import DataType, Payload
from tests.daemon.sparkplug_host import Host, Relay

GROUP, NODE = "Plant1", "rung-node1"
PRESS = Device("press1", "Hydraulic press 1", (Point("oil_temp", "number", "degC"),
                                                Point("pressure", "number", "bar"),
                                                Point("pump_on", "bool")))
OVEN = Device("oven2", "", (Point("zone1", "number", "degC"),))
EVENT: dict[str, Any] = {
    "plc": "press1", "req_seq": 42, "time": "2025-03-04T06:20:11Z", "err": 0,
    "err_text": "success", "result": 3,
    "snapshot": {"oil_temp": 85.3, "pressure": 92.5, "pump_on": True},
    "diagnosis": {"ok": True, "output": {
        "state_detection": [{"point": "oil_temp", "state": "alarm"},
                            {"point": "pressure", "state": "alert"}],
        "health_assessment": [
            {"fault": "internal leakage", "component": "pump", "confidence": 0.4,
             "evidence": ["pressure"]},
            {"fault": "oil cooler fouled", "component": "oil cooler", "confidence": 0.6,
             "evidence": ["oil_temp"]}],
        "prognosis": {"status": "assessed", "remaining_useful_life_h": 120.0},
        "advisory": {"priority": "high", "requires_human_confirmation": True,
                     "actions": ["Check the oil cooler", "Measure case drain flow"]}}}}


def topic(kind: str, device: str | None = None) -> str:
    return f"spBv1.0/{GROUP}/{kind}/{NODE}" + (f"/{device}" if device else "")


@pytest.fixture
def host(broker: LocalBroker) -> Iterator[Host]:
    h = Host(broker.port)
    yield h
    h.close()


async def _until(host: Host, what: str, cond: Any, start: int = 0) -> list[Any]:
    return await asyncio.to_thread(host.wait, what, cond, start)


async def _kinds(host: Host, kinds: list[str], start: int = 0) -> list[Any]:
    return await asyncio.to_thread(host.wait_kinds, kinds, start)


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
@pytest.mark.slow
def test_edge_node_session_on_a_real_broker(broker: LocalBroker, host: Host, tmp_path: Path,
                                           protocol: str) -> None:
    bd_file = tmp_path / "state" / "sparkplug-bdseq"
    bd_file.parent.mkdir()

    async def scenario() -> None:
        relay = Relay(broker.port)
        await relay.start()
        node = EdgeNode(GROUP, NODE, [PRESS, OVEN], node_info={"Version": "0.1.0"},
                        bd_seq_path=bd_file)
        link = SparkplugLink(node, MQTTConfig(port=relay.port, protocol=protocol,
                                              reconnect_min_s=0.1, reconnect_max_s=0.5),
                             "rung-node1-spb")
        task = asyncio.ensure_future(link.run())
        try:
            await _session(host, link, relay)
        finally:
            link.stop()
            await asyncio.wait_for(task, 10)
            await relay.close()

    asyncio.run(scenario())
    assert bd_file.read_text().strip() == "1"
    again = EdgeNode(GROUP, NODE, [PRESS], bd_seq_path=bd_file)
    assert again.will().topic == topic("NDEATH") and again.bd_seq == 2  # kept across restarts


async def _session(host: Host, link: SparkplugLink, relay: Relay) -> None:
    # births: NBIRTH (seq 0, bdSeq 0, rebirth false), a DBIRTH per PLC declaring everything
    nbirth, press, oven = await _kinds(host, ["NBIRTH", "DBIRTH", "DBIRTH"])
    assert (nbirth.topic, nbirth.seq, nbirth.qos, nbirth.retain) == (topic("NBIRTH"), 0, 0,
                                                                     False)
    assert nbirth.metrics() == {"bdSeq": 0, "Node Control/Rebirth": False,
                                "Properties/Version": "0.1.0"}
    assert nbirth.datatypes()["bdSeq"] == DataType.INT64
    assert (press.topic, press.seq, oven.topic, oven.seq) == (
        topic("DBIRTH", "press1"), 1, topic("DBIRTH", "oven2"), 2)
    declared = press.metrics()
    assert {"Diagnosis/Priority", "Diagnosis/Top Fault", "Diagnosis/Remaining Useful Life",
            "Diagnosis/Request Id", "Points/oil_temp/State", "Points/pump_on/Value"} <= set(
        declared)
    assert declared["Diagnosis/Priority"] is None and declared["Properties/Description"] == \
        "Hydraulic press 1"
    assert press.datatypes()["Points/pump_on/Value"] == DataType.BOOLEAN

    # a diagnosis: DDATA, seq 3
    mark = len(host.since())
    link.diagnosis("press1", EVENT)
    (ddata,) = await _kinds(host, ["DDATA"], mark)
    assert (ddata.topic, ddata.seq, ddata.qos, ddata.retain) == (topic("DDATA", "press1"), 3,
                                                                 0, False)
    values = ddata.metrics()
    assert values["Diagnosis/Request Id"] == "press1-42-diagnosis"
    assert values["Diagnosis/Priority"] == "high" and values["Diagnosis/Priority Code"] == 3
    assert values["Diagnosis/Top Fault"] == "oil cooler fouled"
    assert values["Diagnosis/Top Fault Confidence"] == pytest.approx(0.6)
    assert values["Diagnosis/Remaining Useful Life"] == pytest.approx(120.0)
    assert values["Points/oil_temp/State"] == "alarm" and values["Points/pump_on/Value"] is True
    assert values["Points/pressure/Value"] == pytest.approx(92.5)
    assert set(values) <= set(declared)  # nothing that the DBIRTH did not declare

    # NCMD rebirth false: nothing; true: NBIRTH (same bdSeq, seq 0) and DBIRTHs with the data
    mark = len(host.since())
    host.command(topic("NCMD"), rebirth=False)
    host.command(topic("NCMD"), rebirth=True)
    nbirth, press, _oven = await _kinds(host, ["NBIRTH", "DBIRTH", "DBIRTH"], mark)
    assert (nbirth.seq, nbirth.metrics()["bdSeq"], press.seq) == (0, 0, 1)
    assert press.metrics()["Diagnosis/Priority"] == "high"

    # seq runs 0..255 and wraps, across DDATA, DDEATH and DBIRTH
    mark = len(host.since())
    for _ in range(300):
        link.diagnosis("oven2", {"req_seq": 1, "snapshot": {"zone1": 180.0}})
    link.plc_link("oven2", up=False)
    link.plc_link("oven2", up=False)  # once only
    link.diagnosis("oven2", {"req_seq": 2})  # nothing for a dead device
    link.plc_link("oven2", up=True)
    got = await _until(host, "300 DDATA, DDEATH, DBIRTH", lambda s: len(s) >= 302, mark)
    assert [s.seq for s in got] == [(3 + i) % 256 for i in range(302)]
    assert [s.kind for s in got[300:]] == ["DDEATH", "DBIRTH"]
    assert got[300].metrics() == {} and got[300].topic == topic("DDEATH", "oven2")

    # the connection dies without DISCONNECT: the broker publishes the Will (bdSeq 0),
    # the node reconnects with bdSeq 1 and is born again
    mark = len(host.since())
    relay.cut()
    ndeath, nbirth = await _kinds(host, ["NDEATH", "NBIRTH"], mark)
    assert ndeath.topic == topic("NDEATH") and ndeath.metrics() == {"bdSeq": 0}
    assert ndeath.seq is None and (ndeath.qos, ndeath.retain) == (1, False)
    assert (nbirth.seq, nbirth.metrics()["bdSeq"]) == (0, 1)
    assert link.connections == 2

    # a clean stop: the node's own NDEATH with the current bdSeq
    mark = len(host.since())
    link.stop()
    got = await _until(host, "NDEATH", lambda s: any(x.kind == "NDEATH" for x in s), mark)
    assert [s.metrics() for s in got if s.kind == "NDEATH"] == [{"bdSeq": 1}]


def _wire(buf: bytes) -> list[tuple[int, int | bytes]]:
    """Protocol buffer fields (number, varint or bytes), read by hand: the payload checked
    against the field numbers of the Sparkplug B specification, not our own definitions."""
    out, i = [], 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            b = buf[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            n = varint()
            out.append((number, buf[i:i + n]))
            i += n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def test_payload_bytes_follow_the_specification() -> None:
    node = EdgeNode(GROUP, NODE, [PRESS], clock=lambda: 1700000000.5)
    will = node.will()
    nbirth = node.connected()[0]
    fields = _wire(nbirth.payload)
    # Payload: 1 timestamp, 2 metrics, 3 seq
    assert fields[0] == (1, 1700000000500) and fields[-1] == (3, 0)
    bd_seq = _wire(fields[1][1])  # type: ignore[arg-type]
    # Metric: 1 name, 3 timestamp, 4 datatype, 11 long_value
    assert (1, b"bdSeq") in bd_seq and (4, 4) in bd_seq and (11, 0) in bd_seq
    rebirth = _wire(fields[2][1])  # type: ignore[arg-type]
    assert (1, b"Node Control/Rebirth") in rebirth and (4, 11) in rebirth and (14, 0) in rebirth
    death = _wire(will.payload)
    assert [n for n, _ in death] == [1, 2]  # timestamp, metrics; never a seq


def test_bd_seq_counts_connections_and_wraps() -> None:
    node = EdgeNode(GROUP, NODE, [PRESS])
    seqs = [Payload.FromString(node.will().payload).metrics[0].long_value for _ in range(258)]
    assert seqs[:3] == [0, 1, 2] and seqs[255:] == [255, 0, 1]
    births = node.connected()
    assert Payload.FromString(births[0].payload).metrics[0].long_value == 1


def test_primary_host_state_gates_the_session() -> None:
    node = EdgeNode(GROUP, NODE, [PRESS], primary_host_id="scada1")
    state = "spBv1.0/STATE/scada1"
    assert node.subscriptions() == [(topic("NCMD"), 1), (state, 1)]
    node.will()
    assert node.connected() == []  # the host has not said online
    births = node.handle(state, json.dumps({"online": True, "timestamp": 10}).encode())
    assert [m.topic for m in births.messages] == [topic("NBIRTH"), topic("DBIRTH", "press1")]
    assert node.handle(state, b'{"online": false, "timestamp": 5}').messages == []  # older
    gone = node.handle(state, b'{"online": false, "timestamp": 11}')
    assert gone.reconnect and [m.topic for m in gone.messages] == [topic("NDEATH")]
    assert node.diagnosis("press1", EVENT) == []  # not born: kept for the next DBIRTH
    assert node.handle(state, b"not json").messages == []
    node.will()
    assert node.connected() == []
    again = node.handle(state, b'{"online": true, "timestamp": 12}').messages
    dbirth = Payload.FromString(again[1].payload)
    assert {m.name: m.string_value for m in dbirth.metrics}["Diagnosis/Priority"] == "high"


def test_commands_that_are_no_rebirth_are_ignored() -> None:
    node = EdgeNode(GROUP, NODE, [PRESS])
    node.will()
    node.connected()
    assert node.handle(topic("NCMD"), b"\xff\xff garbage").messages == []
    other = Payload()
    other.metrics.add(name="Node Control/Reboot", datatype=DataType.BOOLEAN, boolean_value=True)
    assert node.handle(topic("NCMD"), other.SerializeToString()).messages == []
    assert node.handle("spBv1.0/Plant1/NCMD/another-node", b"").messages == []


def test_a_failed_diagnosis_reports_err_and_no_advice() -> None:
    failed = {**EVENT, "err": 2, "err_text": "invalid answer", "result": 0,
              "diagnosis": {"ok": False, "output": EVENT["diagnosis"]["output"]}}
    values = {m["name"]: m["value"] for m in device_metrics(PRESS, failed, "r1", birth=False)}
    assert values["Diagnosis/Err"] == 2 and values["Diagnosis/Err Text"] == "invalid answer"
    assert values["Diagnosis/Priority"] is None and values["Diagnosis/Top Fault"] is None
    assert values["Points/oil_temp/Value"] == 85.3  # the snapshot is still what was read


@pytest.mark.parametrize("kwargs,message", [
    ({"group_id": "Plant/1"}, "group_id 'Plant/1'"),
    ({"edge_node_id": ""}, "edge_node_id ''"),
    ({"devices": [PRESS, PRESS]}, "two PLCs share an id"),
    ({"devices": [Device("a+b")]}, "device id 'a\\+b'"),
])
def test_bad_identifiers_are_refused(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"group_id": GROUP, "edge_node_id": NODE, "devices": [PRESS],
                            **kwargs}
    with pytest.raises(SparkplugError, match=message):
        EdgeNode(args.pop("group_id"), args.pop("edge_node_id"), args.pop("devices"))


def test_calls_out_of_order_are_refused() -> None:
    node = EdgeNode(GROUP, NODE, [PRESS])
    with pytest.raises(SparkplugError, match="connected\\(\\) before will\\(\\)"):
        node.connected()
    with pytest.raises(SparkplugError, match="no device for PLC 'press9'"):
        node.diagnosis("press9", EVENT)


def test_devices_come_from_register_maps() -> None:
    plc = load_map(Path(__file__).resolve().parents[3] / "configs" / "plcs" / "press1.yaml")
    device = Device.from_map(plc)
    assert device.id == "press1" and device.description == plc.description
    assert [p.name for p in device.points] == [p.name for p in plc.points]
    kinds = {p.name: (p.kind, p.unit) for p in device.points}
    assert kinds["oil_temp"] == ("number", "degC") and kinds["pump_on"] == ("bool", None)
    birth = device_metrics(device, {}, "", birth=True)
    oil = next(m for m in birth if m["name"] == "Points/oil_temp/Value")
    assert oil["unit"] == "degC" and oil["value"] is None


# -- what arrives is bounded ------------------------------------------------------------------


def _ncmd(rebirth: bool, pad: int = 0) -> bytes:
    """An NCMD asking for a rebirth, padded with a string metric to ``pad`` bytes or more."""
    p = Payload(timestamp=int(time.time() * 1000))
    p.metrics.add(name=REBIRTH, datatype=DataType.BOOLEAN, boolean_value=rebirth)
    if pad:
        p.metrics.add(name="padding", datatype=DataType.STRING, string_value="x" * pad)
    return bytes(p.SerializeToString())


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_an_oversized_command_is_refused_unparsed(broker: LocalBroker, host: Host,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture,
                                                  protocol: str) -> None:
    """An NCMD over ``mqtt.max_payload_bytes`` -- even one that asks for a rebirth -- is
    dropped before protobuf sees it; the link goes on and acts on the next command. What
    is parsed is parsed in a worker thread. Under MQTT 5 the broker does not even send a
    3 MiB command (CONNECT Maximum Packet Size); under 3.1.1 the link refuses it too."""
    limit = 1024
    parsed: list[tuple[int, bool]] = []   # (bytes, on the main thread)
    real, normal = sparkplug_module._rebirth, _ncmd(True)
    last_read = threading.Event()

    def spy(payload: bytes) -> bool:
        parsed.append((len(payload), threading.current_thread() is threading.main_thread()))
        if payload == normal:
            last_read.set()
        return real(payload)

    monkeypatch.setattr(sparkplug_module, "_rebirth", spy)
    just_over, huge = _ncmd(True, limit), _ncmd(True, 3 * 2**20)
    assert limit < len(just_over) < limit + 64

    async def scenario() -> None:
        node = EdgeNode(GROUP, NODE, [PRESS])
        link = SparkplugLink(node, MQTTConfig(port=broker.port, protocol=protocol,
                                              max_payload_bytes=limit, reconnect_min_s=0.1,
                                              reconnect_max_s=0.5), "rung-node1-spb")
        task = asyncio.ensure_future(link.run())
        try:
            await _kinds(host, ["NBIRTH", "DBIRTH"])
            mark = len(host.since())
            for payload in (just_over, huge, normal):   # the last one is acted on
                host.client.publish(topic("NCMD"), payload, qos=1).wait_for_publish(5)
            assert await asyncio.to_thread(last_read.wait, 10)
            link.diagnosis("press1", EVENT)   # a fence: published after any birth
            await _until(host, "the DDATA", lambda s: any(x.kind == "DDATA" for x in s), mark)
            # one rebirth: the oversized commands (rebirths too) made none
            assert [s.kind for s in host.since(mark)] == ["NBIRTH", "DBIRTH", "DDATA"]
            assert link.connections == 1
            assert link.oversize.counts["NCMD"] == (1 if protocol == "5" else 2)
        finally:
            link.stop()
            await asyncio.wait_for(task, 10)

    with caplog.at_level(logging.WARNING, logger="rung.sparkplug"):
        asyncio.run(scenario())
    assert parsed and all(n <= limit for n, _ in parsed), parsed
    assert not any(main for _, main in parsed), "parsed on the event loop's thread"
    refusals = [r for r in caplog.records if r.getMessage() == "payload refused"]
    assert len(refusals) == 1, "logged once per kind, not once per message"
    fields = refusals[0].rung_fields  # type: ignore[attr-defined]
    assert fields["kind"] == "NCMD" and fields["bytes"] == len(just_over)
    assert fields["limit"] == limit


def test_hostile_commands_are_answered_with_nothing() -> None:
    node = EdgeNode(GROUP, NODE, [PRESS], primary_host_id="scada1")
    state = "spBv1.0/STATE/scada1"
    node.will()
    for payload in (b'{"online": true, "timestamp": 1e999}', b"[" * 100_000, b'"online"',
                    b'{"online": "yes"}'):
        assert node.decode(state, payload).state is None, payload
        assert node.handle(state, payload).messages == []
    assert node.decode(topic("NCMD"), b"\x0a" * 70_000).rebirth is False
    assert node.decode("spBv1.0/Plant1/NCMD/other", _ncmd(True)).kind == ""


@pytest.mark.slow
@pytest.mark.integration
def test_a_broker_restart_reconnects_through_the_shared_loop(
        broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The broker restarts: the edge node reconnects through the request link's reconnect
    loop (``link.keep_connected``, ``mqtt.reconnect_min_s`` after the drop) and is born
    again with the next bdSeq, its devices with it; data flows after the births."""
    from rung.daemon.mqtt import link as mqtt_link
    from rung.daemon.sparkplug import link as sparkplug_link

    loops: list[str] = []

    async def spy(cfg: MQTTConfig, *args: Any, **kwargs: Any) -> None:
        loops.append(kwargs.get("label", ""))
        await mqtt_link.keep_connected(cfg, *args, **kwargs)

    monkeypatch.setattr(sparkplug_link, "keep_connected", spy)
    bd_file = tmp_path / "sparkplug-bdseq"

    async def scenario() -> None:
        node = EdgeNode(GROUP, NODE, [PRESS], bd_seq_path=bd_file)
        # the first try after the drop comes 1.5 s later: the broker and the new host
        # are up by then
        link = SparkplugLink(node, MQTTConfig(port=broker.port, reconnect_min_s=1.5,
                                              reconnect_max_s=3.0), "rung-node1-spb")
        first = await asyncio.to_thread(Host, broker.port)
        task = asyncio.ensure_future(link.run())
        try:
            nbirth, _ = await _kinds(first, ["NBIRTH", "DBIRTH"])
            assert nbirth.metrics()["bdSeq"] == 0 and link.connections == 1
            await asyncio.to_thread(broker.stop)
            await asyncio.to_thread(first.close)
            await asyncio.to_thread(broker.start)
            second = await asyncio.to_thread(Host, broker.port)
            try:
                nbirth, dbirth = await _kinds(second, ["NBIRTH", "DBIRTH"])
                assert (nbirth.seq, nbirth.metrics()["bdSeq"]) == (0, 1)
                assert (dbirth.topic, dbirth.seq) == (topic("DBIRTH", "press1"), 1)
                assert link.connections == 2
                mark = len(second.since())
                link.diagnosis("press1", EVENT)
                (ddata,) = await _kinds(second, ["DDATA"], mark)
                assert ddata.seq == 2
            finally:
                second.close()
        finally:
            link.stop()
            await asyncio.wait_for(task, 10)

    with caplog.at_level(logging.WARNING, logger="rung.sparkplug"):
        asyncio.run(scenario())
    assert loops == ["sparkplug: "]   # one run of the shared loop, two connections
    assert any(r.getMessage().startswith(f"sparkplug: broker 127.0.0.1:{broker.port}: ")
               for r in caplog.records)
    assert bd_file.read_text().strip() == "1"
