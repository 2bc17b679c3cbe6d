"""sd_notify datagrams on a real Unix socket, the watchdog interval and the watchdog loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rung.daemon.sdnotify import Notifier, watchdog_interval, watchdog_loop


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd's, and its path."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(2)
        yield sock, path


def _recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_status_watchdog_stopping(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier(path)
    assert n.enabled
    assert n.ready("serving 3 tasks")
    assert _recv(sock) == "READY=1\nSTATUS=serving 3 tasks"
    assert n.status("broker disconnected")
    assert _recv(sock) == "STATUS=broker disconnected"
    assert n.watchdog()
    assert _recv(sock) == "WATCHDOG=1"
    assert n.stopping("stopping: finishing the batch")
    assert _recv(sock) == "STOPPING=1\nSTATUS=stopping: finishing the batch"
    assert n.send("EXTEND_TIMEOUT_USEC=5000000", "STATUS=still loading")
    assert _recv(sock) == "EXTEND_TIMEOUT_USEC=5000000\nSTATUS=still loading"


def test_socket_from_environment(receiver: tuple[socket.socket, str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert Notifier().status("hello")
    assert _recv(sock) == "STATUS=hello"


def test_status_text_cannot_inject_fields(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    assert Notifier(path).status("line one\nREADY=1")
    assert _recv(sock) == "STATUS=line one READY=1"


def test_abstract_socket() -> None:
    name = f"rung-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        assert Notifier(f"@{name}").watchdog()
        assert _recv(sock) == "WATCHDOG=1"


def test_disabled_notifier_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    for n in (Notifier(), Notifier("")):
        assert not n.enabled
        assert not n.ready("x")
        assert not n.watchdog()
        assert not n.send("STATUS=x")


def test_vanished_socket_returns_false_and_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gone"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
    path.unlink()
    n = Notifier(str(path))
    with caplog.at_level(logging.DEBUG, logger="rung.sdnotify"):
        assert not n.watchdog()
        assert not n.status("x")
        assert not n.ready("x")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sd_notify" in warnings[0].getMessage()


def test_full_receiver_does_not_block(receiver: tuple[socket.socket, str]) -> None:
    _, path = receiver
    n = Notifier(path)
    t0 = time.monotonic()
    sent = [n.watchdog() for _ in range(2000)]  # nobody reads: the queue fills up
    assert time.monotonic() - t0 < 5
    assert sent[0] and not all(sent)


def test_unhealthy_status_survives_status_updates(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier(path)
    n.status("serving")
    _recv(sock)
    assert n.unhealthy("scheduler stuck")
    assert _recv(sock) == "STATUS=unhealthy: scheduler stuck"
    n.status("serving; queue 2/16")
    assert _recv(sock) == "STATUS=unhealthy: scheduler stuck"
    assert n.unhealthy(None)
    assert _recv(sock) == "STATUS=serving; queue 2/16"
    assert not n.unhealthy(None)  # nothing to clear
    n.stopping("stopping")
    _recv(sock)
    assert not n.unhealthy("the scheduler loop has stopped")  # the watchdog is off by now


@pytest.mark.parametrize(("env", "expected"), [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, None),
    ({"WATCHDOG_USEC": "thirty"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "-5"}, None),
    ({"WATCHDOG_USEC": ""}, None),
    ({}, None),
])
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env) == expected


def test_watchdog_interval_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 0.5


async def _until(sock: socket.socket, want: Callable[[str], bool]) -> list[str]:
    """Datagrams up to and including the first one ``want`` accepts."""
    loop = asyncio.get_running_loop()
    seen = []
    while True:
        seen.append((await loop.sock_recv(sock, 4096)).decode())
        if want(seen[-1]):
            return seen


async def _during(sock: socket.socket, seconds: float) -> list[str]:
    """Every datagram that arrives within ``seconds``."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                seen.append((await loop.sock_recv(sock, 4096)).decode())
    return seen


def test_watchdog_loop_pings_only_while_healthy(receiver: tuple[socket.socket, str],
                                                caplog: pytest.LogCaptureFixture) -> None:
    sock, path = receiver
    sock.setblocking(False)
    notifier = Notifier(path)
    reason: list[str | None] = [None]

    async def scenario() -> None:
        notifier.status("serving")
        task = asyncio.create_task(watchdog_loop(notifier, 0.05, lambda: reason[0]))
        try:
            assert await _until(sock, lambda m: m == "WATCHDOG=1") == ["STATUS=serving",
                                                                       "WATCHDOG=1"]
            reason[0] = "one generation has run for 400 s"
            await _until(sock, lambda m: m.startswith("STATUS=unhealthy"))
            stuck = await _during(sock, 0.3)
            assert stuck and set(stuck) == {"STATUS=unhealthy: one generation has run for 400 s"}
            reason[0] = None
            back = await _until(sock, lambda m: m == "WATCHDOG=1")
            assert back == ["STATUS=serving", "WATCHDOG=1"]
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    with caplog.at_level(logging.INFO, logger="rung.sdnotify"):
        asyncio.run(asyncio.wait_for(scenario(), 10))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["watchdog check failed, withholding the ping: "
                        "one generation has run for 400 s"]  # logged once, not every tick


def test_watchdog_loop_survives_a_raising_check(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    sock.setblocking(False)
    calls = [0]

    def check() -> str | None:
        calls[0] += 1
        if calls[0] <= 2:
            raise RuntimeError("boom")
        return None

    async def scenario() -> list[str]:
        task = asyncio.create_task(watchdog_loop(Notifier(path), 0.02, check))
        try:
            return await _until(sock, lambda m: m == "WATCHDOG=1")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    seen = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert seen[:2] == ["STATUS=unhealthy: check raised RuntimeError: boom"] * 2
    assert seen[-1] == "WATCHDOG=1"
