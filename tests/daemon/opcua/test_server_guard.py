"""What reaches rung's OPC UA server, against real asyncua clients on loopback, some of
them driven by hand as an attacker would (a None channel opened without the endpoint
list, a password sent in clear, sessions created and never activated, oversized messages
and chunks): each refused where it arrives with the status docs/opcua.md names, each one
log line; the sessions capped; nothing of a refused message buffered (a generous RSS
bound, no timings)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from asyncua import ua
from asyncua.client.client import Client
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from asyncua.ua.ua_binary import uatcp_to_binary

from rung.daemon.config import OpcUaServerConfig
from rung.daemon.demo.localbroker import free_port
from rung.daemon.opcua.server import RungServer
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer
from tests.daemon.opcua.certs import Pair, make_pair
from tests.daemon.opcua.test_server import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TASKS = {"diagnosis": object(), "st_code": object(), "fault_tree": object()}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    folder = tmp_path_factory.mktemp("pki")
    return {"rung": make_pair(folder, "rung", server=True),
            "scada": make_pair(folder, "scada", server=False),
            "stranger": make_pair(folder, "stranger", server=False)}


def answered_at_once(req: Request, recovered: bool,
                     on_start: Callable[[Request], object]) -> asyncio.Future[Answer]:
    """The scheduler's place: every request answered ok at once (the model is not what
    these tests are about)."""
    future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    future.set_result(Answer(req, True, output={"state": "ok"}, validation={"ok": True}))
    return future


def _config(tmp_path: Path, pki: dict[str, Pair] | None = None,
            security: tuple[str, ...] = ("None",), **kw: Any) -> OpcUaServerConfig:
    users = tmp_path / "opcua-users"
    users.write_text("scada:s3cret\n")
    secure = {} if pki is None else {
        "certificate": pki["rung"].cert, "private_key": pki["rung"].key,
        "trusted_certificates": (pki["scada"].cert,)}
    return OpcUaServerConfig(enabled=True, endpoint=f"opc.tcp://127.0.0.1:{free_port()}/rung/",
                             security=security, users_file=users, **secure, **kw)


@asynccontextmanager
async def serving(cfg: OpcUaServerConfig) -> AsyncIterator[RungServer]:
    server = RungServer(cfg, TASKS, answered_at_once, lambda: {"ready": True},
                        "rung-test", timeout_s=60.0)
    task = asyncio.get_running_loop().create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 30)
        yield server
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def channel(cfg: OpcUaServerConfig, pki: dict[str, Pair] | None = None,
                  who: str = "scada",
                  mode: ua.MessageSecurityMode | None = None) -> Client:
    """A client with its secure channel open and no session: None, or Basic256Sha256 in
    ``mode`` with ``who``'s certificate."""
    client = Client(cfg.endpoint, timeout=20, watchdog_intervall=600)
    if pki is not None and mode is not None:
        client.application_uri = pki[who].uri
        await client.set_security(SecurityPolicyBasic256Sha256, str(pki[who].cert),
                                  str(pki[who].key), server_certificate=str(pki["rung"].cert),
                                  mode=mode)
    await client.connect_socket()
    try:
        await client.send_hello()
        await client.open_secure_channel()
    except BaseException:
        client.disconnect_socket()
        raise
    return client


def session_parameters(cfg: OpcUaServerConfig, name: str = "probe") -> ua.CreateSessionParameters:
    p = ua.CreateSessionParameters()
    p.ClientNonce = os.urandom(32)
    p.EndpointUrl = cfg.endpoint
    p.SessionName = name
    p.RequestedSessionTimeout = 600_000
    p.ClientDescription = ua.ApplicationDescription()
    return p


def clear_password(user: str = "scada", password: str = "s3cret") -> ua.ActivateSessionParameters:
    a = ua.ActivateSessionParameters()
    a.UserIdentityToken = ua.UserNameIdentityToken(PolicyId="username", UserName=user,
                                                   Password=password.encode())
    return a


def refusals(caplog: pytest.LogCaptureFixture, *parts: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rung.opcua"
            and "refused" in r.getMessage() and all(p in r.getMessage() for p in parts)]


def open_sessions(server: RungServer) -> int:
    """The sessions asyncua holds (its registry of client sessions)."""
    assert server.server is not None
    return len(server.server.iserver._external_sessions)


async def gone(server: RungServer) -> None:
    """Until the sessions of closed connections are closed (asyncua closes them in tasks
    of their own, after the socket)."""
    while open_sessions(server):
        await asyncio.sleep(0.01)


