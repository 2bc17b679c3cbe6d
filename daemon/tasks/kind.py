"""A kind of task: what code knows of the answers of every task of that kind, in one object.

A task file names its kind in ``validators`` (``daemon/tasks/kinds.py`` holds the kinds by
name). A task with none is schema-only (``SCHEMA_ONLY``): its output schema is the whole
of what it asks, its schema section the whole of its validation. A kind adds, each
optional:

- ``input_check``: what a request must hold before anything is generated, beyond the
  input schema (an ST request's test vectors must run within the work budget); raises
  ``InputError``, answered ``bad_request``;
- ``shaper``: the request's output shape (``shaping.Shape``): the schema narrowed by what
  the request fixes, the start of the answer code computes, the grammar that follows it;
- ``validator``: the answer against what code knows of the request, after the schema
  passed: named sections ``{"ok": bool, "errors": [...]}`` of the ``validation`` object;
- ``floor``: the sections that make an answer valid (``quality.judge``); every other
  section is a rightness check;
- ``name_tables``: tables of names the input keyword ``notReserved`` refuses
  (``task.INPUT_KEYWORDS``): a name -> what the table already calls it (None: free).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rung.daemon.tasks.shaping import Schema, Shape

Section = dict[str, Any]


class InputError(ValueError):
    """A request a kind refuses before decoding: the message names the input field first
    (``vectors: ...``), ``hint`` says where to read more."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Kind:
    name: str
    input_check: Callable[[Mapping[str, Any]], None] | None = None
    shaper: Callable[[Schema, Mapping[str, Any]], Shape] | None = None
    validator: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]] | None = None
    floor: tuple[str, ...] = ("schema",)
    name_tables: Mapping[str, Callable[[str], str | None]] = field(default_factory=dict)

    def check_input(self, data: Any) -> None:
        """Raises ``InputError`` for a request this kind cannot answer (the input schema
        passed already)."""
        if self.input_check is not None and isinstance(data, Mapping):
            self.input_check(data)

    def shape(self, schema: Schema, data: Any) -> Shape:
        """The output shape for one request (the task's own schema when nothing narrows
        it)."""
        if self.shaper is None or not isinstance(data, Mapping):
            return Shape(schema)
        return self.shaper(schema, data)

    def validate(self, output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
        """The kind's sections of a schema-valid answer's validation (none: schema-only)."""
        return {} if self.validator is None else self.validator(output, data)


SCHEMA_ONLY = Kind("schema")
