"""The link to one PLC over OPC UA (asyncua's client): the handshake's transport
(:class:`~rung.daemon.plc.transport.Transport`) over a node map.

A :class:`NodeLink` holds one session. It connects when an operation needs it (the
handshake's loop retries with backoff, never the link itself: asyncua's own reconnect is
off), resolves the map's nodes on the server (NodeIds with a namespace URI, browse paths:
one TranslateBrowsePaths call), and subscribes to ``req`` and ``req_seq`` so that a request
wakes the handshake at once (``on_request``). Each operation is one service call: the
handshake's eight values in one Read, the snapshot's points in one Read, rung's writes in
one Write. rung writes only its six handshake nodes and the map's ``writable`` nodes, each
with the node's own data type (read once per session): a handshake node of a type that does
not hold an integer (Float, String) is refused before anything goes out.

Every failure leaves here as an :class:`~rung.daemon.opcua.errors.OpcUaError` naming the
PLC, the operation and the node. A failure of the session (lost, refused, timed out, a
certificate rejected) drops it: the next operation connects again, and the link state reads
``disconnected`` (``error`` after a timeout) until then; a node the server refuses (unknown,
not writable, a type mismatch) fails that operation only.

A session whose connection was lost is kept and reactivated on a new secure channel
(``_resume``) at every attempt until the server answers: an outage longer than one
attempt (a cable pulled for minutes) resumes the same session and subscription, no new
session is made while the server is out of reach, and one is made only when the server
refuses the old one or the session's timeout (revised by the server) has run out since the
loss. A secure connection that fails without a status (the server drops a channel it
cannot decrypt) is explained when it can be: the server's endpoints are read over a None
channel and a ``server_certificate`` that is not among the certificates it presents is
named (``_wrong_certificate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncua import ua
from asyncua.client.client import Client
from asyncua.common.node import Node
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from asyncua.ua.attribute_ids import AttributeIds
from asyncua.ua.uaerrors._base import UaStatusCodeError

from rung.daemon.opcua.errors import (
    OpcUaConfigError,
    OpcUaError,
    status_error,
    translate,
)
from rung.daemon.opcua.nodemap import NodeMap, NodePoint, NodeRef
from rung.daemon.plc.points import RUNG_WRITES
from rung.daemon.plc.shown import ShowsState
from rung.daemon.plc.transport import OnState, Values

__all__ = ["NodeLink"]

log = logging.getLogger("rung.opcua")
# asyncua logs each lost connection, retry and session detail, some with a traceback; rung
# says what matters once per fault itself (the handshake's lines and the link state)
logging.getLogger("asyncua").setLevel(logging.CRITICAL)
_GUARD = 1.5   # x timeout_s: a backstop around each service call, which times out by itself
# integer types a handshake node may have, and the 16-bit handshake value's form in it
_INTS: dict[ua.VariantType, Callable[[int], int]] = {
    ua.VariantType.Byte: lambda v: v & 0xFF,
    ua.VariantType.SByte: lambda v: (v & 0xFF) - (0x100 if v & 0x80 else 0),
    ua.VariantType.UInt16: lambda v: v & 0xFFFF,
    ua.VariantType.Int16: lambda v: (v & 0xFFFF) - (0x10000 if v & 0x8000 else 0),
    ua.VariantType.UInt32: int, ua.VariantType.Int32: int,
    ua.VariantType.UInt64: int, ua.VariantType.Int64: int,
}


# what a resume needs of asyncua's client (2.1: the pieces of its own auto-reconnect)
_RESUMABLE = all(hasattr(Client, name) for name in (
    "_teardown_transport_only", "_start_renew_loop", "_connection_supervisor"))
# statuses after which the session may live on: only the channel or the connection failed
_CHANNEL_LOST = frozenset({"BadSecureChannelIdInvalid", "BadSecureChannelClosed",
                           "BadConnectionClosed", "BadNotConnected", "BadServerNotConnected",
                           "BadCommunicationError", "BadTimeout", "BadRequestTimeout"})


class _Changes:
    """asyncua's subscription handler: a change of req/req_seq wakes the handshake."""

    def __init__(self, link: NodeLink) -> None:
        self.link = link

    def datachange_notification(self, node: Node, val: Any, data: Any) -> None:
        if self.link.on_request is not None:
            self.link.on_request()

    def status_change_notification(self, status: Any) -> None:
        self.link._lost("the server ended the subscription")


