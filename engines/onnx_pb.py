"""The part of the ONNX model format the serving path edits, as protobuf message classes.

The serving install has no ``onnx`` package (it comes with the export extra). Cutting a
graph in two at load (``engines/parted.py``) needs only a few fields of ``onnx.proto``:
nodes with their inputs, outputs and subgraph attributes, initializers with their
external-data length, graph inputs and outputs with tensor types. Those are written here as
a table (field numbers of the ONNX IR specification) and built with protobuf's descriptor
API in a private pool (``engines/proto_table.py``); every other field of a
model read with these classes is kept as an unknown field and written back unchanged.

``ModelProto`` and ``ValueInfoProto`` are the message classes; ``tensor_value_info`` makes a
typed graph input or output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rung.engines.proto_table import F as _F
from rung.engines.proto_table import Field, message_classes

PACKAGE = "rung.onnx"
_I32, _I64, _STR, _BYT, _MSG = (_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_STRING, _F.TYPE_BYTES,
                               _F.TYPE_MESSAGE)
# message -> fields (name, number, type, message type or "", repeated, oneof "value")
MESSAGES: dict[str, list[Field]] = {
    "ModelProto": [("graph", 7, _MSG, "GraphProto", False, False)],
    "GraphProto": [("node", 1, _MSG, "NodeProto", True, False),
                   ("name", 2, _STR, "", False, False),
                   ("initializer", 5, _MSG, "TensorProto", True, False),
                   ("input", 11, _MSG, "ValueInfoProto", True, False),
                   ("output", 12, _MSG, "ValueInfoProto", True, False)],
    "NodeProto": [("input", 1, _STR, "", True, False), ("output", 2, _STR, "", True, False),
                  ("name", 3, _STR, "", False, False), ("op_type", 4, _STR, "", False, False),
                  ("attribute", 5, _MSG, "AttributeProto", True, False),
                  ("domain", 7, _STR, "", False, False)],
    "AttributeProto": [("name", 1, _STR, "", False, False),
                       ("g", 6, _MSG, "GraphProto", False, False),
                       ("graphs", 11, _MSG, "GraphProto", True, False)],
    "TensorProto": [("dims", 1, _I64, "", True, False),
                    ("data_type", 2, _I32, "", False, False), ("name", 8, _STR, "", False, False),
                    ("raw_data", 9, _BYT, "", False, False),
                    ("external_data", 13, _MSG, "StringStringEntryProto", True, False)],
    "StringStringEntryProto": [("key", 1, _STR, "", False, False),
                               ("value", 2, _STR, "", False, False)],
    "ValueInfoProto": [("name", 1, _STR, "", False, False),
                       ("type", 2, _MSG, "TypeProto", False, False)],
    "TypeProto": [("tensor_type", 1, _MSG, "TypeProto.Tensor", False, True)],
    "TypeProto.Tensor": [("elem_type", 1, _I32, "", False, False),
                         ("shape", 2, _MSG, "TensorShapeProto", False, False)],
    "TensorShapeProto": [("dim", 1, _MSG, "TensorShapeProto.Dimension", True, False)],
    "TensorShapeProto.Dimension": [("dim_value", 1, _I64, "", False, True),
                                   ("dim_param", 2, _STR, "", False, True)],
}
# TensorProto.DataType numbers of the tensor types that may cross a cut, by the name
# ONNX Runtime gives them
ELEM_TYPES = {"tensor(float)": 1, "tensor(int32)": 6, "tensor(int64)": 7, "tensor(bool)": 9,
              "tensor(float16)": 10}


_CLASSES = message_classes(PACKAGE, "rung/onnx_subset.proto",
                           {name: (fields, 0) for name, fields in MESSAGES.items()},
                           ("ModelProto", "ValueInfoProto"))
ModelProto: Any = _CLASSES["ModelProto"]
ValueInfoProto: Any = _CLASSES["ValueInfoProto"]


def tensor_value_info(name: str, elem_type: int | None = None,
                      shape: Sequence[int | str | None] | None = None) -> Any:
    """A graph input or output named ``name``: a tensor of ``elem_type`` (a TensorProto
    data type number) and ``shape`` (sizes, symbolic names, None for unknown; no shape at
    all: rank unknown), or, with no type, a name only (ONNX Runtime then infers the type of
    such an output)."""
    info = ValueInfoProto(name=name)
    if elem_type is not None:
        t = info.type.tensor_type
        t.elem_type = elem_type
        if shape is None:
            return info
        t.shape.SetInParent()
        for size in shape:
            d = t.shape.dim.add()
            if isinstance(size, int):
                d.dim_value = size
            elif size is not None:
                d.dim_param = size
    return info
