"""The daemon's configuration: one YAML file, checked once at start-up into frozen dataclasses.

Every key is declared in a small schema per section (converter, expected form, nullability);
anything else is refused naming the dotted key, so a typo never passes silently. ``--set
KEY=VALUE`` overrides are merged before the check and get the same key-named errors.

Secrets: ``mqtt.password`` may be inline, or read from ``mqtt.password_file``. That key and
the TLS file keys may be written ``credential:NAME``, which means ``$CREDENTIALS_DIRECTORY/NAME``
(systemd ``LoadCredential=``). The password is kept out of ``repr`` and error messages.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import math
import os
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rung.daemon import keyed
from rung.daemon.keyed import read_yaml
from rung.daemon.text import text_problem
from rung.daemon.topics import MAX_TOPIC_BYTES, topic_problem
from rung.engines import DEFAULT_MEMORY_BUDGET_MB
from rung.engines.errors import RungError

CREDENTIAL = "credential:"
# Upper bounds of sizes and durations: far above any sensible setting, low enough that a
# typo (an extra three zeros) is refused naming its key instead of failing later as an
# allocation, an overflow or a wait that never ends.
MAX_BATCH = 64              # engine.max_batch: rows of KV buffers allocated at start-up
MAX_THREADS = 1024          # engine.threads
MAX_PENDING = 100_000       # queue.max_pending
MAX_DISK_MB = 1e7           # kv.disk_mb: 10 TB
YEAR_S = 365 * 86400.0      # timeouts, deadlines, retention
DAY_S = 86400.0             # reconnect backoff
MAX_HOST_BYTES = 255        # a DNS name's limit; addresses are shorter


def physical_memory_mb() -> float:
    """This machine's physical memory in MB (the bound of ``kv.ram_mb``); 1e7 where the
    system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, ValueError, OSError):
        return 1e7


class ConfigError(RungError):
    """The configuration is unusable; the message starts with the dotted key (or the file)."""


@dataclass(frozen=True)
class EngineConfig:
    """The exported engine and how it runs."""

    path: Path  # relative paths resolve against the config file's folder
    threads: int = 0  # intra-op threads; 0 = the ONNX Runtime default
    max_batch: int = 1  # requests decoded together
    prepack: bool | None = None  # ONNX Runtime weight prepacking; None = by precision, steps
    backend: str = "onnx"  # onnx (ONNX Runtime) | trt (the TensorRT plan of --target trt)
    provider: str | None = None  # ONNX Runtime's execution provider: cpu (None) | cuda
    decode: str = "auto"  # plain | fast (drafts checked per step) | auto (fast where exact)
    load_parts: int = 0  # sessions the graph is built as, in parallel: 0 = auto (by size), 1, 2
    # MiB; float weights are packed (prepack unset) only where the estimated peak fits
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB


@dataclass(frozen=True)
class TLSConfig:
    """TLS to the broker; each file may be ``credential:NAME``."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False  # skip the hostname check (test benches only)


@dataclass(frozen=True)
class MQTTConfig:
    """The broker connection; ``tls`` present (even empty) means TLS on."""

    host: str = "127.0.0.1"
    port: int = 1883
    base_topic: str = "rung/node1"
    client_id: str = "rung-node1"
    protocol: str = "5"  # "5" or "3.1.1"
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # resolved, never printed
    tls: TLSConfig | None = None
    keepalive_s: int = 30
    session_expiry_s: int = 86400  # persistent session lifetime on the broker (v5)
    max_payload_bytes: int = 65536
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    shared_group: str | None = None  # a fleet: requests taken through $share/{group}/...
    fleet_update_s: float = 5.0  # a fleet node republishes its status when its queue changed
    # a fleet node's PLC claim: renewed every lease/4; another node takes over a claim
    # nobody renews for a lease (docs/mqtt.md, One writer per PLC)
    fleet_lease_s: float = 90.0


@dataclass(frozen=True)
class QueueConfig:
    """The bounded request queue."""

    max_pending: int = 16
    request_timeout_s: float = 300.0  # deadline of a request without MQTT message expiry
    # SIGTERM: how long the sequences being generated may finish before the engine is
    # halted (they stay pending for the restart); systemd/rung.service's TimeoutStopSec
    # allows this plus STOP_TAIL_S
    stop_grace_s: float = 40.0


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint: loopback only, port 0 = off."""

    port: int = 0
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class KVConfig:
    """Cold KV tiers: compressed in RAM, persisted under ``state_dir/kv`` (0 = off)."""

    ram_mb: float = 256.0
    disk_mb: float = 2048.0


