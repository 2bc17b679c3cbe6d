"""The daemon's delivery journal: every request any adapter accepts is recorded here before
it is acknowledged, every answer before it is sent (``store.Journal``; SQLite, WAL checked by
``wal``). MQTT requests and OPC UA calls are rows of the one journal; an adapter names its
rows by an address of its own (an MQTT topic, ``opcua:...`` for a method call)."""
