"""The OPC UA side: node maps, the link to a PLC's OPC UA server (the handshake's transport)
and rung's own OPC UA server (``opcua_server``).
"""
