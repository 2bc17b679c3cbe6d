"""systemd/rung.service: `systemd-analyze verify` finds nothing to say about it, and the
directives the daemon and the install notes rely on are there."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "rung.service"
EXEC_START = "/opt/rung/.venv/bin/rung serve --config /etc/rung/rung.yaml"

# verify also loads the units ours names (After=mosquitto.service, ...); what it says about
# those installed on the test machine is not about ours. A line about another unit starts
# with that unit's file or name.
_OTHER_UNIT = re.compile(r"^(?:\S*/)?(?P<unit>[\w@.:\\-]+\.(?:service|socket|target|mount|"
                         r"automount|timer|path|slice|scope|device|swap))(?::\d+)?: ")


def _systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not Path(exe).is_file():
        pytest.fail("systemd-analyze not found: install the `systemd` Debian package "
                    "(apt-get install systemd) to check systemd/rung.service")
    return exe


def _directives() -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, in file order."""
    out, section = [], ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {raw!r}"
        out.append((section, key.strip(), value.strip()))
    return out


def _values(key: str, section: str = "Service") -> list[str]:
    return [v for s, k, v in _directives() if s == section and k == key]


def _verify(unit_text: str, tmp_path: Path) -> tuple[int, list[str]]:
    """Run verify on a copy named rung.service; (exit status, lines about our unit or
    about no unit at all)."""
    exe = _systemd_analyze()
    # verify checks that ExecStart's binary exists: point it at the installed console
    # script (or this interpreter) instead of the /opt path of a real install.
    rung = Path(sys.executable).with_name("rung")
    binary = str(rung if rung.is_file() else Path(sys.executable))
    text, n = re.subn(r"(?m)^ExecStart=/opt/rung/\.venv/bin/rung ", f"ExecStart={binary} ",
                      unit_text)
    assert n == 1, "expected exactly one ExecStart=/opt/rung/.venv/bin/rung line"
    copy = tmp_path / "rung.service"
    copy.write_text(text)
    proc = subprocess.run([exe, "verify", "--man=no", "--recursive-errors=no", str(copy)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = (proc.stdout + proc.stderr).splitlines()
    ours = [ln for ln in lines if ln.strip() and not ((m := _OTHER_UNIT.match(ln))
                                                      and m["unit"] != "rung.service")]
    return proc.returncode, ours


@pytest.mark.integration
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    rc, lines = _verify(UNIT.read_text(), tmp_path)
    assert rc == 0 and not lines, "systemd-analyze verify:\n" + "\n".join(lines)


@pytest.mark.integration
def test_verify_reports_a_broken_unit(tmp_path: Path) -> None:
    # The clean result above means something only if verify's complaints reach us.
    broken = UNIT.read_text().replace("WatchdogSec=30\n", "WatchdogSec=30\nWatchdogSecs=30\n")
    _, lines = _verify(broken, tmp_path)
    assert any("WatchdogSecs" in ln and "rung.service" in ln for ln in lines), lines


def test_service_directives() -> None:
    one = {k: _values(k) for k in (
        "Type", "NotifyAccess", "ExecStart", "WatchdogSec", "Restart", "RestartSec",
        "TimeoutStopSec", "KillSignal", "StateDirectory", "StateDirectoryMode", "DynamicUser",
        "ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges", "DevicePolicy",
        "PrivateDevices", "CapabilityBoundingSet", "UMask", "MemoryDenyWriteExecute")}
    assert one == {
        "Type": ["notify"], "NotifyAccess": ["main"], "ExecStart": [EXEC_START],
        "WatchdogSec": ["30"], "Restart": ["on-failure"], "RestartSec": ["5"],
        "TimeoutStopSec": ["60"], "KillSignal": ["SIGTERM"], "StateDirectory": ["rung"],
        "StateDirectoryMode": ["0750"], "DynamicUser": ["yes"], "ProtectSystem": ["strict"],
        "ProtectHome": ["yes"], "PrivateTmp": ["yes"], "NoNewPrivileges": ["yes"],
        "DevicePolicy": ["closed"], "PrivateDevices": ["no"], "CapabilityBoundingSet": [""],
        "UMask": ["0027"], "MemoryDenyWriteExecute": ["no"]}
    assert _values("LoadCredential") == [
        "mqtt-password:/etc/rung/credentials/mqtt-password",
        "mqtt-tls-key:/etc/rung/credentials/mqtt-tls-key"]
    assert "PYTHONUNBUFFERED=1" in _values("Environment")
    assert "dialout" in " ".join(_values("SupplementaryGroups")).split()
    allowed = _values("DeviceAllow")
    for dev in ("char-ttyS", "char-ttyUSB", "char-ttyACM", "char-nvidia-uvm", "/dev/nvmap",
                "/dev/nvhost-ctrl-gpu"):
        assert f"{dev} rw" in allowed, dev


def test_unit_and_install_sections() -> None:
    assert "network-online.target" in " ".join(_values("After", "Unit")).split()
    assert "mosquitto.service" in " ".join(_values("After", "Unit")).split()
    assert _values("Wants", "Unit") == ["network-online.target"]
    assert _values("WantedBy", "Install") == ["multi-user.target"]


def test_readme_names_the_install_paths() -> None:
    readme = (UNIT.parent / "README.md").read_text()
    for path in ("/opt/rung/.venv", "/etc/rung/rung.yaml", "/etc/rung/credentials",
                 "/var/lib/rung", "credential:mqtt-password", "credential:mqtt-tls-key"):
        assert path in readme, path
