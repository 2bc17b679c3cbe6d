"""A wrong ``server_certificate`` (another server's, an old export): the server drops the
secure channel encrypted for it without a status, which read as "no answer in time". Now
the link reads the server's endpoints over a None channel and names the file and both
certificates, in the handshake's log line and link state and in ``rung check``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.check import _opcua
from rung.daemon.opcua.errors import OpcUaConfigError
from rung.daemon.opcua.link import NodeLink
from rung.daemon.opcua.nodemap import parse_node_map
from rung.daemon.tasks.runner import TaskRunner
from rung.engines.errors import RungError
from tests.daemon.opcua.certs import Pair, make_pair
from tests.daemon.opcua.rig import MAP, map_doc, plant, run, running
from tests.daemon.opcua.test_agent import runner  # noqa: F401  (the module's fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    folder = tmp_path_factory.mktemp("pki")
    return {"plc": make_pair(folder, "plc", server=True),
            "rung": make_pair(folder, "rung", server=False),
            "other": make_pair(folder, "other-plc", server=True)}


def _doc(endpoint: str, pki: dict[str, Pair], mode: str, server: str) -> dict[str, Any]:
    return map_doc(endpoint, security={"policy": "Basic256Sha256", "mode": mode,
                                       "certificate": str(pki["rung"].cert),
                                       "private_key": str(pki["rung"].key),
                                       "server_certificate": str(pki[server].cert)})


@pytest.mark.parametrize("mode", ["SignAndEncrypt", "Sign"])
def test_a_wrong_server_certificate_is_named(runner: TaskRunner, tmp_path: Path,  # noqa: F811
                                             pki: dict[str, Pair], mode: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.plc")
    wrong = str(pki["other"].cert)

    async def scenario() -> None:
        async with plant(runner, tmp_path, certificate=pki["plc"].cert,
                         private_key=pki["plc"].key, trusted=[pki["rung"].cert]) as p:
            doc = _doc(p.proxy.endpoint, pki, mode, "other")
            link = NodeLink(parse_node_map(doc, MAP))
            with pytest.raises(OpcUaConfigError) as err:
                await link.connect()
            await link.close()
            text = err.value.message
            assert f"security.server_certificate {wrong} (CN=other-plc" in text, text
            assert "is not the certificate the server presents (CN=plc" in text
            assert "no answer in time" not in text
            assert err.value.hint is not None and "export the server's certificate" in \
                err.value.hint
            # rung check says the same on its plcs line
            with pytest.raises(RungError, match="is not the certificate the server"):
                await _opcua(parse_node_map(doc, MAP))

            async def body() -> None:
                await p.until("a failed connect", lambda: p.sample("rung_plc_failing",
                                                                   op="link") >= 1, 30)

            await running(p.agent(doc), body)
            assert {d["state"] for d in p.links()} == {"disconnected"}
            # the right certificate connects (the check does not refuse a good one)
            good = NodeLink(parse_node_map(_doc(p.proxy.endpoint, pki, mode, "plc"), MAP))
            await good.connect()
            assert good.state == "connected"
            await good.close()
    run(scenario)
    down = [r.getMessage() for r in caplog.records if "link down" in r.getMessage()]
    assert down and "is not the certificate the server presents" in down[0], down
