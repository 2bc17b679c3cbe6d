"""systemd notification protocol (sd_notify) and the service watchdog, standard library only.

Under a ``Type=notify`` unit systemd passes ``$NOTIFY_SOCKET``, a Unix datagram socket; the
daemon sends newline-separated ``KEY=value`` fields to it: ``READY=1`` once it serves,
``STATUS=...`` for ``systemctl status``, ``STOPPING=1`` on shutdown and ``WATCHDOG=1`` at
least once per ``WatchdogSec=``. Outside systemd there is no socket and every call is a cheap
no-op, so the daemon calls these unconditionally.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping

__all__ = ["Notifier", "watchdog_interval", "watchdog_loop"]

log = logging.getLogger("rung.sdnotify")


class Notifier:
    """Sends sd_notify datagrams to systemd's notification socket.

    Args:
        socket_path: the socket address; None reads ``$NOTIFY_SOCKET``. A leading ``@``
            names a Linux abstract socket (sent with a leading NUL byte, as systemd does).
            An empty value disables the notifier.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        path = os.environ.get("NOTIFY_SOCKET", "") if socket_path is None else socket_path
        self._address: str | bytes | None = None
        if path.startswith("@"):
            self._address = b"\0" + path[1:].encode()
        elif path:
            self._address = path
        self._warned = False
        self._last_status: str | None = None
        self._unhealthy: str | None = None
        self._stopping = False

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify (the process runs under a notify unit)."""
        return self._address is not None

    def send(self, *fields: str) -> bool:
        """Send ``fields`` (``KEY=value`` strings) as one datagram.

        Never raises and never blocks: the socket is non-blocking, so a full receive queue
        drops the message rather than stalling the event loop. The first failure is logged
        as a warning, later ones at debug level.

        Returns:
            True if the datagram was handed to the kernel; False when disabled or on error.
        """
        if self._address is None or not fields:
            return False
        message = "\n".join(fields).encode()
        try:
            # A fresh socket per message: no descriptor to leak or to close at shutdown, and
            # messages are rare (the watchdog pings every few seconds at most).
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(message, self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify to %r failed: %s (further failures logged at debug)",
                            self._address, exc)
            else:
                log.debug("sd_notify to %r failed: %s", self._address, exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        """Tell systemd start-up is complete (``READY=1``) with a status line."""
        return self.send("READY=1", self._status_field(status))

    def status(self, text: str) -> bool:
        """Set the free-form status shown by ``systemctl status``."""
        return self.send(self._status_field(text))

    def watchdog(self) -> bool:
        """Reset the service watchdog timer (``WATCHDOG=1``)."""
        return self.send("WATCHDOG=1")

    def stopping(self, status: str) -> bool:
        """Tell systemd the daemon is shutting down (``STOPPING=1``) with a status line.

        Ends any unhealthy display for good: systemd stops the watchdog once the unit is
        stopping, and a scheduler winding down would otherwise read as a failure.
        """
        self._stopping = True
        self._unhealthy = None
        return self.send("STOPPING=1", self._status_field(status))

    def unhealthy(self, reason: str | None) -> bool:
        """Show ``STATUS=unhealthy: reason``, or with None, restore the last status text.

        While a reason is set, :meth:`ready` and :meth:`status` record their text but keep
        showing the reason, so periodic status updates do not hide a failing liveness check.

        Returns:
            True if a datagram was sent; False when disabled, on error, after
            :meth:`stopping`, or when clearing with nothing to clear or to restore.
        """
        if self._stopping:
            return False
        if reason is None:
            was, self._unhealthy = self._unhealthy, None
            if was is None or self._last_status is None:
                return False
            return self.send(f"STATUS={self._last_status}")
        self._unhealthy = _one_line(reason)
        return self.send(f"STATUS=unhealthy: {self._unhealthy}")

    def _status_field(self, text: str) -> str:
        self._last_status = _one_line(text)
        if self._unhealthy is not None:
            return f"STATUS=unhealthy: {self._unhealthy}"
        return f"STATUS={self._last_status}"


def _one_line(text: str) -> str:
    # A newline inside a value would start a new field (a stray "READY=1", say).
    return " ".join(text.splitlines())


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """The ping interval for the service watchdog, in seconds.

    Reads ``WATCHDOG_USEC`` (the unit's ``WatchdogSec=``) and ``WATCHDOG_PID`` (when set, the
    watchdog is meant for that process only). Returns half the timeout, as sd_watchdog_enabled(3)
    recommends, so one late ping does not kill the service.

    Args:
        env: the environment to read; None reads ``os.environ``.

    Returns:
        The interval, or None when the watchdog is off, meant for another process, or the
        variables are malformed.
    """
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid is not None:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


async def watchdog_loop(notifier: Notifier, interval: float,
                        check: Callable[[], str | None]) -> None:
    """Ping the systemd watchdog every ``interval`` seconds while ``check`` reports health.

    Runs until cancelled. ``check`` is the caller's liveness test: None when healthy, else
    the reason. While unhealthy no ``WATCHDOG=1`` is sent, only ``STATUS=unhealthy: reason``
    (:meth:`Notifier.unhealthy`), so ``WatchdogSec=`` runs out and systemd kills and
    restarts the daemon; a stall that clears before then costs nothing. The loop runs on the
    event loop on purpose: a blocked loop stops the pings too. An exception from ``check``
    counts as unhealthy.

    Args:
        notifier: where pings and status lines go.
        interval: seconds between checks, usually :func:`watchdog_interval`.
        check: the liveness test, called on the event loop (keep it quick).
    """
    failing: str | None = None
    while True:
        error: Exception | None = None
        try:
            reason = check()
        except Exception as exc:  # a broken check must not end the loop, only the pings
            error = exc
            reason = f"check raised {type(exc).__name__}: {exc}"
        if reason is None:
            if failing is not None:
                log.info("watchdog check healthy again")
                failing = None
                notifier.unhealthy(None)
            notifier.watchdog()
        else:
            reason = _one_line(reason)
            if reason != failing:
                log.warning("watchdog check failed, withholding the ping: %s", reason,
                            exc_info=error)
                failing = reason
            notifier.unhealthy(reason)
        await asyncio.sleep(interval)
