"""A simulated PLC over OPC UA (``rung demo`` and the tests): a real asyncua server on a free
loopback port with a mixer's variables and the rung handshake, laid out as
``docs/opcua.md`` describes (and ``configs/plcs/mixer2-opcua.yaml`` maps)::

    Objects
      Mixer2                           ns=2;s=Mixer2
        Rung                           ns=2;s=Mixer2.Rung
          req, req_seq                 Int16 / UInt16   (the PLC's)
          ack_seq, heartbeat           UInt16           (rung's)
          busy, done                   Boolean          (rung's)
          err, result                  Int16            (rung's)
        BearingTemp, Vibration         Double
        MotorCurrent                   Float
        RunningHours                   UInt32
        AgitatorOn                     Boolean

The values are read and written by name (``get``, ``set``), as the PLC program would. What
the tests inject: a node's type (``types``), a node clients may not write (``refuse``), a
node removed (``remove``), a restart that keeps the values (``restart``), Basic256Sha256
with a client-certificate check (``trusted``) and users with passwords (``users``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from asyncua import ua
from asyncua.server.server import Server
from cryptography.hazmat.primitives.serialization import Encoding

from rung.daemon.demo.localbroker import free_port
from rung.daemon.opcua.server import Users

T = TypeVar("T")
NAMESPACE = "urn:rung:demo:mixer2"
ROOT = "Mixer2"
HANDSHAKE: dict[str, ua.VariantType] = {
    "req": ua.VariantType.Int16, "req_seq": ua.VariantType.UInt16,
    "ack_seq": ua.VariantType.UInt16, "busy": ua.VariantType.Boolean,
    "done": ua.VariantType.Boolean, "err": ua.VariantType.Int16,
    "result": ua.VariantType.Int16, "heartbeat": ua.VariantType.UInt16}
POINTS: dict[str, tuple[ua.VariantType, Any]] = {
    "BearingTemp": (ua.VariantType.Double, 81.5), "Vibration": (ua.VariantType.Double, 5.2),
    "MotorCurrent": (ua.VariantType.Float, 17.25),
    "RunningHours": (ua.VariantType.UInt32, 20411), "AgitatorOn": (ua.VariantType.Boolean, True)}
PLC_OWNED = ("req", "req_seq")

logging.getLogger("asyncua").setLevel(logging.CRITICAL)   # a line per session and request


class SimOpcPlc:
    """The simulated PLC's OPC UA server; ``endpoint`` is its URL."""

    def __init__(self, port: int = 0, types: Mapping[str, ua.VariantType] | None = None,
                 certificate: Path | None = None, private_key: Path | None = None,
                 trusted: list[Path] | None = None, users: Mapping[str, str] | None = None
                 ) -> None:
        self.port = port or free_port()
        self.endpoint = f"opc.tcp://127.0.0.1:{self.port}/rung-sim/"
        self.types = {**HANDSHAKE, **(types or {})}
        self.certificate, self.private_key, self.trusted = certificate, private_key, trusted
        self.users = users
        self.values: dict[str, Any] = {**{n: 0 for n in self.types},
                                       **{n: v for n, (_, v) in POINTS.items()}}
        self.refused: set[str] = set()
        self.removed: set[str] = set()
        self.server: Server | None = None
        self.nodes: dict[str, Any] = {}

    @staticmethod
    def nodeid(name: str) -> str:
        """The NodeId of a variable (``ns=2`` is the first namespace registered)."""
        return f"ns=2;s={ROOT}.Rung.{name}" if name in HANDSHAKE else f"ns=2;s={ROOT}.{name}"

    async def start(self) -> None:
        server = Server(user_manager=Users(self.users) if self.users else None)
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name("rung simulated PLC mixer2")
        if self.certificate is not None and self.private_key is not None:
            server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
                                        ua.SecurityPolicyType.Basic256Sha256_Sign])
            await server.load_certificate(str(self.certificate))
            await server.load_private_key(str(self.private_key))
            if self.trusted is not None:
                server.set_certificate_validator(self._validate)
        else:
            server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        if self.users:
            server.set_identity_tokens([ua.UserNameIdentityToken])
        idx = await server.register_namespace(NAMESPACE)
        root = await server.nodes.objects.add_object(f"ns={idx};s={ROOT}", f"{idx}:{ROOT}")
        rung = await root.add_object(f"ns={idx};s={ROOT}.Rung", f"{idx}:Rung")
        self.nodes = {}
        for name, vtype in self.types.items():
            if name in self.removed:
                continue
            node = await rung.add_variable(self.nodeid(name), f"{idx}:{name}",
                                           ua.Variant(self._cast(name, vtype), vtype))
            if name not in PLC_OWNED and name not in self.refused:
                await node.set_writable()
            self.nodes[name] = node
        for name, (vtype, _) in POINTS.items():
            if name not in self.removed:
                self.nodes[name] = await root.add_variable(
                    self.nodeid(name), f"{idx}:{name}",
                    ua.Variant(self._cast(name, vtype), vtype))
        await server.start()
        self.server = server

    def _cast(self, name: str, vtype: ua.VariantType) -> Any:
        v = self.values[name]
        if vtype == ua.VariantType.Boolean:
            return bool(v)
        if vtype in (ua.VariantType.Float, ua.VariantType.Double):
            return float(v)
        return int(v)

    async def _validate(self, cert: Any, app: Any) -> None:
        from asyncua.crypto import uacrypto

        der = uacrypto.der_from_x509(cert)
        for path in self.trusted or []:
            if (await uacrypto.load_certificate(path)).public_bytes(Encoding.DER) == der:
                return
        raise ua.uaerrors.BadCertificateUntrusted

    async def stop(self) -> None:
        """Stop serving (every session ends); the values are kept for ``start``."""
        if self.server is not None:
            for name in self.nodes:
                self.values[name] = await self.get(name)
            await self.server.stop()
            self.server = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def get(self, name: str) -> Any:
        return await self.nodes[name].read_value()

    async def set(self, name: str, value: Any) -> None:
        vtype = self.types.get(name) or POINTS[name][0]
        self.values[name] = value
        await self.nodes[name].write_value(ua.Variant(self._cast(name, vtype), vtype))

    async def refuse(self, name: str, refused: bool = True) -> None:
        """Clients may not write ``name`` (BadNotWritable), or may again."""
        (self.refused.add if refused else self.refused.discard)(name)
        await self.nodes[name].set_writable(not refused)

    async def remove(self, name: str) -> None:
        """``name`` no longer exists (BadNodeIdUnknown) until ``restore``."""
        assert self.server is not None
        self.values[name] = await self.get(name)
        self.removed.add(name)
        await self.server.delete_nodes([self.nodes.pop(name)])

    async def restore(self, name: str) -> None:
        self.removed.discard(name)
        await self.restart()

    async def trigger(self) -> int:
        """The PLC program raising a request: ``req_seq += 1``, ``req = 1``."""
        seq = (int(await self.get("req_seq")) + 1) & 0xFFFF
        await self.set("req_seq", seq)
        await self.set("req", 1)
        return seq


class SimOpcPlcThread:
    """A :class:`SimOpcPlc` served from an event loop in a thread of its own, for
    synchronous callers (``rung demo``, tests driving a ``rung serve`` child process)."""

    def __init__(self, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="sim-opcua-plc")
        self.thread.start()
        self.sim = SimOpcPlc(**kwargs)
        self.call(self.sim.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def get(self, name: str) -> Any:
        return self.call(self.sim.get(name))

    def set(self, name: str, value: Any) -> None:
        self.call(self.sim.set(name, value))

    def trigger(self) -> int:
        return self.call(self.sim.trigger())

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 120) -> None:
        """Poll ``cond`` until it holds; TimeoutError naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.05)
        raise TimeoutError(f"the PLC never saw {what}")

    def close(self) -> None:
        self.call(self.sim.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
