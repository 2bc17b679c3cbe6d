"""The door of rung's OPC UA server: what asyncua 2.1 lets in that ``opcua_server`` shuts
out, refused where it arrives, each refusal one log line (``rung.opcua``, warning).

asyncua's server, left to itself, opens a secure channel of any policy whose URI it does
not find as a None channel (``SecureConnection.select_policy`` falls back to the channel's
initial None policy), checks a client certificate only when the CreateSession names one,
takes a password in clear text on whatever channel it came, buffers a message chunk whole
whatever size its header claims, and keeps every session created and never activated
(one connection may create hundreds) for the granted session timeout. Here:

- **Channels**: an OpenSecureChannel whose policy URI, or policy and mode, is not one of
  ``opcua_server.security`` is answered with an OPC UA TCP Error message
  ``BadSecurityPolicyRejected`` and the connection closed, before any session; with
  ``trusted_certificates``, a secure channel whose client certificate is not one of them
  likewise (``BadCertificateUntrusted``).
- **Sessions**: a session is activated only on a channel of the policy and mode it was
  created on (``BadSecurityPolicyRejected``), and a password only in the form that
  channel's endpoint offered it: in clear on a SignAndEncrypt channel (or on a server that
  offers None only), encrypted with the server's certificate elsewhere
  (``BadIdentityTokenInvalid``); a refused identity (unknown user, wrong password, a token
  kind not offered, a bad signature) is logged with the user's name, never the password.
- **Memory**: chunks of at most ``CHUNK`` bytes and messages of at most
  ``opcua_server.max_request_bytes`` + ``OVERHEAD`` (checked on each chunk's header, as it
  arrives: ``BadTcpMessageTooLarge`` / ``BadRequestTooLarge``, the connection closed);
  ``PENDING_MESSAGES`` chunks waiting per connection; ``max_sessions`` sessions and
  ``max_pending_sessions`` not yet activated (``BadTooManySessions``); a session not
  activated within ``activation_timeout_s`` closed with its connection; one connection
  holds one session not yet activated (a second CreateSession closes the first).

asyncua's own limits carry the rest (``Server.limits``: the sizes said in the Acknowledge;
``InternalServer.max_connections``, ``max_pending_activation_seconds``,
``max_pending_messages_per_connection``). The classes below are asyncua's server, binary
server, connection protocol and processor with these checks added; ``GuardedServer`` is
used as asyncua's ``Server``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from dataclasses import dataclass
from typing import Any

from asyncua import ua
from asyncua.common.connection import TransportLimits
from asyncua.common.utils import Buffer, ServiceError
from asyncua.crypto import security_policies, uacrypto
from asyncua.server.binary_server_asyncio import BinaryServer, OPCUAProtocol
from asyncua.server.internal_server import InternalServer
from asyncua.server.internal_session import InternalSession, SessionState
from asyncua.server.server import Server
from asyncua.server.uaprocessor import UaProcessor
from asyncua.ua.ua_binary import header_from_binary, struct_from_binary, uatcp_to_binary
from cryptography.exceptions import InvalidSignature

from rung.daemon.config import OpcUaServerConfig

__all__ = ["CHUNK", "OVERHEAD", "PENDING_MESSAGES", "Guard", "GuardedServer", "Refused"]

log = logging.getLogger("rung.opcua")
CHUNK = 65535              # a message chunk, either way (asyncua's default buffer size)
OVERHEAD = 64 * 1024       # beside a request: certificates, the OPC UA envelope; and room
# for answers (asyncua's client applies the server's message size to what it receives)
PENDING_MESSAGES = 64      # chunks received and waiting for the connection's processor
_CHUNK_ROOM = 1024         # a chunk's headers, signature and padding, at most
Channel = tuple[str, ua.MessageSecurityMode]   # policy URI, mode
_POLICIES = {"None": ua.SecurityPolicyType.NoSecurity,
             "Basic256Sha256_Sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
             "Basic256Sha256_SignAndEncrypt":
                 ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt}
_NONE_URI = security_policies.SecurityPolicyNone.URI
_OPEN_SESSION = ua.NodeId(ua.ObjectIds.CreateSessionRequest_Encoding_DefaultBinary)
_ACTIVATE = ua.NodeId(ua.ObjectIds.ActivateSessionRequest_Encoding_DefaultBinary)


class Refused(Exception):
    """A refusal: the status code the peer gets and the reason the log line gives."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason

    @property
    def status(self) -> str:
        return ua.StatusCode(self.code).name


