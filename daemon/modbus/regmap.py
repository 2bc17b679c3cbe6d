"""Modbus register maps: one YAML file per PLC, checked once into frozen dataclasses.

A map names the PLC's transport, the handshake registers (the "Modbus handshake" contract)
and the points rung reads when the PLC asks for a diagnosis. What registers mean (tables,
types, word orders) is data in the tables below; the Modbus client and the simulated PLC
only move raw words and ask this module to plan reads, decode values and vet writes.

Every load error is a :class:`RegisterMapError` whose message reads
``"<file>: <dotted key>: <reason>"``, so a PLC programmer finds the line to fix.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
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
    History,
    Paced,
    check_distinct,
    check_watchdog,
    handshake_keys,
    point_limits,
)
from rung.engines.errors import RungError


class RegisterMapError(RungError):
    """A register map is unusable, or a value does not fit its register type."""


class WriteRefused(RegisterMapError):
    """A write outside the map's allowlist; raised before any I/O happens."""


@dataclass(frozen=True)
class TableSpec:
    """One Modbus data table: what it holds and the protocol's per-request limits."""

    name: str
    bits: bool  # single bits (coil, discrete) rather than 16-bit registers
    max_read: int  # FC1/FC2: 2000 bits, FC3/FC4: 125 registers
    max_write: int  # FC15: 1968 coils, FC16: 123 registers; 0 = read-only table

    @property
    def writable(self) -> bool:
        """Whether Modbus has a function that writes this table at all."""
        return self.max_write > 0


@dataclass(frozen=True)
class TypeSpec:
    """One value type: registers it occupies and its big-endian ``struct`` format."""

    name: str
    words: int  # registers (or, for bool in a bit table, bits)
    fmt: str  # of the value's bytes in ABCD order
    kind: str  # "bool", "int" or "float"


TABLES: dict[str, TableSpec] = {t.name: t for t in (
    TableSpec("coil", bits=True, max_read=2000, max_write=1968),
    TableSpec("discrete", bits=True, max_read=2000, max_write=0),
    TableSpec("holding", bits=False, max_read=125, max_write=123),
    TableSpec("input", bits=False, max_read=125, max_write=0),
)}

TYPES: dict[str, TypeSpec] = {t.name: t for t in (
    TypeSpec("bool", 1, ">H", "bool"),  # a register reads true when non-zero
    TypeSpec("int16", 1, ">h", "int"),
    TypeSpec("uint16", 1, ">H", "int"),
    TypeSpec("int32", 2, ">i", "int"),
    TypeSpec("uint32", 2, ">I", "int"),
    TypeSpec("float32", 2, ">f", "float"),
)}

# Where bytes A, B, C, D of a 32-bit value (A most significant) sit among the four bytes
# on the wire (each register big-endian, first register first). Every order here is its
# own inverse, but encoding still inverts the table rather than rely on that.
_WIRE_POSITION: dict[str, tuple[int, int, int, int]] = {
    "ABCD": (0, 1, 2, 3),
    "CDAB": (2, 3, 0, 1),
    "BADC": (1, 0, 3, 2),
    "DCBA": (3, 2, 1, 0),
}
WORD_ORDERS: tuple[str, ...] = tuple(_WIRE_POSITION)

@dataclass(frozen=True)
class Point:
    """One value in the PLC: where it lives and how raw words become engineering units.

    ``type`` defaults to ``bool`` for the bit tables (coil, discrete). ``word_order`` only
    matters for 32-bit types. ``limits`` are in engineering units (after scale and offset).
    """

    name: str
    table: str
    address: int
    type: str = "uint16"
    word_order: str = "ABCD"
    scale: float = 1.0
    offset: float = 0.0
    unit: str | None = None
    limits: dict[str, float] | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        # The declared default suits register tables; a bit holds nothing but a bool
        if self.type == "uint16" and self.table in TABLES and TABLES[self.table].bits:
            object.__setattr__(self, "type", "bool")

    @property
    def words(self) -> int:
        """Registers (or bits) the point occupies."""
        return TYPES[self.type].words


@dataclass(frozen=True)
class TcpTransport:
    """Modbus TCP to the PLC (or a gateway)."""

    host: str
    port: int = 502
    unit_id: int = 1
    timeout_s: float = 1.0
    kind: str = "tcp"


@dataclass(frozen=True)
class RtuTransport:
    """Modbus RTU over a serial line."""

    port: str
    baud: int = 19200
    parity: str = "E"  # N, E or O
    stopbits: int = 1  # 1 or 2
    bytesize: int = 8
    unit_id: int = 1
    timeout_s: float = 1.0
    kind: str = "rtu"


