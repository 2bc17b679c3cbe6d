"""One supervisor for every long-lived task of ``rung serve``: nothing stops silently.

Each part of the daemon that runs for the life of the process (the MQTT link, the outbox,
the PLC agents, Sparkplug, the fleet, the metrics endpoint, the status and watchdog loops)
runs under :class:`Supervisor` (a part that returns was asked to stop). A part that raises
is

- **restarted with backoff** (``Policy.first_s`` doubling up to ``Policy.max_s``): a
  transient fault (a disk error, a bug hit by one odd input) is logged once with its
  traceback, the restarts after it as one line each; a part that then runs for
  ``Policy.healthy_s`` is healthy again (logged), and its count starts over;
- **declared dead** once it failed ``Policy.restarts`` times in a row, or raised
  :class:`Fatal`, or is a part that must not be restarted (the engine loop, ``watch``):
  logged as critical with its traceback, ``liveness`` names it from then on (the systemd
  watchdog is no longer fed), and ``on_dead`` is told, which makes ``rung serve`` exit 70
  for systemd to restart the whole daemon.

The supervisor sees a part only through its coroutine function: the parts keep their own
per-operation retries (a broker outage, a Modbus timeout), this is the barrier behind them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from rung.daemon.backoff import Backoff

log = logging.getLogger("rung.supervise")


class Fatal(Exception):
    """A part says it cannot go on: no restart, the daemon exits for systemd."""


@dataclass(frozen=True)
class Policy:
    """How failing parts are restarted (the defaults suit a box that runs for months)."""

    first_s: float = 0.5      # the first restart's delay, doubled per failure in a row
    max_s: float = 30.0       # the longest delay between restarts
    restarts: int = 6         # failures in a row survived; one more and the part is dead
    healthy_s: float = 60.0   # a run this long ends a fault episode

    def delay(self, failures: int) -> float:
        """The wait before the restart after ``failures`` failures in a row."""
        return Backoff(self.first_s, self.max_s).delay(failures)


class PartMetrics(Protocol):
    """What the supervisor reports (``daemon.metrics.Metrics``)."""

    def part_restarted(self, name: str) -> None: ...
    def set_part(self, name: str, up: bool) -> None: ...


@dataclass
class _Part:
    name: str
    run: Callable[[], Awaitable[Any]] | None   # None: watched, never restarted
    task: asyncio.Task[Any] | None = None
    failures: int = 0          # in a row, this episode
    last: str | None = None    # the last failure's one-line form (repeats are not re-logged)
    healthy: asyncio.TimerHandle | None = None
    dead: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Supervisor:
    """Runs named parts, restarts the failing ones, and says when one is dead.

    Args:
        on_dead: called once, on the event loop, with the part's name and why, when a part
            is declared dead.
        policy: restart delays and limits.
        metrics: restarts counted and parts' up/down state, per part.
    """

    def __init__(self, on_dead: Callable[[str, str], None], policy: Policy | None = None,
                 metrics: PartMetrics | None = None) -> None:
        self.on_dead, self.policy, self.metrics = on_dead, policy or Policy(), metrics
        self.parts: dict[str, _Part] = {}
        self.stopping = False

    def start(self, name: str, run: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        """Run ``run()`` as the part ``name`` until it returns (it was stopped) or the
        daemon stops; restarted when it raises. Call from the event loop."""
        part = self.parts[name] = _Part(name, run)
        part.task = asyncio.get_running_loop().create_task(self._keep(part), name=name)
        self._up(part, True)
        return part.task

    def watch(self, name: str, task: asyncio.Task[Any]) -> None:
        """A part started elsewhere that must not end while the daemon runs (the engine
        loop): its end is its death."""
        part = self.parts[name] = _Part(name, None, task)
        task.add_done_callback(lambda t: self._ended(part, t))
        self._up(part, True)

    def liveness(self) -> str | None:
        """None while every part runs (or is being restarted), else which one is dead."""
        dead = next((p for p in self.parts.values() if p.dead is not None), None)
        return None if dead is None else f"{dead.name} has stopped: {dead.dead}"

    def tasks(self) -> list[asyncio.Task[Any]]:
        return [p.task for p in self.parts.values() if p.task is not None]

    async def stop(self, names: list[str] | None = None) -> None:
        """Cancel the parts (``names``, or all) and wait for them to end."""
        if names is None:
            self.stopping = True
        chosen = [p for p in self.parts.values() if names is None or p.name in names]
        for p in chosen:
            if p.healthy is not None:
                p.healthy.cancel()
            if p.task is not None:
                p.task.cancel()
        await asyncio.gather(*(p.task for p in chosen if p.task is not None),
                             return_exceptions=True)

    # -- the barrier ---------------------------------------------------------------------

    async def _keep(self, part: _Part) -> None:
        assert part.run is not None
        while True:
            err: BaseException | None = None
            try:
                await part.run()
            except asyncio.CancelledError:
                raise
            except Exception as e:   # the barrier: every part's fault ends here
                err = e
            else:
                return   # the part was asked to stop (its own ``stop``) and did
            if self.stopping:
                return
            part.failures += 1   # reset by ``_recovered`` once a run lasts healthy_s
            if isinstance(err, Fatal) or part.failures > self.policy.restarts:
                how = ("cannot go on" if isinstance(err, Fatal)
                       else f"gave up after {part.failures - 1} restarts")
                self._die(part, err, how)
                return
            delay = self.policy.delay(part.failures)
            self._failed(part, err, delay)
            await asyncio.sleep(delay)

    def _failed(self, part: _Part, err: BaseException | None, delay: float) -> None:
        """Log a failure: with its traceback the first time it is seen in an episode."""
        what = _one_line(err)
        if self.metrics is not None:
            self.metrics.part_restarted(part.name)
        fields = {"part": part.name, "failures": part.failures, "restart_in_s": delay}
        if what != part.last:
            log.error("%s failed (%s): restarting in %.1f s", part.name, what, delay,
                      exc_info=_exc_info(err), extra={"rung_fields": fields})
        else:
            log.warning("%s failed again: restarting in %.1f s", part.name, delay,
                        extra={"rung_fields": fields})
        part.last = what
        if part.healthy is not None:
            part.healthy.cancel()
        part.healthy = asyncio.get_running_loop().call_later(
            delay + self.policy.healthy_s, self._recovered, part)

    def _recovered(self, part: _Part) -> None:
        part.healthy = None
        if part.dead is None and part.failures:
            log.warning("%s has run for %g s since its last failure: healthy again",
                        part.name, self.policy.healthy_s)
            part.failures, part.last = 0, None

    def _ended(self, part: _Part, task: asyncio.Task[Any]) -> None:
        if self.stopping:
            return
        err = None if task.cancelled() else task.exception()
        self._die(part, err, "ended" if err is None else "failed")

    def _die(self, part: _Part, err: BaseException | None, how: str) -> None:
        part.dead = f"{how} ({_one_line(err)})"
        if part.healthy is not None:
            part.healthy.cancel()
        self._up(part, False)
        log.critical("%s has stopped for good: %s; rung exits for systemd to restart it",
                     part.name, part.dead, exc_info=_exc_info(err),
                     extra={"rung_fields": {"part": part.name}})
        self.on_dead(part.name, part.dead)

    def _up(self, part: _Part, up: bool) -> None:
        if self.metrics is not None:
            self.metrics.set_part(part.name, up)


def _one_line(err: BaseException | None) -> str:
    if err is None:
        return "it returned while the daemon runs"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:300] if text else type(err).__name__


def _exc_info(err: BaseException | None) -> Any:
    return (type(err), err, err.__traceback__) if err is not None else None


def spawn(coro: Coroutine[Any, Any, Any], name: str,
          holder: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
    """A one-shot task (a publish, a stop) held in ``holder`` until it ends; if it fails,
    its exception is logged with its traceback, never lost."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    holder.add(task)
    task.add_done_callback(lambda t: _reap(t, holder))
    return task


def _reap(task: asyncio.Task[Any], holder: set[asyncio.Task[Any]]) -> None:
    holder.discard(task)
    if not task.cancelled() and task.exception() is not None:
        err = task.exception()
        log.error("%s failed: %s", task.get_name(), _one_line(err), exc_info=_exc_info(err))
