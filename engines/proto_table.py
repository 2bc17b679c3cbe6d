"""Protobuf message classes from a table of fields, built with the descriptor API in a
private pool: no generated code to keep in step with the protobuf runtime, nothing that
clashes with another library registering the same names. Used for the Sparkplug B payload
(``daemon/sparkplug/pb.py``) and the ONNX fields the engine edits
(``engines/onnx_pb.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
# (field name, number, type, message type or "", repeated, in the oneof "value")
Field = tuple[str, int, int, str, bool, bool]
# message (dotted under its parent when nested) -> (fields, first extension number or 0)
Table = Mapping[str, tuple[Sequence[Field], int]]
_MAX = 536870912  # "extensions N to max": the end of the range is 2**29, exclusive


def _message(package: str, table: Table, name: str) -> descriptor_pb2.DescriptorProto:
    fields, first_extension = table[name]
    msg = descriptor_pb2.DescriptorProto(name=name.rsplit(".", 1)[-1])
    if any(one for *_, one in fields):
        msg.oneof_decl.add(name="value")
    for fname, number, kind, ref, repeated, one in fields:
        f = msg.field.add(name=fname, number=number, type=kind,
                          label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if ref:
            f.type_name = f".{package}.{ref}"
        if one:
            f.oneof_index = 0
    if first_extension:
        msg.extension_range.add(start=first_extension, end=_MAX)
    msg.nested_type.extend(_message(package, table, n) for n in table
                           if n.rsplit(".", 1)[0] == name and n != name)
    return msg


def message_classes(package: str, file_name: str, table: Table,
                    names: Sequence[str]) -> dict[str, Any]:
    """The classes of ``names`` (messages of ``table``, proto2, in ``package``)."""
    file = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto2")
    file.message_type.extend(_message(package, table, n) for n in table if "." not in n)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file.SerializeToString())
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{n}"))
            for n in names}
