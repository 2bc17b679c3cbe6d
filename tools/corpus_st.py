"""The ``st_code`` task of the corpus: one IEC 61131-3 POU per sample, from an archetype table.

Each archetype is a builder ``Kit -> (input, output)`` (see ``corpus_st_kit``); the table maps
its name to it. Every POU is meant to pass ``rung.daemon.tasks.st.validate_pou``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rung.tools.corpus_st_combined import COMBINED
from rung.tools.corpus_st_control import CONTROL
from rung.tools.corpus_st_kit import Kit
from rung.tools.corpus_st_logic import LOGIC
from rung.tools.corpus_st_more import MORE
from rung.tools.corpus_st_setpoints import in_served_form

Builder = Callable[[Kit], tuple[dict[str, Any], dict[str, Any]]]

ARCHETYPES: dict[str, Builder] = {**CONTROL, **LOGIC, **MORE, **COMBINED}
"""Archetype name -> builder."""
_DRAWS = 64


def st_sample(rng: random.Random, archetype: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``(input, output)`` pair of the ``st_code`` task from ``archetype``, in the form
    rung serves it (``corpus_st_setpoints``: the stated values read from the setpoints code
    declares, the type and name code chooses where the request leaves them open); a
    draw that cannot take that form is drawn again (two archetypes write a stated value
    otherwise in up to two draws of three)."""
    for _ in range(_DRAWS):
        data, output = ARCHETYPES[archetype](Kit(rng))
        served = in_served_form(data, output)
        if served is not None:
            return data, served
    raise ValueError(f"st_code[{archetype}]: no draw of {_DRAWS} takes the served form")
