"""The MQTT side: the broker link, the request intake, requests parsed at the edge, the
delivery journal and its WAL check, the outbox, the broker's string rules, the fleet,
`rung ask`.
"""
