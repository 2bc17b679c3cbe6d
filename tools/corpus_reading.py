"""Corpus requests reworded the way engineers write them, so a pretrained base learns to
read prose the generator's templates never use.

A generator writes each archetype's description from a few templates. Engineers write the
same request tersely or wordily, with plant tags (``pump P-101``), other verbs and
comparisons (``drops under``, ``is over``), other unit spellings (``10 sec``, ``2 mins``) and
most often with no POU type, name or interface at all. ``reword`` draws such a variant of a
corpus sample and keeps it only where code still reads the same request from it: the same
stated values in the same order (``st_request.read``), the same setpoints (names, types,
values: ``st_request.setpoints``), the same declared interface where the request fixes it
(``st_request.declared``), the input valid against
the task's input schema and the sample's answer still passing every validator of the task;
otherwise the sample is returned as it was. An answer changes only as rung would serve it
for the reworded request (``corpus_st_setpoints.in_served_form``: where the request no
longer names the POU, code's type and name and the setpoints first).

Fault-tree and diagnosis requests get their free text reworded the same way (a fault tree's
``top_event`` stays as written: its answer quotes it).
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from rung.daemon.tasks.st import request as st_request
from rung.daemon.tasks.task import Task, TaskError, load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.tools.corpus_st_setpoints import in_served_form

VERSION = "reading-2"

# share of st_code samples asked as a description only (no type, name or interface): the
# common case in a plant
DESCRIPTION_ONLY = 0.5

# (pattern, replacements): word-bounded, case kept for the first letter; numbers never touched
PHRASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"\bbelow\b", ("under", "less than", "lower than", "below")),
    (r"\babove\b", ("over", "higher than", "greater than", "above")),
    (r"\bswitch(es)? on\b", ("turn on", "energise", "switch on")),
    (r"\bswitch(es)? off\b", ("turn off", "de-energise", "switch off")),
    (r"\bpush button\b", ("pushbutton", "PB", "push button")),
    (r"\bstart button\b", ("start PB", "START pushbutton", "start key", "start button")),
    (r"\bstop button\b", ("stop PB", "STOP pushbutton", "stop key", "stop button")),
    (r"\be-stop\b", ("emergency stop", "E-Stop", "ESTOP", "e-stop")),
    (r"\buntil reset\b", ("until acknowledged", "until the reset input", "until reset")),
    (r"\blatch(es)?\b", ("latch", "hold", "store")),
    (r"\bthe pump\b", ("pump P-101", "the pump", "pump P2")),
    (r"\bthe motor\b", ("motor M1", "the drive", "the motor")),
    (r"\bthe tank\b", ("tank T-200", "the vessel", "the tank")),
    (r"\bthe valve\b", ("valve XV-12", "the valve", "valve V3")),
    (r"\bthe conveyor\b", ("conveyor CV-4", "the belt", "the conveyor")),
    (r"\bthe compressor\b", ("compressor K1", "the compressor")),
    (r"\bthe fan\b", ("fan F-7", "the fan")),
    (r"\bthe heater\b", ("heater H1", "the heater")),
    (r"\bmust\b", ("has to", "shall", "must")),
    (r"\bwhen\b", ("when", "as soon as", "once")),
    (r"(?<=\d) s\b", (" s", " sec", " seconds", "s")),
    (r"(?<=\d) min\b", (" min", " mins", " minutes")),
    (r"(?<=\d) ms\b", (" ms", " msec")),
    (r"(?<=\d) °C", (" °C", " degC")),
)

# openers the templates write, and what engineers write instead
_OPENER = re.compile(
    r"^(?:Write|Create|Implement|Program)\s+(?:an?\s+)?(?:PLC\s+)?(?:IEC 61131-3\s+)?"
    r"(?:Structured Text|ST|program|PROGRAM|function block|FUNCTION_BLOCK|FB|POU)"
    r"(?:\s*\((?:FB|ST)\))?(?:\s+(?:for|that|which|to))?\s*:?\s*", re.I)
OPENERS = ("", "", "Need ST for this: ", "Logic needed: ", "PLC code: ", "Please write the ST. ",
           "For the new line: ", "Can you write this in ST? ")
CLOSERS = ("", "", "", " Keep it simple.", " Comments in English please.",
           " Standard IEC types only.", " No vendor libraries.")


def _keep_case(old: str, new: str) -> str:
    return new[:1].upper() + new[1:] if old[:1].isupper() and new[:1].islower() else new


def reword_text(text: str, rng: random.Random, p: float = 0.5) -> str:
    """Each phrase of ``PHRASES`` replaced with probability ``p`` by one of its variants."""
    for pattern, options in PHRASES:
        def pick(m: re.Match[str], options: tuple[str, ...] = options) -> str:
            return _keep_case(m.group(0), rng.choice(options)) if rng.random() < p \
                else m.group(0)
        text = re.sub(pattern, pick, text)
    return text


def _st_description(text: str, rng: random.Random) -> str:
    text = reword_text(text, rng)
    if rng.random() < 0.6:
        text = _OPENER.sub("", text)
        text = text[:1].upper() + text[1:]
        text = rng.choice(OPENERS) + text
    return text + rng.choice(CLOSERS)


def _st(data: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    out = dict(data)
    out["description"] = _st_description(str(data.get("description", "")), rng)
    if rng.random() < DESCRIPTION_ONLY:
        for key in ("name", "pou_type", "constraints"):
            out.pop(key, None)
    elif out.get("constraints") and rng.random() < 0.3:
        out["constraints"] = [reword_text(c, rng, 0.3) for c in out["constraints"]]
    return out


def _fault_tree(data: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    out = dict(data)
    if isinstance(out.get("system"), str):
        out["system"] = reword_text(out["system"], rng)
    return out


def _diagnosis(data: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    out = dict(data)
    if isinstance(out.get("description"), str):
        out["description"] = reword_text(out["description"], rng)
    return out


_REWORD: dict[str, Callable[[dict[str, Any], random.Random], dict[str, Any]]] = {
    "st_code": _st, "fault_tree": _fault_tree, "diagnosis": _diagnosis}

_TASKS: dict[str, Task] = {}


def _task(name: str) -> Task:
    if not _TASKS:
        _TASKS.update(load_tasks())
    return _TASKS[name]


def _stated(data: Mapping[str, Any]) -> list[tuple[float, str | None]]:
    """The stated values as code compares them: a duration in seconds, else the number and
    its unit (``°C`` and ``degC`` alike)."""
    out: list[tuple[float, str | None]] = []
    for v in st_request.read(data).values:
        seconds = v.seconds
        unit = None if v.unit is None else v.unit.lower().replace("°c", "degc")
        out.append((seconds, "s") if seconds is not None else (v.number, unit))
    return out


def _named(setpoints: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(v["name"], v["type"], v["initial"]) for v in setpoints]


def same_request(task: str, before: Mapping[str, Any], after: Mapping[str, Any],
                 answer: Any) -> bool:
    """Whether code reads ``after`` as it reads ``before``, and ``answer`` still passes."""
    t = _task(task)
    try:
        t.check_input(after)
    except TaskError:
        return False
    if task == "st_code":
        if _stated(before) != _stated(after):
            return False
        if st_request.read(before).needs != st_request.read(after).needs:
            return False
        if _named(st_request.setpoints(before)) != _named(st_request.setpoints(after)):
            return False   # code would name the setpoints otherwise than the answer does
        if "name" in after and st_request.declared(before) != st_request.declared(after):
            return False
    ok, _ = validate_output(t.output_schema, t.kind, answer, after)
    return ok


def reword(sample: dict[str, Any], rng: random.Random, tries: int = 3) -> dict[str, Any]:
    """``sample`` with its request reworded (``tries`` draws), or unchanged where no draw
    reads as the same request."""
    fn = _REWORD.get(sample["task"])
    if fn is None:
        return sample
    for _ in range(tries):
        data = fn(copy.deepcopy(sample["input"]), rng)
        output = served(sample["task"], data, sample["output"])
        if data != sample["input"] and output is not None and same_request(
                sample["task"], sample["input"], data, output):
            return {**sample, "input": data, "output": output, "reworded": True}
    return sample


def served(task: str, data: Mapping[str, Any], output: Any) -> Any:
    """The answer as rung serves it for the reworded request: an ST request that leaves
    the type and name open gets code's (``st.request.pou``) and the setpoints first."""
    return in_served_form(data, output) if task == "st_code" else output
