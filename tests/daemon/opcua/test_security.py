"""Basic256Sha256 with certificates the test generates, and a user with a password from a
file: the handshake works over SignAndEncrypt and Sign; a server that rejects rung's
certificate, or its password, is one log line and a link state, never a crash."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.tasks.runner import TaskRunner
from tests.daemon.opcua.certs import Pair, make_pair
from tests.daemon.opcua.rig import map_doc, plant, run, running
from tests.daemon.opcua.test_agent import runner  # noqa: F401  (the module's fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    folder = tmp_path_factory.mktemp("pki")
    return {"plc": make_pair(folder, "plc", server=True),
            "rung": make_pair(folder, "rung", server=False),
            "stranger": make_pair(folder, "stranger", server=False)}


def _secure(endpoint: str, pki: dict[str, Pair], tmp_path: Path, mode: str,
            password: str = "s3cret") -> dict[str, Any]:
    (tmp_path / "opcua-password").write_text(password + "\n")
    return map_doc(endpoint, user="rung", password_file=str(tmp_path / "opcua-password"),
                   security={"policy": "Basic256Sha256", "mode": mode,
                             "certificate": str(pki["rung"].cert),
                             "private_key": str(pki["rung"].key),
                             "server_certificate": str(pki["plc"].cert)})


@pytest.mark.parametrize("mode", ["SignAndEncrypt", "Sign"])
def test_basic256sha256_with_a_user(runner: TaskRunner, tmp_path: Path,  # noqa: F811
                                    pki: dict[str, Pair], mode: str) -> None:
    async def scenario() -> None:
        async with plant(runner, tmp_path, certificate=pki["plc"].cert,
                         private_key=pki["plc"].key, trusted=[pki["rung"].cert],
                         users={"rung": "s3cret"}) as p:
            async def body() -> None:
                await p.link("connected")
                await p.beat_moves()
                seq = await p.sim.trigger()
                await p.answered(seq)

            await running(p.agent(_secure(p.proxy.endpoint, pki, tmp_path, mode)), body)
            assert len(p.events()) == 1
    run(scenario)


@pytest.mark.parametrize("fault", ["certificate", "password"])
def test_a_rejected_certificate_or_password(runner: TaskRunner, tmp_path: Path,  # noqa: F811
                                            pki: dict[str, Pair], fault: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.plc")
    trusted = [pki["stranger"].cert] if fault == "certificate" else [pki["rung"].cert]

    async def scenario() -> None:
        async with plant(runner, tmp_path, certificate=pki["plc"].cert,
                         private_key=pki["plc"].key, trusted=trusted,
                         users={"rung": "s3cret"}) as p:
            doc = _secure(p.proxy.endpoint, pki, tmp_path, "SignAndEncrypt",
                          password="wrong" if fault == "password" else "s3cret")

            async def body() -> None:
                await p.until("attempts", lambda: p.sample("rung_plc_failing", op="link") >= 3,
                              30)
                return None

            await running(p.agent(doc), body)
            states = {d["state"] for d in p.links()}
            assert states == {"disconnected"}, p.links()
            assert p.sample("rung_plc_serving") == 0
            assert await p.get("heartbeat") == 0
    run(scenario)
    down = [r.getMessage() for r in caplog.records if "link down" in r.getMessage()]
    assert len(down) == 1, down
    assert "connect" in down[0]
