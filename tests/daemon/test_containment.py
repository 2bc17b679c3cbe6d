"""Fault containment, from the outside: no single request, answer, disk or setting stops
``rung serve``. A real mosquitto, the daemon as a child process on the demo model, faults
injected the way a careless client, a strict broker or a full disk would."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from rung.daemon.demo.localbroker import free_port
from rung.daemon.journal.store import Incoming, Journal
from tests.daemon.harness import BASE, Broker, Daemon, Requester, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ST = {"description": "Pump P1 runs while the level is below 2 m.", "name": "P_Pump",
      "pou_type": "PROGRAM"}
SHORT = {"input": ST, "max_tokens": 3}   # answered quickly: "truncated"
DEFAULT_REPLY = f"{BASE}/res/"


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _bodies(replies: list[Any]) -> dict[str, dict[str, Any]]:
    return {r.body.get("id"): r.body for r in replies}


def _no_logging_errors(d: Daemon) -> None:
    bad = [r for r in d.lines() if "Logging error" in str(r.get("msg", ""))
           or str(r.get("msg", "")).startswith("Traceback")]
    assert not bad, bad[:3]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[list[Daemon]]:
    """Daemons a test starts; all stopped at the end."""
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def _start(started: list[Daemon], config: Path, **kw: Any) -> Daemon:
    d = Daemon(config)
    started.append(d)
    d.start(**kw)
    return d


def test_strings_the_tokenizer_or_broker_refuse_are_answered_and_the_rest_flows(
        tmp_path: Path, broker: Broker, edge_engine: Path, daemon: list[Daemon]) -> None:
    mport = free_port()
    d = _start(daemon, write_config(tmp_path, edge_engine, broker.port,
                                    metrics={"port": mport}))
    r5, r3 = Requester(broker.port), Requester(broker.port, v5=False)
    try:
        r5.send("st_code", b'{"input": {"description": "Motor \\ud800 start"}, "id": "sur"}')
        r5.send("st_code", b'{"input": {}, "id": "a\\ud800"}')
        r5.send("st_code", b'{"input": {}, "session": "\\udfff", "id": "ses"}')
        r5.send("st_code", {"input": ST, "id": "ctl", "reply_to": f"{BASE}/res/a\u0001b"})
        r3.send("st_code", {"input": ST, "id": "del", "client": "a\u007fb"})
        r3.send("st_code", {"input": ST, "id": "nonchar", "reply_to": f"{BASE}/res/\ufdd0"})
        r5.send("st_code", {**SHORT, "id": "after"})
        replies = r5.wait(7, timeout=60)
        bodies = _bodies(replies)
        assert bodies["sur"]["error"]["code"] == "bad_request"
        assert "input.description" in bodies["sur"]["error"]["message"]
        assert bodies["ses"]["error"]["code"] == "bad_request"
        assert "'session'" in bodies["ses"]["error"]["message"]
        for rid, field in (("ctl", "'reply_to'"), ("del", "'client'"),
                           ("nonchar", "'reply_to'")):
            assert bodies[rid]["error"]["code"] == "bad_request", bodies[rid]
            assert field in bodies[rid]["error"]["message"]
        no_id = [b for b in bodies.values() if b.get("id") is None]
        assert len(no_id) == 1 and "'id'" in no_id[0]["error"]["message"]
        # the request after them is served, and a request that reached the model carries
        # its usage also when it failed (truncated)
        after = bodies["after"]
        assert after["error"]["code"] == "truncated"
        assert after["usage"]["completion_tokens"] == 3 and after["usage"]["prompt_tokens"] > 0
        assert all(r.topic.startswith(DEFAULT_REPLY) for r in replies)
        m = _metrics(mport)
        assert m["rung_up"] == 1.0 and m["rung_mqtt_reconnects_total"] == 0.0
        _no_logging_errors(d)
    finally:
        r5.close()
        r3.close()


def test_a_request_recorded_by_an_older_version_does_not_stop_every_restart(
        tmp_path: Path, broker: Broker, edge_engine: Path, daemon: list[Daemon]) -> None:
    """The journal of a daemon that died on a lone surrogate: recovered, answered, served."""
    cfg = write_config(tmp_path, edge_engine, broker.port)
    j = Journal(tmp_path / "state" / "journal.db")
    for payload in (b'{"input": {"description": "Motor \\ud800 start"}, "id": "old"}',
                    b'{"input": {}, "id": "old2", "reply_to": "x/a\\u0001b"}'):
        e = j.record(Incoming(f"{BASE}/req/st_code", payload))
        assert e is not None
        j.started(e.seq)
    j.close()
    req = Requester(broker.port)
    try:
        d = _start(daemon, cfg)
        req.send("st_code", {**SHORT, "id": "new"})
        bodies = _bodies(req.wait(3, timeout=60))
        assert bodies["old"]["error"]["code"] == "bad_request"
        assert bodies["old2"]["error"]["code"] == "bad_request"
        assert bodies["new"]["error"]["code"] == "truncated"
        assert d.terminate() == 0
    finally:
        req.close()


def _attempts(db_path: Path) -> dict[str, int]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT payload, attempts FROM entries WHERE state = 'pending'")
        return {json.loads(p).get("id"): a for p, a in rows}
    finally:
        db.close()


def test_a_request_in_flight_at_every_death_is_quarantined(
        tmp_path: Path, broker: Broker, edge_engine: Path, daemon: list[Daemon]) -> None:
    cfg = write_config(tmp_path, edge_engine, broker.port, journal={"max_attempts": 2})
    db_path = tmp_path / "state" / "journal.db"
    req = Requester(broker.port)
    try:
        long = {"input": {"description": "Write a function block for a conveyor with two "
                          "photo eyes, a jam timer, a start/stop latch and an E-stop."},
                "id": "poison"}
        for attempt in (1, 2):
            d = _start(daemon, cfg)
            if attempt == 1:
                req.send("st_code", long)
            deadline = time.monotonic() + 60
            while _attempts(db_path).get("poison", 0) < attempt:   # the model started on it
                assert time.monotonic() < deadline, d.tail()
                time.sleep(0.01)
            d.kill9()       # as if the request took the daemon down with it
        assert req.replies == []
        d = _start(daemon, cfg)
        [reply] = req.wait(1, timeout=60)
        assert reply.body["id"] == "poison" and reply.body["error"]["code"] == "internal"
        assert "quarantined" in reply.body["error"]["message"]
        req.send("st_code", {**SHORT, "id": "next"})
        assert _bodies(req.wait(2, timeout=60))["next"]["error"]["code"] == "truncated"
        assert d.terminate() == 0
        d = _start(daemon, cfg)       # and it is never replayed again
        req.send("st_code", {**SHORT, "id": "third"})
        replies = req.wait_settled(3, timeout=60)
        assert sorted(r.body["id"] for r in replies) == ["next", "poison", "third"]
        j = Journal(db_path)
        note = j.db.execute("SELECT note FROM entries WHERE note IS NOT NULL").fetchall()
        j.close()
        assert len(note) == 1 and "quarantined" in note[0][0]
    finally:
        req.close()


def test_an_answer_the_broker_refuses_is_dead_lettered_and_the_rest_flow(
        tmp_path: Path, edge_engine: Path, daemon: list[Daemon]) -> None:
    """mosquitto drops a client that publishes a packet over ``max_packet_size``: a long
    answer is refused on every publish, the short ones behind it must still go out."""
    b = Broker(tmp_path / "broker", listener_options=["max_packet_size 1000"])
    b.start()
    mport = free_port()
    req = Requester(b.port, v5=False)
    try:
        d = _start(daemon, write_config(tmp_path, edge_engine, b.port,
                                        mqtt={"protocol": "3.1.1"}, metrics={"port": mport}))
        # the request fits under the broker's limit, its answer (topic + body) does not
        big = "x" * 800
        req.send("st_code", {"input": {"description": "x"}, "id": "big", "max_tokens": 3,
                             "reply_to": f"{BASE}/res/{big}"})
        for i in range(3):
            req.send("st_code", {**SHORT, "id": f"small{i}"})
        replies = req.wait_settled(3, timeout=90)
        assert sorted(r.body["id"] for r in replies) == ["small0", "small1", "small2"]
        rec = d.wait_log("answer dead-lettered", 30)
        assert "refused it 3 times" in rec["why"]
        m = _metrics(mport)
        assert m["rung_answers_dead_lettered_total"] == 1.0
        assert m["rung_mqtt_reconnects_total"] >= 2
        j = Journal(tmp_path / "state" / "journal.db")
        assert [t for _, t, _ in j.dead_letters()] == [f"{BASE}/res/{big}"]
        j.close()
        assert d.terminate() == 0
    finally:
        req.close()
        b.stop()


@contextlib.contextmanager
def _small_tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    path.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"this test needs a small tmpfs for state_dir (run as root): "
                    f"{out.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path) -> Path:
    """Fill the file system to its last page."""
    filler = path / "filler"
    with filler.open("wb", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)
    return filler


def test_a_full_state_dir_answers_unavailable_then_intake_resumes(
        tmp_path: Path, broker: Broker, edge_engine: Path, daemon: list[Daemon]) -> None:
    mport = free_port()
    with _small_tmpfs(tmp_path / "small") as state:
        cfg = write_config(tmp_path, edge_engine, broker.port, state_dir=str(state),
                           kv={"ram_mb": 16, "disk_mb": 0}, metrics={"port": mport})
        d = _start(daemon, cfg)
        req = Requester(broker.port)
        try:
            req.send("st_code", {**SHORT, "id": "before"})
            req.wait(1, timeout=60)
            filler = _fill(state)
            n = 25     # more than mosquitto's in-flight window of 20
            for i in range(n):
                req.send("st_code", {**SHORT, "id": f"full{i}"})
            bodies = _bodies(req.wait(1 + n, timeout=60))
            codes = {bodies[f"full{i}"]["error"]["code"] for i in range(n)}
            assert codes == {"unavailable"}
            assert "retry later" in bodies["full0"]["error"]["message"]
            assert _metrics(mport)["rung_storage_ok"] == 0.0
            check = subprocess.run([sys.executable, "-m", "rung.daemon", "check", "--config",
                                    str(cfg)], capture_output=True, text=True, timeout=120)
            assert check.returncode != 0 and "state_dir" in check.stdout + check.stderr
            filler.unlink()
            for i in range(3):
                req.send("st_code", {**SHORT, "id": f"after{i}"})
            bodies = _bodies(req.wait(1 + n + 3, timeout=60))
            assert {bodies[f"after{i}"]["error"]["code"] for i in range(3)} == {"truncated"}
            assert _metrics(mport)["rung_storage_ok"] == 1.0
            assert d.terminate() == 0
            msgs = [str(r.get("msg")) for r in d.lines()]
            # one log line per state change, not one per refused request
            assert sum(m.startswith("journal writes failing") for m in msgs) == 1, msgs
            assert sum(m.startswith("journal writes work again") for m in msgs) == 1
        finally:
            req.close()


def test_mqtt_3_1_1_end_to_end(tmp_path: Path, broker: Broker, edge_engine: Path,
                               daemon: list[Daemon]) -> None:
    cfg = write_config(tmp_path, edge_engine, broker.port, mqtt={"protocol": "3.1.1"})
    check = subprocess.run([sys.executable, "-m", "rung.daemon", "check", "--config",
                            str(cfg)], capture_output=True, text=True, timeout=120)
    assert "MQTT 3.1.1" in check.stdout, check.stdout + check.stderr
    # a retained request published before rung subscribes: a replay, never run
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="retainer",
                      protocol=mqtt.MQTTv311)
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    pub.publish(f"{BASE}/req/st_code", json.dumps({**SHORT, "id": "retained"}), qos=1,
                retain=True).wait_for_publish(10)
    req = Requester(broker.port, v5=False)
    try:
        d = _start(daemon, cfg)
        d.wait_log("retained request on %s ignored: publish requests with retain off"
                   .replace("%s", f"{BASE}/req/st_code"), 30)
        req.send("st_code", {**SHORT, "id": "a", "reply_to": req.reply_topic})
        [a] = req.wait(1, timeout=60)
        assert (a.topic, a.body["id"], a.body["error"]["code"]) == (req.reply_topic, "a",
                                                                   "truncated")
        assert d.terminate() == 0
        # sent while rung is down: kept in rung's persistent session, answered on return
        req.send("st_code", {**SHORT, "id": "b"})
        d = _start(daemon, cfg)
        replies = req.wait_settled(2, timeout=60)
        assert sorted(r.body["id"] for r in replies) == ["a", "b"]
    finally:
        pub.publish(f"{BASE}/req/st_code", b"", qos=1, retain=True).wait_for_publish(10)
        pub.disconnect()
        pub.loop_stop()
        req.close()


def test_a_denormal_temperature_fails_nobody_in_its_batch(
        tmp_path: Path, broker: Broker, edge_engine: Path, daemon: list[Daemon]) -> None:
    d = _start(daemon, write_config(tmp_path, edge_engine, broker.port,
                                    engine={"max_batch": 4}))
    req = Requester(broker.port)
    try:
        temps = {"denormal": 5e-324, "tiny": 1e-300, "huge": 1e308, "plain": 0.7}
        for rid, t in temps.items():
            req.send("st_code", {"input": ST, "id": rid, "max_tokens": 8, "temperature": t,
                                 "top_k": 10**9, "top_p": 1e-300 if rid == "tiny" else 1.0})
        bodies = _bodies(req.wait(4, timeout=90))
        for rid in temps:
            assert bodies[rid].get("ok") or bodies[rid]["error"]["code"] in (
                "truncated", "invalid_output"), bodies[rid]
        assert d.terminate() == 0
    finally:
        req.close()


def test_a_dead_engine_loop_is_never_silent(tmp_path: Path, broker: Broker, edge_engine: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """In process, with a bug planted in the engine loop itself: the daemon says so
    (critical log, liveness, ``rung_up`` 0) and exits 70 for systemd to restart it; the
    request it held stays pending in the journal."""
    import asyncio

    from rung.daemon.config import load_config
    from rung.daemon.serve import Service, build_runner

    cfg = load_config(write_config(tmp_path, edge_engine, broker.port), [])
    service = Service(cfg, build_runner(cfg))

    def broken() -> None:
        raise MemoryError("a bug in the loop itself")

    service.scheduler._take = broken   # type: ignore[method-assign]

    async def main() -> tuple[int, str | None]:
        run = asyncio.ensure_future(service.run())
        while not service.link.connected:
            await asyncio.sleep(0.01)
        service.intake.on_message(Incoming(f"{BASE}/req/st_code", json.dumps(SHORT).encode()))
        code = await asyncio.wait_for(run, 60)
        return code, service.liveness()

    code, why = asyncio.run(main())
    assert code == 70
    assert why == "scheduler has stopped: failed (MemoryError: a bug in the loop itself)"
    assert service.metrics.up._value.get() == 0
    crit = [r for r in caplog.records if r.levelname == "CRITICAL"
            and "scheduler has stopped" in r.getMessage()]
    assert crit and crit[0].exc_info is not None   # logged once, with its traceback
    j = Journal(tmp_path / "state" / "journal.db")
    assert len(j.pending()) == 1
    j.close()
