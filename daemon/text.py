"""What rung accepts as text it echoes (an id, a session, a name in a config or a map):
the strictest rule of the places it travels. MQTT 3.1.1 and 5 (section 1.5.4 / 1.5.3)
forbid U+0000 and surrogates in UTF-8 strings and let a server refuse control characters
and non-characters; mosquitto does, and an OPC UA answer or a log line carrying them is as
unreadable. So every adapter's request form and the config hold strings to these rules
(``topics.py`` adds a topic's own on top).
"""

from __future__ import annotations


def char_problem(c: str) -> str | None:
    """Why one character may not appear in an MQTT string, or None."""
    cp = ord(c)
    if 0xD800 <= cp <= 0xDFFF:
        return f"a lone surrogate (U+{cp:04X}) that is not encodable as UTF-8"
    if cp <= 0x1F or 0x7F <= cp <= 0x9F:
        return f"a control character (U+{cp:04X})"
    if 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFF) in (0xFFFE, 0xFFFF):
        return f"a Unicode non-character (U+{cp:04X})"
    return None


def text_problem(text: str) -> str | None:
    """Why a string cannot travel as an MQTT UTF-8 string (topic, client id, id), or None."""
    for c in text:
        why = char_problem(c)
        if why is not None:
            return f"contains {why}"
    return None


def surrogate_path(value: object, path: str = "") -> str | None:
    """The JSON path of the first string (key or value) in ``value`` holding a lone
    surrogate (a JSON ``\\ud800`` escape: not text, the tokenizer refuses it), or None."""
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
                return p or "(value)"
        elif isinstance(v, dict):
            for k, item in v.items():
                sub = f"{p}.{k}" if p else str(k)
                if isinstance(k, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in k):
                    return sub.encode("utf-8", "backslashreplace").decode("utf-8")
                stack.append((item, sub))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))
    return None
