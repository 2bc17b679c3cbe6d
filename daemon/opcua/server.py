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

``request`` is the task's input object as JSON, or the whole request form
(``{"input": {...}, "max_tokens": ..., "id": ...}``, docs/contract.md), read by the server's
own entry (``call.py``: the request form every adapter reads, under
``opcua_server.max_request_bytes``: ``too_large``); ``answer`` is the one answer envelope
of every adapter (``daemon/envelope.py``: ``output_formats`` too). A call is answered
through the same scheduler as MQTT's requests (its bounded queue: ``busy``;
``queue.request_timeout_s``: ``expired``); the method returns when the answer is there, so
the client's call timeout must allow a generation. A ``request`` that is not a String is
answered ``bad_request`` naming the type it was; no argument, or more than one, is the
status BadArgumentsMissing / BadTooManyArguments. Every call's answer is one ``answered``
log line (``rung.serve``, as MQTT's, with ``via: opcua``), and what MQTT counts in
``rung_requests_total`` beside the scheduler's answers is counted here too (refused at the
edge, ``busy``, ``duplicate``, ``unavailable``).

Calls are rows of the daemon's journal (``daemon/journal/``): recorded before they run
(address ``opcua:{task}``, the call's canonical request form), the start counted, the
answer kept (``Journal.settle``: never published). A call names itself with the request
form's ``id`` (one is assigned, ``opcua-<hex>``, and echoed when it has none): a call
repeated with the same id and request (after a client timeout, a dropped session, a
restart) gets the kept answer, or waits for the run in progress, and never runs twice.
Calls recorded before a restart and not answered run again at start-up (``recover``),
their answers kept for the caller's next call.

Security: the policies listed (None, Basic256Sha256 Sign / SignAndEncrypt) with rung's
certificate and key; client certificates are trusted only when listed
(``trusted_certificates``); with a ``users_file`` every session needs one of its users.
What reaches the server at all (channels, sessions, message sizes) is ``guard.Guard``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncua import ua
from asyncua.crypto.permission_rules import User, UserRole

from rung.daemon import envelope
from rung.daemon import request_form as form
from rung.daemon.config import OpcUaServerConfig
from rung.daemon.journal.store import (
    OPCUA_PREFIX,
    Entry,
    Incoming,
    Journal,
    JournalError,
    dedupe_key,
)
from rung.daemon.opcua import call as calls
from rung.daemon.opcua.guard import Guard, GuardedServer, policy_types
from rung.daemon.request import Request
from rung.daemon.scheduler import Answer
from rung.engines.errors import RungError

if TYPE_CHECKING:
    from rung.daemon.metrics import Metrics

__all__ = ["METHODS", "RungServer", "read_users"]

log = logging.getLogger("rung.opcua")
answers = logging.getLogger("rung.serve")   # the ``answered`` lines, as MQTT's
logging.getLogger("asyncua").setLevel(logging.CRITICAL)   # rung says what matters itself
METHODS = {"GenerateST": "st_code", "BuildFaultTree": "fault_tree", "Diagnose": "diagnosis"}
# (request, recovered, on_start: told when the model is about to start on it)
Submit = Callable[[Request, bool, Callable[[Request], object]],
                  "asyncio.Future[Answer] | None"]


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


class Users:
    """asyncua's user manager: the given users with their passwords, nobody else (rung's
    server and the demo's simulated PLC)."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = dict(users)

    def get_user(self, iserver: Any, username: str | None = None,
                 password: str | None = None, certificate: Any = None) -> User | None:
        known = self.users.get(username or "")
        if username is not None and known is not None and password is not None \
                and hmac.compare_digest(known.encode(), password.encode()):
            return User(role=UserRole.User, name=username)
        return None


class RungServer:
    """rung's OPC UA server; ``run`` serves until cancelled.

    ``status()`` gives the status nodes' values (``ready``, ``queue_depth``, ``inflight``,
    ``engine``, ``tasks``); ``client_id`` names the server's namespace.
    ``metrics``: where the calls refused before the scheduler are counted (the scheduler's
    answers are counted by its own callback); ``st_edition``: ``st.edition``, for
    ``output_formats``; the input limit is ``cfg.max_request_bytes``."""

    def __init__(self, cfg: OpcUaServerConfig, tasks: Mapping[str, Any], submit: Submit,
                 status: Callable[[], dict[str, Any]], client_id: str,
                 timeout_s: float = 300.0,
                 journal: Journal | None = None, max_attempts: int = 3, *,
                 metrics: Metrics | None = None, st_edition: int = 3) -> None:
        self.cfg, self.tasks, self.submit, self.status = cfg, tasks, submit, status
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.journal, self.max_attempts = journal, max_attempts
        self.metrics, self.st_edition = metrics, st_edition
        self._inflight: dict[str, asyncio.Task[str]] = {}   # journaled calls, by key
        self._open: dict[int, int] = {}   # request uid -> journal row, with the scheduler
        self.users = read_users(cfg.users_file) if cfg.users_file is not None else {}
        self.server: GuardedServer | None = None
        self.guard: Guard | None = None
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

    async def _build(self) -> GuardedServer:
        from asyncua.crypto import uacrypto

        c = self.cfg
        trusted = frozenset([uacrypto.der_from_x509(await uacrypto.load_certificate(str(p)))
                             for p in c.trusted_certificates])
        self.guard = Guard(c, trusted)
        server = GuardedServer(self.guard,
                               user_manager=Users(self.users) if self.users else None)
        await server.init()
        server.set_endpoint(c.endpoint)
        server.set_server_name("rung")
        await server.set_application_uri(f"urn:rung:{self.client_id}")
        server.set_security_policy(policy_types(c))
        if self.users and "None" in c.security \
                and "Basic256Sha256_SignAndEncrypt" not in c.security:
            log.warning("opcua server: passwords cross the wire in clear on a None channel "
                        "(opcua_server.security offers no SignAndEncrypt to encrypt them)")
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
                f"ns={idx};s=rung.{method}", f"{idx}:{method}", self._method(method, task),
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
        """Accept a CreateSession's client certificate only when it is one of
        ``trusted_certificates`` (the channel's was checked by the guard)."""
        from asyncua.crypto import uacrypto

        if self.guard is not None and uacrypto.der_from_x509(cert) in self.guard.trusted:
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

    def _method(self, method: str, task: str) -> Callable[..., Any]:
        async def call(parent: ua.NodeId, *args: ua.Variant) -> list[ua.Variant] | ua.StatusCode:
            if len(args) != 1:
                return self._arguments(method, task, len(args))
            answer = await self.answer(task, args[0])
            return [ua.Variant(answer, ua.VariantType.String)]
        return call

    def _arguments(self, method: str, task: str, n: int) -> ua.StatusCode:
        """A call with no argument or more than one: a status, no answer (logged and
        counted ``bad_request`` as a refused call)."""
        code = ua.StatusCodes.BadArgumentsMissing if n == 0 \
            else ua.StatusCodes.BadTooManyArguments
        status = ua.StatusCode(code)
        message = (f"{method} takes one argument, request (a String: the request as JSON), "
                   f"got {n} ({status.name})")
        self._said(next(self._calls), task, envelope.error_response(
            None, task, "bad_request", message).decode(), time.time(), count="bad_request")
        return status

    async def answer(self, task: str, request: Any) -> str:
        """One method call (``request``: its argument, a Variant, or the text itself): the
        request text parsed as an MQTT request of ``task`` would be; with the journal,
        recorded (under its ``id``, one assigned when it has none) before it runs and its
        answer kept, so that a call repeated with the same id gets that answer (or waits
        for the run in progress) instead of a second run; the answer in MQTT's answer
        form."""
        seq, now = next(self._calls), time.time()
        text = calls.argument_text(request)
        payload = text if isinstance(text, form.Refused) else calls.canonical(
            text, self.cfg.max_request_bytes, assign_id=self.journal is not None)
        read = payload if isinstance(payload, form.Refused) else calls.read(
            task, payload, self.tasks, limit=self.cfg.max_request_bytes, received=now,
            deadline=now + self.timeout_s, seq=seq)
        if isinstance(read, form.Refused):   # refused at the edge: nothing to record
            return self._said(seq, task, envelope.error_response(
                form.own_id(read.doc), task, read.code, read.message).decode(), now,
                count=read.code)
        if self.journal is None:
            return await self._run(read, seq)
        msg = self._incoming(read.address, read.payload)
        key = dedupe_key(msg)
        running = self._inflight.get(key)
        if running is None:
            running = self._track(key, self._journaled(msg, read, now))
        return await asyncio.shield(running)

    # -- the journal -----------------------------------------------------------------------

    def _incoming(self, topic: str, payload: bytes) -> Incoming:
        return Incoming(topic, payload,
                        claimed_id=calls.claimed_id(payload, self.cfg.max_request_bytes))

    def _track(self, key: str, work: Coroutine[Any, Any, str]) -> asyncio.Task[str]:
        """Run one journaled call as a task of its own: a caller that goes away (a client
        timeout, a dropped session) does not stop it, and a repeat awaits it."""
        task = asyncio.get_running_loop().create_task(work, name="opcua-call")
        self._inflight[key] = task

        def done(t: asyncio.Task[str]) -> None:
            if self._inflight.get(key) is t:
                del self._inflight[key]
        task.add_done_callback(done)
        return task

    async def _journaled(self, msg: Incoming, call: calls.Call, now: float) -> str:
        """Record the call, then run it; a duplicate of a kept row gets its answer."""
        journal = self.journal
        assert journal is not None
        try:
            entry = await journal.record_soon(msg, now) if journal.attached \
                else journal.record(msg, now)
        except JournalError as e:
            self._count(call.task, "unavailable", now)
            return envelope.error_response(call.form.id, call.task, "unavailable",
                                           f"request not accepted: {e.message}; retry later"
                                           ).decode()
        if entry is not None:
            return await self._run(call, entry.seq)
        row = journal.find(msg)
        if row is not None and row.response is not None:
            log.info("opcua call answered from the journal", extra={"rung_fields": {
                "seq": row.seq, "id": call.form.id, "task": call.task}})
            self._count(call.task, "duplicate", now)
            return bytes(row.response).decode("utf-8", "replace")
        if row is not None:   # pending, not running here (its answer could not be kept)
            return await self._recovered(row)
        self._count(call.task, "unavailable", now)
        return envelope.error_response(call.form.id, call.task, "unavailable",
                                       "request not accepted (the journal changed "
                                       "meanwhile); retry later").decode()

    def recover(self) -> int:
        """Start-up (after the MQTT intake's ``recover`` attached the journal): run the
        calls recorded before a restart and not answered, each answer kept for the
        caller's next call with the same id. Returns the calls re-queued."""
        if self.journal is None:
            return 0
        pending = self.journal.pending(opcua=True)
        for e in pending:
            self._track(dedupe_key(self._incoming(e.topic, e.payload)), self._recovered(e))
        if pending:
            log.info("recovered %d opcua calls from the journal", len(pending))
        return len(pending)

    async def _recovered(self, e: Entry) -> str:
        """A call recorded before a restart: quarantined after ``max_attempts`` starts,
        else run again from its recorded payload."""
        task = calls.task_of(e)
        read = calls.read(task, e.payload, self.tasks, limit=self.cfg.max_request_bytes,
                          received=e.received, deadline=e.received + self.timeout_s,
                          seq=e.seq)
        if isinstance(read, form.Refused):
            text = self._said(e.seq, task, envelope.error_response(
                form.own_id(read.doc), task, read.code, read.message).decode(), e.received,
                count=read.code)
            await self._settle(e.seq, text)
            return text
        if e.attempts >= self.max_attempts:
            why = (f"quarantined: the daemon stopped {e.attempts} times while this request "
                   f"was in flight (journal.max_attempts = {self.max_attempts}); it is not "
                   "run again")
            log.error("opcua call %d %s", e.seq, why)
            if self.metrics is not None:
                self.metrics.quarantined.inc()
            text = self._said(e.seq, task, envelope.error_response(
                read.form.id, task, "internal", why).decode(), e.received,
                read.form.request.session, count="internal")
            await self._settle(e.seq, text, note=why)
            return text
        return await self._run(read, e.seq, recovered=True)

    async def _settle(self, seq: int, text: str, note: str | None = None,
                      keep: bool = True) -> None:
        """Keep a journaled call's answer (a failure is logged: the row stays pending and
        the call runs again after a restart, at least once)."""
        if self.journal is None:
            return
        try:
            done = self.journal.settle(seq, OPCUA_PREFIX + "caller", text.encode(), note, keep)
            if done is not None:
                await done
        except JournalError as e:
            log.warning("opcua call %d: its answer could not be kept (%s)", seq, e)

    def call_started(self, req: Request) -> asyncio.Future[None] | None:
        """Told by the scheduler when the model is about to start on a call: a journaled
        call's attempt counted before the model starts (a call the daemon keeps dying on
        is quarantined)."""
        seq = self._open.get(req.uid)
        if seq is None or self.journal is None:
            return None
        if not self.journal.attached:
            with contextlib.suppress(JournalError):
                self.journal.started(seq)
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def counted(f: asyncio.Future[int]) -> None:
            if f.exception() is not None:
                log.warning("opcua call %d: its start could not be recorded (%s)", seq,
                            f.exception())
            done.set_result(None)

        self.journal.started_soon(seq).add_done_callback(counted)
        return done

    # -- running ---------------------------------------------------------------------------

    async def _run(self, call: calls.Call, seq: int, recovered: bool = False) -> str:
        """Through the scheduler; the answer kept in the journal (journaled calls)."""
        task = call.task
        req = replace(call.form.request, ref=f"opcua call {seq}")
        future = self.submit(req, recovered, self.call_started)
        if future is None:   # not kept: the same id may be sent again, and then runs
            text = self._said(seq, task, envelope.error_response(
                call.form.id, task, "busy", "queue full; retry later").decode(),
                req.received, req.session, count="busy")
            await self._settle(seq, text, "busy", keep=False)
            return text
        self._open[req.uid] = seq
        try:
            a = await future
        finally:
            self._open.pop(req.uid, None)
        # the one envelope of every adapter (counted by the scheduler's callback)
        text = self._said(seq, task, envelope.answer_payload(
            call.form.id, a, call.form.output_formats, self.st_edition).decode(),
                          req.received, req.session)
        await self._settle(seq, text)
        return text

    # -- the trace -------------------------------------------------------------------------

    def _said(self, seq: int, task: str, text: str, received: float,
              session: str | None = None, count: str | None = None) -> str:
        """An answer's ``answered`` line (the fields of MQTT's) and, with ``count``, its
        outcome in ``rung_requests_total`` (``None``: the scheduler's callback counts it).
        Returns ``text``."""
        try:
            doc = json.loads(text)
        except ValueError:
            doc = {}
        fields: dict[str, Any] = {"seq": seq, "task": task, "ok": bool(doc.get("ok"))}
        if fields["ok"]:
            fields.update(id=doc.get("id"), session=session, **(doc.get("usage") or {}))
        else:
            error = doc.get("error") or {}
            fields.update(code=error.get("code"), error=error.get("message"),
                          id=doc.get("id"), session=session,
                          ms=round((time.time() - received) * 1000, 1))
        fields["via"] = "opcua"
        answers.info("answered", extra={"rung_fields": fields})
        if count is not None:
            self._count(task, count, received)
        return text

    def _count(self, task: str, outcome: str, received: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_request(task if task in self.tasks else None, outcome,
                                         total_s=time.time() - received)


def _argument(name: str, text: str) -> ua.Argument:
    arg = ua.Argument()
    arg.Name = name
    arg.DataType = ua.NodeId(ua.ObjectIds.String)
    arg.ValueRank = -1
    arg.Description = ua.LocalizedText(text)
    return arg
