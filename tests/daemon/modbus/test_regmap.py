"""Register maps: the example loads, reads are planned into few blocks, values decode in
every word order, every bad map names its key, and writes outside the allowlist are refused."""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.modbus.regmap import (
    TABLES,
    TYPES,
    WORD_ORDERS,
    Handshake,
    PlcMap,
    Point,
    ReadBlock,
    RegisterMapError,
    TcpTransport,
    WriteRefused,
    decode,
    decode_words,
    encode_words,
    load_map,
    parse_map,
    values_from_block,
)

EXAMPLE = Path(str(resources.files("rung.configs") / "plcs" / "press1.yaml"))
SOURCE = Path("p1.yaml")
HANDSHAKE = {"req": 100, "req_seq": 101, "ack_seq": 110, "busy": 111, "done": 112, "err": 113,
             "result": 114, "heartbeat": 115}
BASE: dict[str, Any] = {
    "id": "p1",
    "description": "test press",
    "transport": {"kind": "tcp", "host": "127.0.0.1", "port": 502, "unit_id": 1},
    "handshake": HANDSHAKE,
    "points": [
        {"name": "oil_temp", "table": "holding", "address": 200, "type": "int16", "scale": 0.1,
         "limits": {"alert": 70, "alarm": 85}},
        {"name": "pressure", "table": "input", "address": 10, "type": "float32",
         "word_order": "CDAB"},
        {"name": "pump_on", "table": "coil", "address": 5},
    ],
}
RTU = {"kind": "rtu", "port": "/dev/ttyUSB0", "baud": 19200, "parity": "E", "stopbits": 1}
DELETE = object()


def _map(**changes: Any) -> dict[str, Any]:
    """BASE with changes at ``__``-joined paths (``points__1__word_order``); DELETE removes."""
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def _hmap(points: list[Point], writable: frozenset[tuple[str, int]] = frozenset()) -> PlcMap:
    return PlcMap("t", "", TcpTransport("127.0.0.1"), Handshake(**HANDSHAKE), tuple(points),
                  writable)


def _spans(blocks: list[ReadBlock]) -> list[tuple[str, int, int]]:
    return [(b.table, b.address, b.count) for b in blocks]


def test_example_loads_and_plans_one_read_per_table() -> None:
    plc = load_map(EXAMPLE)
    assert plc.id == "press1" and plc.path == EXAMPLE
    assert plc.transport == TcpTransport("127.0.0.1", 5020, 1, 1.0)
    assert plc.fault_tree == {"top_event": "Press 1 hydraulic unit loses system pressure"}
    assert [p.name for p in plc.points] == [
        "oil_temp", "motor_current", "running_hours", "setpoint", "pressure", "vibration",
        "pump_on", "door_closed"]
    by_name = {p.name: p for p in plc.points}
    assert by_name["door_closed"].type == "bool" and by_name["pressure"].word_order == "CDAB"
    assert by_name["pressure"].limits == {"low_alarm": 80.0, "low_alert": 100.0}
    assert _spans(plc.plan()) == [("coil", 5, 1), ("discrete", 0, 1), ("holding", 200, 11),
                                  ("input", 10, 4)]
    assert plc.handshake.read_span() == (100, 16)
    assert plc.handshake.owned == (110, 111, 112, 113, 114, 115)
    assert plc.writable == {("holding", a) for a in range(110, 116)}


def test_plan_merges_points_within_max_gap() -> None:
    plc = _hmap([Point("d", "holding", 400), Point("a", "holding", 200),
                 Point("c", "holding", 210), Point("b", "holding", 201)])
    blocks = plc.plan(max_gap=8)
    assert _spans(blocks) == [("holding", 200, 11), ("holding", 400, 1)]
    assert [p.name for p in blocks[0].points] == ["a", "b", "c"]
    # 202..209 is a gap of 8 registers: one fewer allowed splits it off
    assert _spans(plc.plan(max_gap=7)) == [("holding", 200, 2), ("holding", 210, 1),
                                           ("holding", 400, 1)]
    assert _spans(plc.plan(max_gap=0)) == _spans(plc.plan(max_gap=7))
    with pytest.raises(RegisterMapError, match="max_gap"):
        plc.plan(max_gap=-1)