def policy_types(cfg: OpcUaServerConfig) -> list[ua.SecurityPolicyType]:
    """``opcua_server.security`` as asyncua's policy types."""
    return [_POLICIES[p] for p in cfg.security]


def _name(channel: Channel) -> str:
    """A channel's policy and mode as ``opcua_server.security`` spells it."""
    uri, mode = channel
    for name, kind in _POLICIES.items():
        cls, m, _ = security_policies.SECURITY_POLICY_TYPE_MAP[kind]
        if (cls.URI, m) == (uri, mode):
            return name
    return f"{uri.rpartition('#')[2] or uri or '(none)'} mode {mode.name}"


def _peer(name: Any) -> str:
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)


@dataclass
class Guard:
    """What the server lets in, from ``opcua_server``; ``trusted``: the DER of the client
    certificates accepted (empty: any the policy accepts)."""

    cfg: OpcUaServerConfig
    trusted: frozenset[bytes] = frozenset()

    def __post_init__(self) -> None:
        self.offered: set[Channel] = set()
        for kind in policy_types(self.cfg):
            cls, mode, _ = security_policies.SECURITY_POLICY_TYPE_MAP[kind]
            self.offered.add((cls.URI, mode))
        self.max_message = self.cfg.max_request_bytes + OVERHEAD
        self.max_chunks = math.ceil(self.max_message / (CHUNK - _CHUNK_ROOM))
        # the sessions this server created, with the channel each was created on
        self.sessions: weakref.WeakKeyDictionary[InternalSession, Channel] = \
            weakref.WeakKeyDictionary()
        self.closing: set[asyncio.Task[None]] = set()   # sessions being closed

    def apply(self, server: Server) -> None:
        """Set asyncua's own limits on ``server`` (before it starts)."""
        c, iserver = self.cfg, server.iserver
        server.limits = TransportLimits(max_recv_buffer=CHUNK, max_send_buffer=CHUNK,
                                        max_chunk_count=self.max_chunks,
                                        max_message_size=self.max_message)
        iserver.max_connections = c.max_sessions + c.max_pending_sessions
        iserver.max_pending_activation_seconds = c.activation_timeout_s
        iserver.max_pending_messages_per_connection = PENDING_MESSAGES

    # -- the checks ------------------------------------------------------------------------

    def offered_names(self) -> str:
        return ", ".join(self.cfg.security)

    def channel_policy(self, uri: str | None, certificate: bytes | None) -> None:
        """An OpenSecureChannel's policy URI and client certificate (its clear header)."""
        if not any(uri == u for u, _ in self.offered):
            raise Refused(ua.StatusCodes.BadSecurityPolicyRejected,
                          f"security policy {(uri or '(none)').rpartition('#')[2]} is not "
                          f"offered (opcua_server.security: {self.offered_names()})")
        if uri != _NONE_URI and self.trusted:
            self._trusted(certificate)

    def channel_mode(self, channel: Channel) -> None:
        if channel not in self.offered:
            raise Refused(ua.StatusCodes.BadSecurityPolicyRejected,
                          f"security {_name(channel)} is not offered (opcua_server.security: "
                          f"{self.offered_names()})")

    def _trusted(self, certificate: bytes | None) -> None:
        if not certificate:
            raise Refused(ua.StatusCodes.BadCertificateInvalid,
                          "a secure channel without a client certificate")
        try:
            cert = uacrypto.x509_from_der(certificate)
        except ValueError:
            raise Refused(ua.StatusCodes.BadCertificateInvalid,
                          "the client certificate does not parse") from None
        if uacrypto.der_from_x509(cert) not in self.trusted:
            raise Refused(ua.StatusCodes.BadCertificateUntrusted,
                          f"client certificate {cert.subject.rfc4514_string()} is not in "
                          "opcua_server.trusted_certificates")

    def room(self) -> None:
        """Room for one more session (before a CreateSession)."""
        open_ = [s for s in self.sessions if s.state is not SessionState.Closed]
        pending = sum(1 for s in open_ if s.state is SessionState.Created)
        c = self.cfg
        if len(open_) >= c.max_sessions:
            raise Refused(ua.StatusCodes.BadTooManySessions,
                          f"{len(open_)} sessions open (opcua_server.max_sessions)")
        if pending >= c.max_pending_sessions:
            raise Refused(ua.StatusCodes.BadTooManySessions,
                          f"{pending} sessions not activated yet "
                          "(opcua_server.max_pending_sessions)")

    def activation(self, iserver: InternalServer, session: InternalSession | None,
                   channel: Channel, token: Any) -> None:
        """An ActivateSession of ``session`` on ``channel`` with identity ``token``."""
        if session is None:
            return   # asyncua answers BadSessionIdInvalid
        created = self.sessions.get(session)
        if created != channel:
            raise Refused(ua.StatusCodes.BadSecurityPolicyRejected,
                          f"a session created on {_name(created) if created else 'another'} "
                          f"channel is not activated on {_name(channel)}")
        if isinstance(token, ua.UserNameIdentityToken) and not token.EncryptionAlgorithm:
            wanted = _password_policy(iserver, channel)
            if wanted not in (None, "", _NONE_URI):
                raise Refused(ua.StatusCodes.BadIdentityTokenInvalid,
                              f"password of {token.UserName!r} sent in clear on a "
                              f"{_name(channel)} channel (this endpoint takes it encrypted, "
                              f"{wanted.rpartition('#')[2]})")


