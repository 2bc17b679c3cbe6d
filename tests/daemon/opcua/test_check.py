"""``rung check`` with an OPC UA node map: the map loaded as a node map and the PLC probed
through its link (the simulated PLC, a real asyncua server): a good map passes, a node the
server does not have, a handshake node of the wrong type and a server that is down each
fail the ``plcs`` check, naming the node or the link state, with exit status 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from asyncua import ua

from rung.daemon.check import _plcs
from rung.daemon.config import parse_config
from rung.daemon.demo.opcsim import SimOpcPlcThread
from rung.engines.errors import RungError
from tests.daemon.harness import Broker, write_config
from tests.daemon.opcua.rig import map_doc
from tests.daemon.test_serve import rung_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _map(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _line(out: str, name: str) -> str:
    (line,) = [x for x in out.splitlines() if x.split()[1:2] == [name]]
    return line


def test_rung_check_probes_an_opcua_plc(tmp_path: Path, edge_engine: Path) -> None:
    plc = SimOpcPlcThread()
    broker = Broker(tmp_path / "broker")
    broker.start()
    try:
        good = _map(tmp_path, "mixer2", map_doc(plc.sim.endpoint))
        doc = map_doc(plc.sim.endpoint)
        doc["points"][1]["node"] = "ns=2;s=Mixer2.NoSuchNode"
        bad = _map(tmp_path, "mixer2-bad", doc)
        config = write_config(tmp_path, edge_engine, broker.port, plcs=[str(good)])

        ok = rung_cli("check", "--config", str(config))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        line = _line(ok.stdout, "plcs")
        assert line.startswith("ok") and f"mixer2 at {plc.sim.endpoint}" in line, line
        assert "handshake and 5 points read" in line and "link connected" in line, line
        assert plc.get("heartbeat") == 0 and plc.get("busy") is False   # nothing written

        failed = rung_cli("check", "--config", str(config), "--set", f"plcs=[{bad}]")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        line = _line(failed.stdout, "plcs")
        assert line.startswith("FAIL"), line
        assert "ns=2;s=Mixer2.NoSuchNode" in line and "BadNodeIdUnknown" in line, line
        assert "points[1].node" in line and "link connected" in line, line
        assert "rung: check failed: plcs" in failed.stderr
        assert _line(failed.stdout, "broker").startswith("ok")
    finally:
        broker.stop()
        plc.close()


def test_check_names_a_type_mismatch_and_a_server_down(tmp_path: Path) -> None:
    plc = SimOpcPlcThread(types={"result": ua.VariantType.Float})
    try:
        path = _map(tmp_path, "mixer2", map_doc(plc.sim.endpoint))
        cfg = parse_config({"engine": {"path": "e"}, "plcs": [str(path)]}, tmp_path)
        with pytest.raises(RungError) as e:
            _plcs(cfg)
        assert "type mismatch: handshake.result ns=2;s=Mixer2.Rung.result is Float" in str(e.value)
        assert "link connected" in str(e.value)
    finally:
        plc.close()
    with pytest.raises(RungError) as e:   # the server is gone
        _plcs(cfg)
    assert f"mixer2 at {plc.sim.endpoint} (link disconnected, security None)" in str(e.value)
    assert "connect" in str(e.value)
