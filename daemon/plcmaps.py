"""The PLC maps a config lists (``plcs``), whatever the protocol: a file with ``protocol:
opcua`` is an OPC UA node map (``daemon/opcua/nodemap.py``); any other is a Modbus register
map (``daemon/modbus/regmap.py``; ``protocol: modbus`` may say so). Both give the handshake
the same view (:class:`~rung.daemon.plc.transport.PlcSpec`).

It sits above both adapters, beside ``serve.py`` and ``check.py`` that use it: ``daemon/plc/``
is the protocol-neutral core the adapters build on and imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rung.daemon import keyed
from rung.daemon.modbus.regmap import PlcMap, RegisterMapError, parse_map

if TYPE_CHECKING:
    from rung.daemon.opcua.nodemap import NodeMap

PROTOCOLS = ("modbus", "opcua")


def load_plc_map(path: Path) -> PlcMap | NodeMap:
    """Read and check one PLC map file.

    Raises:
        RegisterMapError: a Modbus map (or a file whose ``protocol`` is unknown) is invalid.
        NodeMapError: an OPC UA node map is invalid.
    """
    path = Path(path)
    data: Any = keyed.read_yaml(path, RegisterMapError, "PLC map file",
                                "check the `plcs` list in the config")
    protocol = data.get("protocol", "modbus") if isinstance(data, Mapping) else "modbus"
    if protocol == "opcua":
        from rung.daemon.opcua.nodemap import parse_node_map

        return parse_node_map(data, path)
    if protocol != "modbus":
        raise RegisterMapError(f"{path}: protocol: expected one of {', '.join(PROTOCOLS)}, "
                               f"got {keyed.show(protocol)}")
    if isinstance(data, Mapping):
        data = {k: v for k, v in data.items() if k != "protocol"}
    return parse_map({} if data is None else data, path)
