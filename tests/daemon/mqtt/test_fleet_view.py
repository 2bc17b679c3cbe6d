"""``rung fleet`` against whatever sits under ``{base}/fleet/``: statuses published by plain
clients on a real mosquitto, read back by ``read_statuses`` and shown by ``table`` and
``as_json`` (what the CLI prints), bounded whatever the payloads."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from rung.daemon.config import MQTTConfig, parse_config
from rung.daemon.mqtt.fleet import NodeStatus, iso, parse_status
from rung.daemon.mqtt.fleet_view import (
    CELL,
    MAX_NODES,
    TEXT,
    Statuses,
    as_json,
    lease_live,
    plc_owners,
    read_statuses,
    table,
)
from tests.daemon.harness import BASE, Broker

GROUP = "line3"


def retain(port: int, messages: dict[str, bytes]) -> None:
    """Publish each payload retained on ``{BASE}/fleet/{name}`` and wait for the broker."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex[:6]}",
                    protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        for name, payload in messages.items():
            c.publish(f"{BASE}/fleet/{name}", payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def config(tmp_path: Path, port: int, **mqtt_keys: Any) -> MQTTConfig:
    return parse_config({"engine": {"path": "e"}, "mqtt": {
        "port": port, "base_topic": BASE, "shared_group": GROUP, "client_id": "viewer",
        **mqtt_keys}}, tmp_path, env={}).mqtt


def live(name: str, **fields: Any) -> bytes:
    """A status as a node publishes it, lease running."""
    now = time.time()
    return json.dumps({"online": True, "client_id": name, "engine": "493ca68d4d746b1c",
                       "since": iso(now), "queue": {"depth": 0, "inflight": 0,
                                                    "max_pending": 16, "max_batch": 1},
                       "plcs": [], "refused": {}, "boot": "6f0c1e2a9b3d", "n": 3,
                       "lease_s": 90.0, "updated": iso(now), "expires": iso(now + 90),
                       **fields}).encode()


@pytest.mark.integration
def test_rung_fleet_bounds_what_it_shows(tmp_path: Path, broker: Broker) -> None:
    """A 2 MiB status, one of 60 kB whose every field is outsized, terminal escapes, a
    recursion bomb, a JSON array: the listing stays a few short lines, the JSON stays
    small, and each payload that is no status is one line saying why."""
    huge = b'{"online": true, "engine": "' + b"E" * 2**21 + b'"}'
    wide = live("wide", engine="W" * 15_000, since="\x1b[2J\x1b[31mred",
                plcs=[f"plc{i}" for i in range(2000)],
                refused={f"r{i}": "x" * 80 for i in range(200)},
                nested=json.loads("[" * 50 + "]" * 50))
    assert 50_000 < len(wide) < 65_536
    retain(broker.port, {"node-a": live("node-a", plcs=["press1"]), "huge": huge,
                         "wide": wide, "bomb": b"[" * 60_000, "list": b"[1, 2]",
                         "text": b"not json \xff", "old": live("old", plcs=["press2"],
                                                            expires=iso(time.time() - 400))})
    cfg = config(tmp_path, broker.port)
    seen = asyncio.run(read_statuses(cfg))
    assert sorted(seen) == ["bomb", "huge", "list", "node-a", "old", "text", "wide"]
    listing = table(seen)
    lines = listing.splitlines()
    assert len(listing) < 3000 and max(len(x) for x in lines) < 400, listing
    assert "\x1b" not in listing and "?[2J?[31mred" in listing
    rows = {x.split()[0]: x.split()[1] for x in lines[1:] if not x.startswith("ignored")}
    assert rows == {"node-a": "online", "wide": "online", "old": "stale"}, listing
    assert "+2192 more" in listing   # 2000 PLCs and 200 refused, 8 shown
    ignored = [x for x in lines if x.startswith("ignored")]
    assert ignored == ["ignored bomb: not JSON",
                       f"ignored huge: {len(huge)} bytes, over the limit of 65536: not read",
                       "ignored list: not a rung status (a JSON object whose online is true "
                       "or false)",
                       "ignored text: not JSON"], ignored
    out = as_json(cfg, seen)
    assert len(out) < 40_000, len(out)
    doc = json.loads(out)
    assert [n["client_id"] for n in doc["nodes"]] == ["node-a", "old", "wide"]
    wide_doc = doc["nodes"][2]
    assert len(wide_doc["engine"]) == TEXT and len(wide_doc["plcs"]) == 65
    assert [i["client_id"] for i in doc["ignored"]] == ["bomb", "huge", "list", "text"]
    owners = plc_owners(seen)
    assert owners["press1"] == "node-a" and "press2" not in owners   # stale: counts nothing


@pytest.mark.integration
def test_a_lower_payload_limit_applies_to_statuses(tmp_path: Path, broker: Broker) -> None:
    retain(broker.port, {"node-a": live("node-a"), "node-b": live("node-b", pad="p" * 2000)})
    seen = asyncio.run(read_statuses(config(tmp_path, broker.port, max_payload_bytes=1024)))
    assert seen["node-a"].online and seen["node-a"].note is None
    assert seen["node-b"].note is not None and "over the limit of 1024" in seen["node-b"].note


def test_parse_status_reads_the_lease() -> None:
    s = parse_status(f"{BASE}/fleet/node-a", live("node-a", plcs=["press1", 7]))
    assert s is not None and s.online and s.plcs == ("press1",)
    assert (s.session, s.n, s.lease_s) == ("6f0c1e2a9b3d", 3, 90.0)
    assert s.expires is not None and lease_live(s) and lease_live(s, s.expires + 89)
    assert not lease_live(s, s.expires + 91)
    assert parse_status(f"{BASE}/fleet/x", b"") is None   # cleared
    forged = parse_status(f"{BASE}/fleet/ghost", b'{"online": true, "plcs": ["press1"]}')
    assert forged is not None and forged.plcs == ("press1",) and not lease_live(forged)
    bad = parse_status(f"{BASE}/fleet/n", live("n", lease_s=True, expires="tomorrow", n=1.5))
    assert bad is not None and (bad.lease_s, bad.expires, bad.n) == (None, None, None)


def test_the_table_keeps_at_most_max_nodes() -> None:
    seen = Statuses({f"n{i}": NodeStatus(f"n{i}", False) for i in range(3)})
    seen.more = 5
    assert table(seen).splitlines()[-1] == (f"not shown: 5 more statuses (at most {MAX_NODES} "
                                            "are read)")
    name = "N" * 500
    one = table({name: NodeStatus(name, False)})
    assert max(len(x) for x in one.splitlines()) < CELL + 60   # the other columns: 48