def test_plan_splits_blocks_at_the_per_request_maximum() -> None:
    regs = [Point(f"r{i}", "holding", i) for i in range(130)]
    assert _spans(_hmap(regs).plan()) == [("holding", 0, 125), ("holding", 125, 5)]
    # a 32-bit point that would end past the 125th register starts the next block
    fits = [Point("a", "input", 0), Point("b", "input", 123, "float32")]
    assert _spans(_hmap(fits).plan(max_gap=200)) == [("input", 0, 125)]
    spills = [Point("a", "input", 0), Point("b", "input", 124, "float32")]
    assert _spans(_hmap(spills).plan(max_gap=200)) == [("input", 0, 1), ("input", 124, 2)]
    bits = [Point("a", "coil", 0), Point("b", "coil", 1999), Point("c", "coil", 2000)]
    assert _spans(_hmap(bits).plan(max_gap=5000)) == [("coil", 0, 2000), ("coil", 2000, 1)]
    assert TABLES["coil"].max_read == 2000 and TABLES["holding"].max_read == 125


# float32 123.45 = 0x42F6E666: bytes A=42 B=F6 C=E6 D=66
@pytest.mark.parametrize(("order", "words"), [
    ("ABCD", [0x42F6, 0xE666]), ("CDAB", [0xE666, 0x42F6]),
    ("BADC", [0xF642, 0x66E6]), ("DCBA", [0x66E6, 0xF642])])
def test_float32_in_every_word_order(order: str, words: list[int]) -> None:
    assert encode_words(123.45, "float32", order) == words
    assert decode_words(words, "float32", order) == 123.45


@pytest.mark.parametrize(("value", "type_", "order", "words"), [
    (-2, "int32", "ABCD", [0xFFFF, 0xFFFE]),
    (-2, "int32", "CDAB", [0xFFFE, 0xFFFF]),
    (4000000000, "uint32", "ABCD", [0xEE6B, 0x2800]),  # 0xEE6B2800
    (4000000000, "uint32", "CDAB", [0x2800, 0xEE6B]),
    (4000000000, "uint32", "BADC", [0x6BEE, 0x0028]),
    (4000000000, "uint32", "DCBA", [0x0028, 0x6BEE]),
    (-1, "int16", "ABCD", [0xFFFF]),
    (-1, "int16", "DCBA", [0xFFFF]),  # word order means nothing to a 16-bit value
    (65535, "uint16", "ABCD", [0xFFFF]),
    (-32768, "int16", "ABCD", [0x8000]),
])
def test_known_values(value: int, type_: str, order: str, words: list[int]) -> None:
    assert encode_words(value, type_, order) == words
    decoded = decode_words(words, type_, order)
    assert decoded == value and type(decoded) is int


def test_word_order_table_matches_the_letters() -> None:
    for order in WORD_ORDERS:
        value = 0x0A0B0C0D  # bytes A..D = 0A 0B 0C 0D
        wire = b"".join(w.to_bytes(2, "big") for w in encode_words(value, "uint32", order))
        assert wire == bytes(0x0A + "ABCD".index(c) for c in order)


@pytest.mark.parametrize(("value", "type_"), [
    (40000, "int16"), (-1, "uint16"), (2**32, "uint32"), (-(2**31) - 1, "int32"),
    (1.5, "int16"), (1e39, "float32"), (2, "bool"), ("7", "uint16"), (True, "float32")])
def test_encode_refuses_what_does_not_fit(value: Any, type_: str) -> None:
    with pytest.raises(RegisterMapError, match="does not fit"):
        encode_words(value, type_)


def test_decode_words_refuses_bad_input() -> None:
    for words, type_, order in [([1], "float32", "ABCD"), ([1, 2], "int16", "ABCD"),
                                ([70000], "uint16", "ABCD"), ([-1], "int16", "ABCD"),
                                ([1], "int64", "ABCD"), ([1, 2], "int32", "ABDC")]:
        with pytest.raises(RegisterMapError):
            decode_words(words, type_, order)


