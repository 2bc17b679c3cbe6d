"""JSON-lines logging: one valid object per line, fields at the top level, no stacking."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.logs import QUIET_LOGGERS, log_fields, setup_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in quiet.items():
        logging.getLogger(name).setLevel(lvl)


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_fields_and_core_keys() -> None:
    out = io.StringIO()
    setup_logging("info", stream=out)
    log = logging.getLogger("rung.test")
    log.info("answered %s", "req-1", extra=log_fields(task="st_code", ms=12.3, path=Path("/x"),
                                                     bad=float("nan"), msg="clash"))
    log.debug("not shown")
    [line] = _lines(out)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"])
    assert line["level"] == "info"
    assert line["logger"] == "rung.test"
    assert line["msg"] == "answered req-1"
    assert line["task"] == "st_code"
    assert line["ms"] == 12.3
    assert line["path"] == "/x"
    assert line["bad"] == "nan"
    assert line["msg_"] == "clash"


def test_exception_is_one_line() -> None:
    out = io.StringIO()
    setup_logging("debug", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("rung.test").exception("failed", extra=log_fields(task="diagnosis"))
    [line] = _lines(out)
    assert line["level"] == "error"
    assert line["task"] == "diagnosis"
    assert "Traceback" in line["exc"]
    assert "RuntimeError: boom" in line["exc"]


def test_setup_twice_does_not_duplicate() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("info", stream=first)
    setup_logging("warning", stream=second)
    log = logging.getLogger("rung.test")
    log.info("quiet")
    log.warning("loud")
    assert first.getvalue() == ""
    assert [line["msg"] for line in _lines(second)] == ["loud"]


def test_noisy_loggers_quieter_and_bad_level() -> None:
    out = io.StringIO()
    setup_logging("info", stream=out)
    logging.getLogger("aiomqtt").info("ping")
    logging.getLogger("aiomqtt").warning("lost broker")
    assert [line["msg"] for line in _lines(out)] == ["lost broker"]
    with pytest.raises(ValueError, match="level"):
        setup_logging("chatty", stream=out)
