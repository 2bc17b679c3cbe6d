"""The demo's held-out requests come from the corpus generator where it is installed; a
wheel without it falls back to the hand-written ones, but a broken install (a module the
generator needs is missing) is said as it is, never swallowed."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from rung.daemon.demo import run


def _missing(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = builtins.__import__

    def fake(mod: str, *args: Any, **kw: Any) -> Any:
        if mod == "rung.tools.corpus":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(mod, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_without_the_generator_the_hand_written_requests_are_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "rung.tools")
    picked = run._requests()
    assert picked == {task: [data] for task, data in run.REQUESTS}


def test_a_module_the_generator_needs_is_not_swallowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "scipy")
    with pytest.raises(ModuleNotFoundError, match="scipy"):
        run._requests()