@dataclass(frozen=True)
class JournalConfig:
    """The delivery journal: how long answered request ids are kept for dedupe."""

    retention_s: float = 604800.0
    max_attempts: int = 3   # daemon deaths with a request in flight before it is quarantined


@dataclass(frozen=True)
class SparkplugConfig:
    """rung as a Sparkplug B edge node (its own client on the ``mqtt`` broker)."""

    enabled: bool = False
    group_id: str | None = None          # required when enabled
    edge_node_id: str | None = None      # default: mqtt.client_id
    client_id: str | None = None         # default: mqtt.client_id + "-spb"
    primary_host_id: str | None = None   # wait for this host's STATE before the births


@dataclass(frozen=True)
class RetriesConfig:
    """Verified retries of answers that fail validation (``task_runner.RetryPolicy``)."""

    attempts: int = 3            # tries per request, the first included (1: no retry)
    budget_s: float = 60.0       # no retry starts later than this after the first try
    temperature: float = 0.7     # a greedy request's retries are sampled at this
    per_task: Mapping[str, int] = field(default_factory=dict)   # task name -> attempts
    mode: str = "resample"       # resample, or feedback: the findings in the retry's prompt


@dataclass(frozen=True)
class StConfig:
    """Structured Text answers: the IEC 61131-3 edition of PLCopen XML files."""

    edition: int = 3   # 2: comments as (* *) for matiec (Beremiz, OpenPLC)


@dataclass(frozen=True)
class ModbusConfig:
    """Links to PLCs (the maps are ``plcs``): reconnect backoff, job deadline."""

    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    job_timeout_s: float = 300.0   # a triggered diagnosis not started by then: err 4


@dataclass(frozen=True)
class OpcUaServerConfig:
    """rung as an OPC UA server (docs/opcua.md, "rung as an OPC UA server"): off by
    default; security policies, rung's certificate, the client certificates it trusts, and
    the users file (``name:password`` lines) that makes every session log in; the size of
    a call's request, the sessions open and not yet activated, the time to activate one."""

    enabled: bool = False
    endpoint: str = "opc.tcp://127.0.0.1:4840/rung/"
    security: tuple[str, ...] = ("None",)
    certificate: Path | None = None
    private_key: Path | None = None
    trusted_certificates: tuple[Path, ...] = ()
    users_file: Path | None = None
    max_request_bytes: int = 65536     # a method's request; messages at most this + 64 KiB
    max_sessions: int = 32             # sessions open at once, activated or not
    max_pending_sessions: int = 8      # of them created and not activated yet
    activation_timeout_s: float = 10.0   # a session not activated by then is closed


@dataclass(frozen=True)
class LogConfig:
    """Log verbosity: debug, info, warning or error (normalized to lower case)."""

    level: str = "info"


@dataclass(frozen=True)
class Config:
    """The whole checked configuration; ``source`` is the file it came from, if any."""

    engine: EngineConfig
    mqtt: MQTTConfig
    queue: QueueConfig
    metrics: MetricsConfig
    kv: KVConfig
    journal: JournalConfig
    log: LogConfig
    modbus: ModbusConfig
    sparkplug: SparkplugConfig
    st: StConfig
    retries: RetriesConfig
    state_dir: Path
    tasks_dir: Path | None  # None = the built-in tasks
    plcs: tuple[Path, ...]  # PLC map files (Modbus register maps, OPC UA node maps)
    source: Path | None
    opcua_server: OpcUaServerConfig = field(default_factory=OpcUaServerConfig)


@dataclass(frozen=True)
class _Ctx:
    base_dir: Path
    env: Mapping[str, str]


# where relative paths and credentials resolve, while one config is being parsed
_CTX: ContextVar[_Ctx] = ContextVar("config_context")