class NodeLink(ShowsState):
    """One PLC's OPC UA session, as the handshake's transport."""

    per_transaction = False

    def __init__(self, plc: NodeMap, on_state: OnState | None = None) -> None:
        super().__init__()
        self.plc = plc
        self.where = plc.server.endpoint
        self.state = "disconnected"
        self.on_state = on_state
        self.on_request: Callable[[], None] | None = None
        self._detail: str | None = None
        self._client: Client | None = None
        self._handshake: dict[str, ua.NodeId] = {}
        self._points: list[tuple[NodePoint, ua.NodeId]] = []
        self._types: dict[str, ua.VariantType] = {}   # written node -> its data type
        self._resolved = False
        # a session whose connection was lost, kept for ActivateSession on a new channel,
        # and when it was lost (monotonic; its session timeout runs from there)
        self._stale: Client | None = None
        self._lost_at = 0.0
        self._unreached = False   # a resume failed before the server answered (logged once)
        self.sessions = {"created": 0, "resumed": 0}   # this link's, for tests and logs
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()   # sessions lost, being closed

    # --- the transport ---------------------------------------------------------------------
    async def connect(self) -> None:
        """Open the session and resolve the map's nodes unless done."""
        await self._ready("connect")

    async def read_handshake(self) -> dict[str, int]:
        op = "handshake read"
        client = await self._ready(op)
        names = list(self._handshake)
        values = await self._read(client, op, [self._handshake[n] for n in names],
                                  [self.plc.handshake.nodes[n] for n in names])
        return {n: self._integer(op, self.plc.handshake.nodes[n], v)
                for n, v in zip(names, values, strict=True)}

    async def write(self, values: Mapping[str, int]) -> None:
        """Write handshake values by name in one Write (rung's six nodes only)."""
        op = "write " + ", ".join(values)
        refs = self.plc.handshake.nodes
        for name in values:
            if name not in RUNG_WRITES or str(refs[name]) not in self.plc.allowed:
                raise OpcUaConfigError(f"plc {self.plc.id}: {op}: refused: handshake.{name} "
                                       "is not rung's to write", plc=self.plc.id)
        client = await self._ready(op)
        items = []
        for name, value in values.items():
            vtype = await self._type(client, op, name)
            items.append((self._handshake[name], refs[name], ua.DataValue(ua.Variant(
                _INTS[vtype](value) if vtype in _INTS else bool(value), vtype))))
        params = ua.WriteParameters()
        for nodeid, _, dv in items:
            params.NodesToWrite.append(ua.WriteValue(NodeId=nodeid,
                                                     AttributeId=AttributeIds.Value,
                                                     Value=dv))
        results = await self._call(op, client.uaclient.write(params))
        for (_, ref, _), status in zip(items, results, strict=True):
            if not status.is_good():
                raise status_error(self.plc.id, f"{op}: {ref.key} {ref}", status.name,
                                   status.value)
        self._set_state("connected", None)

    async def read_snapshot(self) -> Values:
        """Every point of the map in one Read, in engineering units."""
        op = "snapshot read"
        client = await self._ready(op)
        raw = await self._read(client, op, [nid for _, nid in self._points],
                               [p.node for p, _ in self._points])
        return {p.name: _value(self.plc.id, op, p, v)
                for (p, _), v in zip(self._points, raw, strict=True)}

    async def probe(self) -> tuple[dict[str, int], Values]:
        """``rung check``: connect, read the handshake, check the data type of each of
        rung's six handshake nodes (nothing is written) and read the snapshot once; the
        first failure raises as the handshake would see it."""
        handshake = await self.read_handshake()
        client = await self._ready("type check")
        for name in RUNG_WRITES:
            await self._type(client, "type check", name)
        return handshake, await self.read_snapshot()

    async def close(self) -> None:
        await self._drop()
        stale, self._stale = self._stale, None
        if stale is not None:
            await _disconnect(stale)
        self._set_state("disconnected", None)

    # --- session ---------------------------------------------------------------------------
    async def _ready(self, op: str) -> Client:
        """The session, connected and with the map's nodes resolved (under the lock)."""
        async with self._lock:
            client = self._client
            if client is None and self._stale is not None:
                client = await self._resume(op)
            if client is None:
                client = await self._connect(op)
            if not self._resolved:
                await self._resolve(client, op)
            return client

    async def _connect(self, op: str) -> Client:
        s = self.plc.server
        client = Client(s.endpoint, timeout=s.timeout_s, watchdog_intervall=max(
            1.0, self.plc.handshake.heartbeat_s))
        client.name = client.description = f"rung {self.plc.id}"
        client.application_uri = s.application_uri
        if s.user is not None:
            client.set_user(s.user)
            client.set_password(s.password or "")
        try:
            sec = s.security
            if sec.policy == "Basic256Sha256":
                assert sec.certificate and sec.private_key and sec.server_certificate
                client.application_uri = _uri(sec.certificate) or s.application_uri
                await client.set_security(
                    SecurityPolicyBasic256Sha256, str(sec.certificate), str(sec.private_key),
                    server_certificate=str(sec.server_certificate),
                    mode=getattr(ua.MessageSecurityMode, sec.mode))
            async with asyncio.timeout(s.timeout_s * 3):
                await client.connect()
        except Exception as e:
            with contextlib.suppress(Exception):
                client.disconnect_socket()
            op = f"connect {s.endpoint}"
            error = await self._wrong_certificate(op, e) or translate(self.plc.id, op, e)
            error.connection = True
            self._set_state("disconnected", error.message)
            raise error from e
        client.connection_lost_callback = self._connection_lost
        self._client, self._resolved, self._types = client, False, {}
        self.sessions["created"] += 1
        self._set_state("connected", None)
        return client

    async def _resume(self, op: str) -> Client | None:
        """The lost session reactivated on a new secure channel (OPC UA Part 4, 6.7:
        ActivateSession with its authentication token): the server kept it, so its
        subscription and the nodes resolved stand. A failure before the server answered
        the activation (no connection, no channel, no answer in time: the cable is still
        out) keeps the session for the next attempt and raises, so no second session is
        made while the server cannot be reached. None, the old session given up, when the
        server refuses it (``BadSessionIdInvalid`` after a restart, any status to the
        activation) or its timeout has run out since the loss: the caller opens a new
        session. asyncua 2.1's client supports this only inside its own auto-reconnect
        (off here); the steps are its own, with two of its private parts (the
        channel-renew loop and the supervisor that reports a lost connection)."""
        client, self._stale = self._stale, None
        if client is None or not _RESUMABLE:
            return None
        s = self.plc.server
        timeout_s = float(client.session_timeout) / 1000
        if time.monotonic() - self._lost_at > timeout_s:
            log.info("PLC %s: session not resumed (lost %.0f s ago, past the session "
                     "timeout of %.0f s): a new session", self.plc.id,
                     time.monotonic() - self._lost_at, timeout_s)
            await _disconnect(client)
            return None
        activating = False
        try:
            old = client._supervisor_task   # it reported the loss, or is about to
            if old is not None and not old.done():
                old.cancel()
            async with asyncio.timeout(s.timeout_s * 3):
                await client._teardown_transport_only()
                await client.connect_socket()
                await client.send_hello()
                await client.open_secure_channel()
                client.uaclient.session.rebind_authentication_token()
                activating = True
                await client.activate_session(username=s.user, password=s.password,
                                              certificate=client.user_certificate)
            client.uaclient.ensure_publish_loop()
            client._start_renew_loop()
            client._supervisor_task = asyncio.get_running_loop().create_task(
                client._connection_supervisor())
            for sub in list(client._subscriptions):   # the server kept it: publish again
                sub.last_publish_at = time.monotonic()
        except Exception as e:
            why = translate(self.plc.id, op, e)
            if activating and why.status is not None and why.status not in _CHANNEL_LOST:
                log.info("PLC %s: session not resumed (%s): a new session", self.plc.id,
                         why.status)
                await _disconnect(client)
                return None
            # the server did not answer: it may hold the session still; tried again next
            with contextlib.suppress(Exception):
                client.disconnect_socket()
            self._stale = client
            error = await self._wrong_certificate(op, e) or why
            error.connection = True
            if not self._unreached:
                self._unreached = True
                log.info("PLC %s: server not reached (%s): the session is kept and "
                         "resumed once it answers (its session timeout: %.0f s)",
                         self.plc.id, error.message, timeout_s)
            self._set_state("error" if isinstance(e, TimeoutError) else "disconnected",
                            error.message)
            raise error from e
        self._client, self._unreached = client, False
        self.sessions["resumed"] += 1
        log.info("PLC %s: session resumed on a new secure channel", self.plc.id)
        self._set_state("connected", None)
        return client

    async def _wrong_certificate(self, op: str, exc: BaseException) -> OpcUaError | None:
        """A secure connection that failed without a status (a server drops a channel
        encrypted for another certificate, or never answers it): the server's endpoints
        read over a None channel (discovery needs no security); a configured
        ``server_certificate`` that is none of those it presents is the error, named.
        None when security is off, the failure is a status or a refused connection, or the
        endpoints cannot be read."""
        sec, s = self.plc.server.security, self.plc.server
        if sec.policy == "None" or sec.server_certificate is None:
            return None
        if isinstance(exc, UaStatusCodeError | OpcUaError) or (
                isinstance(exc, OSError) and exc.errno in (
                    errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)):
            return None
        probe = Client(s.endpoint, timeout=s.timeout_s)
        try:
            async with asyncio.timeout(s.timeout_s * 2):
                endpoints = await probe.connect_and_get_server_endpoints()
            mine = _certificate(sec.server_certificate.read_bytes())
        except Exception:   # the server out of reach, or a file unreadable: no verdict
            return None
        finally:
            with contextlib.suppress(Exception):
                probe.disconnect_socket()
        theirs = {_first_der(ep.ServerCertificate) for ep in endpoints
                  if ep.ServerCertificate}
        if not theirs or mine in theirs:
            return None
        return OpcUaConfigError(
            f"plc {self.plc.id}: {op}: security.server_certificate "
            f"{sec.server_certificate} ({_describe(mine)}) is not the certificate the server "
            f"presents ({', '.join(sorted(_describe(c) for c in theirs))})",
            plc=self.plc.id, connection=True,
            hint="export the server's certificate from the PLC and name that file "
                 "(docs/opcua.md, Security)")

    async def _resolve(self, client: Client, op: str) -> None:
        """Every node of the map as a NodeId on this server; the subscription on req and
        req_seq (without it the handshake is read every ``poll_s`` only)."""
        hs = self.plc.handshake.nodes
        refs = [*hs.values(), *(p.node for p in self.plc.points)]
        ids = await self._nodeids(client, op, refs)
        self._handshake = dict(zip(hs, ids[:len(hs)], strict=True))
        self._points = list(zip(self.plc.points, ids[len(hs):], strict=True))
        self._resolved = True
        try:
            sub = await self._call(op, client.create_subscription(
                min(self.plc.handshake.poll_s, 0.1) * 1000, _Changes(self)))
            await self._call(op, sub.subscribe_data_change(
                [client.get_node(self._handshake[n]) for n in ("req", "req_seq")]))
        except OpcUaError as e:
            if e.connection:
                raise
            log.warning("PLC %s: no subscription on req/req_seq, reading them every %g s: "
                        "%s", self.plc.id, self.plc.handshake.poll_s, e)

    async def _nodeids(self, client: Client, op: str,
                       refs: Sequence[NodeRef]) -> list[ua.NodeId]:
        namespaces: dict[str, int] = {}

        async def index(uri: str, ref: NodeRef) -> int:
            if uri not in namespaces:
                array = await self._call(op, client.get_namespace_array())
                if uri not in array:
                    raise OpcUaConfigError(
                        f"plc {self.plc.id}: {op}: {ref.key} {ref}: the server has no "
                        f"namespace {uri!r}", plc=self.plc.id,
                        hint=f"its namespaces: {', '.join(array)}")
                namespaces[uri] = array.index(uri)
            return namespaces[uri]

        out: list[ua.NodeId | None] = []
        paths: list[tuple[int, NodeRef, list[ua.QualifiedName]]] = []
        for ref in refs:
            if ref.nodeid is not None:
                text = ref.nodeid if ref.nsu is None else \
                    f"ns={await index(ref.nsu, ref)};{ref.nodeid}"
                out.append(ua.NodeId.from_string(text))
                continue
            names = [ua.QualifiedName(name, ns if ns is not None else
                                      await index(self.plc.server.namespace or "", ref))
                     for ns, name in ref.path]
            paths.append((len(out), ref, names))
            out.append(None)
        if paths:
            found = await self._call(op, client.nodes.objects.get_children_by_path(
                [names for _, _, names in paths], raise_on_partial_error=False))
            for (i, ref, _), nodes in zip(paths, found, strict=True):
                if not nodes or nodes[0] is None:
                    raise status_error(self.plc.id, f"{op}: {ref.key} {ref}", "BadNoMatch")
                out[i] = nodes[0].nodeid
        return [n for n in out if n is not None]

    async def _type(self, client: Client, op: str, name: str) -> ua.VariantType:
        """The data type of rung's handshake node ``name`` (read once per session); a type
        that cannot hold the handshake's integers is refused here."""
        ref = self.plc.handshake.nodes[name]
        if name not in self._types:
            vtype = await self._call(f"{op}: {ref.key} {ref}", client.get_node(
                self._handshake[name]).read_data_type_as_variant_type())
            self._types[name] = vtype
        vtype = self._types[name]
        if vtype not in _INTS and vtype != ua.VariantType.Boolean:
            raise OpcUaConfigError(
                f"plc {self.plc.id}: {op}: type mismatch: {ref.key} {ref} is {vtype.name} on "
                f"the server; rung writes integers", plc=self.plc.id,
                hint="declare the handshake variables as INT, UINT, DINT or UDINT (busy and "
                     "done may be BOOL); docs/opcua.md")
        return vtype

    async def _read(self, client: Client, op: str, nodeids: Sequence[ua.NodeId],
                    refs: Sequence[NodeRef]) -> list[Any]:
        params = ua.ReadParameters()
        for nodeid in nodeids:
            params.NodesToRead.append(ua.ReadValueId(NodeId=nodeid,
                                                     AttributeId=AttributeIds.Value))
        results = await self._call(op, client.uaclient.read(params))
        for ref, dv in zip(refs, results, strict=True):
            status = dv.StatusCode or ua.StatusCode()
            if status.is_bad():
                raise status_error(self.plc.id, f"{op}: {ref.key} {ref}", status.name,
                                   status.value)
        self._set_state("connected", None)
        return [dv.Value.Value if dv.Value is not None else None for dv in results]

    def _integer(self, op: str, ref: NodeRef, value: Any) -> int:
        if isinstance(value, int):   # a BOOL too
            return int(value) & 0xFFFF
        if isinstance(value, float) and value.is_integer():
            return int(value) & 0xFFFF
        raise OpcUaConfigError(f"plc {self.plc.id}: {op}: type mismatch: {ref.key} {ref} "
                               f"holds {type(value).__name__} {value!r}, not an integer",
                               plc=self.plc.id, hint="declare the handshake variables as "
                               "integers (busy and done may be BOOL); docs/opcua.md")

    async def _call(self, op: str, call: Any) -> Any:
        """One service call, bounded; a failed session is dropped."""
        try:
            async with asyncio.timeout(self.plc.server.timeout_s * _GUARD):
                return await call
        except Exception as e:
            error = translate(self.plc.id, op, e)
            if error.connection:   # the session itself refused (a status): not resumable
                await self._drop(resumable=error.status is None
                                 or error.status in _CHANNEL_LOST)
                self._set_state("error" if isinstance(e, TimeoutError) else "disconnected",
                                error.message)
            raise error from e

    async def _connection_lost(self, exc: Exception) -> None:
        """asyncua's callback when the session's transport fails."""
        self._lost(f"connection lost ({exc or type(exc).__name__})")

    def _lost(self, why: str) -> None:
        """The session's connection is gone: the session is kept for ``_resume`` (the
        nodes resolved with it)."""
        client, self._client = self._client, None
        if client is not None:
            self._keep(client)
            self._set_state("disconnected", f"plc {self.plc.id}: {why}")
        if self.on_request is not None:
            self.on_request()   # the handshake's next cycle reconnects

    def _keep(self, client: Client) -> None:
        """Keep a session whose connection failed for ``_resume`` (one at most: an older
        one is closed)."""
        old, self._stale = self._stale, client
        if old is not client:   # a new loss: its timeout and its first line from now
            self._lost_at, self._unreached = time.monotonic(), False
        if old is not None and old is not client:
            closing = asyncio.get_running_loop().create_task(_disconnect(old))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _drop(self, resumable: bool = False) -> None:
        """Leave the session: kept for ``_resume`` (``resumable``: the connection failed,
        the server may still hold it), else closed."""
        client, self._client = self._client, None
        if client is None:
            return
        if resumable:
            self._keep(client)
            return
        self._resolved = False
        await _disconnect(client)

    # --- state -----------------------------------------------------------------------------
    def _set_state(self, state: str, detail: str | None) -> None:
        """A change of state, or why the link is still down (the first failed connect
        says so: the link starts ``disconnected`` without a reason)."""
        if state != self.state or (state != "connected" and detail != self._detail
                                   and detail is not None):
            self.state, self._detail = state, detail
            self._show()

    def __repr__(self) -> str:
        return f"NodeLink({self.plc.id!r}, {self.where}, {self.state})"


