"""JSON-lines logging: one object per line on stdout, for journald and log shippers.

    logger.info("answered", extra=log_fields(task="st_code", ms=12.3))
    {"ts": "2025-01-01T12:00:00.123Z", "level": "info", "logger": "rung.daemon", "msg": "answered",
     "task": "st_code", "ms": 12.3}
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

# third-party loggers that chatter at info (every ping, every packet): one level quieter
QUIET_LOGGERS = ("aiomqtt", "mqtt", "paho")
_FIELDS = "rung_fields"
_CORE = ("ts", "level", "logger", "msg", "exc", "stack")


def _jsonable(value: Any) -> Any:
    try:
        # allow_nan=False: NaN/Infinity would make the line invalid JSON
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def log_fields(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a logging call: the fields appear at the top level of the JSON line.
    Values that are not JSON-serializable are ``str()``-ed."""
    return {_FIELDS: {k: _jsonable(v) for k, v in fields.items()}}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object; fields named like a core key get a "_" suffix."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {"ts": ts.replace("+00:00", "Z"),
                               "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        fields = getattr(record, _FIELDS, None)
        if isinstance(fields, Mapping):
            for k, v in fields.items():
                key = str(k)
                out[key + "_" if key in _CORE else key] = _jsonable(v)
        line = json.dumps(out, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:   # a lone surrogate (from a JSON escape): keep it escaped
            line = json.dumps(out)
        return line


class _RungHandler(logging.StreamHandler[TextIO]):
    """Marks the handler setup_logging installed, so a second call replaces it."""


def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Logs JSON lines at ``level`` (debug, info, warning, error, critical) to ``stream``
    (stdout by default). Calling again replaces the handler installed before."""
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _RungHandler)]:
        root.removeHandler(h)
        h.close()  # leaves the stream open: StreamHandler never closes it
    handler = _RungHandler(stream if stream is not None else sys.stdout)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(lvl)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(min(lvl + 10, logging.CRITICAL))
