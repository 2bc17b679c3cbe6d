"""``rung serve`` with its event loop instrumented: what holds the loop, measured.

    python bench/loop_probe.py CONFIG REPORT.json     (started by loop_latency.py --diagnose)

Runs the daemon exactly as ``rung serve --config CONFIG`` does, plus:

* a loop-lag probe: a task that sleeps 2 ms again and again; how late each wake-up is;
* asyncio's slow-callback report (``loop.slow_callback_duration`` 10 ms, debug mode on):
  every callback or task step that ran longer, with what it was;
* timers on the journal's SQLite calls (``Journal._write`` / ``_read`` / ``_checkpoint``,
  and the writer thread's ``_run_batch`` where it has one), per thread: how long the event
  loop spends in SQLite and fsync;
* ``gc.callbacks``: every garbage collection, its generation and pause, per thread;
* a sampler thread: every 2 ms while the loop is more than 10 ms late, the loop thread's
  and the engine thread's innermost frames (and the sampler's own lateness, which is the
  time no thread let it run: the GIL held, or no CPU).

On SIGTERM the daemon stops as usual and REPORT.json is written.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import inspect
import json
import logging
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

LAG_TICK_S = 0.002
STALL_S = 0.010


class Probe:
    def __init__(self) -> None:
        self.lags: list[float] = []                     # ms late, every probe wake-up
        self.slow: list[dict[str, Any]] = []            # asyncio's slow callbacks
        self.calls: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        self.gcs: list[dict[str, Any]] = []
        self.samples: collections.Counter[str] = collections.Counter()
        self.engine_samples: collections.Counter[str] = collections.Counter()
        self.sampler_late: list[float] = []
        self.heartbeat = time.monotonic()
        self.loop_thread = threading.get_ident()
        self._gc_t0: dict[int, float] = {}
        self.stop = threading.Event()

    # -- the loop side -------------------------------------------------------------------
    async def lag_task(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(LAG_TICK_S)
            now = time.monotonic()
            self.lags.append((now - t0 - LAG_TICK_S) * 1000)
            self.heartbeat = now

    # -- timers --------------------------------------------------------------------------
    def timed(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                where = "loop" if threading.get_ident() == self.loop_thread else \
                    threading.current_thread().name
                self.calls[(name, where)].append((time.perf_counter() - t0) * 1000)
        return wrapper

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._gc_t0[me] = time.perf_counter()
            return
        t0 = self._gc_t0.pop(me, None)
        if t0 is not None:
            self.gcs.append({"gen": info.get("generation"),
                             "ms": (time.perf_counter() - t0) * 1000,
                             "thread": "loop" if me == self.loop_thread
                             else threading.current_thread().name})

    # -- the sampler thread --------------------------------------------------------------
    def sampler(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            time.sleep(0.002)
            now = time.monotonic()
            if now - last > 0.010:
                self.sampler_late.append((now - last - 0.002) * 1000)
            last = now
            if now - self.heartbeat < STALL_S:
                continue
            frames = sys._current_frames()
            loop_frame = frames.get(self.loop_thread)
            if loop_frame is not None:
                self.samples[_where(loop_frame)] += 1
            for t in threading.enumerate():
                if t.name.startswith("rung-engine") and t.ident in frames:
                    self.engine_samples[_where(frames[t.ident])] += 1

    def report(self) -> dict[str, Any]:
        lags = sorted(self.lags)

        def q(p: float) -> float:
            return lags[min(len(lags) - 1, int(p * len(lags)))] if lags else 0.0

        calls = {}
        for (name, where), ms in sorted(self.calls.items()):
            s = sorted(ms)
            calls[f"{name}@{where}"] = {
                "n": len(s), "total_ms": round(sum(s), 1),
                "p50_ms": round(s[len(s) // 2], 2), "p99_ms": round(s[int(0.99 * len(s))], 2),
                "max_ms": round(s[-1], 2), "over_20ms": sum(1 for x in s if x > 20)}
        gcs = collections.defaultdict(list)
        for g in self.gcs:
            gcs[f"gen{g['gen']}@{g['thread']}"].append(g["ms"])
        return {
            "lag_ms": {"n": len(lags), "p50": round(q(0.5), 2), "p99": round(q(0.99), 2),
                       "p999": round(q(0.999), 2), "max": round(lags[-1], 2) if lags else 0,
                       "over_10ms": sum(1 for x in lags if x > 10),
                       "over_50ms": sum(1 for x in lags if x > 50),
                       "over_100ms": sum(1 for x in lags if x > 100)},
            "worst_lags_ms": [round(x, 1) for x in lags[-15:]],
            "slow_callbacks": sorted(self.slow, key=lambda s: -s["ms"])[:40],
            "slow_callbacks_n": len(self.slow),
            "journal_calls": calls,
            "gc": {k: {"n": len(v), "max_ms": round(max(v), 2), "total_ms": round(sum(v), 1)}
                   for k, v in gcs.items()},
            "loop_stall_samples": self.samples.most_common(25),
            "engine_samples_during_stalls": self.engine_samples.most_common(25),
            "sampler_late_ms": sorted(round(x, 1) for x in self.sampler_late)[-20:],
            "sampler_late_n": len(self.sampler_late),
        }


def _where(frame: Any) -> str:
    """The innermost frames of a stack, rung's and the stdlib's, as ``file:func`` lines."""
    out = []
    for fs in reversed(traceback.extract_stack(frame)[-12:]):
        short = fs.filename.split("site-packages/")[-1].split("/lib/python3")[-1]
        out.append(f"{short.rsplit('/', 2)[-2:][-1]}:{fs.name}")
        if len(out) == 4:
            break
    return " < ".join(out)


class SlowHandler(logging.Handler):
    def __init__(self, probe: Probe) -> None:
        super().__init__(logging.WARNING)
        self.probe = probe

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Executing"):
            took = msg.rsplit("took ", 1)[-1].split(" ")[0]
            try:
                ms = float(took) * 1000
            except ValueError:
                ms = -1.0
            self.probe.slow.append({"ms": round(ms, 1), "what": msg[:300]})


def main() -> int:
    config, out = Path(sys.argv[1]), Path(sys.argv[2])
    from rung.daemon import serve as serve_mod
    from rung.daemon.config import load_config
    from rung.daemon.journal import store as journal

    probe = Probe()
    for name in ("_write", "_read", "_checkpoint", "_run_batch"):
        raw = inspect.getattr_static(journal.Journal, name, None)
        if raw is None:
            continue
        if isinstance(raw, staticmethod):
            setattr(journal.Journal, name, staticmethod(probe.timed(name, raw.__func__)))
        else:
            setattr(journal.Journal, name, probe.timed(name, raw))
    gc.callbacks.append(probe.on_gc)
    original_run = serve_mod.Service.run

    async def run(self: Any) -> int:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = STALL_S
        logging.getLogger("asyncio").addHandler(SlowHandler(probe))
        lag = loop.create_task(probe.lag_task())
        threading.Thread(target=probe.sampler, name="loop-sampler", daemon=True).start()
        try:
            return int(await original_run(self))
        finally:
            lag.cancel()
            probe.stop.set()

    serve_mod.Service.run = run  # type: ignore[method-assign]
    try:
        return serve_mod.serve(load_config(config, []))
    finally:
        out.write_text(json.dumps(probe.report(), indent=2))


if __name__ == "__main__":
    sys.exit(main())
