"""docs/add-a-task.md, run as written: each block marked ``<!-- example: NAME -->`` is
taken from the page (task files loaded by the task loader, the kind module executed and
registered, the registry line held to ``daemon/tasks/kinds.py``), so the page cannot
drift from the code it describes."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.tasks import kinds
from rung.daemon.tasks.kind import SCHEMA_ONLY, Kind
from rung.daemon.tasks.quality import judge
from rung.daemon.tasks.task import TaskError, load_task, load_tasks
from rung.daemon.tasks.validate import validate_output

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "add-a-task.md"


def examples() -> dict[str, str]:
    """The page's marked blocks: name -> the block's text."""
    found = re.findall(r"<!-- example: (.+?) -->\n```\w+\n(.*?)```", PAGE.read_text(), re.S)
    return dict(found)


EXAMPLES = examples()


def _kind_module() -> types.ModuleType:
    module = types.ModuleType("work_order_kind")
    exec(compile(EXAMPLES["daemon/tasks/work_order/kind.py"], str(PAGE), "exec"),
         module.__dict__)
    return module


@pytest.fixture
def tasks_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The page's task files in a tasks directory, its kind registered."""
    monkeypatch.setitem(kinds.KINDS, "work_order", _kind_module().KIND)
    for name in ("alarm_text", "work_order"):
        (tmp_path / f"{name}.yaml").write_text(EXAMPLES[f"configs/tasks/{name}.yaml"])
    return tmp_path


def test_the_page_holds_every_example() -> None:
    assert set(EXAMPLES) == {
        "configs/tasks/alarm_text.yaml", "alarm_text answer", "configs/tasks/work_order.yaml",
        "daemon/tasks/work_order/kind.py", "daemon/tasks/kinds.py", "work_order request",
        "work_order answer", "work_order refused answer"}, sorted(EXAMPLES)


def test_a_yaml_file_alone_is_a_schema_only_task(tasks_dir: Path) -> None:
    task = load_tasks(tasks_dir)["alarm_text"]
    assert task.kind is SCHEMA_ONLY
    answer = json.loads(EXAMPLES["alarm_text answer"])
    ok, validation = validate_output(task.output_schema, task.kind, answer, {})
    assert ok and list(validation) == ["schema"]
    too_long = {**answer, "message": "x" * 61}
    ok, validation = validate_output(task.output_schema, task.kind, too_long, {})
    assert not ok and validation["schema"]["errors"][0]["path"] == "message"
    assert judge(task.kind, validation).reason == "schema: 61 characters, at most 60"


def test_a_kind_module_checks_what_the_schema_cannot(tasks_dir: Path) -> None:
    task = load_tasks(tasks_dir)["work_order"]
    assert isinstance(task.kind, Kind) and task.kind.name == "work_order"
    request = json.loads(EXAMPLES["work_order request"])
    task.check_input(request)
    shape = task.kind.shape(task.output_schema, request)
    assert shape.schema["properties"]["asset"] == {"const": "Pump P-101"}
    assert task.output_schema["properties"]["asset"]["type"] == "string"   # untouched

    def judged(name: str) -> tuple[bool, dict[str, Any]]:
        answer = json.loads(EXAMPLES[name])
        return validate_output(shape.schema, task.kind, answer, request)

    ok, validation = judged("work_order answer")
    assert ok and validation["window"] == {"ok": True, "errors": [], "hours": 3.5}
    assert judge(task.kind, validation).right
    ok, validation = judged("work_order refused answer")
    assert not ok
    assert validation["window"]["errors"] == [
        {"path": "steps", "message": "5 h of work, the window is 4 h"}]
    verdict = judge(task.kind, validation)   # the schema is the floor: valid, not right
    assert verdict.valid and not verdict.right and verdict.reason is not None
    assert verdict.reason.startswith("window: ")


def test_the_registry_line_is_the_registry_with_the_kind_added() -> None:
    block = EXAMPLES["daemon/tasks/kinds.py"].splitlines()
    source = (ROOT / "daemon" / "tasks" / "kinds.py").read_text().splitlines()
    imports = [line for line in block if line.startswith("from ")]
    assert imports == ["from rung.daemon.tasks.work_order.kind import KIND as WORK_ORDER"]
    (shown,) = [line for line in block if line.startswith("KINDS")]
    (real,) = [line for line in source if line.startswith("KINDS")]
    assert shown == real.replace(")}", ", WORK_ORDER)}"), (shown, real)


def test_a_task_names_one_kind(tasks_dir: Path) -> None:
    path = tasks_dir / "work_order.yaml"
    path.write_text(path.read_text().replace("validators: [work_order]",
                                             "validators: [work_order, st]"))
    with pytest.raises(TaskError, match="validators: names work_order, st; a task is one kind"):
        load_task(path)
