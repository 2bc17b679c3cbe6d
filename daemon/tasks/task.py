"""Tasks as data: one YAML file per task in ``configs/tasks/``, loaded and checked once.

A task names its prompts, an input JSON Schema, an output JSON Schema (draft 2020-12), its
token budget and its kind (``validators``: the kind's name, ``kinds.KINDS``; none: the
schema alone). Loading refuses, naming the file and the key: invalid YAML, a missing or
mistyped key, an invalid schema, a schema keyword the constraint engine cannot enforce
(never a fallback to unconstrained generation), a prompt template field that the input
schema does not define, an unknown validator, two kinds for one task.

An input schema may also use rung's own keywords (``INPUT_KEYWORDS``), which JSON Schema
tools that do not know them ignore: ``uniqueBy`` (an array's objects differ in that key),
``notReserved`` (a string is no name of that table, e.g. an IEC 61131-3 keyword), and
``noControlCharacters`` (a string holds no C0, DEL or C1 character).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox
import jsonschema

from rung.daemon import keyed
from rung.daemon.tasks.kind import InputError, Kind
from rung.daemon.tasks.kinds import KINDS, kind_of
from rung.daemon.tasks.validate import schema_message
from rung.engines.errors import RungError
from rung.engines.grammar import unenforceable_keywords

# optional input fields render as empty; unknown top-level fields are refused at load
_ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


@lru_cache(maxsize=64)
def _template(source: str) -> jinja2.Template:
    """A prompt template compiled once (~5 ms each time, a tenth of a short answer on the
    demo model)."""
    return _ENV.from_string(source)


class TaskError(RungError):
    """A task file is unusable, or a task input is invalid."""


# -- rung's input keywords -----------------------------------------------------------------
# notReserved's tables, as the kinds give them: a name -> what the table already calls it
# (None: free)
NAME_TABLES: dict[str, Callable[[str], str | None]] = {
    table: names for kind in KINDS.values() for table, names in kind.name_tables.items()}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")   # C0, DEL, C1


def _unique_by(validator: Any, key: str, instance: Any, schema: Any,
               ) -> Iterator[jsonschema.ValidationError]:
    """``uniqueBy: KEY``: no two objects of the array have the same ``KEY``."""
    if not validator.is_type(instance, "array"):
        return
    first: dict[Any, int] = {}
    for i, item in enumerate(instance):
        value = item.get(key) if isinstance(item, dict) else None
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            continue
        if value in first:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            yield jsonschema.ValidationError(
                f"{shown} is already the {key} of item {first[value]}; each item needs "
                f"a {key} of its own", path=(i, key))
        else:
            first[value] = i


def _not_reserved(validator: Any, table: str, instance: Any, schema: Any,
                  ) -> Iterator[jsonschema.ValidationError]:
    """``notReserved: TABLE``: the string is no name ``NAME_TABLES[TABLE]`` knows."""
    if validator.is_type(instance, "string") and (kind := NAME_TABLES[table](instance)):
        yield jsonschema.ValidationError(f"{instance!r} is {kind}; choose a name of its own")


def _no_control_characters(validator: Any, on: bool, instance: Any, schema: Any,
                           ) -> Iterator[jsonschema.ValidationError]:
    """``noControlCharacters: true``: no C0 (U+0000-U+001F), DEL or C1 (U+0080-U+009F)
    character; the message names its code point, never the character itself."""
    if on and validator.is_type(instance, "string") and (m := _CONTROL.search(instance)):
        yield jsonschema.ValidationError(
            f"holds the control character U+{ord(m.group()):04X} at position {m.start()}; "
            "names are printable text")


INPUT_KEYWORDS: dict[str, tuple[Callable[..., Iterator[jsonschema.ValidationError]],
                                Callable[[Any], bool], str]] = {
    # keyword: (its check, what its value must be, that said in words)
    "uniqueBy": (_unique_by, lambda v: isinstance(v, str), "a property name"),
    "notReserved": (_not_reserved, lambda v: isinstance(v, str) and v in NAME_TABLES,
                    f"a name table ({', '.join(NAME_TABLES)})"),
    "noControlCharacters": (_no_control_characters, lambda v: isinstance(v, bool),
                            "true or false"),
}
_InputValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {k: check for k, (check, _, _) in INPUT_KEYWORDS.items()})
# where a schema holds schemas by name (a property named "uniqueBy" is no keyword)
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
_VALUES = frozenset({"enum", "const", "default", "examples"})   # data, not schemas


def _keywords(schema: Any, where: str = "") -> Iterator[tuple[str, str, Any]]:
    """Each use of an input keyword in ``schema``: (where, keyword, value)."""
    if not isinstance(schema, dict):
        return
    for k, v in schema.items():
        if k in INPUT_KEYWORDS:
            yield where, k, v
        if k in _SCHEMA_MAPS and isinstance(v, dict):
            for name, sub in v.items():
                yield from _keywords(sub, f"{where}/{k}/{name}")
        elif k not in _VALUES and isinstance(v, dict):
            yield from _keywords(v, f"{where}/{k}")
        elif k not in _VALUES and isinstance(v, list):
            for i, sub in enumerate(v):
                yield from _keywords(sub, f"{where}/{k}/{i}")


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    system_prompt: str
    prompt_template: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    max_tokens: int
    validators: tuple[str, ...]
    path: Path

    @property
    def kind(self) -> Kind:
        """What code knows of this task's answers (``kind.Kind``)."""
        return kind_of(self.validators)

    @cached_property
    def _input_validator(self) -> Any:
        return _InputValidator(self.input_schema)

    def check_input(self, data: Any) -> None:
        """Raises TaskError naming the first violation of the input schema (rung's input
        keywords included): its path and the rule, never the value
        (``validate.schema_message``); then what the task's kind refuses (an ST request's
        test vectors that cannot run)."""
        err = jsonschema.exceptions.best_match(self._input_validator.iter_errors(data))
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
            raise TaskError(f"task {self.name}: input {where}: {schema_message(err)}",
                            "see the task's input_schema")
        try:
            self.kind.check_input(data)
        except InputError as e:
            raise TaskError(f"task {self.name}: input {e}", e.hint) from e

    def messages(self, data: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat for one input: system prompt + the rendered user prompt."""
        try:
            user = _template(self.prompt_template).render(
                **{k: data.get(k) for k in self.input_schema.get("properties", {})})
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError) as e:
            raise TaskError(f"task {self.name}: prompt_template cannot render this input "
                            f"({e})") from e
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": user}]


def _string(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise keyed.Mismatch
    return v


def _mapping(v: Any, key: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise keyed.Mismatch
    return v


def _validator(v: Any, key: str) -> str:
    if v not in KINDS:
        raise keyed.Invalid(key, f"unknown validator {v!r}", f"known: {', '.join(KINDS)}")
    return str(v)


_KEYS: dict[str, keyed.Key] = {
    "name": keyed.Key(_string, "a string"), "description": keyed.Key(_string, "a string"),
    "system_prompt": keyed.Key(_string, "a string"),
    "prompt_template": keyed.Key(_string, "a string"),
    "input_schema": keyed.Key(_mapping, "a JSON Schema (a mapping)"),
    "output_schema": keyed.Key(_mapping, "a JSON Schema (a mapping)"),
    "max_tokens": keyed.integer(1, 1_000_000),
    "validators": keyed.listof(_validator, "a list of validator names", 0, len(KINDS))}


def load_task(path: Path) -> Task:
    """Read and check one task file (a repeated key, an unknown key, a missing or mistyped
    one is refused naming the file and the dotted key)."""
    raw = keyed.read_yaml(Path(path), TaskError, "task file", "check tasks_dir")
    if not isinstance(raw, dict):
        raise TaskError(f"{path}: a task file is a mapping of keys")
    try:
        values = keyed.fields(raw, "", _KEYS, required=list(_KEYS))
    except keyed.Invalid as e:
        raise TaskError(f"{path}: {e.key}: {e.text}", e.hint) from None
    if len(set(values["validators"])) > 1:
        raise TaskError(f"{path}: validators: names {', '.join(values['validators'])}; a task "
                        "is one kind", "name one of them (docs/add-a-task.md)")
    for key in ("input_schema", "output_schema"):
        _check_schema(path, key, values[key])
    _check_template(path, values["prompt_template"], values["input_schema"])
    return Task(name=values["name"], description=values["description"],
                system_prompt=values["system_prompt"],
                prompt_template=values["prompt_template"],
                input_schema=values["input_schema"], output_schema=values["output_schema"],
                max_tokens=values["max_tokens"], validators=values["validators"],
                path=Path(path))


def _check_schema(path: Path, key: str, schema: dict[str, Any]) -> None:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise TaskError(f"{path}: key '{key}' is not a valid JSON Schema at '{where}': "
                        f"{e.message}") from e
    if key == "output_schema":
        bad = unenforceable_keywords(schema)
        if bad:
            raise TaskError(f"{path}: key '{key}' uses {', '.join(repr(b) for b in bad)}, "
                            "which constrained decoding cannot enforce",
                            "rewrite the schema without it")
    for where, keyword, value in _keywords(schema):
        if key == "output_schema":
            raise TaskError(f"{path}: key '{key}' uses '{keyword}' at '{where or '/'}', "
                            "which constrained decoding cannot enforce",
                            "rung's own keywords check inputs: use it in input_schema")
        _, valid, what = INPUT_KEYWORDS[keyword]
        if not valid(value):
            raise TaskError(f"{path}: key '{key}' at '{where or '/'}': '{keyword}' must be "
                            f"{what}, got {value!r}")


def _check_template(path: Path, template: str, input_schema: dict[str, Any]) -> None:
    try:
        fields = jinja2.meta.find_undeclared_variables(_ENV.parse(template))
    except jinja2.TemplateSyntaxError as e:
        raise TaskError(f"{path}: key 'prompt_template' line {e.lineno}: {e.message}") from e
    known = set(input_schema.get("properties", {}))
    unknown = sorted(fields - known)
    if unknown:
        raise TaskError(f"{path}: key 'prompt_template' uses field '{unknown[0]}', which "
                        "input_schema does not define", f"defined: {', '.join(sorted(known))}")


def builtin_tasks_dir() -> Path:
    return Path(str(resources.files("rung.configs") / "tasks"))


def load_tasks(directory: Path | None = None) -> dict[str, Task]:
    """All ``*.yaml`` tasks in ``directory`` (default: the built-in ones), by name."""
    directory = Path(directory) if directory is not None else builtin_tasks_dir()
    if not directory.is_dir():
        raise TaskError(f"{directory}: no task directory")
    tasks: dict[str, Task] = {}
    for path in sorted(directory.glob("*.yaml")):
        task = load_task(path)
        if task.name in tasks:
            raise TaskError(f"{path}: task name {task.name!r} also defined in "
                            f"{tasks[task.name].path}")
        tasks[task.name] = task
    return tasks
