"""A rung fleet end to end: a real mosquitto, two or three ``rung serve`` child processes on
the demo model sharing one request topic through ``$share/{group}/...``, a paho requester,
and a pymodbus PLC behind one Modbus proxy per node (so each node's traffic is its own)."""

from __future__ import annotations

import asyncio
import collections
import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml

from rung.daemon.config import ConfigError, parse_config
from rung.daemon.mqtt.fleet import NodeStatus
from rung.daemon.mqtt.fleet_view import plc_owners, read_statuses, table
from tests.daemon.harness import BASE, Broker, Daemon, Reply, Requester, write_config
from tests.daemon.modbus.test_plc import HEARTBEAT, PlcThread, _plant
from tests.daemon.modbus_proxy import ModbusProxy
from tests.daemon.plc_rig import map_doc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GROUP = "line3"
ST = {"description": "Pump P1 runs while the level is below 2 m.", "name": "P_Pump",
      "pou_type": "PROGRAM"}
SHORT = {"input": ST, "max_tokens": 3}   # answered in a few ms: "truncated"
WRITES = (5, 6, 15, 16)


@pytest.fixture
def nodes(tmp_path: Path, broker: Broker, edge_engine: Path) -> Iterator[Callable[..., Daemon]]:
    """``nodes(name, **sections)`` -> a fleet node's Daemon (not started); all stopped at
    the end."""
    made: list[Daemon] = []

    def make(name: str, **sections: Any) -> Daemon:
        root = tmp_path / name
        root.mkdir()
        mqtt = {"shared_group": GROUP, "client_id": name, "fleet_update_s": 0.5,
                **sections.pop("mqtt", {})}
        d = Daemon(write_config(root, edge_engine, broker.port, mqtt=mqtt,
                                queue={"max_pending": 400}, **sections))
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def start(*daemons: Daemon) -> None:
    """Start the nodes together, then wait until each is ready."""
    for d in daemons:
        d.start(wait_ready=False)
    for d in daemons:
        d.wait_log("ready")


def answered(d: Daemon) -> list[str]:
    """The ids of the answers this run of ``d`` logged."""
    return [str(r.get("id")) for r in d.lines() if r.get("msg") == "answered"]


def journal_rows(d: Daemon) -> dict[str, int]:
    """The node's journal rows by state (read beside the running daemon)."""
    db = sqlite3.connect(d.config.parent / "state" / "journal.db")
    try:
        return dict(db.execute("SELECT state, COUNT(*) FROM entries GROUP BY state"))
    finally:
        db.close()


def statuses(d: Daemon) -> dict[str, NodeStatus]:
    from rung.daemon.config import load_config

    return asyncio.run(read_statuses(load_config(d.config).mqtt))


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(f"never happened within {timeout} s: {what}")


def settled(req: Requester, running: list[Daemon], n: int, timeout: float = 120) -> list[Reply]:
    """At least ``n`` replies; then, once no running node holds a request or an answer the
    broker has not acknowledged, everything sent before a fence the requester publishes to
    its own reply topic (the broker hands it over after every answer it took before)."""
    req.wait(n, timeout)
    wait_for("every journal row delivered", lambda: all(
        set(journal_rows(d)) <= {"delivered", "dead"} for d in running), timeout)
    fid = f"fence-{uuid.uuid4().hex[:8]}"
    req.client.publish(req.reply_topic, json.dumps({"id": fid}), qos=1).wait_for_publish(10)
    wait_for("the fence", lambda: any(r.body.get("id") == fid for r in req.snapshot()))
    return [r for r in req.snapshot() if r.body.get("id") != fid]


def by_id(replies: list[Reply]) -> dict[str, list[Reply]]:
    out: dict[str, list[Reply]] = collections.defaultdict(list)
    for r in replies:
        out[str(r.body.get("id"))].append(r)
    return out


