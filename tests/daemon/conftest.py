"""Fixtures shared by the daemon tests (the rest live in tests/conftest.py)."""

from tests.daemon.plc_rig import rig_factory  # noqa: F401  (the PLC fault-test rig)
