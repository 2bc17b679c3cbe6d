"""Fixtures shared by the daemon tests (the rest live in tests/conftest.py)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from rung.daemon.demo.localbroker import LocalBroker
from tests.daemon.plc_rig import rig_factory  # noqa: F401  (the PLC fault-test rig)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A private mosquitto on a free loopback port, for one test."""
    b = LocalBroker(tmp_path / "broker")
    b.start()
    yield b
    b.stop()
