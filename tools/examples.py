"""A plant's own examples for ``python -m rung.tools.train --base ... --examples FILE``.

One JSON object per line: ``{"task": "st_code", "input": {...}, "answer": {...}}`` (blank
lines and lines starting with ``#`` are skipped). Every example is checked before training as
``rung serve`` checks an answer: the input against the task's input schema, the answer
against its output schema and every validator the task names (ST parsed, identifiers
declared, the stated values read, the test vectors in ``input.vectors`` executed; a fault
tree analysed; a diagnosis against what code computes of its points). An example that fails
is reported by line with the reason and not trained on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rung.daemon.tasks.task import Task, TaskError, load_tasks
from rung.daemon.tasks.validate import validate_output

Refusal = tuple[int, str]


def _finding(d: Any) -> str:
    if isinstance(d, dict) and "message" in d:
        at = f"line {d['line']}:{d.get('column', 0)} " if "line" in d else ""
        return f"{at}{d['message']}"
    return str(d)


def _failed(validation: dict[str, Any]) -> str:
    for name, section in validation.items():
        if isinstance(section, dict) and not section.get("ok", True) \
                and not section.get("advisory"):
            detail = section.get("error") or section.get("errors") or section.get("message")
            if isinstance(detail, list):
                detail = "; ".join(_finding(d) for d in detail[:3])
            return f"answer fails {name}" + (f": {detail}" if detail else "")
    return "answer fails its checks"


def check_example(tasks: dict[str, Task], obj: Any) -> tuple[dict[str, Any] | None, str]:
    """(the sample in corpus form, "") or (None, why it is refused)."""
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    extra = sorted(set(obj) - {"task", "input", "answer"})
    if extra:
        return None, f"unknown field {extra[0]!r} (expected task, input, answer)"
    name = obj.get("task")
    if name not in tasks:
        return None, f"task {name!r} is not one of {', '.join(sorted(tasks))}"
    task = tasks[name]
    if "input" not in obj or "answer" not in obj:
        return None, "needs both input and answer"
    try:
        task.check_input(obj["input"])
    except TaskError as e:
        return None, e.message
    ok, validation = validate_output(task.output_schema, task.kind, obj["answer"],
                                     obj["input"])
    if not ok:
        return None, _failed(validation)
    return {"task": name, "kind": "example", "input": obj["input"],
            "output": obj["answer"]}, ""


def read_examples(path: Path) -> tuple[list[dict[str, Any]], list[Refusal]]:
    """(the examples that pass, (line, reason) for each that does not)."""
    tasks = dict(load_tasks())
    kept: list[dict[str, Any]] = []
    refused: list[Refusal] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            refused.append((n, f"not JSON ({e.msg} at column {e.colno})"))
            continue
        sample, why = check_example(tasks, obj)
        if sample is None:
            refused.append((n, why))
        else:
            kept.append(sample)
    return kept, refused
