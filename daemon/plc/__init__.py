"""What every plant protocol shares: the request handshake with one PLC (req/ack/busy/done/
err/result/heartbeat), its transport interface and its error family. The Modbus adapter
(``daemon/modbus``) and the OPC UA adapter (``daemon/opcua``) are transports under it.
"""