@dataclass(frozen=True)
class Handshake(Paced):
    """The handshake block (``daemon/plc/points.py``) in holding registers (0-based
    addresses).

    ``req`` and ``req_seq`` are written by the PLC; ``ack_seq`` .. ``heartbeat`` by rung.
    ``watchdog_s`` is how long the PLC program lets ``heartbeat`` stand still before it
    takes rung for down; rung's retries are paced by it (:attr:`retry_max_s`).
    """

    req: int
    req_seq: int
    ack_seq: int
    busy: int
    done: int
    err: int
    result: int
    heartbeat: int
    poll_s: float = 0.2
    heartbeat_s: float = 1.0
    watchdog_s: float = 5.0

    @property
    def owned(self) -> tuple[int, ...]:
        """The registers rung writes: ack_seq, busy, done, err, result, heartbeat."""
        return (self.ack_seq, self.busy, self.done, self.err, self.result, self.heartbeat)

    @property
    def registers(self) -> dict[str, int]:
        """All eight registers by handshake name."""
        return {name: getattr(self, name) for name in HANDSHAKE_VALUES}

    def read_span(self) -> tuple[int, int]:
        """``(start, count)`` of the one holding-register read that covers all eight.

        Raises:
            RegisterMapError: they span more than one request can read (a loaded map
                never does).
        """
        addresses = self.registers.values()
        start, count = min(addresses), max(addresses) - min(addresses) + 1
        if count > TABLES["holding"].max_read:
            raise RegisterMapError(f"handshake registers span {count} registers from {start}, "
                                   f"more than one read of {TABLES['holding'].max_read}")
        return start, count


@dataclass(frozen=True)
class ReadBlock:
    """One read request: ``count`` registers (or bits) from ``address``, holding ``points``."""

    table: str
    address: int
    count: int
    points: tuple[Point, ...]


@dataclass(frozen=True)
class PlcMap:
    """A checked register map for one PLC.

    ``writable`` holds every ``(table, address)`` rung may write: its own handshake
    registers plus the map's ``writable`` entries. ``fault_tree`` (``{top_event, system?}``)
    asks rung for a fault tree as well on each trigger.
    """

    id: str
    description: str
    transport: TcpTransport | RtuTransport
    handshake: Handshake
    points: tuple[Point, ...]
    writable: frozenset[tuple[str, int]]
    path: Path | None = None
    fault_tree: dict[str, Any] | None = None
    history: History | None = None

    def plan(self, max_gap: int = 8) -> list[ReadBlock]:
        """The snapshot's points in as few read requests as the map allows.

        Per table (in :data:`TABLES` order), points sorted by address join the current block
        while the block stays within the table's per-request maximum and at most ``max_gap``
        unmapped registers (or bits) lie between them; the gap is read and thrown away, so
        use ``max_gap=0`` for a PLC that refuses reads of unmapped addresses. Handshake
        registers are read separately (:meth:`Handshake.read_span`).
        """
        if max_gap < 0:
            raise RegisterMapError(f"{self.id}: max_gap must be >= 0, got {max_gap}")
        blocks: list[ReadBlock] = []
        for name, table in TABLES.items():
            group: list[Point] = []
            start = end = 0
            for p in sorted((p for p in self.points if p.table == name),
                            key=lambda p: p.address):
                last = p.address + p.words - 1
                if (group and p.address - end - 1 <= max_gap
                        and max(end, last) - start + 1 <= table.max_read):
                    group.append(p)
                    end = max(end, last)
                    continue
                if group:
                    blocks.append(ReadBlock(name, start, end - start + 1, tuple(group)))
                group, start, end = [p], p.address, last
            if group:
                blocks.append(ReadBlock(name, start, end - start + 1, tuple(group)))
        return blocks

    def check_write(self, table: str, address: int, count: int = 1) -> None:
        """Refuse a write unless every address in it is in :attr:`writable`.

        Raises:
            WriteRefused: naming the PLC, the table and the first refused address.
        """
        if count < 1:
            raise WriteRefused(f"{self.id}: {table} {address}: a write of {count} values")
        for a in range(address, address + count):
            if (table, a) not in self.writable:
                where = self.path.name if self.path else "the register map"
                raise WriteRefused(
                    f"{self.id}: {table} {a}: not writable by rung",
                    f"rung writes only its handshake registers and the `writable` entries "
                    f"of {where}")