def test_decode_applies_scale_and_offset() -> None:
    assert decode(Point("t", "holding", 0, "int16", scale=0.1), [853]) == 85.3
    assert decode(Point("t", "holding", 0, "int16", scale=0.1), [0xFCAD]) == -85.1  # -851
    assert decode(Point("t", "holding", 0, scale=0.1, offset=-50), [1000]) == 50.0
    assert decode(Point("t", "holding", 0, "uint16", offset=273.15), [20]) == 293.15
    raw = decode(Point("t", "holding", 0, "int16"), [0xFFFF])
    assert raw == -1 and type(raw) is int  # no scale, no offset: stays an int
    scaled = decode(Point("t", "holding", 0, "uint32", scale=0.01), [0x0001, 0x0000])
    assert scaled == 655.36 and type(scaled) is float
    cdab = encode_words(123.45, "float32", "CDAB")
    assert decode(Point("t", "input", 0, "float32", "CDAB", scale=2), cdab) == pytest.approx(246.9)


def test_decode_bools() -> None:
    assert decode(Point("c", "coil", 5), [True]) is True
    assert decode(Point("d", "discrete", 0), [0]) is False
    assert decode(Point("b", "holding", 7, "bool"), [2]) is True
    assert decode(Point("b", "holding", 7, "bool"), [0]) is False
    assert Point("c", "coil", 5).type == "bool" and Point("r", "input", 5).type == "uint16"
    assert {t: s.words for t, s in TYPES.items()} == {
        "bool": 1, "int16": 1, "uint16": 1, "int32": 2, "uint32": 2, "float32": 2}
    with pytest.raises(RegisterMapError):
        decode(Point("c", "coil", 5), [True, False])


def test_values_from_block_with_gaps() -> None:
    plc = load_map(EXAMPLE)
    holding, inputs = (b for b in plc.plan() if b.table in ("holding", "input"))
    raw = [853, 4210, *encode_words(123456, "uint32"), 9, 9, 9, 9, 9, 9, 1805]  # 204..209: gap
    assert len(raw) == holding.count
    assert values_from_block(holding, raw) == {
        "oil_temp": 85.3, "motor_current": 42.1, "running_hours": 123456, "setpoint": 180.5}
    raw = encode_words(95.5, "float32", "CDAB") + encode_words(2.8, "float32", "ABCD")
    assert values_from_block(inputs, raw) == {"pressure": 95.5, "vibration": 2.8}
    coil = next(b for b in plc.plan() if b.table == "coil")
    padded = [True, False, False, False, False, False, False, False]  # bit reads pad to a byte
    assert values_from_block(coil, padded) == {"pump_on": True}
    with pytest.raises(RegisterMapError, match="needs 11"):
        values_from_block(holding, raw)


def test_check_write_allows_only_owned_and_writable_addresses() -> None:
    plc = parse_map(_map(writable=[{"table": "holding", "address": 210, "count": 2},
                                   {"table": "coil", "address": 5}]), SOURCE)
    plc.check_write("holding", 110, 6)  # ack_seq..heartbeat in one write
    plc.check_write("holding", 115)
    plc.check_write("holding", 210, 2)
    plc.check_write("coil", 5)
    refused = [(("holding", 100, 1), "holding 100"),  # req belongs to the PLC
               (("holding", 114, 3), "holding 116"),  # partly outside: first refused address
               (("holding", 209, 2), "holding 209"),
               (("coil", 6, 1), "coil 6"),
               (("input", 10, 1), "input 10"),
               (("holding", 200, 1), "holding 200")]  # a point is not writable by default
    for args, where in refused:
        with pytest.raises(WriteRefused, match=f"^p1: {where}: not writable") as e:
            plc.check_write(*args)
        assert e.value.hint and "writable" in e.value.hint
    with pytest.raises(WriteRefused):
        plc.check_write("holding", 110, 0)