def _password_policy(iserver: InternalServer, channel: Channel) -> str | None:
    """The policy a password is encrypted with on ``channel``'s endpoint (asyncua's
    endpoint list); None when the endpoint offers no user name token."""
    for ep in iserver.endpoints:
        if (ep.SecurityPolicyUri, ep.SecurityMode) == channel:
            for policy in ep.UserIdentityTokens:
                if policy.TokenType == ua.UserTokenType.UserName:
                    return policy.SecurityPolicyUri or _NONE_URI
    return None


def _refuse(transport: Any, peer: Any, what: str, r: Refused) -> None:
    """One log line; the peer gets an OPC UA TCP Error message, the connection closes."""
    log.warning("opcua server: refused %s from %s: %s (%s)", what, _peer(peer), r.reason,
                r.status)
    if transport is not None and not transport.is_closing():
        transport.write(uatcp_to_binary(ua.MessageType.Error,
                                        ua.ErrorMessage(ua.StatusCode(r.code), r.reason)))
        transport.close()


def _who(token: Any) -> str:
    if isinstance(token, ua.UserNameIdentityToken):
        return f"a login as {token.UserName!r}"
    if isinstance(token, ua.AnonymousIdentityToken):
        return "an anonymous login"
    return f"a login ({type(token).__name__})"


