"""What a PLC link shows of itself, the same for every protocol: its connection state, read
``degraded`` while it is connected and an operation of the handshake keeps failing (the
operations and why, as the detail), each change told once to ``on_state``."""

from __future__ import annotations

from rung.daemon.plc.transport import OnState


class ShowsState:
    """Mixed into a link that keeps ``state`` (connected, disconnected, error), ``_detail``
    (why) and ``on_state``; it calls ``_show`` after each change of them."""

    state: str
    on_state: OnState | None
    _detail: str | None

    def __init__(self) -> None:
        self._faults: dict[str, str] = {}   # the caller's operation -> why it keeps failing
        self._shown: tuple[str, str | None] = ("disconnected", None)

    def set_fault(self, what: str, detail: str | None) -> None:
        """The caller's operation ``what`` keeps failing (``detail`` says why), or is fine
        again (None). While any is failing, a connected link reads ``degraded``."""
        if detail is None:
            self._faults.pop(what, None)
        else:
            self._faults[what] = detail
        self._show()

    def _show(self) -> None:
        state, detail = self.state, self._detail
        if state == "connected" and self._faults:
            state = "degraded"
            detail = "; ".join(f"{what}: {why}" for what, why in self._faults.items())
        if (state, detail) != self._shown:
            self._shown = (state, detail)
            if self.on_state is not None:
                self.on_state(state, detail)