def rung_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rung.daemon", *args], capture_output=True,
                          text=True, timeout=120)


def send(req: Requester, ids: list[str]) -> None:
    for rid in ids:
        req.send("st_code", SHORT, correlation=rid, response_topic=req.reply_topic, wait=False)


# -- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(("mqtt", "key", "says"), [
    ({"shared_group": "a/b"}, "mqtt.shared_group", "one topic level"),
    ({"shared_group": "+"}, "mqtt.shared_group", "one topic level"),
    ({"shared_group": "g", "client_id": "rung/a"}, "mqtt.client_id", "{base}/fleet/"),
    ({"fleet_update_s": 0}, "mqtt.fleet_update_s", "> 0"),
    ({"fleet_lease_s": 0}, "mqtt.fleet_lease_s", "> 0"),
    ({"shared_group": "g", "keepalive_s": 40}, "mqtt.fleet_lease_s", ">= 3 x"),
    ({"shared_group": "g", "keepalive_s": 0}, "mqtt.keepalive_s", "> 0"),
])
def test_fleet_keys_are_checked(tmp_path: Path, mqtt: dict[str, Any], key: str,
                                says: str) -> None:
    with pytest.raises(ConfigError, match=r"^" + key.replace(".", r"\.")) as err:
        parse_config({"engine": {"path": "e"}, "mqtt": mqtt}, tmp_path, env={})
    assert says in str(err.value)
    ok = parse_config({"engine": {"path": "e"}, "mqtt": {"shared_group": "line3"}}, tmp_path,
                      env={})
    assert ok.mqtt.shared_group == "line3" and ok.mqtt.fleet_update_s == 5.0
    assert ok.mqtt.fleet_lease_s == 90.0


def test_rung_fleet_needs_a_group(tmp_path: Path, broker: Broker, edge_engine: Path) -> None:
    out = rung_cli("fleet", "--config", str(write_config(tmp_path, edge_engine, broker.port)))
    assert out.returncode == 1 and "mqtt.shared_group is not set" in out.stderr


# -- requests across nodes -----------------------------------------------------------------


def test_300_requests_spread_over_three_nodes_each_answered_once(
        broker: Broker, nodes: Callable[..., Daemon]) -> None:
    fleet = [nodes(f"node-{c}") for c in "abc"]
    start(*fleet)
    listing = rung_cli("fleet", "--config", str(fleet[0].config), "--json")
    assert listing.returncode == 0, listing.stderr
    docs = {d["client_id"]: d for d in json.loads(listing.stdout)["nodes"]}
    assert sorted(docs) == ["node-a", "node-b", "node-c"]
    assert all(d["online"] and d["group"] == GROUP and d["queue"]["max_pending"] == 400
               for d in docs.values())
    assert len({d["engine"] for d in docs.values()}) == 1
    req = Requester(broker.port)
    ids = [f"r{i}" for i in range(300)]
    try:
        send(req, ids)
        replies = by_id(settled(req, fleet, len(ids)))
    finally:
        req.close()
    assert sorted(replies) == sorted(ids)
    assert all(len(v) == 1 for v in replies.values()), [k for k, v in replies.items()
                                                         if len(v) > 1]
    assert {v[0].body["error"]["code"] for v in replies.values()} == {"truncated"}
    per_node = [answered(d) for d in fleet]
    assert sorted(sum(per_node, [])) == sorted(ids)   # each answered by exactly one node
    assert all(len(a) >= 60 for a in per_node), [len(a) for a in per_node]


