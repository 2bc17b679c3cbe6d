"""The Modbus side: register maps, the links to PLCs, the handshake agent per PLC and its job.
"""
