"""The error family of the PLC links, whatever the protocol.

A failure is either a configuration error (the map, the PLC program or a certificate is
wrong: retrying cannot help) or transient (the PLC or the path to it is down or busy: the
caller retries with backoff), and, orthogonal to that, a failure of the connection
(``connection``: no answer at all, or no session) rather than a reply the PLC gave to this
one operation. The handshake backs off the whole link only for the former.

Every adapter translates its library's exceptions into these at the place it calls the
library (``daemon/modbus/errors.py``, ``daemon/opcua/errors.py``).
"""

from __future__ import annotations

from rung.engines.errors import RungError


class PlcError(RungError):
    """An operation on a PLC failed. ``plc``: the map's id; ``code``: the protocol's own
    code when the PLC answered with one (a Modbus exception code, an OPC UA status code);
    ``transient``: whether retrying later may succeed; ``connection``: the connection (or
    session) failed, rather than the PLC refusing or mangling this one operation."""

    transient = False

    def __init__(self, message: str, *, plc: str, code: int | None = None,
                 hint: str | None = None, connection: bool = False) -> None:
        super().__init__(message, hint)
        self.plc = plc
        self.code = code
        self.connection = connection


class PlcConfigError(PlcError):
    """The operation cannot succeed as asked: fix the map, the PLC program or the
    certificates, do not retry."""

    transient = False


class PlcTransientError(PlcError):
    """The PLC or the path to it is down, busy or silent: retry with backoff."""

    transient = True


ERRORS: dict[bool, type[PlcError]] = {False: PlcConfigError, True: PlcTransientError}