class GuardedProcessor(UaProcessor):
    """asyncua's per-connection processor, with the channel and session checks."""

    def __init__(self, iserver: InternalServer, transport: Any, limits: TransportLimits,
                 guard: Guard) -> None:
        super().__init__(iserver, transport, limits)
        self.guard = guard
        self._activation: asyncio.TimerHandle | None = None   # the waiting session's

    def _channel(self) -> Channel:
        policy = self._connection.security_policy
        return policy.URI, policy.Mode

    async def process(self, header: ua.Header, body: Buffer) -> bool:
        try:
            if header.MessageType == ua.MessageType.SecureOpen \
                    and not self._connection.is_open():
                clear = struct_from_binary(ua.AsymmetricAlgorithmHeader,
                                           body.copy(header.body_size))
                self.guard.channel_policy(clear.SecurityPolicyURI, clear.SenderCertificate)
            ok: bool = await super().process(header, body)
            return ok
        except Refused as r:
            _refuse(self._transport, self.name, "a channel", r)
            return False

    def open_secure_channel(self, algohdr: Any, seqhdr: Any, body: Buffer) -> None:
        if not self._connection.is_open():
            request = struct_from_binary(ua.OpenSecureChannelRequest, body.copy())
            self.guard.channel_mode((algohdr.SecurityPolicyURI,
                                     request.Parameters.SecurityMode))
        super().open_secure_channel(algohdr, seqhdr, body)

    async def _process_message(self, typeid: ua.NodeId, requesthdr: ua.RequestHeader,
                               seqhdr: Any, body: Buffer) -> bool:
        if typeid == _OPEN_SESSION:
            return await self._create_session(typeid, requesthdr, seqhdr, body)
        if typeid == _ACTIVATE:
            return await self._activate_session(typeid, requesthdr, seqhdr, body)
        ok: bool = await super()._process_message(typeid, requesthdr, seqhdr, body)
        return ok

    async def _create_session(self, typeid: ua.NodeId, requesthdr: ua.RequestHeader,
                              seqhdr: Any, body: Buffer) -> bool:
        old = self.session
        if old is not None and old.state is SessionState.Created:
            await old.close_session(True)   # one session waiting per connection
        if self._activation is not None:
            self._activation.cancel()
        if self._session_watchdog_task is not None:   # asyncua starts one per session
            self._session_watchdog_task.cancel()
        try:
            self.guard.room()
        except Refused as r:
            log.warning("opcua server: refused a session from %s: %s (%s)", _peer(self.name),
                        r.reason, r.status)
            raise ServiceError(r.code) from None
        ok: bool = await super()._process_message(typeid, requesthdr, seqhdr, body)
        session = self.session
        if session is not None and session is not old:
            self.guard.sessions[session] = self._channel()
            self._activation = asyncio.get_running_loop().call_later(
                self.guard.cfg.activation_timeout_s, self._activation_due, session)
        return ok

    def _activation_due(self, session: InternalSession) -> None:
        """A session still not activated: closed, and its connection if it is this one's."""
        if session.state is not SessionState.Created:
            return
        if self.session is session and self._transport.is_closing():
            return   # closed with its connection (asyncua's processor closes it)
        log.warning("opcua server: closed a session from %s: not activated within %g s "
                    "(opcua_server.activation_timeout_s)", _peer(self.name),
                    self.guard.cfg.activation_timeout_s)
        task = asyncio.get_running_loop().create_task(session.close_session(True))
        self.guard.closing.add(task)
        task.add_done_callback(self.guard.closing.discard)
        if self.session is session:
            self._transport.close()

    async def _activate_session(self, typeid: ua.NodeId, requesthdr: ua.RequestHeader,
                                seqhdr: Any, body: Buffer) -> bool:
        params = struct_from_binary(ua.ActivateSessionParameters, body.copy())
        token = params.UserIdentityToken
        session = self.session or self.iserver.lookup_external_session(
            requesthdr.AuthenticationToken)
        try:
            self.guard.activation(self.iserver, session, self._channel(), token)
            try:
                ok: bool = await super()._process_message(typeid, requesthdr, seqhdr, body)
            except InvalidSignature:
                raise ServiceError(ua.StatusCodes.BadApplicationSignatureInvalid) from None
            return ok
        except Refused as r:
            log.warning("opcua server: refused %s from %s: %s (%s)", _who(token),
                        _peer(self.name), r.reason, r.status)
            raise ServiceError(r.code) from None
        except (ServiceError, ua.UaStatusCodeError) as e:
            status = ua.StatusCode(e.code).name
            why = {"BadUserAccessDenied": "unknown user or wrong password",
                   "BadIdentityTokenRejected": "this kind of login is not offered",
                   "BadSessionIdInvalid": "no such session"}.get(status, "refused")
            log.warning("opcua server: refused %s from %s: %s (%s)", _who(token),
                        _peer(self.name), why, status)
            raise


