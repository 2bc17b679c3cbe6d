"""Task files: the built-in tasks load; broken task files are refused naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rung.daemon.tasks.task import TaskError, builtin_tasks_dir, load_task, load_tasks

BUILTIN = ("st_code", "fault_tree", "diagnosis")


def test_builtin_tasks_load() -> None:
    tasks = load_tasks()
    assert set(tasks) == set(BUILTIN)
    for task in tasks.values():
        assert task.max_tokens > 0 and task.validators
        assert task.output_schema["$schema"].endswith("2020-12/schema")


def test_prompt_renders_optional_fields_as_empty() -> None:
    task = load_tasks()["st_code"]
    msgs = task.messages({"description": "tank level control", "constraints": ["use TON"]})
    assert msgs[0]["role"] == "system" and "tank level control" in msgs[1]["content"]
    assert "- use TON" in msgs[1]["content"] and "POU name" not in msgs[1]["content"]


def test_input_is_checked_against_the_input_schema() -> None:
    task = load_tasks()["diagnosis"]
    with pytest.raises(TaskError, match="input points/0: 'value' is a required property"):
        task.check_input({"asset": "pump", "points": [{"name": "t"}]})
    task.check_input({"asset": "pump", "points": [{"name": "t", "value": 1.5}]})


def _write(tmp_path: Path, edit: dict | None = None, drop: str | None = None,
           text: str | None = None) -> Path:
    raw = yaml.safe_load((builtin_tasks_dir() / "st_code.yaml").read_text())
    raw.update(edit or {})
    if drop:
        raw.pop(drop)
    path = tmp_path / "task.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(raw))
    return path


def test_unenforceable_keyword_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load((builtin_tasks_dir() / "st_code.yaml").read_text())
    raw["output_schema"]["properties"]["variables"]["uniqueItems"] = True
    path = _write(tmp_path, {"output_schema": raw["output_schema"]})
    with pytest.raises(TaskError, match="'output_schema' uses 'uniqueItems'") as e:
        load_task(path)
    assert str(path) in str(e.value)


def test_bad_template_field_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {"prompt_template": "Do {{ descripton }} now"})
    with pytest.raises(TaskError, match="'prompt_template' uses field 'descripton'"):
        load_task(path)


def test_template_syntax_error_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {"prompt_template": "{% if description %}unclosed"})
    with pytest.raises(TaskError, match="'prompt_template' line 1"):
        load_task(path)


def test_invalid_yaml_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, text="name: st_code\n  bad: [indent\n")
    with pytest.raises(TaskError, match="invalid YAML") as e:
        load_task(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("edit,drop,match", [
    (None, "output_schema", "output_schema: required, expected a JSON Schema"),
    ({"max_tokens": "many"}, None, "max_tokens: expected an integer 1..1000000, got 'many'"),
    ({"max_tokens": 0}, None, "max_tokens: expected an integer 1..1000000, got 0"),
    ({"validators": ["st", "spellcheck"]}, None,
     r"validators\[1\]: unknown validator 'spellcheck'"),
    ({"colour": "blue"}, None, "colour: unknown key; known keys here"),
    ({"input_schema": {"type": "objekt"}}, None, "'input_schema' is not a valid JSON Schema"),
])
def test_bad_keys_refused(tmp_path: Path, edit: dict | None, drop: str | None,
                          match: str) -> None:
    with pytest.raises(TaskError, match=match):
        load_task(_write(tmp_path, edit, drop))


def test_a_repeated_key_is_refused_with_its_line(tmp_path: Path) -> None:
    text = (builtin_tasks_dir() / "st_code.yaml").read_text()
    path = tmp_path / "twice.yaml"
    path.write_text(text + "\nmax_tokens: 12\n")
    with pytest.raises(TaskError, match="invalid YAML at line .*key 'max_tokens' given twice"):
        load_task(path)


def test_duplicate_task_names_refused(tmp_path: Path) -> None:
    text = (builtin_tasks_dir() / "st_code.yaml").read_text()
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text)
    with pytest.raises(TaskError, match="task name 'st_code' also defined"):
        load_tasks(tmp_path)
