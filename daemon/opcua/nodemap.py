"""OPC UA node maps: one YAML file per PLC (``protocol: opcua``), checked once into frozen
dataclasses, beside the Modbus register maps in ``configs/plcs/``.

A node map names the server (endpoint, security, user), the handshake's eight nodes and
the snapshot's points. Points are the register map's point model (name, unit, limits,
scale/offset, description) with a node in place of a table and an address. A node is a
NodeId (``ns=2;s=Rung.req``, ``nsu=urn:plc;i=1001``, ``i=2258``) or a browse path from the
Objects folder (``/2:PLC/2:Rung/2:req``; a segment without ``N:`` is in ``server.namespace``).
Nothing here imports asyncua: NodeIds and browse paths are checked as text and resolved on
the server at connect (``daemon/opcua/link.py``).

Every load error is a :class:`NodeMapError` whose message reads ``"<file>: <dotted key>:
<reason>"``; secrets (the password) are read here and never shown.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rung.daemon import keyed
from rung.daemon.plc.points import (
    FAULT_TREE_KEY,
    HANDSHAKE_VALUES,
    HISTORY_KEY,
    ID_PATTERN,
    LIMIT_KEYS,
    MAX_POINTS,
    NAME_PATTERN,
    PLC_WRITES,
    RUNG_WRITES,
    History,
    Paced,
    check_distinct,
    check_watchdog,
    handshake_keys,
    point_limits,
)
from rung.engines.errors import RungError

CREDENTIAL = "credential:"
POLICIES = {"None": ("None",), "Basic256Sha256": ("Sign", "SignAndEncrypt")}
# auto: whatever the server holds (a number or a bool); number: any number; the rest insist
POINT_TYPES = ("auto", "number", "bool", "int", "float")
# ns=<index>;<kind>=<id> | nsu=<uri>;<kind>=<id> | <kind>=<id> (namespace 0)
_NODEID = re.compile(r"(?:(?:ns=(?P<ns>\d{1,5})|nsu=(?P<nsu>[^;]+));)?(?P<kind>[isgb])="
                     r"(?P<id>.+)", re.DOTALL)
_SEGMENT = re.compile(r"(?:(?P<ns>\d{1,5}):)?(?P<name>[^/]+)")


class NodeMapError(RungError):
    """A node map is unusable."""


@dataclass(frozen=True)
class NodeRef:
    """One node as the map names it: a NodeId (``nodeid``: its text, ``nsu``: a namespace
    URI to resolve) or a browse path (``path``: ``(namespace index or None, name)`` per
    segment from the Objects folder). ``key``: the map key, for messages."""

    text: str
    key: str
    nodeid: str | None = None
    nsu: str | None = None
    path: tuple[tuple[int | None, str], ...] = ()

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Security:
    """The secure channel: ``policy`` None or Basic256Sha256, ``mode`` None, Sign or
    SignAndEncrypt; the client's certificate and key, and the one server certificate
    rung trusts (required for Basic256Sha256)."""

    policy: str = "None"
    mode: str = "None"
    certificate: Path | None = None
    private_key: Path | None = None
    server_certificate: Path | None = None


@dataclass(frozen=True)
class Server:
    """The PLC's OPC UA server: endpoint, security, user, per-request timeout and the
    namespace of browse-path segments without an index."""

    endpoint: str
    security: Security = field(default_factory=Security)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 2.0
    namespace: str | None = None
    application_uri: str = "urn:rung:client"


@dataclass(frozen=True)
class NodeHandshake(Paced):
    """The handshake block (``daemon/plc/points.py``) in nodes. ``req`` and ``req_seq`` are
    the PLC's; the rest rung's.
    ``poll_s`` is the supervision cycle (a request is seen at once through the
    subscription on req/req_seq), ``heartbeat_s`` and ``watchdog_s`` as for Modbus."""

    req: NodeRef
    req_seq: NodeRef
    ack_seq: NodeRef
    busy: NodeRef
    done: NodeRef
    err: NodeRef
    result: NodeRef
    heartbeat: NodeRef
    poll_s: float = 0.5
    heartbeat_s: float = 1.0
    watchdog_s: float = 5.0

    @property
    def nodes(self) -> dict[str, NodeRef]:
        return {name: getattr(self, name) for name in HANDSHAKE_VALUES}


@dataclass(frozen=True)
class NodePoint:
    """One snapshot value: a register-map point with a node for its place. ``type``:
    ``auto`` takes a number or a bool as the server holds it, ``number`` any number,
    ``int``/``float``/``bool`` insist (a value of another type fails the read as a type
    mismatch)."""

    name: str
    node: NodeRef
    type: str = "auto"
    scale: float = 1.0
    offset: float = 0.0
    unit: str | None = None
    limits: dict[str, float] | None = None
    description: str | None = None


@dataclass(frozen=True)
class NodeMap:
    """A checked node map for one PLC. ``writable``: the nodes rung may write besides its
    own six handshake nodes (by text)."""

    id: str
    description: str
    server: Server
    handshake: NodeHandshake
    points: tuple[NodePoint, ...]
    writable: frozenset[str]
    path: Path | None = None
    fault_tree: dict[str, Any] | None = None
    history: History | None = None
    protocol: str = "opcua"

    @property
    def allowed(self) -> frozenset[str]:
        """Every node rung may write: its handshake nodes and ``writable``."""
        hs = self.handshake.nodes
        return frozenset(str(hs[name]) for name in RUNG_WRITES) | self.writable


# ---- loading -------------------------------------------------------------------------------

def _noderef(v: Any, key: str) -> NodeRef:
    if not isinstance(v, str) or not v.strip() or len(v) > 4096:
        raise keyed.Mismatch
    text = v.strip()
    if text.startswith("/"):
        segments = []
        for part in text[1:].split("/"):
            m = _SEGMENT.fullmatch(part)
            if m is None:
                raise keyed.Invalid(key, f"{text!r}: empty segment in the browse path")
            ns = m["ns"]
            segments.append((int(ns) if ns is not None else None, m["name"]))
        return NodeRef(text, key, path=tuple(segments))
    m = _NODEID.fullmatch(text)
    if m is None:
        raise keyed.Invalid(key, f"expected a NodeId (ns=2;s=Name, ns=2;i=1001, "
                            f"nsu=URI;s=Name) or a browse path (/2:Folder/2:Name), got "
                            f"{keyed.show(text)}")
    if m["kind"] == "i" and not m["id"].isdigit():
        raise keyed.Invalid(key, f"{text!r}: a numeric NodeId (i=) takes digits")
    if m["nsu"] is not None:
        return NodeRef(text, key, nodeid=f"{m['kind']}={m['id']}", nsu=m["nsu"])
    return NodeRef(text, key, nodeid=text)


_NODE = keyed.Key(_noderef, "a NodeId (ns=2;s=Name) or a browse path (/2:Folder/2:Name)")
_TIMEOUT = keyed.number(lambda v: v > 0, "a number > 0")


def _file(v: Any, key: str) -> Path:
    """A file path relative to the map's folder, or ``credential:NAME`` (systemd's
    ``LoadCredential=``); it must exist."""
    if not isinstance(v, str) or not v:
        raise keyed.Mismatch
    if v.startswith(CREDENTIAL):
        name = v[len(CREDENTIAL):]
        if not name or "/" in name or name in (".", ".."):
            raise keyed.Invalid(key, f"{v!r} does not name a credential")
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise keyed.Invalid(key, f"{v!r} needs systemd's LoadCredential= "
                                "(CREDENTIALS_DIRECTORY is not set)",
                                f"add LoadCredential={name}:/path/to/file to the unit")
        path = Path(directory) / name
    else:
        path = _FOLDER.get() / v
    if not path.is_file():
        raise keyed.Invalid(key, f"{path} is not an existing file")
    return path


# the folder relative paths resolve against while one map is checked
_FOLDER: ContextVar[Path] = ContextVar("node_map_folder", default=Path("."))
_FILE = keyed.Key(_file, "a file path (relative to the map) or credential:NAME",
                  nullable=True)


def _security(values: dict[str, Any], key: str) -> Security:
    sec = Security(**values)
    if sec.policy not in POLICIES:
        raise keyed.Invalid(f"{key}.policy", f"expected one of {', '.join(POLICIES)}, got "
                            f"{keyed.show(sec.policy)}")
    if sec.mode not in POLICIES[sec.policy]:
        raise keyed.Invalid(f"{key}.mode", f"with policy {sec.policy} expected "
                            f"{' or '.join(POLICIES[sec.policy])}, got {keyed.show(sec.mode)}")
    if sec.policy != "None":
        for name in ("certificate", "private_key", "server_certificate"):
            if getattr(sec, name) is None:
                raise keyed.Invalid(f"{key}.{name}", f"required with policy {sec.policy}",
                                    "rung trusts exactly the server certificate named here; "
                                    "docs/opcua.md, Security")
    return sec


def _server(values: dict[str, Any], key: str) -> Server:
    password_file = values.pop("password_file", None)
    if password_file is not None:
        if values.get("user") is None:
            raise keyed.Invalid(f"{key}.user", f"required with {key}.password_file")
        try:
            values["password"] = password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise keyed.Invalid(f"{key}.password_file",
                                f"cannot read {password_file} ({type(e).__name__})") from None
    elif values.get("user") is not None:
        raise keyed.Invalid(f"{key}.password_file", f"required with {key}.user",
                            "a file holding the password, or credential:NAME")
    endpoint = values["endpoint"]
    if not endpoint.startswith("opc.tcp://"):
        raise keyed.Invalid(f"{key}.endpoint", f"expected opc.tcp://host:port[/path], got "
                            f"{keyed.show(endpoint)}")
    values.setdefault("security", Security())
    return Server(**values)


def _handshake(values: dict[str, Any], key: str) -> NodeHandshake:
    check_distinct(values, key, "every handshake value needs its own node")
    hs = NodeHandshake(**values)
    check_watchdog(hs, key, "set watchdog_s to the PLC program's heartbeat watchdog")
    return hs


def _point(v: Any, key: str) -> NodePoint:
    values = keyed.fields(v, key, _POINT, ("name", "node"))
    if values.get("type") == "bool":
        for name in ("scale", "offset", "limits"):
            if name in values:
                raise keyed.Invalid(f"{key}.{name}", "only for numeric types; this point is "
                                    "a bool")
    return NodePoint(**values)


_SECURITY = {"policy": keyed.choice(*POLICIES),
             "mode": keyed.choice("None", "Sign", "SignAndEncrypt"),
             "certificate": _FILE, "private_key": _FILE, "server_certificate": _FILE}
_SERVER = {
    "endpoint": keyed.text(1024, expect="an opc.tcp:// URL"),
    "security": keyed.section(_security, _SECURITY, nullable=True),
    "user": keyed.text(256, nullable=True),
    "password_file": _FILE,
    "timeout_s": _TIMEOUT,
    "namespace": keyed.text(1024, nullable=True),
    "application_uri": keyed.text(1024),
}
_HANDSHAKE = handshake_keys(_NODE)
_POINT = {
    "name": keyed.text(64, NAME_PATTERN, "a name of 1..64 letters, digits, '_', '.' or '-'"),
    "node": _NODE,
    "type": keyed.choice(*POINT_TYPES),
    "scale": keyed.number(lambda v: v != 0, "a non-zero number"),
    "offset": keyed.number(),
    "unit": keyed.text(16, nullable=True),
    "limits": keyed.section(point_limits, {name: keyed.number() for name in LIMIT_KEYS},
                            nullable=True),
    "description": keyed.text(200, nullable=True),
}
_TOP = {
    "protocol": keyed.choice("opcua"),
    "id": keyed.text(64, ID_PATTERN, "1..64 letters, digits, '_' or '-' (an MQTT topic level)"),
    "description": keyed.text(2000, nullable=True),
    "server": keyed.section(_server, _SERVER, ("endpoint",)),
    "handshake": keyed.section(_handshake, _HANDSHAKE, HANDSHAKE_VALUES),
    "points": keyed.listof(_point, f"a list of 1..{MAX_POINTS} points", 1, MAX_POINTS),
    "writable": keyed.listof(_noderef, "a list of nodes", 0, 1000, nullable=True),
    "fault_tree": FAULT_TREE_KEY,
    "history": HISTORY_KEY,
}


def _check(values: dict[str, Any]) -> frozenset[str]:
    hs: NodeHandshake = values["handshake"]
    nodes = {str(ref): f"handshake.{name}" for name, ref in hs.nodes.items()}
    for name, ref in hs.nodes.items():
        if ref.path and any(ns is None for ns, _ in ref.path) \
                and values["server"].namespace is None:
            raise _unqualified(f"handshake.{name}", ref)
    names: dict[str, int] = {}
    for i, p in enumerate(values["points"]):
        if p.name in names:
            raise keyed.Invalid(f"points[{i}].name", f"{p.name!r} is also "
                                f"points[{names[p.name]}].name")
        names[p.name] = i
        if p.node.path and any(ns is None for ns, _ in p.node.path) \
                and values["server"].namespace is None:
            raise _unqualified(f"points[{i}].node", p.node)
    writable = values.pop("writable", None) or ()
    for i, ref in enumerate(writable):
        owner = nodes.get(str(ref))
        if owner in tuple(f"handshake.{name}" for name in PLC_WRITES):
            raise keyed.Invalid(f"writable[{i}]", f"{ref} is {owner}, which the PLC writes")
    return frozenset(str(ref) for ref in writable)


def _unqualified(key: str, ref: NodeRef) -> keyed.Invalid:
    return keyed.Invalid(key, f"{ref}: a browse-path segment without a namespace index",
                         "write 2:Name, or set server.namespace to the namespace URI")


def parse_node_map(data: Mapping[str, Any], source: Path) -> NodeMap:
    """Check raw node-map data (from ``source``, named in errors; relative files resolve
    against its folder) into a :class:`NodeMap`.

    Raises:
        NodeMapError: the first invalid key, as ``"<file>: <dotted key>: <reason>"``.
    """
    if not isinstance(data, Mapping):
        raise NodeMapError(f"{source}: expected a mapping of keys at the top level, got a "
                           f"{type(data).__name__}")
    token = _FOLDER.set(Path(source).absolute().parent)
    try:
        values = keyed.fields(data, "", _TOP, ("protocol", "id", "server", "handshake",
                                                "points"))
        writable = _check(values)
    except keyed.Invalid as e:
        raise NodeMapError(f"{source}: {e.key}: {e.text}", e.hint) from None
    finally:
        _FOLDER.reset(token)
    values.pop("protocol")
    values.setdefault("description", "")
    return NodeMap(**values, writable=writable, path=Path(source))


def load_node_map(path: Path) -> NodeMap:
    """Read and check the node-map file at ``path``."""
    path = Path(path)
    data = keyed.read_yaml(path, NodeMapError, "node-map file",
                           "check the `plcs` list in the config")
    return parse_node_map({} if data is None else data, path)
