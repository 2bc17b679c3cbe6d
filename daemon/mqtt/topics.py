"""What an MQTT broker accepts as a string, checked before rung ever sends one.

MQTT 3.1.1 and 5 (section 1.5.4 / 1.5.3) forbid U+0000 and surrogates in UTF-8 strings and
let a server refuse control characters and non-characters; mosquitto does (it disconnects
the client for a malformed packet), and so would rung's answers to such a topic, one
reconnect after another. These checks are mosquitto's (``mosquitto_validate_utf8`` and
``mosquitto_pub_topic_check``), so a topic rung accepts from a request, a config or a map
is one the broker takes.
"""

from __future__ import annotations

MAX_TOPIC_BYTES = 65535


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


def topic_problem(topic: str, *, level: bool = False) -> str | None:
    """Why ``topic`` is not a topic name rung can publish to (or, ``level``: one topic
    level), or None. Names starting with ``$`` are the broker's own."""
    if not topic:
        return "is empty"
    why = text_problem(topic)
    if why is not None:
        return why
    if len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
        return f"is longer than {MAX_TOPIC_BYTES} bytes"
    if "+" in topic or "#" in topic:
        return "contains a wildcard (+ or #)"
    if level and "/" in topic:
        return "contains '/' (one topic level expected)"
    if topic.startswith("$"):
        return "starts with '$' (reserved for the broker's own topics)"
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
