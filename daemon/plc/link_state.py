"""A PLC's link state on MQTT, whatever the protocol: ``{base}/plc/{plc}/link``, retained
(docs/contract.md).

The PLC's transport (a Modbus ``Link``, an OPC UA ``NodeLink``) reports every change of its state
(``connected``, ``degraded``, ``disconnected``, ``error``); :class:`LinkState` logs it
(``plc link``), publishes it and says it again after every reconnection to the broker. The
publisher holds what the broker cannot take and keeps the newest of a retained topic, so a
broker outage loses nothing. A change between up (the PLC answers: ``connected`` or
``degraded``) and down is also told to ``on_up`` (the Sparkplug B device's birth and death).
In a fleet, a PLC another node drives is ``silence``-d: its link state is that node's to say.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rung.daemon.wallclock import iso

log = logging.getLogger("rung.serve")   # the daemon's own lines (plc link, answered) share it

Publish = Callable[[str, dict[str, Any], bool], Awaitable[bool]]   # topic, doc, retain
OnUp = Callable[[str, bool], None]   # (PLC id, up)


class LinkState:
    """One PLC's link state: ``changed`` is its link's ``on_state``."""

    def __init__(self, plc_id: str, base_topic: str, publish: Publish,
                 on_up: OnUp | None = None) -> None:
        self.plc_id, self.publish, self.on_up = plc_id, publish, on_up
        self.topic = f"{base_topic}/plc/{plc_id}/link"
        self.doc: dict[str, Any] | None = None   # the latest state said
        self.silent = False
        self._up: bool | None = None
        self._sending: set[asyncio.Future[bool]] = set()

    def changed(self, state: str, detail: str | None) -> None:
        """The link's state changed: log it and publish it."""
        if self.silent:
            return
        up = state in ("connected", "degraded")   # the PLC answers
        if self.on_up is not None and self._up != up:
            self.on_up(self.plc_id, up)   # on a change only
        self._up = up
        self.doc = {"plc": self.plc_id, "state": state, "detail": detail,
                    "since": iso(time.time())}
        log.info("plc link", extra={"rung_fields": self.doc})
        self.republish()

    def republish(self) -> None:
        """Publish the latest state again (after every reconnection to the broker)."""
        if self.doc is None:
            return
        sending = asyncio.ensure_future(self.publish(self.topic, self.doc, True))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    def silence(self) -> None:
        """Another node drives the PLC now: say nothing more about its link."""
        self.silent, self.doc = True, None
