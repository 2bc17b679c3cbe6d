"""rung as a Sparkplug B edge node (``sparkplug``): births, deaths and metrics of the node
and its PLCs on the plant's MQTT broker, on a link of its own (``link.py``, the MQTT
adapter's reconnect loop); the payloads built from the descriptor (``pb.py``)."""