def _int(lo: int, hi: int | None = None) -> keyed.Key:
    def conv(v: Any, key: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise keyed.Mismatch
        return v
    return keyed.Key(conv, f"an integer {lo}..{hi}" if hi is not None else f"an integer >= {lo}")


def _num(lo: float, hi: float, strict: bool = False, what: str = "") -> keyed.Key:
    """A finite number in [lo, hi] (``strict``: above lo); ``what`` names the bound."""
    def conv(v: Any, key: str) -> float:
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or v < lo or (strict and v == lo) or v > hi):
            raise keyed.Mismatch
        return float(v)
    bound = f"{hi:.0f}" if hi >= 1 else f"{hi:g}"
    return keyed.Key(conv, f"a number {'>' if strict else '>='} {lo:g} and <= {bound}"
                      + (f" ({what})" if what else ""))


def _str(ok: Callable[[str], bool] = bool, expect: str = "a non-empty string",
         nullable: bool = False, secret: bool = False) -> keyed.Key:
    def conv(v: Any, key: str) -> str:
        if not isinstance(v, str) or not ok(v):
            raise keyed.Mismatch
        return v
    return keyed.Key(conv, expect, nullable, secret)


def _choice(*options: str) -> keyed.Key:
    # YAML reads `protocol: 5` as an int and `level: INFO` in capitals: both normalize
    def conv(v: Any, key: str) -> str:
        text = str(v).lower() if isinstance(v, str | int) and not isinstance(v, bool) else None
        if text not in options:
            raise keyed.Mismatch
        return text
    return keyed.Key(conv, f"one of {', '.join(options)}")


def _bool(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise keyed.Mismatch
    return v


def _path(must: str | None = None, credential: bool = False, nullable: bool = False,
          expect: str = "a path") -> keyed.Key:
    def conv(v: Any, key: str) -> Path:
        if not isinstance(v, str) or not v:
            raise keyed.Mismatch
        if v.startswith(CREDENTIAL):
            name = v[len(CREDENTIAL):]
            if not credential:
                raise keyed.Invalid(key, f"{CREDENTIAL}NAME is only for mqtt.password_file and "
                                    "the mqtt.tls files")
            if not name or "/" in name or name in (".", ".."):
                raise keyed.Invalid(key, f"{v!r} does not name a credential")
            ctx = _CTX.get()
            if not ctx.env.get("CREDENTIALS_DIRECTORY"):
                raise keyed.Invalid(key, f"{v!r} needs systemd's LoadCredential= "
                                    "(CREDENTIALS_DIRECTORY is not set)",
                               f"add LoadCredential={name}:/path/to/file to the unit, "
                               "or set CREDENTIALS_DIRECTORY")
            path = Path(ctx.env["CREDENTIALS_DIRECTORY"]) / name
        else:
            path = _CTX.get().base_dir / v
        if must == "file" and not path.is_file():
            raise keyed.Invalid(key, f"{path} is not an existing file")
        if must == "dir" and not path.is_dir():
            raise keyed.Invalid(key, f"{path} is not an existing directory")
        if must == "no_file" and path.exists() and not path.is_dir():
            raise keyed.Invalid(key, f"{path} exists and is not a directory")
        return path
    return keyed.Key(conv, expect, nullable)


def _plcs(v: Any, key: str) -> tuple[Path, ...]:
    if v is None:  # `plcs:` with every entry commented out
        return ()
    if not isinstance(v, list):
        raise keyed.Mismatch
    file, out = _path("file"), []
    for i, item in enumerate(v):
        try:
            out.append(file.conv(item, f"{key}[{i}]"))
        except keyed.Mismatch:
            raise keyed.Invalid(f"{key}[{i}]", f"expected a path, got {keyed.show(item)}") from None
    return tuple(out)


def _section(cls: type[Any], schema: Mapping[str, keyed.Key], nullable: bool = False,
             check: Callable[[dict[str, Any], str], None] | None = None) -> keyed.Key:
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]

    def conv(v: Any, key: str) -> Any:
        values = keyed.fields(v, key, schema, required, keep_none=True)
        if check:
            check(values, key)
        return cls(**values)
    return keyed.Key(conv, "a mapping", nullable)


def _check_tls(values: dict[str, Any], key: str) -> None:
    if values.get("key_file") and not values.get("cert_file"):
        raise keyed.Invalid(f"{key}.key_file", f"needs {key}.cert_file as well")