def decode_words(words: Sequence[int], type: str, word_order: str = "ABCD") -> int | float:
    """Decode a value's raw registers (0..65535 each) into a number.

    ``word_order`` only matters for 32-bit types. A float32 comes back as the shortest
    decimal that is the same float32 (``123.45``, not ``123.44999694824219``). ``bool``
    gives ``True`` when the register is non-zero.

    Raises:
        RegisterMapError: unknown type or word order, wrong word count, a word out of range.
    """
    spec, positions = _type(type), _order(word_order)
    if len(words) != spec.words:
        raise RegisterMapError(f"{type} takes {spec.words} registers, got {len(words)}")
    for w in words:
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= 0xFFFF:
            raise RegisterMapError(f"a register holds 0..65535, got {w!r}")
    wire = b"".join(w.to_bytes(2, "big") for w in words)
    data = bytes(wire[p] for p in positions) if len(wire) == 4 else wire
    (value,) = struct.unpack(spec.fmt, data)
    return _FROM_RAW[spec.kind](value)


def encode_words(value: int | float, type: str, word_order: str = "ABCD") -> list[int]:
    """The registers that hold ``value`` as ``type`` (the inverse of :func:`decode_words`).

    Raises:
        RegisterMapError: unknown type or word order, or ``value`` does not fit the type
            (out of range, or not a whole number for an integer type).
    """
    spec, positions = _type(type), _order(word_order)
    try:
        data = struct.pack(spec.fmt, _TO_RAW[spec.kind](value))
    except (struct.error, OverflowError, TypeError, ValueError):
        raise RegisterMapError(f"{value!r} does not fit {type}") from None
    wire = bytearray(len(data))
    for i, byte in enumerate(data):
        wire[positions[i] if len(data) == 4 else i] = byte
    return [int.from_bytes(wire[i:i + 2], "big") for i in range(0, len(wire), 2)]


def decode(point: Point, raw: Sequence[int] | Sequence[bool]) -> float | int | bool:
    """A point's value from its raw words (or its one bit), in engineering units.

    Scale and offset apply to numeric types: ``raw * scale + offset``. An integer stays an
    int when scale is 1 and offset 0, else becomes a float computed from the numbers as the
    map writes them (853 with scale 0.1 is 85.3, not 85.30000000000001).

    Raises:
        RegisterMapError: unknown table or type, or ``raw`` has the wrong length.
    """
    if _table(point.table).bits:
        if len(raw) != 1:
            raise RegisterMapError(f"{point.name}: a {point.table} point takes 1 bit, "
                                   f"got {len(raw)}")
        return bool(raw[0])
    value = decode_words(raw, point.type, point.word_order)
    if isinstance(value, bool) or (point.scale == 1 and point.offset == 0):
        return value
    if isinstance(value, int):
        exact = Decimal(value) * Decimal(repr(point.scale)) + Decimal(repr(point.offset))
        return float(exact)
    return value * point.scale + point.offset


def values_from_block(block: ReadBlock,
                      raw: Sequence[int] | Sequence[bool]) -> dict[str, float | int | bool]:
    """Decode every point of ``block`` from the block's raw read (point name -> value).

    ``raw`` may be longer than the block: Modbus clients pad bit reads to whole bytes.

    Raises:
        RegisterMapError: ``raw`` is shorter than the block.
    """
    if len(raw) < block.count:
        raise RegisterMapError(f"{block.table} {block.address}: read returned {len(raw)} "
                               f"values, the block needs {block.count}")
    out: dict[str, float | int | bool] = {}
    for p in block.points:
        at = p.address - block.address
        out[p.name] = decode(p, raw[at:at + p.words])
    return out


def _type(name: str) -> TypeSpec:
    if name not in TYPES:
        raise RegisterMapError(f"expected a type, one of {', '.join(TYPES)}, got {name!r}")
    return TYPES[name]


def _order(name: str) -> tuple[int, int, int, int]:
    if name not in _WIRE_POSITION:
        raise RegisterMapError(f"expected a word order, one of {', '.join(WORD_ORDERS)}, "
                               f"got {name!r}")
    return _WIRE_POSITION[name]


def _table(name: str) -> TableSpec:
    if name not in TABLES:
        raise RegisterMapError(f"expected a table, one of {', '.join(TABLES)}, got {name!r}")
    return TABLES[name]


def _shortest_float32(value: float) -> float:
    if not math.isfinite(value):
        return value
    packed = struct.pack(">f", value)
    for digits in range(1, 10):  # 9 significant digits always round-trip a float32
        candidate = float(f"{value:.{digits}g}")
        if struct.pack(">f", candidate) == packed:
            return candidate
    return value


def _whole(value: int | float) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError
    return int(value)


def _flag(value: int | float) -> int:
    if value not in (0, 1):  # True and False compare equal to 1 and 0
        raise ValueError
    return int(value)


