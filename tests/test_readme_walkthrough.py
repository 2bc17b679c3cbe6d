"""The README's "Serve your own model" walkthrough, run as written: each command in the
block marked ``<!-- walkthrough -->`` runs against the shipped demo model, a temp dir, a
private mosquitto on a free loopback port and a free metrics port. A misspelt subcommand,
flag or config key in the README fails here."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from rung.daemon.demo.localbroker import LocalBroker, free_port
from tests.daemon.harness import Daemon
from tests.daemon.test_serve import rung_cli

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "/opt/rung/engines/edge-tiny"
CONFIG = "/etc/rung/rung.yaml"


def walkthrough() -> list[list[str]]:
    """The commands of the marked shell block, one argv each (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- walkthrough -->\s*```sh\n(.*?)```", text, re.S)
    assert m, "README.md has no ```sh block after <!-- walkthrough -->"
    return [shlex.split(line, comments=True) for line in m.group(1).splitlines()
            if shlex.split(line, comments=True)]


def test_walkthrough_block_is_the_expected_steps() -> None:
    steps = [argv[:2] for argv in walkthrough()]
    assert steps == [["rung", "export"], ["cp", "configs/rung.yaml"], ["rung", "check"],
                     ["rung", "serve"], ["rung", "ask"]], steps


@pytest.mark.slow
def test_readme_walkthrough(tmp_path: Path) -> None:
    engine, config = tmp_path / "engine", tmp_path / "rung.yaml"

    def subst(argv: list[str]) -> list[str]:
        return [a.replace(ENGINE, str(engine)).replace(CONFIG, str(config)) for a in argv]

    export, copy, check, serve, ask = (subst(argv) for argv in walkthrough())
    broker = LocalBroker(tmp_path / "broker")
    broker.start()
    daemon = None
    try:
        done = rung_cli(*export[1:], timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (engine / "manifest.json").is_file()

        # cp configs/rung.yaml CONFIG, then "set engine.path" as the README says; the
        # test's own broker, ports and state dir replace the box's.
        assert copy[0] == "cp" and copy[2] == str(config)
        cfg = yaml.safe_load((ROOT / copy[1]).read_text())
        assert "path" in cfg["engine"]
        cfg["engine"]["path"] = str(engine)
        cfg["engine"]["threads"] = 1
        cfg["mqtt"]["port"] = broker.port
        cfg["metrics"]["port"] = free_port()
        cfg["state_dir"] = str(tmp_path / "state")
        config.write_text(yaml.safe_dump(cfg))

        done = rung_cli(*check[1:])
        assert done.returncode == 0, done.stdout + done.stderr

        assert serve[1:] == ["serve", "--config", str(config)], serve
        daemon = Daemon(config)                   # rung serve --config CONFIG, in the background
        daemon.start(timeout=120)

        done = rung_cli(*ask[1:], timeout=300)
        assert done.returncode in (0, 1) and done.stdout.strip(), done.stderr
        answer = json.loads(done.stdout)          # an answer came back over MQTT
        assert isinstance(answer, dict) and answer, done.stderr
        if done.returncode == 1:                  # an answer the checks refused is an answer
            assert "error" in answer, answer
    finally:
        if daemon is not None:
            daemon.stop()
        broker.stop()
