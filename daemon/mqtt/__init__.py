"""The MQTT side: the broker link, requests parsed at the edge, the delivery journal and its
WAL check, the broker's string rules, `rung ask`.
"""