def _real(value: int | float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError
    return float(value)


_FROM_RAW: dict[str, Callable[[Any], int | float]] = {
    "bool": lambda v: v != 0, "int": int, "float": _shortest_float32}
_TO_RAW: dict[str, Callable[[int | float], int | float]] = {
    "bool": _flag, "int": _whole, "float": _real}


# ---- loading -------------------------------------------------------------------------------

_UNIT_ID = keyed.integer(1, 247, "an integer 1..247 (0 is broadcast, which answers no reads)")
_TIMEOUT = keyed.number(lambda v: v > 0, "a number > 0")
_TRANSPORTS: dict[str, tuple[type[TcpTransport | RtuTransport], dict[str, keyed.Key], str]] = {
    "tcp": (TcpTransport, {"kind": keyed.choice("tcp"), "host": keyed.text(253),
                           "port": keyed.integer(1, 65535), "unit_id": _UNIT_ID,
                           "timeout_s": _TIMEOUT},
            "host"),
    "rtu": (RtuTransport, {"kind": keyed.choice("rtu"),
                           "port": keyed.text(4096, expect="a serial device path"),
                           "baud": keyed.integer(1, 10_000_000,
                                                 "a positive integer (e.g. 9600, 19200)"),
                           "parity": keyed.choice("N", "E", "O"), "stopbits": keyed.integer(1, 2),
                           "bytesize": keyed.integer(7, 8), "unit_id": _UNIT_ID,
                           "timeout_s": _TIMEOUT},
            "port"),
}


def _transport(v: Any, key: str) -> TcpTransport | RtuTransport:
    if not isinstance(v, Mapping):
        raise keyed.Mismatch
    kind = v.get("kind")
    if kind not in _TRANSPORTS:
        got = "nothing" if kind is None else keyed.show(kind)
        raise keyed.Invalid(f"{key}.kind", f"expected one of {', '.join(_TRANSPORTS)}, got {got}")
    cls, schema, required = _TRANSPORTS[kind]
    return cls(**keyed.fields(v, key, schema, ("kind", required)))


def _handshake(values: dict[str, Any], key: str) -> Handshake:
    check_distinct(values, key, "every handshake register needs its own address")
    seen = [values[name] for name in HANDSHAKE_VALUES]
    span = max(seen) - min(seen) + 1
    if span > TABLES["holding"].max_read:
        raise keyed.Invalid(key, f"the registers span {span} addresses ({min(seen)}..{max(seen)}), "
                            f"more than one read of {TABLES['holding'].max_read}",
                            "keep the eight handshake registers close together")
    hs = Handshake(**values)
    check_watchdog(hs, key, "the heartbeat moves every heartbeat_s + poll_s at worst; set "
                            "watchdog_s to the PLC program's heartbeat watchdog (5 s or more "
                            "is usual)")
    return hs


def _point(v: Any, key: str) -> Point:
    values = keyed.fields(v, key, _POINT, ("name", "table", "address"))
    table = TABLES[values["table"]]
    type_ = values.setdefault("type", "bool" if table.bits else "uint16")
    spec = TYPES[type_]
    if table.bits and type_ != "bool":
        raise keyed.Invalid(f"{key}.type",
                            f"the {table.name} table holds single bits: expected bool, "
                            f"got {type_!r}")
    if values["address"] + spec.words - 1 > 0xFFFF:
        raise keyed.Invalid(f"{key}.address", f"a {type_} at {values['address']} runs past address "
                            "65535")
    if spec.kind == "bool":
        for name in ("scale", "offset", "limits"):
            if name in values:
                raise keyed.Invalid(f"{key}.{name}", "only for numeric types; this point is a bool")
    if "word_order" in values and spec.words != 2:
        raise keyed.Invalid(f"{key}.word_order", f"only for 32-bit types (int32, uint32, float32), "
                            f"not {type_} ({'one bit' if table.bits else 'one register'})",
                            "remove word_order, or give the point its 32-bit type")
    return Point(**values)


def _writable(v: Any, key: str) -> tuple[str, int, int, str]:
    values = keyed.fields(v, key, _WRITABLE, ("table", "address"))
    table, address, count = values["table"], values["address"], values.get("count", 1)
    if not TABLES[table].writable:
        writable = ", ".join(t.name for t in TABLES.values() if t.writable)
        raise keyed.Invalid(f"{key}.table", f"the {table} table is read-only; expected {writable}")
    if address + count - 1 > 0xFFFF:
        raise keyed.Invalid(f"{key}.count", f"{count} addresses from {address} run past 65535")
    return table, address, count, key


_HANDSHAKE = handshake_keys(keyed.integer(0, 0xFFFF))
_LIMITS = {name: keyed.number() for name in LIMIT_KEYS}
_POINT = {
    "name": keyed.text(64, NAME_PATTERN, "a name of 1..64 letters, digits, '_', '.' or '-'"),
    "table": keyed.choice(*TABLES),
    "address": keyed.integer(0, 0xFFFF),
    "type": keyed.choice(*TYPES),
    "word_order": keyed.choice(*WORD_ORDERS),
    "scale": keyed.number(lambda v: v != 0, "a non-zero number"),
    "offset": keyed.number(),
    "unit": keyed.text(16, nullable=True),
    "limits": keyed.section(point_limits, _LIMITS, nullable=True),
    "description": keyed.text(200, nullable=True),
}
_WRITABLE = {"table": keyed.choice(*TABLES), "address": keyed.integer(0, 0xFFFF),
             "count": keyed.integer(1, 0x10000)}
_TOP = {
    "id": keyed.text(64, ID_PATTERN, "1..64 letters, digits, '_' or '-' (an MQTT topic level)"),
    "description": keyed.text(2000, nullable=True),
    "transport": keyed.Key(_transport, "a mapping with kind: tcp or kind: rtu"),
    "handshake": keyed.section(_handshake, _HANDSHAKE, HANDSHAKE_VALUES),
    "points": keyed.listof(_point, f"a list of 1..{MAX_POINTS} points", 1, MAX_POINTS),
    "writable": keyed.listof(_writable, "a list of {table, address, count} entries", 0, 0xFFFF,
                      nullable=True),
    "fault_tree": FAULT_TREE_KEY,
    "history": HISTORY_KEY,
}


def _span(p: Point) -> tuple[int, int]:
    return p.address, p.address + p.words - 1


def _check_layout(points: Sequence[Point], handshake: Handshake) -> None:
    named = [(f"handshake.{name}", "holding", (a, a))
             for name, a in handshake.registers.items()]
    names: dict[str, int] = {}
    for i, p in enumerate(points):
        key = f"points[{i}]"
        if p.name in names:
            raise keyed.Invalid(f"{key}.name", f"{p.name!r} is also points[{names[p.name]}].name")
        names[p.name] = i
        lo, hi = _span(p)
        for other, table, (olo, ohi) in named:
            if table == p.table and lo <= ohi and olo <= hi:
                raise keyed.Invalid(f"{key}.address", f"{p.name!r} ({p.table} {lo}..{hi}) overlaps "
                                    f"{other} ({table} {olo}..{ohi})")
        named.append((f"points[{i}] {p.name!r}", p.table, (lo, hi)))


def _allowlist(entries: Sequence[tuple[str, int, int, str]],
               handshake: Handshake) -> frozenset[tuple[str, int]]:
    plc_owned = {getattr(handshake, name): name for name in PLC_WRITES}
    allowed = {("holding", a) for a in handshake.owned}
    for table, address, count, key in entries:
        for a in range(address, address + count):
            if table == "holding" and a in plc_owned:
                raise keyed.Invalid(key, f"covers handshake.{plc_owned[a]} ({a}), which the "
                                    "PLC writes")
            allowed.add((table, a))
    return frozenset(allowed)


def parse_map(data: Mapping[str, Any], source: Path) -> PlcMap:
    """Check raw register-map data (from ``source``, named in errors) into a :class:`PlcMap`.

    Raises:
        RegisterMapError: the first invalid key, as ``"<file>: <dotted key>: <reason>"``.
    """
    if not isinstance(data, Mapping):
        raise RegisterMapError(f"{source}: expected a mapping of keys at the top level, "
                               f"got a {type(data).__name__}")
    try:
        values = keyed.fields(data, "", _TOP, ("id", "transport", "handshake", "points"))
        _check_layout(values["points"], values["handshake"])
        allowed = _allowlist(values.pop("writable", ()), values["handshake"])
    except keyed.Invalid as e:
        raise RegisterMapError(f"{source}: {e.key}: {e.text}", e.hint) from None
    values.setdefault("description", "")
    return PlcMap(**values, writable=allowed, path=source)


def load_map(path: Path) -> PlcMap:
    """Read and check the register-map file at ``path``.

    Raises:
        RegisterMapError: the file is missing, unreadable, not YAML, or a key is invalid.
    """
    path = Path(path)
    data = keyed.read_yaml(path, RegisterMapError, "register-map file",
                     "check the `plcs` list in the config")
    return parse_map({} if data is None else data, path)
