"""The ``st`` kind: an IEC 61131-3 POU that parses, names only what it declares, uses what
the request states and, given test vectors, behaves as they say.

Its sections of the validation:

    st_syntax        the rendered POU parsed by an ST parser (floor)
    identifiers      identifiers used in the body are declared; the POU's name is no
                     IEC 61131-3 name (floor)
    pou_text         the rendered POU (a string, not a section)
    relevance        the values the request states appear (``request.values_used``)
    building_blocks  the blocks the request's behaviour needs are declared and called
    inputs           no VAR_INPUT is assigned
    outputs          every VAR_OUTPUT (a FUNCTION: its result) is written
    behaviour        with the request's ``vectors``: the POU run on a simulated clock
                     gives the expected outputs (``interpreter.run_vectors``)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rung.daemon.tasks.kind import InputError, Kind, Section
from rung.daemon.tasks.st import request
from rung.daemon.tasks.st.interpreter import check_vectors, run_vectors
from rung.daemon.tasks.st.pou import assigned_names, reserved_kind, validate_pou, written_names
from rung.daemon.tasks.st.shape import shape


def _check_input(data: Mapping[str, Any]) -> None:
    """An ST request's test vectors run within a test's scans and the run's work budget:
    malformed ones, or ones no answer could run within it, are the request's mistake,
    refused at the edge before any answer is written."""
    vectors = data.get("vectors")
    if vectors is None:
        return
    try:
        check_vectors(vectors)
    except ValueError as e:
        raise InputError(f"vectors: {str(e).removeprefix('vectors: ')}",
                         "see docs/tasks.md, test vectors") from e


def _validate(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The POU parses and names only what it declares (valid); it uses the values the
    request states, the building blocks its behaviour needs, never assigns a VAR_INPUT and
    writes every output (right, as far as code can tell: ``request``). All gating."""
    result = validate_pou(output)
    stated = request.read(data)
    identifiers = result["identifiers"]
    kind = reserved_kind(str(output.get("name", "")))
    if kind is not None:   # a name the model chose (a request's name is refused earlier)
        identifiers = {**identifiers, "ok": False, "errors": [*identifiers.get("errors", []), {
            "path": "name", "message": f"the POU name {output.get('name')!r} is {kind} in "
            "IEC 61131-3"}]}
    return {"st_syntax": result["st_syntax"], "identifiers": identifiers,
            "pou_text": result["text"],
            "relevance": request.values_used(stated, output),
            "building_blocks": request.blocks_used(stated, output),
            "inputs": request.inputs_not_assigned(output, assigned_names(result["text"])),
            "outputs": request.outputs_written(output, written_names(result["text"])),
            **_behaviour(output, data)}


def _behaviour(output: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Section]:
    """With the request's test vectors: the POU executed on a simulated clock gives the
    expected outputs (``interpreter.run_vectors``)."""
    vectors = data.get("vectors")
    if not isinstance(vectors, Mapping):
        return {}
    try:
        run = run_vectors(output, vectors)
    except ValueError as e:   # vectors the input schema let through but cannot run
        return {"behaviour": {"ok": False, "errors": [{"path": "vectors", "message": str(e)}]}}
    errors = [{"path": "body", "message": f"at t = {f.get('t')} s: {f.get('message') or f}"}
              for f in run.get("failures") or []]
    if run.get("error"):
        errors.insert(0, {"path": "body", "message": str(run["error"])})
    return {"behaviour": {"ok": bool(run.get("ok")), "errors": errors[:20],
                          "steps": run.get("steps", 0)}}


def _iec_name(name: str) -> str | None:
    """What IEC 61131-3 already calls ``name`` (a keyword, a type, a standard block), if
    anything: the ``notReserved: iec61131-3`` table."""
    kind = reserved_kind(name)
    return None if kind is None else f"{kind} in IEC 61131-3"


KIND = Kind("st", input_check=_check_input, shaper=shape, validator=_validate,
            floor=("schema", "st_syntax", "identifiers"),
            name_tables={"iec61131-3": _iec_name})
