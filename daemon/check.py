"""``rung check``: everything ``rung serve`` needs, checked without serving.

Config, tasks, engine (loaded, one forward step), grammars, state directory and journal,
the metrics endpoint's address (free, or a running rung's), broker (connect and CONNACK
with the configured credentials, under a client id of its own so a running daemon is not
disturbed), PLC maps (Modbus register maps and OPC UA node maps, each PLC read once through
its link, nothing written), and in a fleet who drives each of those PLCs. One line per
check (a check that does not apply prints none); exit status 0 only when all pass.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import socket
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiomqtt

from rung.daemon.config import Config
from rung.daemon.mqtt.link import connect_args
from rung.engines.errors import RungError

if TYPE_CHECKING:
    from rung.daemon.opcua.nodemap import NodeMap


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _engine(cfg: Config) -> str:
    import numpy as np

    from rung.daemon.serve import build_runner

    runner = build_runner(cfg)
    engine = runner.engine
    cache = engine.new_cache(1, 8)
    engine.forward(cache, np.array([[0]], np.int64), np.array([1], np.int64))
    m = engine.manifest
    return (f"{cfg.engine.path}: {m.dims.hf_architecture}, engine {m.engine_id}, "
            f"{m.weights} weights, {m.kv.dtype} KV, max_seq {m.dims.max_seq}; tasks "
            f"{', '.join(sorted(runner.tasks))} (grammars compiled)")


def _state_dir(cfg: Config) -> str:
    from rung.daemon.journal.store import Journal

    path = cfg.state_dir
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    try:   # a write that needs space, not only an inode: a full disk fails here
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rung-check-") as probe:
            probe.write(b"\0" * 65536)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        raise RungError(f"{path}: cannot write ({e.strerror}; {free} bytes free): requests "
                        "are answered 'unavailable' until it can",
                        "free space in state_dir or fix its permissions") from e
    journal = Journal(path / "journal.db", cfg.journal.retention_s)
    counts = journal.counts()
    journal.close()
    aside = f"; a corrupt journal was moved to {journal.moved_aside}" if journal.moved_aside \
        else ""
    damage = f"; {journal.wal_damage}" if journal.wal_damage else ""
    return (f"{path} writable, {free / 2**20:.0f} MiB free; journal "
            f"{dict(counts) or 'empty'}{aside}{damage}")


def _metrics(cfg: Config) -> str | None:
    """``metrics.port`` can be listened on: bound once and let go (as the endpoint binds
    it, address reuse on). A port in use fails, unless what listens there is a rung's own
    ``/metrics`` (this config's daemon, running): then it is said. None when it is off."""
    from rung.daemon.metrics import listen_error

    host, port = cfg.metrics.host, cfg.metrics.port
    if not port:
        return None
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as e:
        if e.errno == errno.EADDRINUSE and _rung_metrics(host, port):
            return f"{host}:{port} serves a running rung's /metrics (rung_up)"
        raise listen_error(host, port, e) from e
    return f"{host}:{port} free for /metrics"


def _rung_metrics(host: str, port: int) -> bool:
    """Whether ``host:port`` answers ``/metrics`` with rung's series."""
    where = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{where}:{port}/metrics", timeout=3) as resp:
            return b"\nrung_up " in resp.read(4 << 20)
    except (OSError, ValueError):
        return False


def _broker(cfg: Config) -> str:
    c = cfg.mqtt

    async def probe() -> None:
        client = aiomqtt.Client(**connect_args(c), identifier=f"{c.client_id}-check-"
                                f"{os.getpid()}", timeout=5)
        async with client:
            pass

    try:
        asyncio.run(probe())
    except aiomqtt.MqttError as e:
        raise RungError(f"{c.host}:{c.port}: {e}") from e
    return (f"{c.host}:{c.port} accepted a connection (MQTT {c.protocol}"
            f"{', TLS' if c.tls else ''}{', user ' + c.username if c.username else ''})")


def _plcs(cfg: Config) -> str:
    """Each PLC map loads (register map or OPC UA node map, ``load_plc_map``) and its PLC
    answers the handshake and the snapshot: a Modbus PLC its handshake block and the
    snapshot's registers, an OPC UA PLC through its link (session, nodes resolved, the
    eight handshake values in one Read, the data type of rung's six, the snapshot in one
    Read; nothing written)."""
    from rung.daemon.modbus.link import Link
    from rung.daemon.modbus.regmap import PlcMap
    from rung.daemon.plcmaps import load_plc_map

    if not cfg.plcs:
        return "none configured"

    async def modbus(plc: PlcMap) -> str:
        link = Link(plc)
        try:
            start, count = plc.handshake.read_span()
            await link.read("holding", start, count)
            values = await link.read_snapshot()
        finally:
            await link.close()
        return f"{plc.id} at {link.where}: handshake and {len(values)} points read"

    def probe(path: Path) -> str:
        plc = load_plc_map(path)
        if isinstance(plc, PlcMap):
            return asyncio.run(modbus(plc))
        return asyncio.run(_opcua(plc))

    return "; ".join(probe(Path(p)) for p in cfg.plcs)


async def _opcua(plc: NodeMap) -> str:
    """One OPC UA PLC probed through its link; a failure names the link state it left
    (``disconnected``: no session, e.g. security; ``connected``: a node or type refused)."""
    from rung.daemon.opcua.link import NodeLink

    link = NodeLink(plc)
    sec = plc.server.security
    security = "None" if sec.policy == "None" else f"{sec.policy} {sec.mode}"
    try:
        _, values = await link.probe()
        state = link.state
    except RungError as e:
        state = link.state
        await link.close()
        raise RungError(f"{plc.id} at {link.where} (link {state}, security {security}): "
                        f"{e.message}", e.hint) from e
    await link.close()
    return (f"{plc.id} at {link.where}: handshake and {len(values)} points read (OPC UA, "
            f"link {state}, security {security})")


def _plc_owner(cfg: Config) -> str | None:
    """In a fleet: each configured PLC is free, or driven by this node; one driven by
    another online node fails (this node would refuse it). None outside a fleet or without
    PLCs."""
    from rung.daemon.mqtt.fleet_view import plc_owners, read_statuses
    from rung.daemon.plcmaps import load_plc_map

    if not cfg.mqtt.shared_group or not cfg.plcs:
        return None
    me = cfg.mqtt.client_id
    owners = plc_owners(asyncio.run(read_statuses(cfg.mqtt)))
    ok, taken = [], []
    for path in cfg.plcs:
        plc = load_plc_map(Path(path)).id
        owner = owners.get(plc)
        if owner is not None and owner != me:
            taken.append(f"{plc} is driven by {owner}")
        else:
            ok.append(f"{plc} {'driven by this node' if owner == me else 'free'}")
    if taken:
        raise RungError(f"{'; '.join(taken)}: {me} refuses to drive "
                        f"{'it' if len(taken) == 1 else 'them'} (one writer per PLC)",
                        "remove it from plcs here, or stop the node that drives it")
    return f"{'; '.join(ok)} (group {cfg.mqtt.shared_group})"


CHECKS: list[tuple[str, Callable[[Config], str | None]]] = [
    ("engine", _engine), ("state_dir", _state_dir), ("metrics", _metrics),
    ("broker", _broker), ("plcs", _plcs), ("plc_owner", _plc_owner)]


def run_checks(cfg: Config) -> list[Check]:
    """Every check, each failure caught and described (one does not hide the next)."""
    out = []
    for name, fn in CHECKS:
        try:
            detail = fn(cfg)
            if detail is not None:
                out.append(Check(name, True, detail))
        except RungError as e:
            out.append(Check(name, False, str(e)))
        except OSError as e:
            out.append(Check(name, False, f"{type(e).__name__}: {e}"))
    return out
