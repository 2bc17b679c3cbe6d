"""A request's answer names the protocol its transport speaks: the err texts come from the
adapter (``via``), never from the protocol-neutral job."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from rung.daemon.backoff import Backoff
from rung.daemon.modbus import agent as modbus_agent
from rung.daemon.opcua import agent as opcua_agent
from rung.daemon.plc.errors import PlcConfigError
from rung.daemon.plc.job import ERR_SNAPSHOT, Diagnoser, Job, err_codes
from rung.daemon.plc.transport import Values


class _Unreadable:
    async def read_snapshot(self) -> Values:
        raise PlcConfigError("no such point", plc="press1")


def _snapshot_failure(via: str) -> dict[str, Any]:
    plc: Any = SimpleNamespace(id="press1", description="", points=(), fault_tree=None,
                               history=None)
    diagnoser = Diagnoser(plc, _Unreadable(), lambda req: None, "rung", 1.0,
                          Backoff(0.01, 0.02), lambda op, n: None, via=via)
    answered = asyncio.run(diagnoser.run(Job(req_seq=7, resumed=False)))
    assert answered.err == ERR_SNAPSHOT
    assert answered.last["err_text"] == answered.event["err_text"]
    return answered.event


def test_an_opcua_snapshot_failure_says_opcua() -> None:
    event = _snapshot_failure(opcua_agent.VIA)
    assert event["err_text"] == "snapshot could not be read over OPC UA"
    assert "Modbus" not in str(event)


def test_a_modbus_snapshot_failure_reads_as_before() -> None:
    event = _snapshot_failure(modbus_agent.VIA)
    assert event["err_text"] == "snapshot could not be read over Modbus"
    assert modbus_agent.ERR_CODES[ERR_SNAPSHOT] == event["err_text"]


@pytest.mark.parametrize("via", ["Modbus", "OPC UA"])
def test_only_the_snapshot_text_names_the_protocol(via: str) -> None:
    codes = err_codes(via)
    assert [code for code, text in codes.items() if via in text] == [ERR_SNAPSHOT]
    assert not any("{" in text for text in codes.values())
