"""rung as an OPC UA server (``opcua_server.enabled``): a SCADA or MES client calls rung's
tasks as methods, without an MQTT broker.

Address space (namespace ``urn:rung:{client_id}:api``, index 2)::

    Objects
      rung                      ns=2;s=rung
        GenerateST(request: String) -> answer: String     the st_code task
        BuildFaultTree(request: String) -> answer: String the fault_tree task
        Diagnose(request: String) -> answer: String       the diagnosis task
        Status                  ns=2;s=rung.Status
          Ready: Boolean, QueueDepth: UInt32, InFlight: UInt32, Engine: String,
          Tasks: String (JSON list)

``request`` is the task's input object as JSON, or the whole request form of an MQTT
request (``{"input": {...}, "max_tokens": ..., "session": ...}``, docs/mqtt.md); ``answer``
is the MQTT answer form (``{"ok": true, "output": ..., "validation": ...}`` or ``{"ok":
false, "error": {"code", "message"}}``). A call is parsed by the MQTT adapter's own
``requests.parse`` (the payload size cap, the field and input checks) and answered through
the same scheduler (its bounded queue: ``busy``; ``queue.request_timeout_s``: ``expired``);
the method returns when the answer is there, so the client's call timeout must allow a
generation. Calls are not journaled: a call cut short by a restart fails at the client,
which calls again.

Security: the policies listed (None, Basic256Sha256 Sign / SignAndEncrypt) with rung's
certificate and key; client certificates are trusted only when listed
(``trusted_certificates``); with a ``users_file`` every session needs one of its users.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncua import ua
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.server import Server

from rung.daemon.config import OpcUaServerConfig
from rung.daemon.mqtt import requests as rq
from rung.daemon.mqtt.journal import Entry
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer
from rung.engines.errors import RungError

__all__ = ["METHODS", "RungServer", "read_users"]

log = logging.getLogger("rung.opcua")
logging.getLogger("asyncua").setLevel(logging.CRITICAL)   # rung says what matters itself
METHODS = {"GenerateST": "st_code", "BuildFaultTree": "fault_tree", "Diagnose": "diagnosis"}
_POLICIES = {"None": ua.SecurityPolicyType.NoSecurity,
             "Basic256Sha256_Sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
             "Basic256Sha256_SignAndEncrypt":
                 ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt}
Submit = Callable[[Request], "asyncio.Future[Answer] | None"]


def read_users(path: Path) -> dict[str, str]:
    """``name:password`` per line (blank lines and ``#`` comments skipped).

    Raises:
        RungError: the file cannot be read, or a line is not ``name:password``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RungError(f"opcua_server.users_file: cannot read {path} "
                        f"({type(e).__name__})") from None
    users: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, password = line.partition(":")
        if not sep or not name.strip() or not password:
            raise RungError(f"opcua_server.users_file: {path} line {n}: expected "
                            "name:password")
        users[name.strip()] = password
    return users


class _Users:
    """asyncua's user manager: the users file's users, nobody else."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = dict(users)

    def get_user(self, iserver: Any, username: str | None = None,
                 password: str | None = None, certificate: Any = None) -> User | None:
        if username is not None and self.users.get(username) == password:
            return User(role=UserRole.User, name=username)
        return None


class RungServer:
    """rung's OPC UA server; ``run`` serves until cancelled.

    ``status()`` gives the status nodes' values (``ready``, ``queue_depth``, ``inflight``,
    ``engine``, ``tasks``); ``base_topic``/``client_id`` name requests as MQTT would."""

    def __init__(self, cfg: OpcUaServerConfig, tasks: Mapping[str, Any], submit: Submit,
                 status: Callable[[], dict[str, Any]], base_topic: str, client_id: str,
                 max_payload_bytes: int, timeout_s: float) -> None:
        self.cfg, self.tasks, self.submit, self.status = cfg, tasks, submit, status
        self.base, self.client_id = base_topic, client_id
        self.max_payload, self.timeout_s = max_payload_bytes, timeout_s
        self.users = read_users(cfg.users_file) if cfg.users_file is not None else {}
        self.server: Server | None = None
        self._status_nodes: dict[str, tuple[Any, ua.VariantType]] = {}
        self._calls = itertools.count(1)
        self.started = asyncio.Event()

    async def run(self) -> None:
        server = await self._build()
        await server.start()
        self.server = server
        log.info("opcua server listening", extra={"rung_fields": {
            "endpoint": self.cfg.endpoint, "security": list(self.cfg.security),
            "users": len(self.users)}})
        self.started.set()
        try:
            while True:
                await self._update_status()
                await asyncio.sleep(1.0)
        finally:
            self.server = None
            await server.stop()

    async def _build(self) -> Server:
        c = self.cfg
        server = Server(user_manager=_Users(self.users) if self.users else None)
        await server.init()
        server.set_endpoint(c.endpoint)
        server.set_server_name("rung")
        await server.set_application_uri(f"urn:rung:{self.client_id}")
        server.set_security_policy([_POLICIES[p] for p in c.security])
        if c.certificate is not None and c.private_key is not None:
            await server.load_certificate(str(c.certificate))
            await server.load_private_key(str(c.private_key))
        if c.trusted_certificates:
            server.set_certificate_validator(self._trusted)
        server.set_identity_tokens([ua.UserNameIdentityToken] if self.users
                                   else [ua.AnonymousIdentityToken])
        idx = await server.register_namespace(f"urn:rung:{self.client_id}:api")
        rung = await server.nodes.objects.add_object(f"ns={idx};s=rung", f"{idx}:rung")
        for method, task in METHODS.items():
            await rung.add_method(
                f"ns={idx};s=rung.{method}", f"{idx}:{method}", self._method(task),
                [_argument("request", f"the {task} input as JSON, or an MQTT request form")],
                [_argument("answer", "the answer as JSON (docs/mqtt.md, answers)")])
        status = await rung.add_object(f"ns={idx};s=rung.Status", f"{idx}:Status")
        for name, vtype, value in (("Ready", ua.VariantType.Boolean, False),
                                   ("QueueDepth", ua.VariantType.UInt32, 0),
                                   ("InFlight", ua.VariantType.UInt32, 0),
                                   ("Engine", ua.VariantType.String, ""),
                                   ("Tasks", ua.VariantType.String, "[]")):
            node = await status.add_variable(f"ns={idx};s=rung.Status.{name}",
                                             f"{idx}:{name}", ua.Variant(value, vtype))
            self._status_nodes[name] = (node, vtype)
        await self._update_status()
        return server

    async def _trusted(self, cert: Any, app: Any) -> None:
        """Accept a client certificate only when it is one of ``trusted_certificates``."""
        from asyncua.crypto import uacrypto
        from cryptography.hazmat.primitives.serialization import Encoding

        der = uacrypto.der_from_x509(cert)
        for path in self.cfg.trusted_certificates:
            if (await uacrypto.load_certificate(str(path))).public_bytes(Encoding.DER) == der:
                return
        log.warning("opcua server: refused a client certificate (%s): not in "
                    "opcua_server.trusted_certificates", cert.subject.rfc4514_string())
        raise ua.uaerrors.BadCertificateUntrusted

    async def _update_status(self) -> None:
        s = self.status()
        values = {"Ready": bool(s.get("ready")), "QueueDepth": int(s.get("queue_depth", 0)),
                  "InFlight": int(s.get("inflight", 0)), "Engine": str(s.get("engine", "")),
                  "Tasks": json.dumps(sorted(s.get("tasks", [])))}
        for name, (node, vtype) in self._status_nodes.items():
            await node.write_value(ua.Variant(values[name], vtype))

    def _method(self, task: str) -> Callable[..., Any]:
        async def call(parent: ua.NodeId, request: ua.Variant) -> list[ua.Variant]:
            answer = await self.answer(task, request.Value)
            return [ua.Variant(answer, ua.VariantType.String)]
        return call

    async def answer(self, task: str, text: Any) -> str:
        """One method call: the request text parsed as an MQTT request of ``task`` would
        be, run through the scheduler, the answer in MQTT's answer form."""
        seq = next(self._calls)
        payload = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else b""
        if len(payload) <= self.max_payload:
            try:
                doc = json.loads(payload)
            except (ValueError, RecursionError):
                doc = None
            if isinstance(doc, dict) and "input" not in doc:   # the input object alone
                payload = json.dumps({"input": doc}, ensure_ascii=False).encode()
        now = time.time()
        entry = Entry(seq, f"{self.base}/req/{task}", payload, None, None, now, None)
        parsed = rq.parse(entry, self.base, self.client_id, self.tasks, self.max_payload,
                          self.timeout_s)
        if isinstance(parsed, rq.Failure):
            return rq.error_response(parsed.reply, task, parsed.code,
                                     parsed.message).decode()
        req = replace(parsed.request, ref=f"opcua call {seq}")
        future = self.submit(req)
        if future is None:
            return rq.error_response(parsed.reply, task, "busy", "queue full").decode()
        a = await future
        if a.ok:
            return rq.ok_response(parsed.reply, task, a.output, a.validation,
                                  a.usage).decode()
        extra = {"output": a.output, "validation": a.validation} \
            if a.output is not None else None
        return rq.error_response(parsed.reply, task, a.code or "internal",
                                 a.message or "", extra).decode()


def _argument(name: str, text: str) -> ua.Argument:
    arg = ua.Argument()
    arg.Name = name
    arg.DataType = ua.NodeId(ua.ObjectIds.String)
    arg.ValueRank = -1
    arg.Description = ua.LocalizedText(text)
    return arg
