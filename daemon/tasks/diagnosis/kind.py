"""The ``diagnosis`` kind: an ISO 13374 diagnosis that agrees with what code knows of the
snapshot (``snapshot``). Its section of the validation:

    diagnosis   states, evidence, priority, prognosis, names against what code knows of
                the request
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rung.daemon.tasks.diagnosis import snapshot
from rung.daemon.tasks.kind import Kind, Section
from rung.daemon.tasks.shaping import Schema, Shape


def _shape(schema: Schema, data: Mapping[str, Any]) -> Shape:
    """What code knows of the snapshot: the states as the answer's start; evidence only
    from the points that are not normal, each once; the priorities the worst state allows;
    the prognosis from the points' history; no fault asserted twice
    (``snapshot.fault_names_at``)."""
    narrowed, prefix = snapshot.narrow(schema, data)
    return Shape(narrowed, prefix, names=snapshot.fault_names_at)


def _validate(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    """The answer against what code knows of the request: states, evidence, faults,
    priority, prognosis, the names in free text."""
    return {"diagnosis": snapshot.check(output, data)}


KIND = Kind("diagnosis", shaper=_shape, validator=_validate)
