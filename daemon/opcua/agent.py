"""The handshake with one PLC over OPC UA: the shared handshake
(``daemon/plc/handshake.py``) over a node map's nodes (``daemon/opcua/link.py``).

The same contract, faults and kept answers as the Modbus agent; a request is seen at once
through the subscription on ``req``/``req_seq``, and the handshake is read (and the
heartbeat moved) every ``poll_s`` besides.
"""

from __future__ import annotations

from pathlib import Path

from rung.daemon.metrics import Metrics
from rung.daemon.opcua.link import NodeLink
from rung.daemon.opcua.nodemap import NodeMap
from rung.daemon.plc.handshake import HandshakeAgent, Plant
from rung.daemon.plc.job import Submit
from rung.daemon.plc.link_state import Publish

__all__ = ["VIA", "OpcUaAgent"]

VIA = "OPC UA"   # in the diagnosis request and the err texts


class OpcUaAgent(HandshakeAgent):
    """Drives one PLC's handshake nodes; ``link`` is its session."""

    def __init__(self, plc: NodeMap, link: NodeLink, submit: Submit, publish: Publish,
                 base_topic: str, timeout_s: float, reconnect_min_s: float = 0.5,
                 reconnect_max_s: float = 30.0, metrics: Metrics | None = None,
                 state_dir: Path | None = None, plant: Plant | None = None) -> None:
        self.link = link
        super().__init__(plc, link, submit, publish, base_topic, timeout_s, reconnect_min_s,
                         reconnect_max_s, metrics=metrics, state_dir=state_dir, plant=plant,
                         via=VIA)
