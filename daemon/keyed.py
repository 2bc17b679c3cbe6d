"""Config-shaped data checked against small key tables: one place for the daemon's config,
the register maps and the task files.

A table maps each key to a ``Key``: a converter, the expected form (for the message) and
whether an empty value means the default. ``fields`` checks one mapping against a table:
an unknown key is refused with the known ones and the closest match, a missing required
key and a value of the wrong form are refused naming the dotted key. ``read_yaml`` reads a
file in which a repeated key is an error, not a silent override.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rung.engines.errors import RungError


class Invalid(Exception):
    """A value is refused: ``key`` is the dotted key, ``text`` why, ``hint`` what to do."""

    def __init__(self, key: str, text: str, hint: str | None = None) -> None:
        super().__init__(key, text, hint)
        self.key, self.text, self.hint = key, text, hint


class Mismatch(Exception):
    """Wrong type or out of range: reported as 'expected <form>, got <value>'."""


Conv = Callable[[Any, str], Any]   # (value, dotted key) -> the checked value


@dataclass(frozen=True)
class Key:
    conv: Conv
    expect: str
    nullable: bool = False   # None (an empty YAML value) means the default
    secret: bool = False     # the value is never shown in a message


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def at(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def fields(raw: Any, prefix: str, schema: Mapping[str, Key],
           required: Sequence[str] = (), keep_none: bool = False) -> dict[str, Any]:
    """The keys of ``raw`` checked and converted (an empty nullable value is left out, so
    the default applies; ``keep_none``: kept as None).

    Raises:
        Invalid: not a mapping, an unknown key, a required key missing, a wrong value.
    """
    if raw is None:   # a section whose keys are all commented out
        raw = {}
    if not isinstance(raw, Mapping):
        raise Invalid(prefix, f"expected a mapping of keys, got {show(raw)}")
    for name in raw:
        if name not in schema:
            close = difflib.get_close_matches(str(name), list(schema), n=1)
            raise Invalid(at(prefix, str(name)), f"unknown key; known keys here: "
                          f"{', '.join(schema)}", f"did you mean {close[0]!r}?" if close else None)
    for name in required:
        if raw.get(name) is None:
            raise Invalid(at(prefix, name), f"required, expected {schema[name].expect}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        spec = schema[name]
        if value is None and spec.nullable:
            if keep_none:
                out[name] = None
            continue
        try:
            out[name] = spec.conv(value, at(prefix, name))
        except Mismatch:
            got = f"a {type(value).__name__}" if spec.secret else show(value)
            raise Invalid(at(prefix, name), f"expected {spec.expect}, got {got}") from None
    return out


def integer(lo: int, hi: int | None = None, expect: str | None = None) -> Key:
    def conv(v: Any, key: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None
                                                                       and v > hi):
            raise Mismatch
        return v
    return Key(conv, expect or (f"an integer {lo}..{hi}" if hi is not None
                                else f"an integer >= {lo}"))


def number(check: Callable[[float], bool] = lambda v: True, expect: str = "a number",
           nullable: bool = False) -> Key:
    """A finite number passing ``check``."""
    def conv(v: Any, key: str) -> float:
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or not check(v)):
            raise Mismatch
        return float(v)
    return Key(conv, expect, nullable)


def text(max_len: int, pattern: re.Pattern[str] | None = None, expect: str | None = None,
         nullable: bool = False) -> Key:
    """A non-blank string of at most ``max_len`` characters (matching ``pattern``)."""
    def conv(v: Any, key: str) -> str:
        if (not isinstance(v, str) or not v.strip() or len(v) > max_len
                or (pattern and not pattern.fullmatch(v))):
            raise Mismatch
        return v
    return Key(conv, expect or f"a non-empty string of at most {max_len} characters",
               nullable)


def choice(*options: str) -> Key:
    def conv(v: Any, key: str) -> str:
        if not isinstance(v, str) or v not in options:
            raise Mismatch
        return v
    return Key(conv, f"one of {', '.join(options)}")


def listof(item: Callable[[Any, str], Any], expect: str, lo: int, hi: int,
           nullable: bool = False) -> Key:
    """A list of ``lo..hi`` items, each checked by ``item(value, "key[i]")``."""
    def conv(v: Any, key: str) -> tuple[Any, ...]:
        if not isinstance(v, list) or not lo <= len(v) <= hi:
            raise Mismatch
        return tuple(item(x, f"{key}[{i}]") for i, x in enumerate(v))
    return Key(conv, expect, nullable)


def section(build: Callable[[dict[str, Any], str], Any], schema: Mapping[str, Key],
            required: Sequence[str] = (), nullable: bool = False) -> Key:
    """A nested mapping checked against ``schema``, then ``build(values, key)``."""
    def conv(v: Any, key: str) -> Any:
        return build(fields(v, key, schema, required), key)
    return Key(conv, "a mapping", nullable)


_Loader: Any = type("_Loader", (yaml.SafeLoader,), {})


def _unique_keys(loader: Any, node: Any) -> Any:
    seen: set[tuple[str, str]] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            if (key_node.tag, key_node.value) in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key_node.value!r} given twice", key_node.start_mark)
            seen.add((key_node.tag, key_node.value))
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys)


def read_yaml(path: Path, error: type[RungError], what: str, hint: str) -> Any:
    """A YAML file's content (a repeated key is an error), or ``error`` naming the file:
    missing (with ``hint``), unreadable, or invalid YAML with its line and column."""
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what}", hint) from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read "
                    f"({getattr(e, 'strerror', None) or type(e).__name__})") from None
    try:
        return yaml.load(content, Loader=_Loader)  # a SafeLoader underneath
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{path}: invalid YAML{where}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: invalid YAML ({e})".replace("\n", " ")) from None