BAD_MAPS: list[tuple[dict[str, Any], str | None]] = [
    (_map(idd="x"), "idd: unknown key; known keys here: id, description"),
    (_map(points=DELETE), "points: required"),
    (_map(id="press 1"), "id: expected 1..64 letters"),
    (_map(id=7), "id: expected"),
    (_map(transport={"kind": "udp", "host": "h"}), "transport.kind: expected one of tcp, rtu"),
    (_map(transport={"host": "h"}), "transport.kind: expected one of tcp, rtu, got nothing"),
    (_map(transport={"kind": "tcp"}), "transport.host: required"),
    (_map(transport__port=70000), "transport.port: expected an integer 1..65535"),
    (_map(transport__unit_id=0), "transport.unit_id: expected an integer 1..247"),
    (_map(transport__timeout_s=0), "transport.timeout_s: expected a number > 0"),
    (_map(transport__baud=9600), "transport.baud: unknown key"),
    (_map(transport={**RTU, "parity": "X"}), "transport.parity: expected one of N, E, O"),
    (_map(transport={**RTU, "stopbits": 3}), "transport.stopbits: expected an integer 1..2"),
    (_map(transport={**RTU, "baud": 0}), "transport.baud: expected a positive integer"),
    (_map(transport={**RTU, "host": "h"}), "transport.host: unknown key"),
    (_map(handshake__heartbeat=DELETE), "handshake.heartbeat: required"),
    (_map(handshake__busy=110), "handshake.busy: 110 is also handshake.ack_seq"),
    (_map(handshake__heartbeat=400), "handshake: the registers span 301 addresses"),
    (_map(handshake__req=-1), "handshake.req: expected an integer 0..65535"),
    (_map(handshake__poll_s=0), "handshake.poll_s: expected a number > 0"),
    (_map(handshake__watchdog_s=0), "handshake.watchdog_s: expected a number > 0"),
    (_map(handshake__watchdog_s=1),
     "handshake.watchdog_s: expected >= handshake.heartbeat_s + 2 x handshake.poll_s (1.4), "
     "got 1"),
    (_map(handshake__watchdog_s=1, handshake__heartbeat_s=0.5, handshake__poll_s=0.25), None),
    (_map(points=[]), "points: expected a list of 1..100 points"),
    (_map(points=[{"name": f"p{i}", "table": "holding", "address": i} for i in range(101)]),
     "points: expected a list of 1..100 points"),
    (_map(points__1__word_order="ABDC"),
     "p1.yaml: points[1].word_order: expected one of ABCD, CDAB, BADC, DCBA, got 'ABDC'"),
    (_map(points__0__word_order="CDAB"),
     "p1.yaml: points[0].word_order: only for 32-bit types (int32, uint32, float32), not "
     "int16 (one register)"),
    (_map(points__0__type="uint16", points__0__word_order="ABCD"),
     "points[0].word_order: only for 32-bit types (int32, uint32, float32), not uint16 "
     "(one register)"),
    (_map(points__0__type="bool", points__0__scale=DELETE, points__0__limits=DELETE,
          points__0__word_order="DCBA"),
     "points[0].word_order: only for 32-bit types (int32, uint32, float32), not bool "
     "(one register)"),
    (_map(points__2__word_order="ABCD"),
     "points[2].word_order: only for 32-bit types (int32, uint32, float32), not bool "
     "(one bit)"),
    (_map(points__0__type="int32", points__0__word_order="CDAB"), None),
    (_map(points__0__table="holdings"), "points[0].table: expected one of coil, discrete"),
    (_map(points__0__type="float64"), "points[0].type: expected one of bool, int16"),
    (_map(points__2__type="int16"), "points[2].type: the coil table holds single bits"),
    (_map(points__0__adress=1), "points[0].adress: unknown key"),
    (_map(points__0__name=DELETE), "points[0].name: required"),
    (_map(points__0__name="oil temp"), "points[0].name: expected a name"),
    (_map(points__0__address=65535, points__0__type="float32"),
     "points[0].address: a float32 at 65535 runs past address 65535"),
    (_map(points__0__address=-1), "points[0].address: expected an integer 0..65535"),
    (_map(points__0__address=True), "points[0].address: expected an integer"),
    (_map(points__0__scale=0), "points[0].scale: expected a non-zero number"),
    (_map(points__0__scale=float("nan")), "points[0].scale: expected a non-zero number"),
    (_map(points__0__offset="1"), "points[0].offset: expected a number"),
    (_map(points__0__unit="x" * 17), "points[0].unit: expected a non-empty string"),
    (_map(points__0__limits={"high": 1}), "points[0].limits.high: unknown key"),
    (_map(points__0__limits={"alert": "hot"}), "points[0].limits.alert: expected a number"),
    (_map(points__0__limits={"alert": 90, "alarm": 85}),
     "points[0].limits.alarm: expected >= points[0].limits.alert (90), got 85"),
    (_map(points__0__limits={"low_alert": 100, "low_alarm": 120}),
     "points[0].limits.low_alert: expected >= points[0].limits.low_alarm (120), got 100"),
    (_map(points__2__scale=2), "points[2].scale: only for numeric types"),
    (_map(points__1__name="oil_temp"), "points[1].name: 'oil_temp' is also points[0].name"),
    (_map(points__0__type="int32", points__1__table="holding", points__1__address=201),
     "points[1].address: 'pressure' (holding 201..202) overlaps points[0] 'oil_temp' "
     "(holding 200..201)"),
    (_map(points__0__address=114, points__0__type="int32"),
     "points[0].address: 'oil_temp' (holding 114..115) overlaps handshake.result"),
    (_map(points__2__table="discrete", points__2__address=110), None),  # other table: fine
    (_map(writable=[{"table": "input", "address": 10}]),
     "writable[0].table: the input table is read-only; expected coil, holding"),
    (_map(writable=[{"table": "holding", "address": 99, "count": 2}]),
     "writable[0]: covers handshake.req (100), which the PLC writes"),
    (_map(writable=[{"table": "holding", "adress": 99}]), "writable[0].adress: unknown key"),
    (_map(writable=[{"table": "holding", "address": 65535, "count": 2}]),
     "writable[0].count: 2 addresses from 65535 run past 65535"),
    (_map(writable={"table": "coil", "address": 1}), "writable: expected a list"),
    (_map(fault_tree={"system": "press"}), "fault_tree.top_event: required"),
    (_map(fault_tree={"top_event": ""}), "fault_tree.top_event: expected a non-empty string"),
    (_map(description=["x"]), "description: expected a non-empty string"),
]