def test_kill9_of_a_node_mid_stream_loses_nothing(
        broker: Broker, nodes: Callable[..., Daemon]) -> None:
    """MQTT 3.1.1. Requests the killed node had recorded wait in its journal; those it had
    received unacknowledged, and its share of the requests published while it is down
    (mosquitto 2.0 keeps handing it one), wait in its persistent session: all are answered
    after its restart; the others answer theirs meanwhile."""
    fleet = [nodes(f"node-{c}", mqtt={"protocol": "3.1.1"}) for c in "abc"]
    start(*fleet)
    victim = fleet[1]
    req = Requester(broker.port, v5=False, persistent=True, client_id="req-fleet-kill9")

    def send311(ids: list[str]) -> None:
        for rid in ids:
            req.send("st_code", {**SHORT, "id": rid, "reply_to": req.reply_topic}, wait=False)

    first, second = [f"a{i}" for i in range(90)], [f"b{i}" for i in range(60)]
    try:
        send311(first)
        victim.wait_log("answered")
        victim.kill9()
        before = set(answered(victim))
        send311(second)   # published while the victim is down
        wait_for("the other nodes answering while one is down", lambda: len(
            {r.body.get("id") for r in req.snapshot()} & set(second)) >= 20)
        victim.start()
        replies = by_id(settled(req, fleet, len(first) + len(second)))
    finally:
        req.close()
    assert sorted(replies) == sorted(first + second), "a request was lost"
    for rid, copies in replies.items():   # a crash window may repeat an answer: same body
        assert all(c.body == copies[0].body for c in copies), rid
    assert len(before) < 30, "the victim had nothing left in flight when it was killed"
    after = set(answered(victim))
    assert after & set(first), "the victim's own leftovers were answered after its restart"
    assert after & set(second), "no request waited in the victim's session while it was down"
    assert any(str(r.get("msg")).startswith("recovered") for r in victim.lines())


def test_a_node_stopped_for_good_hands_its_requests_over(
        broker: Broker, nodes: Callable[..., Daemon]) -> None:
    """SIGTERM: the node leaves the group (the others get every new request), takes in what
    the broker had queued for it, and republishes the requests it had not answered; each
    request is answered exactly once, the later ones by the others."""
    fleet = [nodes(f"node-{c}") for c in "abc"]
    start(*fleet)
    leaving, staying = fleet[2], fleet[:2]
    req = Requester(broker.port)
    first, second = [f"a{i}" for i in range(150)], [f"b{i}" for i in range(60)]
    try:
        for rid in first:   # expiring requests keep their expiry when handed over
            req.send("st_code", SHORT, correlation=rid, response_topic=req.reply_topic,
                     expiry=300, wait=False)
        leaving.wait_log("answered")
        assert leaving.terminate(60) == 0
        own = set(answered(leaving))
        handed = leaving.wait_log("handed over", 1)
        send(req, second)
        replies = by_id(settled(req, staying, len(first) + len(second)))
        offline = statuses(staying[0])["node-c"]
    finally:
        req.close()
    assert sorted(replies) == sorted(first + second)
    assert all(len(v) == 1 for v in replies.values()), [k for k, v in replies.items()
                                                         if len(v) > 1]
    db = sqlite3.connect(leaving.config.parent / "state" / "journal.db")
    try:
        rows = db.execute("SELECT correlation, note FROM entries").fetchall()
    finally:
        db.close()
    given = {bytes(c).decode() for c, note in rows if str(note).startswith("handed over")}
    # it started nothing after SIGTERM: all it held but had not answered went to the others
    assert len(given) == handed["requests"] >= 10 and handed["group"] == GROUP, handed
    assert given <= set(first) and given.isdisjoint(own) and len(rows) == len(own | given)
    assert own.isdisjoint(second)
    assert sorted(sum((answered(d) for d in staying), [])) == sorted(
        set(first + second) - own)
    assert any(r.get("msg") == "left the group" and r["staying"] == ["node-a", "node-b"]
               for r in leaving.lines())
    assert set(journal_rows(leaving)) == {"delivered"}   # nothing left pending on it
    assert offline.online is False and offline.plcs == ()


