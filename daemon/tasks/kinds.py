"""The kinds of task rung knows, by the name a task file gives in ``validators``: each
imported here by name (a new kind is one module and one line below; docs/add-a-task.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from rung.daemon.tasks.diagnosis.kind import KIND as DIAGNOSIS
from rung.daemon.tasks.fault_tree.kind import KIND as FAULT_TREE
from rung.daemon.tasks.kind import SCHEMA_ONLY, Kind
from rung.daemon.tasks.st.kind import KIND as ST

KINDS: dict[str, Kind] = {k.name: k for k in (ST, FAULT_TREE, DIAGNOSIS)}


def kind_of(names: Sequence[str]) -> Kind:
    """The kind a task's ``validators`` name (schema-only when they name none; a task is
    one kind, so they name at most one, ``task.load_task`` checks)."""
    return KINDS[names[0]] if names else SCHEMA_ONLY