class GuardedProtocol(OPCUAProtocol):
    """asyncua's connection protocol: each chunk's header checked as it arrives (its size,
    and the message's chunks and bytes so far) before the chunk is buffered, each chunk
    then queued on its own (asyncua's queues a view of everything received)."""

    def __init__(self, iserver: InternalServer, policies: list[Any],
                 clients: list[OPCUAProtocol], closing_tasks: list[asyncio.Task[Any]],
                 limits: TransportLimits, guard: Guard) -> None:
        super().__init__(iserver, policies, clients, closing_tasks, limits)
        self.guard = guard
        self._received = bytearray()
        self._chunks = 0   # of the message being received, and their bytes
        self._bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.processor is None:   # asyncua closed it: max_connections reached
            c = self.guard.cfg
            log.warning("opcua server: refused a connection from %s: %d connections open "
                        "(opcua_server.max_sessions + max_pending_sessions) "
                        "(BadTooManySessions)", _peer(self.peer_name),
                        c.max_sessions + c.max_pending_sessions)
            return
        self.processor = GuardedProcessor(self.iserver, self.transport, self.limits,
                                          self.guard)
        self.processor.set_policies(self.policies)

    async def _activation_watchdog(self) -> None:
        """asyncua's: a connection with no session activated this long after it was
        made is closed; here with its log line."""
        await asyncio.sleep(self.iserver.max_pending_activation_seconds)
        session = None if self.processor is None else self.processor.session
        if self.transport is not None and not self.transport.is_closing() \
                and (session is None or not session.is_activated()):
            log.warning("opcua server: closed a connection from %s: no session activated "
                        "within %g s (opcua_server.activation_timeout_s)",
                        _peer(self.peer_name), self.iserver.max_pending_activation_seconds)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self._received += data
        while len(self._received) >= 8:
            size = int.from_bytes(self._received[4:8], "little")
            try:
                self._check(bytes(self._received[:4]), size)
            except Refused as r:
                _refuse(self.transport, self.peer_name, "a message", r)
                self._received.clear()
                return
            if len(self._received) < size:
                return
            chunk = Buffer(bytes(self._received[:size]))
            del self._received[:size]
            header = header_from_binary(chunk)
            try:
                self.messages.put_nowait((header, chunk))
            except asyncio.QueueFull:
                _refuse(self.transport, self.peer_name, "a message", Refused(
                    ua.StatusCodes.BadTcpNotEnoughResources,
                    f"more than {PENDING_MESSAGES} messages waiting on one connection"))
                return

    def _check(self, kind: bytes, size: int) -> None:
        """One chunk's header (message type, chunk type, size) against the limits."""
        secure = kind[:3] in (b"MSG", b"OPN", b"CLO")
        if size < (12 if secure else 8):
            raise Refused(ua.StatusCodes.BadTcpMessageTypeInvalid,
                          f"a malformed chunk header ({size} bytes)")
        if size > CHUNK:
            raise Refused(ua.StatusCodes.BadTcpMessageTooLarge,
                          f"a chunk of {size} bytes, at most {CHUNK}")
        chunks, total = self._chunks + 1, self._bytes + size
        wire = self.guard.max_message + self.guard.max_chunks * _CHUNK_ROOM
        if chunks > self.guard.max_chunks or total > wire:
            raise Refused(ua.StatusCodes.BadRequestTooLarge,
                          f"a message of more than {total} bytes in {chunks}+ chunks, at most "
                          f"{self.guard.max_message} (opcua_server.max_request_bytes "
                          f"{self.guard.cfg.max_request_bytes} + {OVERHEAD})")
        intermediate = kind[:3] == b"MSG" and kind[3:4] == b"C"
        self._chunks, self._bytes = (chunks, total) if intermediate else (0, 0)


class GuardedBinaryServer(BinaryServer):
    """asyncua's listening socket, its connections guarded."""

    def __init__(self, iserver: InternalServer, hostname: str, port: int,
                 limits: TransportLimits, guard: Guard) -> None:
        super().__init__(iserver, hostname, port, limits)
        self.guard = guard

    def _make_protocol(self) -> OPCUAProtocol:
        return GuardedProtocol(self.iserver, self._policies, self.clients,
                               self.closing_tasks, self.limits, self.guard)


class GuardedServer(Server):
    """asyncua's ``Server`` listening through ``GuardedBinaryServer``, asyncua's limits set
    from the guard."""

    def __init__(self, guard: Guard, **kw: Any) -> None:
        super().__init__(**kw)
        self.guard = guard
        guard.apply(self)

    async def start(self) -> None:
        """As ``Server.start``, with the guarded binary server."""
        await self._setup_server_nodes()
        await self.iserver.start()
        try:
            host, port = self._get_bind_socket_info()
            self.bserver = GuardedBinaryServer(self.iserver, host or "", port or 0,
                                               self.limits, self.guard)
            self.bserver.set_policies(self._policies)
            await self.bserver.start()
        except Exception:
            await self.iserver.stop()
            raise
