"""Real text for the export's checks and calibration, written for rung.

Random token ids give a model nothing to predict: its next-token distributions stay flat
and every measure of quality drifts towards noise. Real sentences give the peaked
distributions a model shows in use, so KL and greedy agreement measured on them track what
a user sees. Two disjoint sets: ``CALIBRATION`` to fit (weight importance, which matrices
stay at 8 bits), ``HELD_OUT`` to accept or refuse. The text mixes the plant-floor language
rung serves with everyday prose, instructions, code and a chat turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

CALIBRATION = (
    "The hydraulic press on line 3 stopped twice this morning. Both times the oil "
    "temperature had climbed above 80 degrees and the pressure dropped below 100 bar.",
    "Before you replace the bearing, lock out the drive, wait for the flywheel to stop and "
    "check that the motor cannot be started from the control panel.",
    "Rivers carry sand and silt from the mountains to the sea. Where the water slows down, "
    "near the mouth of the river, the sediment settles and slowly builds a delta.",
    "IF tank_level < 20.0 THEN inlet_valve := TRUE; ELSIF tank_level > 80.0 THEN "
    "inlet_valve := FALSE; END_IF;",
    "My grandmother kept bees behind the house. Every August we helped her take the honey "
    "out of the frames, and the whole kitchen smelled of wax for a week.",
    "The conveyor belt runs at 1.2 metres per second. A light barrier at the end counts the "
    "boxes, and every hundredth box is weighed and checked for damage.",
    "def moving_average(values, n):\n    total = sum(values[:n])\n    out = [total / n]\n"
    "    for i in range(n, len(values)):\n        total += values[i] - values[i - n]\n"
    "        out.append(total / n)\n    return out\n",
    "Vibration on the drive end of pump P-101 rose from 2.8 to 7.1 mm/s within two days, "
    "which points to a worn bearing or a loose foundation bolt.",
    "The train was late again, so she walked the last two miles through the rain and "
    "arrived at the interview with wet shoes and a borrowed umbrella.",
    "<|im_start|>user\nWhat does a PID controller do?<|im_end|>\n<|im_start|>assistant\nIt "
    "measures the error between a setpoint and the process value and corrects it with a "
    "proportional, an integral and a derivative term.<|im_end|>\n",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Plants "
    "store the sugar as starch and use it when there is no light.",
    "To calibrate the pressure sensor, apply 0 bar and 250 bar from the reference pump, "
    "note the raw counts at both points and enter them as the new zero and span.",
    "The museum opens at nine on weekdays and at ten on Sundays. Children under twelve get "
    "in for free, and the guided tour in English starts every day at two.",
    "A fault tree starts from the unwanted top event and works down through AND and OR "
    "gates to the basic events whose probabilities are known.",
    "Cut the onions into thin rings, fry them slowly in butter until they are golden, then "
    "add a spoon of flour and pour in the stock while stirring.",
    "The frequency converter reported an overcurrent fault at 14:32. The motor had been "
    "running at full load for six hours, and the cooling fan was blocked by dust.",
)

HELD_OUT = (
    "The cooling water pump failed at night. The operator switched to the standby pump, "
    "but the temperature in the mould had already risen by ten degrees.",
    "Mount the new sensor with the arrow pointing in the direction of flow, tighten the "
    "nut by hand and then a quarter turn with the spanner.",
    "The old lighthouse stands on a rock a mile from the coast. Until 1970 a keeper lived "
    "there with his family and rowed to the village once a week for food.",
    "FUNCTION_BLOCK FB_Motor\nVAR_INPUT\n    start : BOOL;\n    stop : BOOL;\nEND_VAR\n"
    "VAR_OUTPUT\n    run : BOOL;\nEND_VAR\nrun := (start OR run) AND NOT stop;\nEND_FUNCTION_BLOCK",
    "Most of the energy in a car's fuel is lost as heat. Only about a quarter of it ends up "
    "moving the car forward; the rest warms the engine, the exhaust and the brakes.",
    "Pressure at the outlet of the compressor is 7.4 bar, the setpoint is 8 bar, and the "
    "motor runs at 96 percent of its rated current, so the filter is probably clogged.",
    "<|im_start|>user\nWhy do we check the oil level with the engine off?<|im_end|>\n"
    "<|im_start|>assistant\nBecause with the engine running much of the oil is in the pump "
    "and the lines, so the level in the sump reads too low.<|im_end|>\n",
    "He planted the tomatoes too early, and a late frost killed half of them. The next "
    "year he waited until the middle of May and had more than he could eat.",
    "for (int i = 0; i < n; i++) {\n    if (samples[i] > limit) {\n        alarms++;\n"
    "        last = i;\n    }\n}\nprintf(\"%d alarms, last at %d\\n\", alarms, last);",
    "The maintenance plan lists a visual check every shift, grease every 500 hours and a "
    "full inspection of the gearbox once a year or after 8000 hours, whichever comes first.",
    "Water boils at a lower temperature in the mountains because the air pressure is lower, "
    "so pasta takes longer to cook at two thousand metres than at the sea.",
    "The safety relay opens both contactors when the light curtain is interrupted, and the "
    "press can only be restarted after the operator presses the reset button.",
)


def text_stream(encode: Callable[[str], list[int]], texts: Sequence[str],
                vocab: int) -> list[int]:
    """``texts`` tokenized one by one (no special tokens added) and joined; ids past the
    model's vocabulary (a tokenizer larger than the embedding) are dropped."""
    return [i for text in texts for i in encode(text) if i < vocab]


def text_rows(ids: Sequence[int], length: int, rows: int) -> npt.NDArray[np.int64]:
    """Up to ``rows`` consecutive windows of ``length`` tokens from ``ids`` [n, length];
    a stream shorter than one window is repeated (tiny tokenizers and short max_seq)."""
    if not ids:
        raise ValueError("no tokens")
    ids = list(ids) * (1 + length // len(ids))
    n = max(1, min(rows, len(ids) // length))
    return np.array(ids[:n * length], dtype=np.int64).reshape(n, length)