def test_the_last_node_keeps_its_subscription(broker: Broker,
                                              nodes: Callable[..., Daemon]) -> None:
    """With no other node online the last one keeps its shared subscription, so requests
    published while the whole group is down wait in the broker for it."""
    (only,) = fleet = [nodes("node-a")]
    start(*fleet)
    assert only.terminate(60) == 0
    assert only.wait_log("last node of the group", 1)["group"] == GROUP
    req = Requester(broker.port)
    ids = [f"w{i}" for i in range(10)]
    try:
        send(req, ids)
        only.start()
        replies = by_id(settled(req, fleet, len(ids)))
    finally:
        req.close()
    assert sorted(replies) == ids and sorted(answered(only)) == ids


def test_drain_hands_a_dead_nodes_queue_to_the_others(
        broker: Broker, nodes: Callable[..., Daemon]) -> None:
    """``rung fleet --drain`` with the dead node's config: the requests its session holds
    are answered by the node online, without the dead one coming back."""
    alive, dead = nodes("node-a"), nodes("node-b")
    start(alive, dead)
    dead.kill9()
    wait_for("node-b's Last Will", lambda: statuses(alive)["node-b"].online is False)
    req = Requester(broker.port)
    ids = [f"d{i}" for i in range(40)]
    try:
        for rid in ids:
            req.send("st_code", SHORT, correlation=rid, response_topic=req.reply_topic,
                     expiry=300)
        wait_for("node-a's share", lambda: len(answered(alive)) >= 15)
        out = rung_cli("fleet", "--config", str(dead.config), "--drain")
        assert out.returncode == 0, out.stderr
        replies = by_id(settled(req, [alive], len(ids)))
        refused = rung_cli("fleet", "--config", str(alive.config), "--drain")
    finally:
        req.close()
    moved = int(out.stdout.split("handed ")[1].split()[0])
    # mosquitto hands the members of a group one message each in turn, the dead one too
    assert moved == len(ids) // 2, out.stdout
    assert sorted(replies) == sorted(ids) and all(len(v) == 1 for v in replies.values())
    assert sorted(answered(alive)) == sorted(ids)
    assert refused.returncode == 1 and "node-a is online" in refused.stderr


# -- one writer per PLC ----------------------------------------------------------------------


@pytest.fixture
def plc() -> Iterator[tuple[PlcThread, Callable[[], ModbusProxy]]]:
    """A simulated PLC and a factory of Modbus proxies in front of it, one per node."""
    sim = PlcThread()
    _plant(sim)
    proxies: list[ModbusProxy] = []

    def proxy() -> ModbusProxy:
        p = ModbusProxy((sim.sim.host, sim.sim.port))
        sim.call(p.start())
        proxies.append(p)
        return p

    yield sim, proxy
    for p in proxies:
        sim.call(p.pause())
    sim.close()


def plc_node(nodes: Callable[..., Daemon], name: str, proxy: ModbusProxy,
             **sections: Any) -> Daemon:
    d = nodes(name, **sections)
    doc = map_doc(port=proxy.port)
    map_path = d.config.parent / "press1.yaml"
    map_path.write_text(yaml.safe_dump(doc))
    cfg = yaml.safe_load(d.config.read_text())
    cfg["plcs"] = [str(map_path)]
    cfg["modbus"] = {"reconnect_min_s": 0.1}
    d.config.write_text(yaml.safe_dump(cfg))
    return d


def writes(proxy: ModbusProxy) -> list[Any]:
    return [s for s in proxy.requests() if s.function in WRITES]


