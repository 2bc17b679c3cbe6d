"""``pip install`` of the wheel into a fresh virtual environment (no site packages of this
checkout's), then ``rung demo`` from a folder outside the checkout: the installed package
finds its data (task files, the register map, the demo model) and answers."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.typecheck import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_wheel_installs_into_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/bin:/bin"
    wheels = tmp_path / "wheels"
    out = _run([sys.executable, "-m", "pip", "wheel", "-v", str(ROOT), "-w", str(wheels),
                "--no-deps"], tmp_path, env)
    assert "absent from the packages configuration" not in out
    [wheel] = wheels.glob("rung-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("rung/configs/rung.yaml", "rung/configs/tasks/st_code.yaml",
                 "rung/configs/plcs/press1.yaml", "rung/configs/grafana/rung.json",
                 "rung/configs/prometheus/rung-alerts.yml",
                 "rung/models/edge-tiny/model.safetensors", "rung/daemon/demo/plcsim.py",
                 "rung/models/smollm2-plant/adapter_model.safetensors",
                 "rung/models/smollm2-plant/adapter_config.json"):
        assert data in names, data
    # no command needs the corpus generators, the training or the eval (docs/architecture.md)
    assert not [n for n in names if n.startswith("rung/tools/")]
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    # the dependencies come from the configured package index, as for a user
    _run([str(py), "-m", "pip", "install", "-q", f"rung[export] @ {wheel.as_uri()}"],
         tmp_path, env)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    env["RUNG_CACHE"] = str(tmp_path / "cache")
    where = _run([str(py), "-c", "import rung.daemon, importlib.util; print(rung.daemon.__file__);"
                  " print(importlib.util.find_spec('rung.tools'))"], work, env)
    assert str(venv) in where.splitlines()[0] and str(ROOT) not in where
    assert where.splitlines()[1] == "None"

    demo = subprocess.run([str(venv / "bin" / "rung"), "demo", "--max-tokens", "64"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0, demo.stderr[-3000:]
    # the shipped model, found as package data inside the venv
    assert f"shipped demo model {venv}" in demo.stderr
    for task in ("st_code", "fault_tree", "diagnosis"):
        assert f"=== {task}:" in demo.stdout
        assert f"held-out {task} instructions: " in demo.stdout   # one answer each, judged
    assert "=== press1: diagnosis triggered by the PLC" in demo.stdout
    assert "--- handed back to the PLC: err = " in demo.stdout
    assert "rung serve stopped on SIGTERM (exit 0)" in demo.stderr
