"""The quality figure: how many answers are *right*, beside how many are *valid*.

- **valid** is the floor: the answer is a document of the task's published schema, and an
  ST answer's POU parses and declares every name it uses. Valid answers can still be wrong.
- **right** is what a plant engineer would accept, as far as checks can tell: every gating
  check passed (the stated values used, the building blocks the behaviour needs, no input
  assigned; gates under the top event, evidence quoting the real value, basic events
  naming the components the system lists; evidence from abnormal points only, priority
  from the worst state, no remaining life from one snapshot), and an ST answer that comes
  with test vectors *behaves* right when executed (the ``behaviour`` section:
  ``st.interpreter.run_vectors`` on a simulated clock).

``judge`` gives one answer's verdict and the reason it is not right; ``Tally`` counts them
per task (the eval and ``rung demo`` print it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rung.daemon.tasks.kind import Kind


@dataclass(frozen=True)
class Verdict:
    valid: bool
    right: bool
    reason: str | None = None     # why not right (the first failed check), None when right


def _failed(validation: Mapping[str, Any], names: tuple[str, ...] | None) -> str | None:
    for name, section in validation.items():
        if not isinstance(section, Mapping) or section.get("ok", True) or \
                section.get("advisory"):
            continue
        if names is None or name in names:
            errors = section.get("errors") or []
            first = errors[0].get("message") if errors and isinstance(errors[0], Mapping) \
                else None
            return f"{name}: {first}" if first else name
    return None


def judge(kind: Kind, validation: Mapping[str, Any] | None,
          error: str | None = None) -> Verdict:
    """One answer's verdict from its validation as the runner gives it (None: no answer,
    ``error`` says why): valid when the sections of the kind's floor (``Kind.floor``)
    passed, right when every section did."""
    if not validation:
        return Verdict(False, False, error or "no answer")
    invalid = _failed(validation, kind.floor)
    if invalid is not None:
        return Verdict(False, False, invalid)
    wrong = _failed(validation, None)
    return Verdict(True, wrong is None, wrong)


@dataclass
class Tally:
    """Right and valid counts per task, with the reasons answers were not right."""

    n: Counter[str] = field(default_factory=Counter)
    valid: Counter[str] = field(default_factory=Counter)
    right: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, task: str, v: Verdict) -> None:
        self.n[task] += 1
        self.valid[task] += v.valid
        self.right[task] += v.right
        if v.reason is not None:
            kind = v.reason.split(":", 1)[0]
            self.reasons.setdefault(task, Counter())[kind] += 1

    def report(self) -> dict[str, Any]:
        return {task: {"n": n, "valid": self.valid[task] / n, "right": self.right[task] / n,
                       "not_right_because": dict(self.reasons.get(task, Counter()))}
                for task, n in self.n.items()}

    def line(self, task: str) -> str:
        n = self.n[task]
        return f"{task}: {self.right[task]} of {n} right, {self.valid[task]} of {n} valid"
