"""The ``fault_tree`` kind: a sound tree whose evidence quotes the request's readings and
whose basic events name the components the request's system lists.

Its sections of the validation:

    fault_tree   references, acyclicity, cut sets, probability (``analysis``)
    components   the basic events name the system's components
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rung.daemon.tasks.fault_tree.analysis import (
    GATE_PREFIX,
    analyze_fault_tree,
    check_components,
)
from rung.daemon.tasks.fault_tree.shape import fault_tree_shape
from rung.daemon.tasks.kind import Kind, Section
from rung.daemon.tasks.shaping import Schema, Shape


def _shape(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """Every gate under the top, gate and basic-event ids told apart, no reference
    dangling, evidence quoting its point's reading (``shape``): narrowed again after each
    token with a quote, as the tree is written."""
    narrowed, restage = fault_tree_shape(schema, data)
    return Shape(narrowed, restage=restage, restage_at='"')


def _validate(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    """The tree's checks and analysis; evidence names a point of the request and quotes its
    reading; no basic event is named like a gate (``G_``); the basic events name the
    components the request's ``system`` lists (``analysis.check_components``)."""
    points = data.get("points")
    known = [p["name"] for p in points] if isinstance(points, list) else None
    by_name = ({p["name"]: p for p in reversed(points) if isinstance(p, dict)}
               if isinstance(points, list) else None)
    system = data.get("system")
    return {"fault_tree": analyze_fault_tree(output, known_points=known, points=by_name,
                                             gate_prefix=GATE_PREFIX),
            "components": check_components(output, system if isinstance(system, str) else "")}


KIND = Kind("fault_tree", shaper=_shape, validator=_validate)
