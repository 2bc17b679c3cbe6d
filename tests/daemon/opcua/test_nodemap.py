"""Node maps: the shipped example loads; a bad key is refused naming the file and the key;
``plcs`` entries go to the right loader by ``protocol``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rung.daemon.modbus.regmap import PlcMap, RegisterMapError
from rung.daemon.opcua.nodemap import NodeMap, NodeMapError, load_node_map, parse_node_map
from rung.daemon.plcmaps import load_plc_map

ROOT = Path(__file__).resolve().parents[3]
MAP = ROOT / "configs" / "plcs" / "mixer2-opcua.yaml"


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MAP.read_text())
    return doc


def test_the_shipped_map_loads() -> None:
    plc = load_node_map(MAP)
    assert plc.id == "mixer2" and plc.server.security.policy == "None"
    assert [p.name for p in plc.points] == ["bearing_temp", "vibration", "motor_current",
                                            "running_hours", "agitator_on"]
    assert plc.points[0].limits == {"alert": 75.0, "alarm": 90.0}
    assert plc.handshake.req.nodeid == "ns=2;s=Mixer2.Rung.req"
    assert plc.handshake.busy.path == ((None, "Mixer2"), (None, "Rung"), (None, "busy"))
    assert plc.handshake.retry_max_s == 2.0
    assert str(plc.handshake.heartbeat) in plc.allowed
    assert str(plc.handshake.req) not in plc.allowed


def test_plcs_entries_load_by_protocol(tmp_path: Path) -> None:
    assert isinstance(load_plc_map(MAP), NodeMap)
    assert isinstance(load_plc_map(ROOT / "configs" / "plcs" / "press1.yaml"), PlcMap)
    modbus = yaml.safe_load((ROOT / "configs" / "plcs" / "press1.yaml").read_text())
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"protocol": "modbus", **modbus}))
    assert isinstance(load_plc_map(tmp_path / "m.yaml"), PlcMap)
    (tmp_path / "x.yaml").write_text(yaml.safe_dump({"protocol": "profinet", **modbus}))
    with pytest.raises(RegisterMapError, match="x.yaml: protocol: expected one of modbus, opcua"):
        load_plc_map(tmp_path / "x.yaml")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["server"].update(endpint="x"), r"server\.endpint: unknown key.*'endpoint'"),
    (lambda d: d["server"].update(endpoint="http://plc"), r"server\.endpoint: expected opc\.tcp"),
    (lambda d: d["handshake"].update(req="Rung.req"), r"handshake\.req: expected a NodeId"),
    (lambda d: d["handshake"].update(done=d["handshake"]["busy"]),
     r"handshake\.done: /Mixer2/Rung/busy is also handshake\.busy"),
    (lambda d: d["handshake"].update(watchdog_s=1.0), r"handshake\.watchdog_s: expected >="),
    (lambda d: d["server"].update(security={"policy": "Basic256Sha256", "mode": "None"}),
     r"server\.security\.mode: with policy Basic256Sha256 expected Sign or SignAndEncrypt"),
    (lambda d: d["server"].update(security={"policy": "Basic256Sha256", "mode": "Sign"}),
     r"server\.security\.certificate: required with policy Basic256Sha256"),
    (lambda d: d["server"].update(user="rung"), r"server\.password_file: required"),
    (lambda d: d["server"].update(user="rung", password_file="nowhere"),
     r"server\.password_file: .*nowhere is not an existing file"),
    (lambda d: d["server"].pop("namespace"),
     r"handshake\.busy: /Mixer2/Rung/busy: a browse-path segment without a namespace index"),
    (lambda d: d["points"][1].update(name="bearing_temp"),
     r"points\[1\]\.name: 'bearing_temp' is also points\[0\]\.name"),
    (lambda d: d["points"][0]["limits"].update(alert=95),
     r"points\[0\]\.limits\.alarm: expected >= points\[0\]\.limits\.alert"),
    (lambda d: d["points"][4].update(scale=2), r"points\[4\]\.scale: only for numeric types"),
    (lambda d: d.update(writable=["ns=2;s=Mixer2.Rung.req"]),
     r"writable\[0\]: ns=2;s=Mixer2\.Rung\.req is handshake\.req, which the PLC writes"),
])
def test_a_bad_key_is_named(edit: Any, message: str) -> None:
    doc = copy.deepcopy(_doc())
    edit(doc)
    with pytest.raises(NodeMapError, match=message) as e:
        parse_node_map(doc, MAP)
    assert str(e.value).startswith(f"{MAP}: ")


def test_a_password_from_a_systemd_credential(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "opcua-mixer2").write_text("s3cret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    doc = _doc()
    doc["server"].update(user="rung", password_file="credential:opcua-mixer2")
    plc = parse_node_map(doc, MAP)
    assert plc.server.password == "s3cret" and "s3cret" not in repr(plc)
