"""OPC UA failures in the PLC error family (``daemon/plc/errors.py``).

asyncua raises a ``UaStatusCodeError`` subclass per status code (a service or a whole
request refused), hands per-node results back as ``StatusCode`` values (one node of a Read
or Write refused), and raises ``ConnectionError``/``OSError``/``TimeoutError`` when the
transport fails. :func:`translate` turns each into a :class:`OpcUaConfigError` (retrying
cannot help: a node that does not exist, a type mismatch, a certificate rejected) or a
:class:`OpcUaTransientError`, with ``connection`` set when the session is gone (the link
drops it and reconnects with backoff) and a hint that says what to check.
"""

from __future__ import annotations

from rung.daemon.plc.errors import PlcError


class OpcUaError(PlcError):
    """An OPC UA operation failed; ``status``: the status code's name, when there is one."""

    status: str | None = None


class OpcUaConfigError(OpcUaError):
    """The map, the PLC program or a certificate is wrong: do not retry as is."""

    transient = False


class OpcUaTransientError(OpcUaError):
    """The server or the path to it is down, busy or restarting: retry with backoff."""

    transient = True


# status code name -> (transient, connection, hint). A name not here: config, the operation
# only (an unknown answer goes to a person, not a retry loop).
STATUS: dict[str, tuple[bool, bool, str | None]] = {
    "BadNodeIdUnknown": (False, False, "the server has no such node; check the map's NodeId "
                         "or browse path against the server (UaExpert shows both)"),
    "BadNodeIdInvalid": (False, False, "the NodeId is malformed for this server"),
    "BadNoMatch": (False, False, "no node at this browse path; check each segment's "
                   "namespace index and browse name"),
    "BadBrowseNameInvalid": (False, False, "a browse-path segment is not a valid name"),
    "BadAttributeIdInvalid": (False, False, "the node is no variable; name the variable"),
    "BadTypeMismatch": (False, False, "the node's data type does not take this value; "
                        "declare the handshake variables as integers or BOOL "
                        "(docs/opcua.md)"),
    "BadOutOfRange": (False, False, "the value is out of the node's range"),
    "BadNotWritable": (False, False, "the server does not let rung write this node; make "
                       "it writable for rung's user"),
    "BadNotReadable": (False, False, "the server does not let rung read this node"),
    "BadUserAccessDenied": (False, False, "the server does not let rung's user access this "
                            "node; grant it (or make the node writable)"),
    "BadWriteNotSupported": (False, False, "the server does not support this write"),
    "BadIdentityTokenRejected": (False, True, "the server refused rung's user or password"),
    "BadIdentityTokenInvalid": (False, True, "the server refused rung's user or password"),
    "BadUserSignatureInvalid": (False, True, "the server refused rung's user token"),
    "BadCertificateInvalid": (False, True, "the server refused rung's certificate"),
    "BadCertificateUntrusted": (False, True, "trust rung's certificate on the server "
                                "(docs/opcua.md, Security)"),
    "BadCertificateUriInvalid": (False, True, "the certificate's application URI does not "
                                 "match server.application_uri"),
    "BadSecurityChecksFailed": (False, True, "the server rejected rung's certificate or the "
                                "security settings; trust rung's certificate on the server "
                                "(docs/opcua.md, Security)"),
    "BadSecurityPolicyRejected": (False, True, "the server does not offer this security "
                                  "policy and mode"),
    "BadSessionIdInvalid": (True, True, None),
    "BadSessionClosed": (True, True, None),
    "BadSessionNotActivated": (True, True, None),
    "BadSecureChannelIdInvalid": (True, True, None),
    "BadSecureChannelClosed": (True, True, None),
    "BadConnectionClosed": (True, True, None),
    "BadNotConnected": (True, True, None),
    "BadServerNotConnected": (True, True, None),
    "BadServerHalted": (True, True, None),
    "BadShutdown": (True, True, None),
    "BadCommunicationError": (True, True, None),
    "BadTimeout": (True, True, None),
    "BadRequestTimeout": (True, True, None),
    "BadTooManySessions": (True, True, "the server's session limit is reached"),
    "BadTcpServerTooBusy": (True, True, None),
    "BadServerTooBusy": (True, False, None),
    "BadTooManyOperations": (True, False, None),
    "BadResourceUnavailable": (True, False, None),
    "BadWaitingForInitialData": (True, False, None),
    "BadOutOfService": (True, False, None),
    "BadDeviceFailure": (True, False, None),
    "BadSensorFailure": (True, False, None),
    "BadNoCommunication": (True, False, None),
    "BadInternalError": (True, False, None),
}


def status_error(plc: str, op: str, name: str, code: int | None = None,
                 detail: str | None = None) -> OpcUaError:
    """The error of a status code ``name`` (``BadNodeIdUnknown``) answered to ``op``."""
    transient, connection, hint = STATUS.get(name, (False, False, None))
    what = f" ({detail})" if detail else ""
    cls = OpcUaTransientError if transient else OpcUaConfigError
    error = cls(f"plc {plc}: {op}: the server answered {name}{what}", plc=plc, code=code,
                hint=hint, connection=connection)
    error.status = name
    return error


def translate(plc: str, op: str, exc: BaseException) -> OpcUaError:
    """A foreign exception raised by asyncua (or the transport under it) as an
    :class:`OpcUaError` naming the PLC and the operation."""
    from asyncua import ua
    from asyncua.ua.uaerrors._base import UaError, UaStatusCodeError

    if isinstance(exc, OpcUaError):
        return exc
    if isinstance(exc, UaStatusCodeError):
        name = ua.StatusCode(exc.code).name
        return status_error(plc, op, name, exc.code)
    if isinstance(exc, TimeoutError):
        return OpcUaTransientError(f"plc {plc}: {op}: no answer in time", plc=plc,
                                   connection=True)
    if isinstance(exc, ConnectionError | OSError | EOFError):
        why = str(exc) or type(exc).__name__
        return OpcUaTransientError(f"plc {plc}: {op}: connection failed ({why})", plc=plc,
                                   connection=True)
    if isinstance(exc, UaError):
        return OpcUaTransientError(f"plc {plc}: {op}: {exc or type(exc).__name__}", plc=plc,
                                   connection=True)
    return OpcUaConfigError(f"plc {plc}: {op}: {type(exc).__name__}: {exc}", plc=plc)
