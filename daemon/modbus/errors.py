"""The Modbus error family and how failures are classified (daemon/modbus/link.py raises them).

A failure is a :class:`ModbusConfigError` (the request or the map is wrong: retrying cannot
help) or a :class:`ModbusTransientError` (the PLC or the path to it is down or busy), and,
orthogonal to that, a failure of the connection (``connection``: no answer at all) or a
reply the PLC gave to this one request.
"""

from __future__ import annotations

from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException

from rung.daemon.plc.errors import PlcError


class ModbusError(PlcError):
    """A Modbus request failed. ``plc``: the map's id; ``code``: the Modbus exception code
    when the PLC answered with one; ``transient``: whether retrying later may succeed;
    ``connection``: the connection failed (no answer at all), rather than the PLC refusing
    or mangling this one request."""

    transient = False


class ModbusConfigError(ModbusError):
    """The request cannot succeed as asked (function, address, value, allowlist, response
    shape): fix the map or the PLC program, do not retry."""

    transient = False


class ModbusTransientError(ModbusError):
    """The PLC or the path to it is down, busy or silent: retry with backoff."""

    transient = True


# Modbus exception code -> (name in the Modbus specification, transient). Transient means the
# PLC may answer later: 4 is a fault inside the device (a module fault, a CPU in STOP), which
# clears without any change on rung's side; 5 (acknowledge: accepted, still working) and 6
# (busy) say "ask again later"; 8 is a device memory fault like 4; 10 and 11 come from a
# gateway whose serial side is down. 1, 2, 3 and 7 reject the request itself. Codes outside
# the table are treated as not transient: an unknown answer goes to a person, not a retry loop.
EXCEPTION_CODES: dict[int, tuple[str, bool]] = {
    1: ("illegal function", False),
    2: ("illegal data address", False),
    3: ("illegal data value", False),
    4: ("server device failure", True),
    5: ("acknowledge", True),
    6: ("server device busy", True),
    7: ("negative acknowledge", False),
    8: ("memory parity error", True),
    10: ("gateway path unavailable", True),
    11: ("gateway target device failed to respond", True),
}
HINTS = {
    1: "the PLC does not serve this table with this function; check the point's table",
    2: "the PLC has no such address; check the map's addresses (0-based) against the PLC",
    3: "the PLC refused the count or the value; check the map against the PLC program",
}
ERRORS: dict[bool, type[ModbusError]] = {False: ModbusConfigError,
                                          True: ModbusTransientError}

# A foreign failure -> (what happened, transient, link state after it). First match wins:
# the pymodbus classes derive from ModbusException, and TimeoutError derives from OSError.
# A bare ModbusException (e.g. ParameterException) rejects the request and leaves the state.
FAILURES: tuple[tuple[type[Exception], str, bool, str | None], ...] = (
    (ConnectionException, "connection failed", True, "disconnected"),
    (ModbusIOException, "no valid answer", True, "error"),
    (TimeoutError, "no answer in time", True, "error"),
    (OSError, "connection failed", True, "disconnected"),
    (ModbusException, "request refused by the client", False, None),
)
