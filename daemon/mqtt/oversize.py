"""Inbound MQTT payloads refused for their size before anything parses them (every
subscription rung has beside requests: Sparkplug commands and STATE, fleet statuses; the
requests' own check answers ``too_large``)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable


class Oversize:
    """Inbound messages refused unparsed for their size, counted per kind (``counts``); the
    1st, 10th, 100th, ... of a kind are logged, so a flood costs a few lines."""

    def __init__(self, logger: logging.Logger, limit: int, what: str) -> None:
        self.log, self.limit, self.what = logger, limit, what
        self.counts: collections.Counter[str] = collections.Counter()
        self.observe: Callable[[str, str], None] | None = None   # (part, kind): metrics

    def refuse(self, kind: str, topic: str, size: int) -> bool:
        """True (counted, maybe logged) when ``size`` bytes are over the limit."""
        if size <= self.limit:
            return False
        self.counts[kind] += 1
        n = self.counts[kind]
        if self.observe is not None:
            self.observe(self.what, kind)
        if n == 10 ** (len(str(n)) - 1):
            self.log.warning("payload refused", extra={"rung_fields": {
                "part": self.what, "kind": kind, "topic": topic[:200], "bytes": size,
                "limit": self.limit, "refused": n,
                "why": f"{size} bytes is over the limit of {self.limit} "
                       "(mqtt.max_payload_bytes): dropped before parsing; logged for the "
                       "1st, 10th, 100th, ... of its kind"}})
        return True
