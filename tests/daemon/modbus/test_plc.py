"""Modbus-triggered diagnostics end to end: a real pymodbus server as the PLC (in a thread of
its own), real mosquitto, ``rung serve`` as a child process on the shipped demo model."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rung.daemon.demo.plcsim import SimPlcThread
from rung.daemon.tasks.task import load_tasks
from tests.daemon.harness import BASE, Broker, Daemon, Requester, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REQ, REQ_SEQ, ACK_SEQ, BUSY, DONE, ERR, RESULT, HEARTBEAT = 100, 101, 110, 111, 112, 113, 114, 115


class PlcThread(SimPlcThread):
    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 120) -> None:
        try:
            super().wait(what, cond, timeout)
        except TimeoutError as e:
            raise TimeoutError(f"{e}: handshake {self.regs[100:116]}") from None

    def trigger(self) -> int:  # type: ignore[override]
        return super().trigger(REQ, REQ_SEQ)


def _plant(plc: PlcThread) -> None:
    from rung.daemon.modbus.regmap import encode_words

    plc.regs[200] = 853                       # oil_temp 85.3 degC: past the alarm limit
    plc.regs[201] = 3950                      # motor_current 39.5 A
    plc.regs[202:204] = encode_words(11873, "uint32")
    plc.regs[210] = 2100                      # setpoint 210.0 bar
    plc.sim.input[10:12] = encode_words(92.5, "float32", "CDAB")   # pressure: low alert
    plc.sim.input[12:14] = encode_words(3.1, "float32", "ABCD")    # vibration
    plc.sim.coil[5] = True
    plc.sim.discrete[0] = True


@pytest.fixture
def plant(tmp_path: Path, edge_engine: Path
          ) -> Iterator[tuple[PlcThread, Broker, Daemon, Requester]]:
    plc = PlcThread()
    _plant(plc)
    source = Path(__file__).resolve().parents[3] / "configs" / "plcs" / "press1.yaml"
    doc = yaml.safe_load(source.read_text())
    doc["transport"]["port"] = plc.sim.port
    doc["handshake"].update(poll_s=0.05, heartbeat_s=0.3)
    doc.pop("fault_tree")   # one diagnosis per trigger keeps the tests short
    map_path = tmp_path / "press1.yaml"
    map_path.write_text(yaml.safe_dump(doc))
    broker = Broker(tmp_path / "broker")
    broker.start()
    daemon = Daemon(write_config(tmp_path, edge_engine, broker.port, plcs=[str(map_path)],
                                 modbus={"reconnect_min_s": 0.1, "reconnect_max_s": 0.5}))
    daemon.start()
    watcher = Requester(broker.port, topics=(f"{BASE}/diag/#", f"{BASE}/plc/#"))
    yield plc, broker, daemon, watcher
    watcher.close()
    daemon.stop()
    broker.stop()
    plc.close()


def _events(watcher: Requester, suffix: str) -> list[dict[str, Any]]:
    return [r.body for r in watcher.snapshot() if r.topic.endswith(suffix)]


def _wait_event(watcher: Requester, n: int = 1, timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = _events(watcher, "/diag/press1/event")
        if len(events) >= n:
            return events
        time.sleep(0.05)
    raise TimeoutError("no diagnosis event on MQTT")


def _check_event(event: dict[str, Any], req_seq: int) -> None:
    assert event["plc"] == "press1" and event["req_seq"] == req_seq
    assert event["snapshot"]["oil_temp"] == 85.3 and event["snapshot"]["pump_on"] is True
    assert event["snapshot"]["pressure"] == 92.5
    diag = event["diagnosis"]
    # constrained decoding: schema-valid output even when a semantic check refuses it
    jsonschema.validate(diag["output"], load_tasks()["diagnosis"].output_schema)
    assert event["err"] == (0 if diag["ok"] else 2)


def test_trigger_diagnosis_handshake(plant: tuple[PlcThread, Broker, Daemon, Requester]
                                     ) -> None:
    plc, _, _, watcher = plant
    plc.wait("a heartbeat", lambda: plc.regs[HEARTBEAT] >= 2, 30)
    seq = plc.trigger()
    plc.wait("ack_seq and busy", lambda: plc.regs[ACK_SEQ] == seq and plc.regs[BUSY] == 1
             or plc.regs[DONE] == 1)
    (event,) = _wait_event(watcher)
    _check_event(event, seq)
    plc.wait("done", lambda: plc.regs[DONE] == 1)
    assert plc.regs[BUSY] == 0 and plc.regs[ERR] == event["err"]
    assert plc.regs[RESULT] == event["result"]
    if event["err"] == 0:
        assert 1 <= plc.regs[RESULT] <= 4
    plc.regs[REQ] = 0                                   # the PLC took the answer
    plc.wait("done cleared", lambda: plc.regs[DONE] == 0, 30)
    (last,) = _events(watcher, "/diag/press1/last")
    assert last["req_seq"] == seq and last["err"] == event["err"]
    links = _events(watcher, "/plc/press1/link")
    assert links and links[-1]["state"] == "connected"
    # what went over the wire: reads, and writes only to rung's own registers
    writes = [a for a in plc.sim.log if a.function in (5, 6, 15, 16)]
    assert writes and all(110 <= a.address <= 115 for a in writes)
    beat = plc.regs[HEARTBEAT]
    plc.wait("the heartbeat going on", lambda: plc.regs[HEARTBEAT] != beat, 10)


def test_link_drops_during_a_diagnosis(plant: tuple[PlcThread, Broker, Daemon, Requester]
                                       ) -> None:
    plc, _, daemon, watcher = plant
    seq = plc.trigger()
    plc.wait("busy", lambda: plc.regs[BUSY] == 1 or plc.regs[DONE] == 1)
    plc.call(plc.sim.stop())                            # the cable is pulled
    plc.wait("rung noticing the link down", lambda: any(
        d["state"] in ("disconnected", "error") for d in _events(watcher, "/plc/press1/link")),
        30)
    plc.call(plc.sim.start())
    plc.wait("done after the link came back", lambda: plc.regs[DONE] == 1)
    assert plc.regs[BUSY] == 0 and plc.regs[ACK_SEQ] == seq
    # the snapshot is retried across the outage and the diagnosis agrees with it: success
    assert plc.regs[ERR] == 0, _wait_event(watcher)
    states = [d["state"] for d in _events(watcher, "/plc/press1/link")]
    assert "disconnected" in states or "error" in states
    assert states[-1] == "connected"
    plc.regs[REQ] = 0
    plc.wait("done cleared", lambda: plc.regs[DONE] == 0, 30)
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_restart_with_a_request_pending(plant: tuple[PlcThread, Broker, Daemon, Requester]
                                        ) -> None:
    plc, _, daemon, watcher = plant
    seq = plc.trigger()
    plc.wait("busy", lambda: plc.regs[BUSY] == 1 and plc.regs[ACK_SEQ] == seq)
    daemon.kill9()
    assert plc.regs[DONE] == 0
    daemon.start()
    plc.wait("done after the restart", lambda: plc.regs[DONE] == 1)
    events = _wait_event(watcher)
    resumed = [e for e in events if e["resumed"]]
    assert resumed and resumed[-1]["req_seq"] == seq
    _check_event(resumed[-1], seq)
    assert plc.regs[ERR] == resumed[-1]["err"]


def test_rung_check_reads_the_plc(plant: tuple[PlcThread, Broker, Daemon, Requester]) -> None:
    from tests.daemon.test_serve import rung_cli

    plc, _, daemon, _ = plant
    good = rung_cli("check", "--config", str(daemon.config))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "press1 at 127.0.0.1:" in good.stdout and "8 points read" in good.stdout
    plc.call(plc.sim.stop())
    down = rung_cli("check", "--config", str(daemon.config))
    assert down.returncode == 1
    assert any(line.startswith("FAIL plcs") and "press1" in line
               for line in down.stdout.splitlines())


def test_device_busy_on_the_snapshot_is_retried(
        plant: tuple[PlcThread, Broker, Daemon, Requester]) -> None:
    plc, _, _, watcher = plant
    plc.sim.fail_addresses("input", range(10, 14), 6)   # the pressure/vibration block
    seq = plc.trigger()
    plc.wait("busy", lambda: plc.regs[BUSY] == 1 or plc.regs[DONE] == 1)
    time.sleep(0.6)
    plc.sim.clear_failures()
    plc.wait("done", lambda: plc.regs[DONE] == 1)
    assert plc.regs[ERR] != 1                            # the snapshot was read in the end
    assert len([a for a in plc.sim.log if (a.function, a.address) == (4, 10)]) >= 2
    (event,) = _wait_event(watcher)
    _check_event(event, seq)


def test_illegal_address_is_reported_not_retried(
        plant: tuple[PlcThread, Broker, Daemon, Requester]) -> None:
    plc, _, _, watcher = plant
    plc.sim.fail_addresses("input", range(10, 14), 2)   # the map names a missing register
    seq = plc.trigger()
    plc.wait("done", lambda: plc.regs[DONE] == 1, 30)
    assert plc.regs[ERR] == 1 and plc.regs[RESULT] == 0
    assert len([a for a in plc.sim.log if (a.function, a.address) == (4, 10)]) == 1
    (event,) = _wait_event(watcher)
    assert event["req_seq"] == seq and event["err"] == 1 and "diagnosis" not in event


def test_next_request_while_done_is_still_up(
        plant: tuple[PlcThread, Broker, Daemon, Requester]) -> None:
    plc, _, _, watcher = plant
    first = plc.trigger()
    plc.wait("done", lambda: plc.regs[DONE] == 1 and plc.regs[ACK_SEQ] == first)
    second = plc.trigger()               # req stays 1, req_seq moves on
    plc.wait("the second request taken", lambda: plc.regs[ACK_SEQ] == second)
    plc.wait("done for the second", lambda: plc.regs[DONE] == 1 and plc.regs[BUSY] == 0)
    assert [e["req_seq"] for e in _wait_event(watcher, 2)] == [first, second]


def test_withdrawn_request_after_a_crash_clears_busy(
        plant: tuple[PlcThread, Broker, Daemon, Requester]) -> None:
    plc, _, daemon, watcher = plant
    plc.trigger()
    plc.wait("busy", lambda: plc.regs[BUSY] == 1)
    daemon.kill9()
    plc.regs[REQ] = 0                    # the PLC gave up on it
    daemon.start()
    plc.wait("busy cleared", lambda: plc.regs[BUSY] == 0, 30)
    assert plc.regs[DONE] == 0 and not _events(watcher, "/diag/press1/event")


def test_two_maps_with_one_id_are_refused(tmp_path: Path, edge_engine: Path
                                          ) -> None:
    from tests.daemon.test_serve import rung_cli

    source = Path(__file__).resolve().parents[3] / "configs" / "plcs" / "press1.yaml"
    config = write_config(tmp_path, edge_engine, 1883, plcs=[str(source), str(source)])
    out = rung_cli("serve", "--config", str(config), timeout=60)
    assert out.returncode == 1 and "two register maps use the id 'press1'" in out.stderr