def test_a_second_claimant_of_a_plc_is_refused(
        plc: tuple[PlcThread, Callable[[], ModbusProxy]],
        nodes: Callable[..., Daemon]) -> None:
    sim, proxy = plc
    pa, pb = proxy(), proxy()
    owner, second = plc_node(nodes, "node-a", pa), plc_node(nodes, "node-b", pb)
    start(owner)
    assert owner.wait_log("plc claimed")["plc"] == "press1"
    pa.wait("node-a's heartbeat", lambda: len(pa.requests(16, HEARTBEAT)) >= 2)
    start(second)
    refused = second.wait_log("plc refused")
    assert refused["plc"] == "press1" and refused["owner"] == "node-a", refused
    assert "one writer per PLC" in refused["why"]
    beats = len(pa.requests(16, HEARTBEAT))
    pa.wait("three more heartbeats", lambda: len(pa.requests(16, HEARTBEAT)) >= beats + 3)
    assert pb.requests() == [], "the refused node talked to the PLC"
    listing = rung_cli("fleet", "--config", str(second.config))
    check = rung_cli("check", "--config", str(second.config))
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert "press1" in lines["node-a"] and "refused press1 (driven by node-a)" in lines["node-b"]
    assert check.returncode == 1
    (owner_line,) = [x for x in check.stdout.splitlines() if "plc_owner" in x]
    assert owner_line.startswith("FAIL") and "press1 is driven by node-a" in owner_line
    assert writes(pb) == []   # rung check read the PLC through node-b's proxy; no writes
    # the owner's Last Will ends its claim: a node started after it takes the PLC over
    owner.kill9()
    wait_for("node-a's Last Will", lambda: statuses(second)["node-a"].online is False)
    second.terminate(60)
    second.start()
    assert second.wait_log("plc claimed")["plc"] == "press1"
    pb.wait("node-b's heartbeat", lambda: len(pb.requests(16, HEARTBEAT)) >= 2)


def test_two_nodes_claiming_a_plc_at_once_one_drives_it(
        plc: tuple[PlcThread, Callable[[], ModbusProxy]],
        nodes: Callable[..., Daemon]) -> None:
    sim, proxy = plc
    pair = [(plc_node(nodes, f"node-{c}", p), p) for c, p in (("a", proxy()), ("b", proxy()))]
    start(*(d for d, _ in pair))
    outcome = {}
    for d, _ in pair:
        wait_for(f"{d.config.parent.name} settles its claim", lambda d=d: any(
            r.get("msg") in ("plc claimed", "plc refused") for r in d.lines()))
        outcome[d.config.parent.name] = next(r["msg"] for r in d.lines()
                                             if r.get("msg") in ("plc claimed", "plc refused"))
    assert sorted(outcome.values()) == ["plc claimed", "plc refused"], outcome
    (winner,) = [p for (d, p) in pair if outcome[d.config.parent.name] == "plc claimed"]
    (loser,) = [p for (d, p) in pair if outcome[d.config.parent.name] == "plc refused"]
    winner.wait("the winner's heartbeat", lambda: len(winner.requests(16, HEARTBEAT)) >= 2)
    assert loser.requests() == []


# -- claims tied to live nodes: forged statuses -------------------------------------------------

LEASE = {"keepalive_s": 2, "fleet_lease_s": 6}   # a short lease: 3 x keepalive


