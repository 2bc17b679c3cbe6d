"""The Modbus side: register maps, the links to PLCs, the handshake agent per PLC, its job
and its link state on MQTT.
"""
