"""A private mosquitto on a free loopback port, from a config file of our own (``rung demo``
and the tests). Never the system service: the process is ours and ends with us."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from rung.engines.errors import RungError


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_bin() -> str:
    """The mosquitto executable (Debian puts it in /usr/sbin)."""
    found = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()),
        None)
    if found is None:
        raise RungError("mosquitto is not installed",
                        "apt-get install -y mosquitto (make demo and make test install it)")
    return found


class LocalBroker:
    """mosquitto on 127.0.0.1 with persistence in ``root`` (a restart keeps sessions)."""

    def __init__(self, root: Path, port: int | None = None,
                 listener_options: Sequence[str] = (), password_file: Path | None = None) -> None:
        """``listener_options``: mosquitto lines for the listener (``cafile``, ``certfile``,
        ``keyfile`` for TLS); ``password_file`` (mosquitto_passwd format) turns anonymous
        access off."""
        self.root = Path(root)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        auth = ([f"password_file {password_file}", "allow_anonymous false"]
                if password_file is not None else ["allow_anonymous true"])
        lines = [f"listener {self.port} 127.0.0.1", *listener_options, *auth,
                 "persistence true", f"persistence_location {self.root}/",
                 "max_queued_messages 5000", "set_tcp_nodelay true",
                 f"log_dest file {self.root}/mosquitto.log",
                 "log_type error", "log_type warning", "log_type notice"]
        if os.geteuid() == 0:   # else mosquitto drops to its own user and cannot write here
            lines.append("user root")
        (self.root / "mosquitto.conf").write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen([mosquitto_bin(), "-c", str(self.root / "mosquitto.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RungError(f"mosquitto exited at start: {self.log()}") from None
                time.sleep(0.05)
        self.stop()
        raise RungError(f"mosquitto did not listen on 127.0.0.1:{self.port} in {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log(self) -> str:
        p = self.root / "mosquitto.log"
        return p.read_text(errors="replace")[-2000:] if p.exists() else ""
