"""The Sparkplug B payload (``org.eclipse.tahu.protobuf.Payload``) as a protobuf message class.

The message definitions of the Sparkplug 3.0 specification (section 6.4, the
``sparkplug_b.proto`` schema: proto2, field numbers, oneofs and extension ranges) are written
here as a table and built with protobuf's descriptor API in a private pool, so there is no
generated code to keep in step with the protobuf runtime and nothing clashes with another
library that registers the same names. The bytes are those of any Sparkplug B implementation.

``Payload`` is the message class; ``DataType`` the metric datatype numbers.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from rung.engines.proto_table import F as _F
from rung.engines.proto_table import Field, message_classes

__all__ = ["PACKAGE", "DataType", "Payload"]

PACKAGE = "org.eclipse.tahu.protobuf"


class DataType(IntEnum):
    """Sparkplug B datatypes (``Metric.datatype``, ``PropertyValue.type``)."""

    INT8, INT16, INT32, INT64 = 1, 2, 3, 4
    UINT8, UINT16, UINT32, UINT64 = 5, 6, 7, 8
    FLOAT, DOUBLE, BOOLEAN, STRING, DATETIME, TEXT = 9, 10, 11, 12, 13, 14
    UUID, DATASET, BYTES, FILE, TEMPLATE = 15, 16, 17, 18, 19
    PROPERTYSET, PROPERTYSETLIST = 20, 21


# message (dotted under Payload) -> fields: (name, number, type, message type or "",
# repeated, in the oneof "value"); first extension number or 0 for none
_U32, _U64, _FLT, _DBL = _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_FLOAT, _F.TYPE_DOUBLE
_BOOL, _STR, _BYT, _MSG = _F.TYPE_BOOL, _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE


def _scalars(ext: str, first: int) -> list[Field]:
    """The value oneof shared by Parameter and DataSetValue: scalars then an extension."""
    kinds = [("int_value", _U32), ("long_value", _U64), ("float_value", _FLT),
             ("double_value", _DBL), ("boolean_value", _BOOL), ("string_value", _STR)]
    fields = [(name, first + i, kind, "", False, True) for i, (name, kind) in enumerate(kinds)]
    return [*fields, ("extension_value", first + len(kinds), _MSG, ext, False, True)]


MESSAGES: dict[str, tuple[list[Field], int]] = {
    "Payload": ([("timestamp", 1, _U64, "", False, False),
                 ("metrics", 2, _MSG, "Payload.Metric", True, False),
                 ("seq", 3, _U64, "", False, False), ("uuid", 4, _STR, "", False, False),
                 ("body", 5, _BYT, "", False, False)], 6),
    "Payload.Template": ([("version", 1, _STR, "", False, False),
                          ("metrics", 2, _MSG, "Payload.Metric", True, False),
                          ("parameters", 3, _MSG, "Payload.Template.Parameter", True, False),
                          ("template_ref", 4, _STR, "", False, False),
                          ("is_definition", 5, _BOOL, "", False, False)], 6),
    "Payload.Template.Parameter": (
        [("name", 1, _STR, "", False, False), ("type", 2, _U32, "", False, False),
         *_scalars("Payload.Template.Parameter.ParameterValueExtension", 3)], 0),
    "Payload.Template.Parameter.ParameterValueExtension": ([], 1),
    "Payload.DataSet": ([("num_of_columns", 1, _U64, "", False, False),
                         ("columns", 2, _STR, "", True, False),
                         ("types", 3, _U32, "", True, False),
                         ("rows", 4, _MSG, "Payload.DataSet.Row", True, False)], 5),
    "Payload.DataSet.DataSetValue": (
        _scalars("Payload.DataSet.DataSetValue.DataSetValueExtension", 1), 0),
    "Payload.DataSet.DataSetValue.DataSetValueExtension": ([], 1),
    "Payload.DataSet.Row": ([("elements", 1, _MSG, "Payload.DataSet.DataSetValue", True,
                              False)], 2),
    "Payload.PropertyValue": (
        [("type", 1, _U32, "", False, False), ("is_null", 2, _BOOL, "", False, False),
         *_scalars("", 3)[:-1],
         ("propertyset_value", 9, _MSG, "Payload.PropertySet", False, True),
         ("propertysets_value", 10, _MSG, "Payload.PropertySetList", False, True),
         ("extension_value", 11, _MSG, "Payload.PropertyValue.PropertyValueExtension", False,
          True)], 0),
    "Payload.PropertyValue.PropertyValueExtension": ([], 1),
    "Payload.PropertySet": ([("keys", 1, _STR, "", True, False),
                             ("values", 2, _MSG, "Payload.PropertyValue", True, False)], 3),
    "Payload.PropertySetList": ([("propertyset", 1, _MSG, "Payload.PropertySet", True,
                                  False)], 2),
    "Payload.MetaData": ([("is_multi_part", 1, _BOOL, "", False, False),
                          ("content_type", 2, _STR, "", False, False),
                          ("size", 3, _U64, "", False, False), ("seq", 4, _U64, "", False, False),
                          ("file_name", 5, _STR, "", False, False),
                          ("file_type", 6, _STR, "", False, False),
                          ("md5", 7, _STR, "", False, False),
                          ("description", 8, _STR, "", False, False)], 9),
    "Payload.Metric": (
        [("name", 1, _STR, "", False, False), ("alias", 2, _U64, "", False, False),
         ("timestamp", 3, _U64, "", False, False), ("datatype", 4, _U32, "", False, False),
         ("is_historical", 5, _BOOL, "", False, False),
         ("is_transient", 6, _BOOL, "", False, False), ("is_null", 7, _BOOL, "", False, False),
         ("metadata", 8, _MSG, "Payload.MetaData", False, False),
         ("properties", 9, _MSG, "Payload.PropertySet", False, False),
         *((n, num + 7, kind, ref, rep, one) for n, num, kind, ref, rep, one
           in _scalars("", 3)[:-1]),
         ("bytes_value", 16, _BYT, "", False, True),
         ("dataset_value", 17, _MSG, "Payload.DataSet", False, True),
         ("template_value", 18, _MSG, "Payload.Template", False, True),
         ("extension_value", 19, _MSG, "Payload.Metric.MetricValueExtension", False, True)],
        0),
    "Payload.Metric.MetricValueExtension": ([], 1),
}


def _payload_class() -> Any:
    return message_classes(PACKAGE, "rung/sparkplug_b.proto", MESSAGES, ["Payload"])["Payload"]


Payload: Any = _payload_class()
"""The Sparkplug B payload message class (``Payload()``, ``FromString(bytes)``)."""
