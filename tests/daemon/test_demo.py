"""``rung demo`` from an empty cache: builds, exports, verifies and answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_from_empty_cache_then_reuses_it(tmp_path: Path) -> None:
    env = {"RUNG_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "rung.daemon", "demo", "--max-tokens", "8"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    assert "export verified" in first.stderr and "greedy agreement 1.00" in first.stderr
    assert "prompt tokens" in first.stderr
    assert (tmp_path / "demo-tiny" / "engine" / "manifest.json").is_file()
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0 and "writing ONNX graph" not in second.stderr
    assert second.stdout == first.stdout  # same seed, same engine: same answer