def _check_mqtt(values: dict[str, Any], key: str) -> None:
    pw_file = values.pop("password_file", None)
    if pw_file is not None:
        if values.get("password") is not None:
            raise keyed.Invalid(f"{key}.password_file",
                           f"give either {key}.password or {key}.password_file, not both")
        try:
            text = pw_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise keyed.Invalid(f"{key}.password_file", f"cannot read {pw_file} "
                           f"({getattr(e, 'strerror', None) or type(e).__name__})") from None
        values["password"] = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
        if not values["password"]:
            raise keyed.Invalid(f"{key}.password_file", f"{pw_file} is empty")
    if (values.get("password") is not None and values.get("username") is None
            and values.get("protocol") == "3.1.1"):
        raise keyed.Invalid(f"{key}.password", "MQTT 3.1.1 sends a password only with a username",
                       f"set {key}.username or use protocol 5")
    lo = values.get("reconnect_min_s", MQTTConfig.reconnect_min_s)
    if values.get("reconnect_max_s", MQTTConfig.reconnect_max_s) < lo:
        raise keyed.Invalid(f"{key}.reconnect_max_s", f"must be >= {key}.reconnect_min_s ({lo:g})")
    client_id = values.get("client_id", MQTTConfig.client_id)
    why = topic_problem(client_id, level=True) if values.get("shared_group") else None
    if why is not None:
        raise keyed.Invalid(f"{key}.client_id", f"{keyed.show(client_id)} {why}: with "
                       f"{key}.shared_group set it names the node's status topic "
                       "{base}/fleet/{client_id}, one topic level")
    if values.get("shared_group"):
        _check_lease(values, key)


def _check_lease(values: dict[str, Any], key: str) -> None:
    """A fleet node's Last Will must come before its claim's lease runs out: a live node
    whose renewals stop is then offline (and keeps its PLC) before any other takes it."""
    keepalive = values.get("keepalive_s", MQTTConfig.keepalive_s)
    lease = values.get("fleet_lease_s", MQTTConfig.fleet_lease_s)
    if keepalive == 0:
        raise keyed.Invalid(f"{key}.keepalive_s", f"must be > 0 with {key}.shared_group set",
                            "a fleet node's Last Will ends its PLC claims when it vanishes")
    if lease < 3 * keepalive:
        raise keyed.Invalid(f"{key}.fleet_lease_s", f"must be >= 3 x {key}.keepalive_s "
                            f"({3 * keepalive:g}), got {lease:g}",
                            f"raise it, or lower {key}.keepalive_s")


def _check_modbus(values: dict[str, Any], key: str) -> None:
    lo = values.get("reconnect_min_s", ModbusConfig.reconnect_min_s)
    if values.get("reconnect_max_s", ModbusConfig.reconnect_max_s) < lo:
        raise keyed.Invalid(f"{key}.reconnect_max_s", f"must be >= {key}.reconnect_min_s ({lo:g})")


def _check_engine(values: dict[str, Any], key: str) -> None:
    if values.get("backend") == "trt" and values.get("provider") is not None:
        raise keyed.Invalid(f"{key}.provider", f"applies to {key}.backend onnx only",
                       "drop it: TensorRT always runs on the GPU")


def _check_metrics(values: dict[str, Any], key: str) -> None:
    host = values.get("host", "127.0.0.1")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise keyed.Invalid(f"{key}.host", f"{host!r} is not a loopback address",
                       "the endpoint has no authentication: keep it on 127.0.0.1 and let a "
                       "local agent or an SSH tunnel scrape it")


_BASE_TOPIC = ("a topic without wildcards (+ #), '$' prefix, control characters, empty "
               "levels or leading/trailing '/'")


def _base_topic(v: Any, key: str) -> str:
    """A topic name the broker takes (``topics.topic_problem``) that rung can extend by
    levels: no leading or trailing '/', no empty level."""
    if not isinstance(v, str):
        raise keyed.Mismatch
    why = topic_problem(v)
    if why is None and (v.startswith("/") or v.endswith("/")):
        why = "starts or ends with '/'"
    if why is None and "//" in v:
        why = "has an empty level ('//')"
    if why is not None:
        raise keyed.Invalid(key, f"expected {_BASE_TOPIC}, got {keyed.show(v)}, which {why}")
    return v