def forge(port: int, topic: str, payload: bytes, **login: str) -> int:
    """Publish ``payload`` retained on ``topic`` from a plain paho client (no rung); the
    v5 PUBACK reason code (0 when the broker took it; 135 "not authorized")."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"forger-{uuid.uuid4().hex[:6]}",
                    protocol=mqtt.MQTTv5)
    codes: list[int] = []
    c.on_publish = lambda _c, _u, _mid, reason, _p: codes.append(int(reason.value))
    if login:
        c.username_pw_set(login["user"], login["password"])
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
        wait_for("the PUBACK", lambda: bool(codes), 10)
    finally:
        c.disconnect()
        c.loop_stop()
    return codes[0]


def log_time(rec: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(rec["ts"]).replace("Z", "+00:00")).timestamp()


def test_a_forged_claim_stops_blocking_after_its_lease(
        broker: Broker, plc: tuple[PlcThread, Callable[[], ModbusProxy]],
        nodes: Callable[..., Daemon]) -> None:
    """A retained ``{"online": true, "plcs": ["press1"]}`` from a client that is no node
    keeps press1 from a node for one lease, not for ever; junk statuses beside it (2 MiB,
    not JSON) are dropped unparsed. ``rung fleet`` shows the forged claim as stale."""
    sim, proxy = plc
    pb = proxy()
    forge(broker.port, f"{BASE}/fleet/ghost", b'{"online": true, "plcs": ["press1"]}')
    junk = b'{"online": true, "x": "' + b"x" * 2**21 + b'"}'
    forge(broker.port, f"{BASE}/fleet/junk", junk)
    forge(broker.port, f"{BASE}/fleet/bomb", b"[" * 60_000)
    node = plc_node(nodes, "node-b", pb, mqtt=LEASE)
    start(node)
    refused = node.wait_log("plc refused")
    assert refused["owner"] == "ghost", refused
    ended = node.wait_log("plc claim ended", 30)
    claimed = node.wait_log("plc claimed")
    assert ended["owner"] == "ghost" and "never renewed" in ended["why"], ended
    held = log_time(claimed) - log_time(refused)   # one lease (a reconnection: two)
    assert LEASE["fleet_lease_s"] - 0.5 <= held <= 3 * LEASE["fleet_lease_s"], held
    pb.wait("node-b's heartbeat", lambda: len(pb.requests(16, HEARTBEAT)) >= 2)
    dropped = [r for r in node.lines() if r.get("msg") == "payload refused"]
    assert [(r["kind"], r["bytes"]) for r in dropped] == [("status", len(junk))], dropped
    seen = statuses(node)
    listing = table(seen)
    assert len(listing) < 2000 and max(len(x) for x in listing.splitlines()) < 200, listing
    rows = {line.split()[0]: line.split()[1] for line in listing.splitlines()[1:]
            if not line.startswith("ignored")}
    assert rows == {"node-b": "online", "ghost": "stale"}, listing
    assert f"ignored junk: {len(junk)} bytes, over the limit of 65536" in listing
    assert "ignored bomb: not JSON" in listing
    assert seen["node-b"].plcs == ("press1",) and plc_owners(seen) == {"press1": "node-b"}


def test_a_forged_offline_status_does_not_make_two_writers(
        broker: Broker, plc: tuple[PlcThread, Callable[[], ModbusProxy]],
        nodes: Callable[..., Daemon]) -> None:
    """A retained ``{"online": false}`` on the owner's topic, from a client that is no
    node, while the owner drives press1 and node-b refuses it. The owner reads its own
    topic: it stops driving press1 at once and republishes its real status (press1 given
    up); node-b, which took the offline status for the broker's word and kept refusing,
    takes press1 once the live owner's status no longer claims it. press1 sees no write
    from node-a after node-b's first."""
    sim, proxy = plc
    pa, pb = proxy(), proxy()
    owner, second = plc_node(nodes, "node-a", pa), plc_node(nodes, "node-b", pb)
    start(owner)
    owner.wait_log("plc claimed")
    pa.wait("node-a's heartbeat", lambda: len(pa.requests(16, HEARTBEAT)) >= 2)
    start(second)
    assert second.wait_log("plc refused")["owner"] == "node-a"
    boot = statuses(owner)["node-a"].doc["boot"]
    forge(broker.port, f"{BASE}/fleet/node-a",
          json.dumps({"online": False, "client_id": "node-a", "group": GROUP}).encode())
    overwritten = owner.wait_log("fleet status overwritten")
    assert overwritten["by"] == "an offline status" and overwritten["stopped"] == ["press1"]
    lost = owner.wait_log("plc lost")
    assert lost["plc"] == "press1" and lost["owner"] == "(status overwritten)", lost
    owner.wait_log("fleet status restored")
    ended = second.wait_log("plc claim ended")
    assert ended["owner"] == "node-a" and "withdrew" in ended["why"], ended
    assert second.wait_log("plc claimed")["plc"] == "press1"
    pb.wait("node-b's heartbeats", lambda: len(pb.requests(16, HEARTBEAT)) >= 3)
    first_b = min(s.t for s in writes(pb))
    assert writes(pa) and max(s.t for s in writes(pa)) < first_b, "two writers at once"
    beats = len(pa.requests())
    pb.wait("two more heartbeats", lambda: len(pb.requests(16, HEARTBEAT)) >= 5)
    assert len(pa.requests()) == beats, "node-a still talks to press1"
    now = statuses(owner)
    assert now["node-a"].online and now["node-a"].doc["boot"] == boot   # restored, same run
    assert now["node-a"].plcs == () and now["node-a"].doc["refused"] == {
        "press1": "(status overwritten)"}
    assert now["node-b"].plcs == ("press1",)
    assert not any(r.get("msg") == "fleet status overwritten" for r in second.lines())