async def _disconnect(client: Client) -> None:
    """Close a session without waiting on a server that is gone."""
    try:
        async with asyncio.timeout(2):
            await client.disconnect()
    except Exception:   # the session is gone either way
        with contextlib.suppress(Exception):
            client.disconnect_socket()


def _value(plc: str, op: str, p: NodePoint, v: Any) -> float | int | bool:
    """A point's value from the server's, in engineering units; a value of another type
    than the point's is a type mismatch."""
    ok = {"bool": isinstance(v, bool), "int": isinstance(v, int) and not isinstance(v, bool),
          "float": isinstance(v, float),
          "number": isinstance(v, int | float) and not isinstance(v, bool),
          "auto": isinstance(v, int | float)}[p.type]
    if not ok:
        raise OpcUaConfigError(f"plc {plc}: {op}: type mismatch: {p.node.key} {p.node} holds "
                               f"{type(v).__name__} {v!r}, the point is {p.type}", plc=plc,
                               hint="set the point's type to what the server holds")
    if isinstance(v, bool) or (p.scale == 1 and p.offset == 0):
        return v  # type: ignore[no-any-return]
    return float(v * p.scale + p.offset)


def _uri(certificate: Any) -> str | None:
    """The application URI in a certificate's subject alternative names (DER or PEM)."""
    from cryptography import x509

    data = certificate.read_bytes()
    try:
        cert = x509.load_der_x509_certificate(data)
    except ValueError:
        cert = x509.load_pem_x509_certificate(data)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    return uris[0] if uris else None


def _first_der(data: bytes) -> bytes:
    """The leading certificate of a DER blob (a server may send its chain after it)."""
    if len(data) < 2 or data[0] != 0x30:
        return data
    if data[1] < 0x80:
        return data[:2 + data[1]]
    n = data[1] & 0x7F
    return data[:2 + n + int.from_bytes(data[2:2 + n], "big")]


def _certificate(data: bytes) -> bytes:
    """A certificate file's content (DER or PEM) as DER."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    if data.lstrip().startswith(b"-----BEGIN"):
        return x509.load_pem_x509_certificate(data).public_bytes(Encoding.DER)
    return _first_der(data)


def _describe(der: bytes) -> str:
    """A certificate as an operator finds it in the PLC's tools: its subject and SHA-1
    thumbprint."""
    from cryptography import x509

    thumb = hashlib.sha1(der, usedforsecurity=False).hexdigest()
    try:
        subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    except ValueError:
        subject = "unreadable"
    return f"{subject or 'no subject'}, SHA-1 {thumb}"