def _mqtt_str(expect: str, max_bytes: int = MAX_TOPIC_BYTES,
              nullable: bool = False) -> keyed.Key:
    """A non-empty string an MQTT broker takes (client id, user name): no control
    characters, non-characters or surrogates (``text.text_problem``), at most
    ``max_bytes`` of UTF-8."""
    def conv(v: Any, key: str) -> str:
        if not isinstance(v, str) or not v:
            raise keyed.Mismatch
        why = text_problem(v)
        if why is None and len(v.encode("utf-8")) > max_bytes:
            why = f"is longer than {max_bytes} bytes"
        if why is not None:
            raise keyed.Invalid(key, f"expected {expect}, got {keyed.show(v)}, which {why}")
        return v
    return keyed.Key(conv, expect, nullable)


def _password(v: Any, key: str) -> str:
    # MQTT passwords are binary data: any text, but the length field holds 65535 bytes
    if not isinstance(v, str):
        raise keyed.Mismatch
    try:
        size = len(v.encode("utf-8"))
    except UnicodeEncodeError:
        raise keyed.Mismatch from None
    if size > MAX_TOPIC_BYTES:
        raise keyed.Mismatch
    return v


_SPB_ID = "a Sparkplug id: one topic level without + # / or control characters"


def _sparkplug_id(s: str) -> bool:
    return topic_problem(s, level=True) is None


def _edition(v: Any, key: str) -> int:
    if isinstance(v, bool) or v not in (2, 3):
        raise keyed.Mismatch
    return int(v)


def _per_task(v: Any, key: str) -> dict[str, int]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise keyed.Mismatch
    out = {}
    for name, n in v.items():
        if not isinstance(name, str) or isinstance(n, bool) or not isinstance(n, int) \
                or not 1 <= n <= 10:
            raise keyed.Invalid(f"{key}.{name}", f"expected attempts 1..10, got {keyed.show(n)}")
        out[name] = n
    return out


_OPCUA_POLICIES = ("None", "Basic256Sha256_Sign", "Basic256Sha256_SignAndEncrypt")