def test_the_fleet_acl_keeps_other_clients_off(
        tmp_path: Path, edge_engine: Path,
        plc: tuple[PlcThread, Callable[[], ModbusProxy]]) -> None:
    """The ACL of docs/mqtt.md ("Access control"), as written there, on mosquitto: a node
    serves and claims under it, ``rung fleet`` reads the fleet with a node's or an
    operator's login, and no other client can write a status, its own or a node's."""
    passwd = tmp_path / "passwd"
    for i, user in enumerate(["rung-node2", "ops", "hmi7"]):
        subprocess.run(["mosquitto_passwd", "-b", *(["-c"] if i == 0 else []), str(passwd),
                        user, f"pw-{user}"], check=True, capture_output=True, timeout=30)
    passwd.chmod(0o600)
    acl = tmp_path / "acl"
    acl.write_text(fleet_acl().replace("v1/acme/plant1/press-line/rung", BASE))
    broker = Broker(tmp_path / "broker", password_file=passwd,
                    listener_options=[f"acl_file {acl}"])
    broker.start()
    made: list[Daemon] = []

    def make(name: str, **sections: Any) -> Daemon:
        root = tmp_path / name
        root.mkdir()
        mqtt_section = {"shared_group": GROUP, "client_id": name, **sections.pop("mqtt")}
        made.append(Daemon(write_config(root, edge_engine, broker.port, mqtt=mqtt_section,
                                        **sections)))
        return made[-1]

    try:
        node = plc_node(make, "rung-node2", plc[1](), mqtt={
            "username": "rung-node2", "password": "pw-rung-node2"})
        start(node)
        assert node.wait_log("plc claimed")["plc"] == "press1"   # its birth came back
        forged = b'{"online": true, "plcs": ["press1"]}'
        for user in ("hmi7", "ops"):
            for victim in ("ghost", "rung-node2"):
                code = forge(broker.port, f"{BASE}/fleet/{victim}", forged, user=user,
                             password=f"pw-{user}")
                assert code == 135, (user, victim, code)   # not authorized
        for user in ("rung-node2", "ops"):
            cfg = parse_config({"engine": {"path": "e"}, "mqtt": {
                "port": broker.port, "base_topic": BASE, "shared_group": GROUP,
                "client_id": user, "username": user, "password": f"pw-{user}"}},
                tmp_path, env={}).mqtt
            seen = asyncio.run(read_statuses(cfg))
            assert sorted(seen) == ["rung-node2"] and seen["rung-node2"].online, user
            assert seen["rung-node2"].plcs == ("press1",)
        assert not any(r.get("msg") == "fleet status overwritten" for r in node.lines())
    finally:
        for d in made:
            d.stop()
        broker.stop()


def fleet_acl() -> str:
    """The mosquitto ACL block under "Access control" in docs/mqtt.md."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "mqtt.md").read_text()
    return doc.split("### Access control", 1)[1].split("```", 2)[1] + "\n"
