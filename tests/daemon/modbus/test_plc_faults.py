"""The PLC handshake under faults that used to break it: a refused final write (no
re-diagnosis storm), one refused or short reply (no 30 s stop), a PLC that closes after
every response (served, not just alive), a refused acknowledgement (backoff). Each through
the fault-injecting proxy between ``rung serve`` and a pymodbus PLC (tests/daemon/plc_rig)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.daemon.plc_rig import (
    ACK_SEQ,
    BUSY,
    DONE,
    ERR,
    HEARTBEAT,
    REQ,
    RESULT,
    RETRY_MAX_S,
    Rig,
    gaps,
    map_doc,
    wait_quiet,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RigFactory = Callable[..., Rig]


def _backs_off(seen_gaps: list[float], first: float = 0.05, cap: float = RETRY_MAX_S) -> None:
    """Each gap at least what the backoff says (with 20 % slack), doubling to the cap."""
    for k, gap in enumerate(seen_gaps):
        assert gap >= 0.8 * min(first * 2 ** k, cap), seen_gaps


@pytest.mark.parametrize("code", [2, 3])
def test_refused_answer_write_is_retried_never_rerun(rig_factory: RigFactory,
                                                     code: int) -> None:
    rig = rig_factory()
    rig.proxy.inject("exception", 16, at=ERR, arg=code)    # err, result: one write at 113
    seq = rig.trigger()
    (event,) = rig.wait_event()
    tried = rig.wait_attempts(16, ERR, 6)
    _backs_off(gaps(tried))
    assert len(rig.events()) == 1                        # the model ran once
    regs = rig.plc.regs
    assert (regs[ACK_SEQ], regs[BUSY], regs[DONE]) == (seq, 1, 0)
    link = rig.wait_link("degraded", lambda d: d["state"] == "degraded")
    assert "answer write" in link["detail"] and f"exception {code}" in link["detail"]
    assert len(rig.logged("answer write for request", "fails")) == 1
    rig.proxy.clear()
    rig.wait("done", lambda: regs[DONE] == 1)
    assert (regs[ERR], regs[RESULT], regs[BUSY]) == (event["err"], event["result"], 0)
    rig.wait_link("connected again", lambda d: d["state"] == "connected")
    assert rig.logged("answer write works again")
    regs[REQ] = 0
    rig.wait("done cleared", lambda: regs[DONE] == 0)
    assert len(rig.events()) == 1 and len(rig.logged("plc answered")) == 1


def test_refused_done_write_is_retried_never_rerun(rig_factory: RigFactory) -> None:
    rig = rig_factory()
    rig.proxy.inject("exception", 16, at=BUSY, arg=2)     # done 1, busy 0: one write at 111
    seq = rig.trigger()
    (event,) = rig.wait_event()
    rig.wait_attempts(16, BUSY, 5)
    regs = rig.plc.regs
    assert (regs[ERR], regs[RESULT]) == (event["err"], event["result"])   # landed first
    assert (regs[ACK_SEQ], regs[DONE]) == (seq, 0) and len(rig.events()) == 1
    rig.proxy.clear()
    rig.wait("done", lambda: regs[DONE] == 1 and regs[BUSY] == 0)
    assert len(rig.events()) == 1


@pytest.mark.parametrize(("fault", "function", "at", "arg"), [
    ("exception", 16, HEARTBEAT, 2),    # the heartbeat write refused
    ("exception", 16, HEARTBEAT, 6),    # ... busy
    ("short", 3, 100, 1),               # the handshake read returns 15 of 16 registers
    ("exception", 3, 100, 2),           # the handshake read refused
])
def test_one_bad_reply_does_not_stop_the_link(rig_factory: RigFactory, fault: str,
                                              function: int, at: int, arg: int) -> None:
    rig = rig_factory()    # modbus.reconnect_max_s stays at its default, 30 s
    rig.wait("the heartbeat", lambda: rig.plc.regs[HEARTBEAT] >= 2, 30)
    rig.proxy.inject(fault, function, at=at, arg=arg, times=1)
    rig.proxy.wait("the fault", lambda: any(s.fault for s in rig.proxy.requests()))
    (hit,) = [s for s in rig.proxy.requests() if s.fault]
    beat = rig.plc.regs[HEARTBEAT]
    rig.wait("the heartbeat moving again", lambda: rig.plc.regs[HEARTBEAT] != beat, 5)
    assert rig.beats_after(hit.t)[0].t - hit.t < 1.0    # not reconnect_max_s later
    reads = rig.wait_attempts(3, 100, 2, since=hit.t)
    assert reads[1].t - hit.t < 0.5                     # polling went on
    seq = rig.trigger()
    rig.wait("done", lambda: rig.plc.regs[DONE] == 1 and rig.plc.regs[ACK_SEQ] == seq)
    assert rig.wait_link("connected", lambda d: d["state"] == "connected")


def test_no_heartbeat_while_the_handshake_cannot_be_read(rig_factory: RigFactory) -> None:
    rig = rig_factory()
    rig.wait("the heartbeat", lambda: rig.plc.regs[HEARTBEAT] >= 2, 30)
    rig.proxy.inject("exception", 3, at=100, arg=2)
    first = rig.wait_attempts(3, 100, 1, since=time.monotonic())[0]
    seq = rig.trigger()                                  # cannot be seen meanwhile
    refused = rig.wait_attempts(3, 100, 7, since=first.t)
    assert rig.beats_after(first.t) == []                # the PLC sees rung as down
    _backs_off(gaps(refused))
    assert rig.attempts(16, ACK_SEQ) == []
    link = rig.wait_link("degraded", lambda d: d["state"] == "degraded")
    assert "handshake read" in link["detail"] and "exception 2" in link["detail"]
    assert len(rig.logged("handshake read fails")) == 1
    cleared = time.monotonic()
    rig.proxy.clear()
    rig.wait("the heartbeat again", lambda: bool(rig.beats_after(cleared)), 5)
    assert rig.beats_after(cleared)[0].t - cleared < RETRY_MAX_S + 0.5
    rig.wait("done", lambda: rig.plc.regs[DONE] == 1 and rig.plc.regs[ACK_SEQ] == seq)
    assert rig.logged("handshake read works again")


def test_requests_are_served_while_the_heartbeat_write_is_refused(
        rig_factory: RigFactory) -> None:
    rig = rig_factory()
    injected = time.monotonic()
    rig.proxy.inject("exception", 16, at=HEARTBEAT, arg=2)
    seq = rig.trigger()
    rig.wait("done", lambda: rig.plc.regs[DONE] == 1 and rig.plc.regs[ACK_SEQ] == seq)
    link = rig.wait_link("degraded", lambda d: d["state"] == "degraded")
    assert "heartbeat write" in link["detail"]
    beats = rig.attempts(16, HEARTBEAT, injected)
    assert beats and all(s.fault for s in beats)              # never landed
    _backs_off(gaps(beats))   # backed off (a count would depend on how long the answer took)
    cleared = time.monotonic()
    rig.proxy.clear()
    rig.wait("the heartbeat", lambda: bool(rig.beats_after(cleared)), 5)


def test_a_plc_that_closes_after_each_response_is_served(rig_factory: RigFactory) -> None:
    rig = rig_factory()
    rig.wait("the heartbeat", lambda: rig.plc.regs[HEARTBEAT] >= 1, 30)
    rig.proxy.inject("close")
    since, states_before = time.monotonic(), len(rig.links())
    for _ in range(3):
        seq = rig.trigger()
        rig.wait("done", lambda s=seq: rig.plc.regs[DONE] == 1 and rig.plc.regs[ACK_SEQ] == s)
        rig.plc.regs[REQ] = 0
        rig.wait("done cleared", lambda: rig.plc.regs[DONE] == 0)
    assert [e["req_seq"] for e in rig.events()] == [seq - 2, seq - 1, seq]
    assert len(rig.beats_after(since)) >= 3
    assert rig.links()[states_before:] == []            # the link never flapped
    assert len(rig.logged("closes the connection after every response")) == 1
    after = rig.proxy.requests(since=since)
    assert len({s.conn for s in after}) >= len(after) - 2   # a connection per request


def test_refused_ack_write_backs_off_and_ends_with_the_request(rig_factory: RigFactory
                                                               ) -> None:
    rig = rig_factory()
    rig.proxy.inject("exception", 16, at=ACK_SEQ, arg=2)
    seq = rig.trigger()
    tried = rig.wait_attempts(16, ACK_SEQ, 6)
    _backs_off(gaps(tried))
    assert len(rig.logged(f"ack write for request {seq}", "fails")) == 1
    assert rig.events() == [] and rig.plc.regs[BUSY] == 0
    rig.plc.regs[REQ] = 0                                 # the PLC gives up
    rig.wait("the attempts to stop", lambda: bool(rig.logged("ack write no longer needed")))
    stopped = time.monotonic()
    wait_quiet(rig, 1.5)
    assert rig.attempts(16, ACK_SEQ, stopped) == []
    rig.proxy.clear()
    seq = rig.trigger()
    rig.wait("done", lambda: rig.plc.regs[DONE] == 1 and rig.plc.regs[ACK_SEQ] == seq)
    assert [e["req_seq"] for e in rig.wait_event()] == [seq]


def test_a_faulty_plc_does_not_hold_up_another(rig_factory: RigFactory) -> None:
    press2 = map_doc("press2", req=120, req_seq=121, ack_seq=130, busy=131, done=132, err=133,
                     result=134, heartbeat=135)
    rig = rig_factory(extra_maps=(press2,))
    rig.proxy.inject("exception", 3, at=120, arg=2)       # press2's handshake is unreadable
    refused = rig.wait_attempts(3, 120, 1, since=time.monotonic())[0]
    beat = rig.plc.regs[HEARTBEAT]
    rig.wait("press1's heartbeat", lambda: rig.plc.regs[HEARTBEAT] >= beat + 3, 30)
    seq = rig.trigger()
    rig.wait("press1 done", lambda: rig.plc.regs[DONE] == 1 and rig.plc.regs[ACK_SEQ] == seq)
    assert rig.attempts(16, 135, refused.t) == []          # press2 stopped beating
    link = rig.wait_link("press2 degraded", lambda d: d["state"] == "degraded", "press2")
    assert "handshake read" in link["detail"]
    assert rig.links()[-1]["state"] == "connected"