def test_a_none_channel_is_refused_by_a_secure_only_server(
        tmp_path: Path, pki: dict[str, Pair], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.opcua")
    cfg = _config(tmp_path, pki, ("Basic256Sha256_SignAndEncrypt",))

    async def scenario() -> None:
        async with serving(cfg) as server:
            # the attack: a None channel opened by hand, then a session with the password
            # in clear (before: created, activated, rung.Status read, Diagnose ok)
            with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                attacker = await channel(cfg)
                await attacker.uaclient.create_session(session_parameters(cfg))
                await attacker.uaclient.activate_session(clear_password())
            # the right policy in a mode not offered
            with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                await channel(cfg, pki, mode=ua.MessageSecurityMode.Sign)
            # a certificate not trusted, refused with the channel (whatever the
            # CreateSession would name)
            with pytest.raises(ua.uaerrors.BadCertificateUntrusted):
                await channel(cfg, pki, "stranger", ua.MessageSecurityMode.SignAndEncrypt)
            assert open_sessions(server) == 0
            # the configured way in still works
            client = Client(cfg.endpoint, timeout=20, watchdog_intervall=600)
            client.application_uri = pki["scada"].uri
            client.set_user("scada")
            client.set_password("s3cret")
            await client.set_security(SecurityPolicyBasic256Sha256, str(pki["scada"].cert),
                                      str(pki["scada"].key),
                                      server_certificate=str(pki["rung"].cert),
                                      mode=ua.MessageSecurityMode.SignAndEncrypt)
            async with client:
                ready = await client.nodes.objects.get_child(["2:rung", "2:Status", "2:Ready"])
                assert await ready.read_value() is True
    run(scenario)
    assert len(refusals(caplog)) == 3, refusals(caplog)
    (none,) = refusals(caplog, "a channel", "security policy None is not offered",
                       "opcua_server.security: Basic256Sha256_SignAndEncrypt",
                       "BadSecurityPolicyRejected")
    (sign,) = refusals(caplog, "security Basic256Sha256_Sign is not offered")
    (cert,) = refusals(caplog, "client certificate", "stranger",
                       "not in opcua_server.trusted_certificates", "BadCertificateUntrusted")


def test_a_password_goes_only_as_its_endpoint_offered_it(
        tmp_path: Path, pki: dict[str, Pair], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.opcua")
    cfg = _config(tmp_path, pki, ("None", "Basic256Sha256_SignAndEncrypt"))

    async def scenario() -> None:
        async with serving(cfg) as server:
            # None is offered, but its endpoint takes the password encrypted
            attacker = await channel(cfg)
            try:
                await attacker.uaclient.create_session(session_parameters(cfg))
                with pytest.raises(ua.uaerrors.BadIdentityTokenInvalid):
                    await attacker.uaclient.activate_session(clear_password())
            finally:
                attacker.disconnect_socket()
            # a session created on a SignAndEncrypt channel is not activated over None
            secure = await channel(cfg, pki, mode=ua.MessageSecurityMode.SignAndEncrypt)
            plain = await channel(cfg)
            try:
                created = await secure.uaclient.create_session(session_parameters(cfg))
                assert plain.uaclient.protocol is not None
                plain.uaclient.protocol.authentication_token = created.AuthenticationToken
                with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                    await plain.uaclient.activate_session(clear_password())
            finally:
                secure.disconnect_socket()
                plain.disconnect_socket()
            # the right user with a wrong password, and anonymous: refused, one line each
            for password in ("wrong", None):
                client = Client(cfg.endpoint, timeout=20, watchdog_intervall=600)
                if password is not None:
                    client.set_user("scada")
                    client.set_password(password)
                with pytest.raises(ua.UaError):
                    await client.connect()
                client.disconnect_socket()
            # asyncua's own client on None encrypts the password, as offered: let in
            client = Client(cfg.endpoint, timeout=20, watchdog_intervall=600)
            client.set_user("scada")
            client.set_password("s3cret")
            async with client:
                ready = await client.nodes.objects.get_child(["2:rung", "2:Status", "2:Ready"])
                assert await ready.read_value() is True
            assert open_sessions(server) <= 1
    run(scenario)
    lines = refusals(caplog)
    assert len(lines) == 4, lines
    (clear,) = refusals(caplog, "a login as 'scada'", "sent in clear on a None channel",
                        "BadIdentityTokenInvalid")
    (moved,) = refusals(caplog, "created on Basic256Sha256_SignAndEncrypt",
                        "not activated on None", "BadSecurityPolicyRejected")
    (wrong,) = refusals(caplog, "a login as 'scada'", "wrong password", "BadUserAccessDenied")
    (anonymous,) = refusals(caplog, "an anonymous login", "BadIdentityTokenRejected")
    assert not any("s3cret" in line for line in lines)


def test_sessions_are_capped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.opcua")
    cfg = _config(tmp_path, max_sessions=3, max_pending_sessions=2, activation_timeout_s=300)

    async def scenario() -> None:
        async with serving(cfg) as server:
            # one connection creating session after session holds one, never 200
            hoarder = await channel(cfg)
            for n in range(200):
                await hoarder.uaclient.create_session(session_parameters(cfg, f"s{n}"))
            assert open_sessions(server) == 1
            waiting = await channel(cfg)
            await waiting.uaclient.create_session(session_parameters(cfg))
            third = await channel(cfg)
            with pytest.raises(ua.uaerrors.BadTooManySessions):
                await third.uaclient.create_session(session_parameters(cfg))
            for c in (hoarder, waiting, third):
                c.disconnect_socket()
            await gone(server)
            # activated sessions count too
            clients = [Client(cfg.endpoint, timeout=20, watchdog_intervall=600)
                       for _ in range(3)]
            for c in clients:
                c.set_user("scada")
                c.set_password("s3cret")
                await c.connect()
            extra = await channel(cfg)
            with pytest.raises(ua.uaerrors.BadTooManySessions):
                await extra.uaclient.create_session(session_parameters(cfg))
            extra.disconnect_socket()
            for c in clients:
                await c.disconnect()
    run(scenario)
    (pending,) = refusals(caplog, "a session", "2 sessions not activated yet",
                          "opcua_server.max_pending_sessions", "BadTooManySessions")
    (full,) = refusals(caplog, "a session", "3 sessions open", "opcua_server.max_sessions")


def test_a_session_never_activated_is_closed(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.opcua")
    cfg = _config(tmp_path, activation_timeout_s=0.5)

    async def scenario() -> None:
        async with serving(cfg) as server:
            idle = await channel(cfg)
            lost = asyncio.Event()
            protocol = idle.uaclient.protocol
            assert protocol is not None
            protocol.on_connection_lost = lambda exc: lost.set()
            await idle.uaclient.create_session(session_parameters(cfg))
            assert open_sessions(server) == 1
            await asyncio.wait_for(lost.wait(), 30)   # closed by the server
            await gone(server)
    run(scenario)
    lines = [r.getMessage() for r in caplog.records if "activated within 0.5 s" in
             r.getMessage()]
    assert len(lines) == 1 and "opcua_server.activation_timeout_s" in lines[0], lines


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_oversized_messages_are_refused_before_they_are_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rung.opcua")
    cfg = _config(tmp_path, max_request_bytes=4096)

    async def scenario() -> None:
        async with serving(cfg):
            # a chunk whose header claims 64 MiB, streamed: the server closes at the header
            # (before: it read and held all of it)
            url = urlparse(cfg.endpoint)
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
            hello = ua.Hello()
            hello.EndpointUrl = cfg.endpoint
            writer.write(uatcp_to_binary(ua.MessageType.Hello, hello))
            assert (await reader.readexactly(8))[:3] == b"ACK"
            await reader.readexactly(20)
            block = bytes(2**20)
            before = _rss_mib()
            writer.write(b"MSGF" + (64 * 2**20).to_bytes(4, "little") + bytes(4) + block)
            await writer.drain()
            error = await reader.read(4096)   # at the header, before the rest is read
            assert error[:3] == b"ERR", error[:16]
            try:
                for _ in range(63):
                    writer.write(block)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            grown = _rss_mib() - before
            writer.close()
            assert grown < 32, f"RSS grew {grown:.0f} MiB while 64 MiB were offered"
            # a CreateSession with a 4 MiB SessionName, from asyncua's client
            big = await channel(cfg)
            with pytest.raises((ua.uaerrors.BadRequestTooLarge, ConnectionError)):
                await big.uaclient.create_session(session_parameters(cfg, "x" * 4 * 2**20))
            big.disconnect_socket()
            # a logged-in call: over the limit but within the message's room, answered
            # too_large; far over it, refused as a message before it is read whole
            client = Client(cfg.endpoint, timeout=20, watchdog_intervall=600)
            client.set_user("scada")
            client.set_password("s3cret")
            async with client:
                rung = await client.nodes.objects.get_child(["2:rung"])
                answer = await rung.call_method("2:Diagnose", ua.Variant(
                    '{"asset": "' + "x" * 5000 + '"}', ua.VariantType.String))
                assert '"too_large"' in answer and "opcua_server.max_request_bytes" in answer
                with pytest.raises((ua.uaerrors.BadRequestTooLarge, ConnectionError)):
                    await rung.call_method("2:Diagnose", ua.Variant(
                        '{"asset": "' + "x" * 2**20 + '"}', ua.VariantType.String))
    run(scenario)
    (chunk,) = refusals(caplog, "a message", f"a chunk of {64 * 2**20} bytes",
                        "BadTcpMessageTooLarge")
    big_ones = refusals(caplog, "a message", "opcua_server.max_request_bytes 4096",
                        "BadRequestTooLarge")
    assert len(big_ones) == 2, big_ones
