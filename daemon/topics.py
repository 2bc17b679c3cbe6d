"""What an MQTT broker accepts as a string, checked before rung ever sends one.

MQTT 3.1.1 and 5 (section 1.5.4 / 1.5.3) forbid U+0000 and surrogates in UTF-8 strings and
let a server refuse control characters and non-characters; mosquitto does (it disconnects
the client for a malformed packet), and so would rung's answers to such a topic, one
reconnect after another. These checks are mosquitto's (``mosquitto_validate_utf8`` and
``mosquitto_pub_topic_check``), so a topic rung accepts from a request, a config or a map
is one the broker takes.
"""

from __future__ import annotations

from rung.daemon.text import text_problem

MAX_TOPIC_BYTES = 65535


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