def _policies(v: Any, key: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or any(p not in _OPCUA_POLICIES for p in v):
        raise keyed.Mismatch
    return tuple(dict.fromkeys(v))


def _paths(v: Any, key: str) -> tuple[Path, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise keyed.Mismatch
    file = _path("file", credential=True)
    return tuple(file.conv(item, f"{key}[{i}]") for i, item in enumerate(v))


def _check_opcua_server(values: dict[str, Any], key: str) -> None:
    endpoint = values.get("endpoint", OpcUaServerConfig.endpoint)
    if not endpoint.startswith("opc.tcp://"):
        raise keyed.Invalid(f"{key}.endpoint", f"expected opc.tcp://host:port/path, got "
                            f"{keyed.show(endpoint)}")
    sessions = values.get("max_sessions", OpcUaServerConfig.max_sessions)
    if values.get("max_pending_sessions", OpcUaServerConfig.max_pending_sessions) > sessions:
        raise keyed.Invalid(f"{key}.max_pending_sessions", f"at most {key}.max_sessions "
                            f"({sessions})", "sessions not yet activated are among them")
    secure = [p for p in values.get("security", ()) if p != "None"]
    for name in ("certificate", "private_key"):
        if secure and values.get(name) is None:
            raise keyed.Invalid(f"{key}.{name}", f"required with {key}.security {secure[0]}",
                                "rung's own certificate (DER or PEM) and its key (PEM)")


def _check_sparkplug(values: dict[str, Any], key: str) -> None:
    if values.get("enabled") and not values.get("group_id"):
        raise keyed.Invalid(f"{key}.group_id", f"required when {key}.enabled is true",
                       "name the Sparkplug group the SCADA host subscribes to")


_TLS = {"ca_file": _path("file", credential=True, nullable=True),
        "cert_file": _path("file", credential=True, nullable=True),
        "key_file": _path("file", credential=True, nullable=True),
        "insecure": keyed.Key(_bool, "true or false")}

_SHARE_NAME = ("a shared subscription group name: one topic level without + # / or control "
               "characters")

_MQTT = {
    "host": _mqtt_str(f"a non-empty host name or address (at most {MAX_HOST_BYTES} bytes)",
                      MAX_HOST_BYTES),
    "port": _int(1, 65535),
    "base_topic": keyed.Key(_base_topic, _BASE_TOPIC),
    "client_id": _mqtt_str("a non-empty string without control characters (at most "
                           f"{MAX_TOPIC_BYTES} bytes)"),
    "protocol": _choice("5", "3.1.1"),
    "username": _mqtt_str("a non-empty string without control characters (at most "
                          f"{MAX_TOPIC_BYTES} bytes)", nullable=True),
    "password": keyed.Key(_password, f"a string of at most {MAX_TOPIC_BYTES} bytes", nullable=True,
                     secret=True),
    "password_file": _path(credential=True, nullable=True),
    "tls": _section(TLSConfig, _TLS, nullable=True, check=_check_tls),
    "keepalive_s": _int(0, 65535),
    "session_expiry_s": _int(0, 2**32 - 1),
    "max_payload_bytes": _int(1, 268435455),  # the MQTT maximum packet size
    "reconnect_min_s": _num(0, DAY_S, strict=True, what="one day"),
    "reconnect_max_s": _num(0, DAY_S, strict=True, what="one day"),
    "shared_group": _str(lambda s: topic_problem(s, level=True) is None, _SHARE_NAME,
                         nullable=True),
    "fleet_update_s": _num(0, DAY_S, strict=True, what="one day"),
    "fleet_lease_s": _num(0, DAY_S, strict=True, what="one day"),
}

_TOP = {
    "engine": _section(EngineConfig, {"path": _path(expect="the exported engine directory"),
                                      "threads": _int(0, MAX_THREADS),
                                      "max_batch": _int(1, MAX_BATCH),
                                      "prepack": keyed.Key(_bool, "true or false",
                                                      nullable=True),
                                      "backend": _choice("onnx", "trt"),
                                      "provider": keyed.Key(_choice("cpu", "cuda").conv,
                                                       "one of cpu, cuda", nullable=True),
                                      "decode": _choice("auto", "plain", "fast"),
                                      "load_parts": _int(0, 2),
                                      "memory_budget_mb": _int(1, 1 << 24)},   # 16 TiB
                       check=_check_engine),
    "mqtt": _section(MQTTConfig, _MQTT, check=_check_mqtt),
    "queue": _section(QueueConfig, {"max_pending": _int(1, MAX_PENDING),
                                    "request_timeout_s": _num(0, YEAR_S, strict=True,
                                                              what="one year"),
                                    "stop_grace_s": _num(0, 3600, what="one hour")}),
    "metrics": _section(MetricsConfig, {"port": _int(0, 65535), "host": _str()},
                        check=_check_metrics),
    "kv": _section(KVConfig, {"ram_mb": _num(0, physical_memory_mb(),
                                             what="this machine's physical memory"),
                              "disk_mb": _num(0, MAX_DISK_MB, what="10 TB")}),
    "journal": _section(JournalConfig, {"retention_s": _num(0, YEAR_S, strict=True,
                                                             what="one year"),
                                        "max_attempts": _int(1, 100)}),
    "log": _section(LogConfig, {"level": _choice("debug", "info", "warning", "error")}),
    "sparkplug": _section(SparkplugConfig, {
        "enabled": keyed.Key(_bool, "true or false"),
        "group_id": _str(_sparkplug_id, _SPB_ID, nullable=True),
        "edge_node_id": _str(_sparkplug_id, _SPB_ID, nullable=True),
        "client_id": _str(lambda s: text_problem(s) is None and 0 < len(s.encode()) <= 65535,
                          "a client id without control characters", nullable=True),
        "primary_host_id": _str(_sparkplug_id, _SPB_ID, nullable=True)},
        check=_check_sparkplug),
    "st": _section(StConfig, {"edition": keyed.Key(_edition, "2 or 3")}),
    "retries": _section(RetriesConfig, {
        "attempts": _int(1, 10), "budget_s": _num(0, YEAR_S, what="one year"),
        "temperature": _num(0, 2, strict=True),
        "per_task": keyed.Key(_per_task, "a mapping of task name to attempts 1..10"),
        "mode": _choice("resample", "feedback")}),   # runner.RETRY_MODES
    "modbus": _section(ModbusConfig, {"reconnect_min_s": _num(0, DAY_S, strict=True,
                                                              what="one day"),
                                      "reconnect_max_s": _num(0, DAY_S, strict=True,
                                                              what="one day"),
                                      "job_timeout_s": _num(0, YEAR_S, strict=True,
                                                            what="one year")},
                       check=_check_modbus),
    "state_dir": _path("no_file", expect="a directory path"),
    "tasks_dir": _path("dir", nullable=True),
    "plcs": keyed.Key(_plcs, "a list of register-map file paths"),
    "opcua_server": _section(OpcUaServerConfig, {
        "enabled": keyed.Key(_bool, "true or false"),
        "endpoint": _str(expect="an opc.tcp:// URL"),
        "security": keyed.Key(_policies, f"a non-empty list of {', '.join(_OPCUA_POLICIES)}"),
        "certificate": _path("file", credential=True, nullable=True),
        "private_key": _path("file", credential=True, nullable=True),
        "trusted_certificates": keyed.Key(_paths, "a list of certificate file paths"),
        "users_file": _path("file", credential=True, nullable=True),
        "max_request_bytes": _int(1, 16 * 2**20),
        "max_sessions": _int(1, 1000),
        "max_pending_sessions": _int(1, 1000),
        "activation_timeout_s": _num(0, 600, strict=True, what="ten minutes")},
        check=_check_opcua_server),
}
_TOP_DEFAULTS: dict[str, Any] = {"engine": {}, "mqtt": {}, "queue": {}, "metrics": {}, "kv": {},
                                 "journal": {}, "log": {}, "modbus": {}, "sparkplug": {},
                                 "st": {}, "retries": {},
                                 "state_dir": "/var/lib/rung",
                                 "tasks_dir": None, "plcs": [], "opcua_server": {}}


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``--set KEY=VALUE`` to raw config data in place.

    ``KEY`` is dotted (``mqtt.port``); missing intermediate sections are created. ``VALUE``
    is parsed as YAML, so ``1884`` is an int and ``[a.yaml]`` a list.

    Raises:
        ConfigError: ``item`` is not ``KEY=VALUE``, the value is not YAML, or a key on the
            way is not a mapping.
    """
    key, sep, text = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):
        raise ConfigError(f"--set {key or item}: expected KEY=VALUE with a dotted KEY",
                          "e.g. --set mqtt.port=1884")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:  # the message would quote the value, which may be a secret
        raise ConfigError(f"--set {key}: the value is not valid YAML",
                          "quote it, e.g. --set 'mqtt.host=\"a:b\"'") from None
    node = data
    for i, part in enumerate(parts[:-1]):
        if node.get(part) is None:
            node[part] = {}
        if not isinstance(node[part], dict):
            raise ConfigError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a mapping")
        node = node[part]
    node[parts[-1]] = value


def parse_config(data: Mapping[str, Any], base_dir: Path, overrides: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, source: Path | None = None) -> Config:
    """Check raw config data (``--set`` overrides applied first) into a :class:`Config`.

    Relative paths resolve against ``base_dir``; ``credential:NAME`` against
    ``env["CREDENTIALS_DIRECTORY"]`` (``env`` defaults to ``os.environ``).

    Raises:
        ConfigError: the first invalid key, named in dotted form.
    """
    raw: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        apply_override(raw, item)
    overridden = [item.partition("=")[0].strip() for item in overrides]
    token = _CTX.set(_Ctx(Path(base_dir).absolute(), os.environ if env is None else env))
    try:
        values = keyed.fields({**_TOP_DEFAULTS, **raw}, "", _TOP, keep_none=True)
    except keyed.Invalid as e:
        from_set = any(e.key == k or e.key.startswith((f"{k}.", f"{k}[")) for k in overridden)
        where = "--set" if from_set else source
        raise ConfigError(f"{e.key}: {e.text}" + (f" [{where}]" if where else ""),
                          e.hint) from None
    finally:
        _CTX.reset(token)
    return Config(**values, source=source)


def load_config(path: Path | None, overrides: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> Config:
    """Read and check the config file at ``path`` (``None``: built-in defaults only).

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, not a mapping, or a key is
            invalid.
    """
    if path is None:
        return parse_config({}, Path.cwd(), overrides, env)
    path = Path(path)
    data = read_yaml(path, ConfigError, "config file", "pass --config with the path of rung.yaml")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, "
                          f"got a {type(data).__name__}")
    return parse_config(data, path.absolute().parent, overrides, env, source=path)
