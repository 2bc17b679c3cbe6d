"""docs/contract.md and the code agree: every command and flag of the ``rung`` parser, every
configuration key the loader knows and every key of configs/rung.yaml is documented, nothing
documented is unknown to the code, and every error code the daemon can answer is in
docs/mqtt.md's table."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from rung.daemon import config
from rung.daemon.cli import build_parser
from tests.typecheck import ROOT, module_files

CONTRACT = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
MQTT_DOC = (ROOT / "docs" / "mqtt.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, heading
    return found.group(1)


def _first_column(text: str) -> set[str]:
    """Backticked names in the first column of the markdown tables of ``text``."""
    out: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            out.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return out


def _loader_keys(schema: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted keys of the loader's schema (a section's keys live in its converter)."""
    for name, key in schema.items():
        dotted = f"{prefix}{name}"
        inner = inspect.getclosurevars(key.conv).nonlocals.get("schema")
        if inner is None:
            yield dotted
        else:
            if key.nullable:
                yield dotted   # a section that may be absent (mqtt.tls) is a key itself
            yield from _loader_keys(inner, dotted + ".")


def _yaml_keys(doc: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in doc.items():
        if isinstance(value, dict) and value and name != "per_task":
            yield from _yaml_keys(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


DOCUMENTED_KEYS = _first_column(_section(CONTRACT, "Configuration keys"))
LOADER_KEYS = set(_loader_keys(config._TOP))


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    assert {"engine.path", "mqtt.tls.key_file", "retries.per_task"} <= LOADER_KEYS
    assert sorted(LOADER_KEYS - DOCUMENTED_KEYS) == [], "keys docs/contract.md leaves out"
    assert sorted(DOCUMENTED_KEYS - LOADER_KEYS) == [], "documented keys the loader refuses"


def test_the_example_config_uses_documented_keys_and_loads() -> None:
    path = ROOT / "configs" / "rung.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert sorted(set(_yaml_keys(doc)) - DOCUMENTED_KEYS) == []
    # and the keys it comments out (`# prepack: false`) are documented too
    commented = {f"{section}.{key}" for section, key in re.findall(
        r"^(\w+):\n(?:(?:  .*|#.*)?\n)*?  # (\w+): ", path.read_text(encoding="utf-8"), re.M)}
    assert sorted(commented - DOCUMENTED_KEYS) == []
    config.parse_config(doc, path.parent, [f"engine.path={ROOT}"])


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _documented_flags(command: str) -> set[str]:
    """Flags in the tables that follow the heading naming the command."""
    commands = _section(CONTRACT, "Commands")
    flags: set[str] = set()
    for block in re.split(r"^### ", commands, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        if f"`rung {command}`" in heading:
            # a heading naming several commands holds their shared flags, then each
            # command's own table after the paragraph naming it
            parts = re.split(r"^`rung (\w+)", body, flags=re.M)
            flags |= {f for f in _first_column(parts[0]) if f.startswith("-")}
            for name, text in zip(parts[1::2], parts[2::2], strict=True):
                if name == command:
                    flags |= {f for f in _first_column(text) if f.startswith("-")}
    return flags


def test_every_command_and_flag_is_documented_and_nothing_else() -> None:
    commands = _commands()
    headings = set(re.findall(r"`rung (\w+)`", " ".join(
        re.findall(r"^### (.*)$", CONTRACT, re.M))))
    assert headings == set(commands)
    for name, parser in commands.items():
        flags = {o for a in parser._actions for o in a.option_strings
                 if o not in ("-h", "--help")}
        documented = _documented_flags(name)
        assert sorted(flags - documented) == [], f"rung {name}: undocumented flags"
        assert sorted(documented - flags) == [], f"rung {name}: documented, not in the parser"


def _emitted_codes() -> set[str]:
    """Error codes in the daemon's source: the code argument of the calls that answer an
    error (``fail``, ``error_response``, ``Refused``, ``Answer(..., False, CODE``) and
    ``"code": CODE``."""
    codes: set[str] = set()
    for module, path in module_files().items():
        if not module.startswith("rung.daemon"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if (isinstance(k, ast.Constant) and k.value == "code"
                            and isinstance(v, ast.Constant) and isinstance(v.value, str)):
                        codes.add(v.value)
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            strings = [a for a in args if isinstance(a, str)]
            if name.lstrip("_") in ("fail", "error_response", "Refused"):
                codes.update(s for s in strings[:1] if re.fullmatch(r"[a-z_]+", s))
            elif (name == "Answer" and len(node.args) > 2
                  and isinstance(node.args[1], ast.Constant) and node.args[1].value is False
                  and isinstance(node.args[2], ast.Constant)):
                codes.add(node.args[2].value)
    return codes


def test_every_error_code_the_daemon_answers_is_documented() -> None:
    table = _first_column(_section(MQTT_DOC, "Error codes"))
    emitted = _emitted_codes()
    assert {"bad_json", "busy", "expired", "invalid_output", "unavailable"} <= emitted
    assert sorted(emitted - table) == [], "codes missing from docs/mqtt.md, Error codes"
    paragraph = re.search(r"Error codes, when each.*?\n\n", _section(CONTRACT, "MQTT"), re.S)
    assert paragraph
    listed = set(re.findall(r"`([a-z_]+)`", paragraph.group(0)))
    assert listed == table, "docs/contract.md lists the codes of docs/mqtt.md's table"


def test_no_document_points_outside_the_repository() -> None:
    # the contract lives here; nothing refers users to files a clone does not have
    texts = [p for p in ROOT.rglob("*") if p.suffix in (".md", ".py", ".yaml", ".toml")
             and not {".venv", ".git", "build"} & set(p.relative_to(ROOT).parts)]
    assert [str(p) for p in texts if "../shared" in p.read_text(encoding="utf-8")
            and p != Path(__file__)] == []
