"""rung's OPC UA server against real asyncua clients: the task methods answered through the
real scheduler on the demo model, the MQTT request checks and answer forms, the status
nodes; security None and Basic256Sha256 with a users file, certificates generated here."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua
from asyncua.client.client import Client
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256

from rung.daemon.config import OpcUaServerConfig, parse_config
from rung.daemon.demo.localbroker import free_port
from rung.daemon.metrics import Metrics
from rung.daemon.opcua.server import RungServer
from rung.daemon.scheduler import Scheduler
from rung.daemon.tasks.runner import TaskRunner
from rung.engines.errors import RungError
from tests.daemon.opcua.certs import Pair, make_pair
from tests.daemon.opcua.test_agent import runner  # noqa: F401  (the module's fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DIAGNOSIS = {"asset": "Centrifugal pump P-101",
             "points": [{"name": "bearing_temp", "value": 91.0, "unit": "degC",
                         "limits": {"alert": 70, "alarm": 85}},
                        {"name": "flow", "value": 41.0, "unit": "m3/h",
                         "limits": {"low_alert": 35, "low_alarm": 25}}]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    folder = tmp_path_factory.mktemp("pki")
    return {"rung": make_pair(folder, "rung", server=True),
            "scada": make_pair(folder, "scada", server=False),
            "stranger": make_pair(folder, "stranger", server=False)}


@asynccontextmanager
async def serving(runner: TaskRunner, cfg: OpcUaServerConfig,  # noqa: F811
                  metrics: Metrics | None = None) -> AsyncIterator[RungServer]:
    scheduler = Scheduler(runner, lambda a: None, 4)
    scheduler.start()
    server = RungServer(cfg, runner.tasks, scheduler.submit,
                        lambda: {"ready": True, "queue_depth": scheduler.depth,
                                 "inflight": scheduler.inflight, "engine": "edge-test",
                                 "tasks": list(runner.tasks)},
                        "rung-test", timeout_s=120.0, metrics=metrics)
    task = asyncio.get_running_loop().create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 30)
        yield server
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await scheduler.stop(5)


async def _call(client: Client, method: str, request: str) -> dict[str, Any]:
    rung = await client.nodes.objects.get_child(["2:rung"])
    answer = await rung.call_method(f"2:{method}", ua.Variant(request, ua.VariantType.String))
    doc: dict[str, Any] = json.loads(answer)
    return doc


def run(scenario: Callable[[], Awaitable[None]], seconds: float = 120) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(seconds):
            await scenario()
    asyncio.run(bounded())


def test_methods_and_status_without_security(runner: TaskRunner) -> None:  # noqa: F811
    cfg = OpcUaServerConfig(enabled=True, endpoint=f"opc.tcp://127.0.0.1:{free_port()}/rung/",
                            max_request_bytes=4096)

    async def scenario() -> None:
        async with serving(runner, cfg):
            client = Client(cfg.endpoint, timeout=120, watchdog_intervall=600)   # a call
            # holds its session until the answer: no keep-alive probe meanwhile
            async with client:
                status = await client.nodes.objects.get_child(["2:rung", "2:Status"])
                ready = await (await status.get_child("2:Ready")).read_value()
                engine = await (await status.get_child("2:Engine")).read_value()
                tasks = json.loads(await (await status.get_child("2:Tasks")).read_value())
                assert ready is True and engine == "edge-test" and "diagnosis" in tasks
                depth = await (await status.get_child("2:QueueDepth")).read_value()
                assert depth == 0

                answer = await _call(client, "Diagnose", json.dumps(DIAGNOSIS))
                # answered through the scheduler and its checks: right, or refused by them
                # with the output that failed (the demo model's quality is not tested here)
                assert answer["task"] == "diagnosis", answer
                assert answer["ok"] or answer["error"]["code"] == "invalid_output", answer
                states = {s["point"]: s["state"] for s in answer["output"]["state_detection"]}
                assert states["bearing_temp"] == "alarm"
                assert answer["usage"]["completion_tokens"] > 0
                tree = await _call(client, "BuildFaultTree", json.dumps(
                    {"input": {"top_event": "Pump P-101 stops", "system": "Cooling loop"},
                     "max_tokens": 600}))
                assert tree["task"] == "fault_tree"
                assert tree["ok"] or tree["error"]["code"] in ("invalid_output", "truncated")

                bad = await _call(client, "GenerateST", "{not json")
                assert (bad["ok"], bad["error"]["code"]) == (False, "bad_json")
                unknown = await _call(client, "GenerateST", json.dumps(
                    {"input": {"description": "a timer"}, "colour": "red"}))
                assert unknown["error"]["code"] == "bad_request"
                assert "unknown field 'colour'" in unknown["error"]["message"]
                big = await _call(client, "GenerateST", json.dumps(
                    {"description": "x" * 5000}))
                assert big["error"]["code"] == "too_large"
                assert "opcua_server.max_request_bytes" in big["error"]["message"]
    run(scenario, 600)


def _secure(pki: dict[str, Pair], tmp_path: Path) -> OpcUaServerConfig:
    users = tmp_path / "opcua-users"
    users.write_text("# SCADA clients\nscada:s3cret\n")
    return OpcUaServerConfig(
        enabled=True, endpoint=f"opc.tcp://127.0.0.1:{free_port()}/rung/",
        security=("Basic256Sha256_SignAndEncrypt",), certificate=pki["rung"].cert,
        private_key=pki["rung"].key, trusted_certificates=(pki["scada"].cert,),
        users_file=users)


async def _client(cfg: OpcUaServerConfig, pki: dict[str, Pair], who: str,
                  password: str | None) -> Client:
    client = Client(cfg.endpoint, timeout=30, watchdog_intervall=600)
    client.application_uri = pki[who].uri
    if password is not None:
        client.set_user("scada")
        client.set_password(password)
    await client.set_security(SecurityPolicyBasic256Sha256, str(pki[who].cert),
                              str(pki[who].key), server_certificate=str(pki["rung"].cert),
                              mode=ua.MessageSecurityMode.SignAndEncrypt)
    return client


def test_basic256sha256_and_users(runner: TaskRunner, tmp_path: Path,  # noqa: F811
                                  pki: dict[str, Pair]) -> None:
    cfg = _secure(pki, tmp_path)

    async def scenario() -> None:
        async with serving(runner, cfg):
            client = await _client(cfg, pki, "scada", "s3cret")
            async with client:
                bad = await _call(client, "Diagnose", "[]")
                assert bad["error"]["code"] == "bad_request"
            for who, password in (("scada", "wrong"), ("scada", None), ("stranger", "s3cret")):
                client = await _client(cfg, pki, who, password)
                with pytest.raises((ua.UaError, ConnectionError, OSError, TimeoutError)):
                    await client.connect()
                client.disconnect_socket()
            plain = Client(cfg.endpoint, timeout=10)      # security None is not offered
            with pytest.raises((ua.UaError, ConnectionError, OSError, TimeoutError)):
                await plain.connect()
            plain.disconnect_socket()
    run(scenario)


def test_config_keys_are_checked(tmp_path: Path, pki: dict[str, Pair]) -> None:
    def load(**server: Any) -> OpcUaServerConfig:
        return parse_config({"engine": {"path": "e"}, "opcua_server": server},
                            tmp_path).opcua_server

    assert load().enabled is False and load().security == ("None",)
    assert (load().max_request_bytes, load().max_sessions, load().max_pending_sessions,
            load().activation_timeout_s) == (65536, 32, 8, 10.0)
    assert load(max_request_bytes=4096).max_request_bytes == 4096
    cfg = load(enabled=True, security=["Basic256Sha256_Sign"], certificate=str(pki["rung"].cert),
               private_key=str(pki["rung"].key), trusted_certificates=[str(pki["scada"].cert)])
    assert cfg.trusted_certificates == (pki["scada"].cert,)
    for server, message in [
            ({"endpoint": "http://x"}, "opcua_server.endpoint: expected opc.tcp://"),
            ({"security": ["Basic128"]}, "opcua_server.security: expected a non-empty list"),
            ({"security": ["Basic256Sha256_Sign"]},
             "opcua_server.certificate: required with opcua_server.security"),
            ({"users_file": "missing"}, "opcua_server.users_file: "),
            ({"enabeld": True}, "opcua_server.enabeld: unknown key"),
            ({"max_request_bytes": 0}, "opcua_server.max_request_bytes: expected an integer"),
            ({"max_request_bytes": "64k"}, "opcua_server.max_request_bytes: expected"),
            ({"max_sessions": 0}, "opcua_server.max_sessions: expected an integer 1..1000"),
            ({"max_pending_sessions": 9, "max_sessions": 8},
             "opcua_server.max_pending_sessions: at most opcua_server.max_sessions (8)"),
            ({"activation_timeout_s": 0}, "opcua_server.activation_timeout_s: expected a "
                                          "number > 0")]:
        with pytest.raises(RungError, match=re.escape(message)):
            load(**server)
    (tmp_path / "users").write_text("nobody\n")
    from rung.daemon.opcua.server import read_users
    with pytest.raises(RungError, match="line 1: expected name:password"):
        read_users(tmp_path / "users")