@pytest.mark.parametrize(("data", "expected"), BAD_MAPS)
def test_bad_map_names_the_key(data: dict[str, Any], expected: str | None) -> None:
    if expected is None:
        parse_map(data, SOURCE)
        return
    with pytest.raises(RegisterMapError) as e:
        parse_map(data, SOURCE)
    assert str(e.value).startswith("p1.yaml: ")
    assert expected in str(e.value)


def test_unknown_key_hint_suggests_the_close_one() -> None:
    with pytest.raises(RegisterMapError) as e:
        parse_map(_map(points__0__adress=1), SOURCE)
    assert e.value.hint == "did you mean 'address'?"


def test_optional_keys_and_rtu() -> None:
    plc = parse_map(_map(transport=RTU, description=DELETE, fault_tree=None, writable=None,
                         points__0__unit=None), SOURCE)
    assert plc.transport.kind == "rtu" and plc.description == "" and plc.fault_tree is None
    assert plc.points[0].unit is None and plc.points[0].limits == {"alert": 70, "alarm": 85}
    assert plc.writable == {("holding", a) for a in range(110, 116)}


def test_load_map_file_errors(tmp_path: Path) -> None:
    with pytest.raises(RegisterMapError, match="no such register-map file"):
        load_map(tmp_path / "missing.yaml")
    cases = {"bad.yaml": ("id: [", "invalid YAML at line"),
             "twice.yaml": ("id: a\nid: b\n", "given twice"),
             "list.yaml": ("- 1\n", "top level"),
             "empty.yaml": ("", "id: required")}
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(RegisterMapError, match=expected) as e:
            load_map(tmp_path / name)
        assert str(e.value).startswith(str(tmp_path / name))


def test_read_span_of_a_hand_made_wide_handshake() -> None:
    wide = Handshake(**{**HANDSHAKE, "heartbeat": 300})
    with pytest.raises(RegisterMapError, match="span 201"):
        wide.read_span()


def test_retry_max_follows_the_plc_watchdog() -> None:
    assert Handshake(**HANDSHAKE).retry_max_s == 2.0      # (5 - 1) / 2 with the defaults
    fast = parse_map(_map(handshake={**HANDSHAKE, "poll_s": 0.05, "heartbeat_s": 0.2,
                                     "watchdog_s": 1.5}), SOURCE)
    assert fast.handshake.retry_max_s == pytest.approx(0.65)
    hand_made = Handshake(**HANDSHAKE, poll_s=0.5, heartbeat_s=1.0, watchdog_s=1.5)
    assert hand_made.retry_max_s == 0.5                   # never below poll_s


def test_word_order_refusal_has_a_hint() -> None:
    with pytest.raises(RegisterMapError) as e:
        parse_map(_map(points__2__word_order="ABCD"), SOURCE)
    assert e.value.hint == "remove word_order, or give the point its 32-bit type"
