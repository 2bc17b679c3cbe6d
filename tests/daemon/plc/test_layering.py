"""daemon/plc/ is the protocol-neutral core the adapters build on: no module under it may
import a protocol adapter (Modbus, OPC UA) or MQTT (docs/architecture.md, "Packages and
imports")."""

from __future__ import annotations

import ast
from pathlib import Path

PLC = Path(__file__).resolve().parents[3] / "daemon" / "plc"
FORBIDDEN = ("rung.daemon.modbus", "rung.daemon.opcua", "rung.daemon.mqtt")


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):   # imports inside functions and TYPE_CHECKING blocks too
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_plc_imports_no_protocol_adapter() -> None:
    files = sorted(PLC.rglob("*.py"))
    assert files, PLC
    bad = sorted({f"{path.relative_to(PLC.parent)}:{line}: {name}"
                  for path in files
                  for line, name in _imports(ast.parse(path.read_text(), str(path)))
                  if _forbidden(name)})
    assert bad == [], "daemon/plc/ must not import these (move the shared part into plc/)"


def test_the_check_sees_a_forbidden_import() -> None:
    tree = ast.parse("from rung.daemon import modbus\n"
                     "def f():\n    import rung.daemon.opcua.link\n")
    assert [n for _, n in _imports(tree) if _forbidden(n)] == ["rung.daemon.modbus",
                                                              "rung.daemon.opcua.link"]
