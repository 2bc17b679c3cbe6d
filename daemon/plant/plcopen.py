"""An ``st_code`` answer as a PLCopen TC6 XML 2.01 project, and such a project read back.

PLCopen XML is what CODESYS, TwinCAT, Beremiz and OpenPLC import. :func:`to_plcopen_xml`
writes one POU (the ``st_code`` task's output object: ``pou_type``, ``name``,
``return_type``, ``variables``, ``body``, ``assumptions``) as a project document:

* ``fileHeader`` and ``contentHeader`` with every required attribute (``coordinateInfo``
  scaling 1:1; graphical languages are not used);
* the interface: the return type, then one varList per run of variables of the same section
  (``inputVars``, ``outputVars``, ``inOutVars``, ``localVars``, ``tempVars``) in the
  object's order; each variable's type, its initial value as a ``simpleValue`` and its
  comment as ``documentation``;
* the body as ``<ST><xhtml:p>`` with the text in CDATA, rewritten for the chosen
  IEC 61131-3 edition (``daemon/tasks/st/edition.py``: edition 2 has no ``//`` comments);
* the assumptions twice: as the POU's ``documentation`` for people, and in an ``addData``
  element of rung's own (``urn:rung:st_code``) so :func:`from_plcopen_xml` gives back the
  same object.

Types: the elementary types of TC6 2.01 (``TIME_OF_DAY`` is written ``TOD``,
``DATE_AND_TIME`` ``DT``), ``STRING[n]``, ``ARRAY[a..b, ...] OF T`` and any other name as a
``derived`` type (function block instances). A variable whose ``initial`` or ``comment`` is
blank gets none, as in the rendered text (``daemon/tasks/st/pou.py``). Validation against the
official schema lives in the tests (the serving path needs no XSD validator).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from datetime import UTC, datetime
from itertools import groupby
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from rung.daemon.tasks.st.edition import to_edition
from rung.daemon.tasks.st.pou import ELEMENTARY_TYPES, SECTION_ORDER
from rung.engines.errors import RungError

__all__ = ["PLCOPEN_NS", "PlcopenError", "from_plcopen_xml", "to_edition", "to_plcopen_xml"]

PLCOPEN_NS = "http://www.plcopen.org/xml/tc6_0201"
XHTML_NS = "http://www.w3.org/1999/xhtml"
RUNG_DATA = "urn:rung:st_code"  # rung's addData: name, and namespace of its elements
_POU_TYPES = {"PROGRAM": "program", "FUNCTION_BLOCK": "functionBlock",
              "FUNCTION": "function"}
_VAR_LISTS = {"VAR_INPUT": "inputVars", "VAR_OUTPUT": "outputVars",
              "VAR_IN_OUT": "inOutVars", "VAR": "localVars", "VAR_TEMP": "tempVars"}
# ST name -> TC6 element; the reverse table gives the st_code schema's spellings back
_SAME_NAME = ("BOOL", "BYTE", "WORD", "DWORD", "LWORD", "SINT", "INT", "DINT", "LINT", "USINT",
              "UINT", "UDINT", "ULINT", "REAL", "LREAL", "TIME", "DATE")
_ELEMENTARY = {n: n for n in _SAME_NAME} | {
    "TIME_OF_DAY": "TOD", "TOD": "TOD", "DATE_AND_TIME": "DT", "DT": "DT", "STRING": "string",
    "WSTRING": "wstring"}
_FROM_ELEMENT = {v: k for k, v in _ELEMENTARY.items() if k not in ("TOD", "DT")}
_ARRAY_RE = re.compile(r"^ARRAY\s*\[(.+?)\]\s*OF\s+(.+)$", re.DOTALL | re.IGNORECASE)
_DIM_RE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
_STRING_RE = re.compile(r"^(W?STRING)\s*[\[(]\s*(\d+)\s*[\])]$", re.IGNORECASE)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# characters XML 1.0 cannot carry at all (not even as a character reference)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class PlcopenError(RungError):
    """A POU that has no PLCopen XML form, or a PLCopen document rung cannot read."""


# --- writing ----------------------------------------------------------------------------


def _xml_text(value: str, where: str) -> str:
    if (bad := _NOT_XML.search(value)) is not None:
        raise PlcopenError(f"{where}: character U+{ord(bad[0]):04X} cannot be written in XML")
    return value


def _chars(value: str, where: str) -> str:
    """Element text: escaped, with a carriage return as a reference (parsers drop it)."""
    return escape(_xml_text(value, where)).replace("\r", "&#13;")


def _attr(value: str, where: str) -> str:
    return quoteattr(_xml_text(value, where))


def _cdata(value: str, where: str) -> str:
    body = _xml_text(value, where).replace("]]>", "]]]]><![CDATA[>")
    return "<![CDATA[" + body.replace("\r", "]]>&#13;<![CDATA[") + "]]>"


def _type_xml(type_: str, where: str) -> str:
    """One TC6 ``dataType`` element for an ST type name."""
    text = type_.strip()
    if (m := _ARRAY_RE.match(text)) is not None:
        dims = []
        for dim in m[1].split(","):
            if (d := _DIM_RE.match(dim)) is None:
                raise PlcopenError(f"{where}: array bounds {dim.strip()!r} are not lo..hi")
            dims.append(f"<dimension lower=\"{int(d[1])}\" upper=\"{int(d[2])}\"/>")
        base = _type_xml(m[2], where)
        return f"<array>{''.join(dims)}<baseType>{base}</baseType></array>"
    if (m := _STRING_RE.match(text)) is not None:
        return f"<{m[1].lower()} length=\"{int(m[2])}\"/>"
    if (element := _ELEMENTARY.get(text.upper())) is not None:
        return f"<{element}/>"
    if _NAME_RE.match(text) and text.upper() not in ELEMENTARY_TYPES:
        return f"<derived name={_attr(text, where)}/>"
    raise PlcopenError(f"{where}: type {type_!r} has no PLCopen TC6 2.01 form")


def _documentation(text: str, where: str) -> str:
    return f"<documentation><xhtml:p>{_chars(text, where)}</xhtml:p></documentation>"


def _variable(v: Mapping[str, Any], i: int) -> str:
    where = f"variables[{i}]"
    name = v.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PlcopenError(f"{where}.name: {name!r} is not an IEC identifier")
    parts = [f"<variable name=\"{name}\"><type>{_type_xml(str(v['type']), where)}</type>"]
    initial = v.get("initial")
    if initial is not None and str(initial).strip():
        parts.append(f"<initialValue><simpleValue value={_attr(str(initial), where)}/>"
                     "</initialValue>")
    comment = v.get("comment")
    if comment is not None and str(comment).strip():
        parts.append(_documentation(str(comment), f"{where}.comment"))
    return "".join(parts) + "</variable>"


def _section(v: Any, i: int) -> str:
    section = str(v.get("section", "")).upper() if isinstance(v, Mapping) else ""
    if section not in _VAR_LISTS:
        raise PlcopenError(f"variables[{i}]: needs a section, one of {', '.join(SECTION_ORDER)}")
    return section


def _interface(pou: Mapping[str, Any]) -> list[str]:
    """The interface element, one line per variable."""
    lines = ["<interface>"]
    if pou.get("return_type"):
        lines.append(f"  <returnType>{_type_xml(str(pou['return_type']), 'return_type')}"
                     "</returnType>")
    numbered = list(enumerate(pou.get("variables") or []))
    # one varList per run of one section: the object's order comes back on reading
    for section, run in groupby(numbered, key=lambda iv: _section(iv[1], iv[0])):
        tag = _VAR_LISTS[section]
        lines += [f"  <{tag}>", *(f"    {_variable(v, i)}" for i, v in run), f"  </{tag}>"]
    return [*lines, "</interface>"]


def _rung_data(pou: Mapping[str, Any], edition: int) -> str:
    assumptions = pou.get("assumptions")
    inner = ""
    if assumptions is not None:
        items = "".join(f"<rung:assumption>{_chars(str(a), f'assumptions[{i}]')}"
                        "</rung:assumption>" for i, a in enumerate(assumptions))
        inner = f"<rung:assumptions>{items}</rung:assumptions>"
    return (f"<addData><data name=\"{RUNG_DATA}\" handleUnknown=\"discard\">"
            f"<rung:pou xmlns:rung=\"{RUNG_DATA}\" edition=\"{edition}\">{inner}</rung:pou>"
            "</data></addData>")


def _pou_documentation(pou: Mapping[str, Any], edition: int) -> str:
    lines = [f"Written by rung (st_code task), IEC 61131-3 edition {edition}."]
    if pou.get("assumptions"):
        lines += ["Assumptions:", *(f"- {a}" for a in pou["assumptions"])]
    return _documentation("\n".join(lines), "assumptions")


def to_plcopen_xml(pou: Mapping[str, Any], edition: int = 3, *,
                   project_name: str | None = None) -> str:
    """The POU object as a PLCopen TC6 XML 2.01 project document (UTF-8 text).

    ``edition`` 2 rewrites the body's comments for edition-2 toolchains (Beremiz, OpenPLC);
    3 keeps it as is (CODESYS, TwinCAT). ``project_name`` names the project (default: the
    POU's name).

    Raises:
        PlcopenError: a field the document cannot carry (unknown POU type or section, a type
            with no TC6 form, a character XML forbids).
        EditionError: ``edition`` is neither 2 nor 3.
    """
    pou_type = _POU_TYPES.get(str(pou.get("pou_type", "")).upper())
    if pou_type is None:
        raise PlcopenError(f"pou_type {pou.get('pou_type')!r} is not one of "
                           f"{', '.join(_POU_TYPES)}")
    name = pou.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PlcopenError(f"name: {name!r} is not an IEC identifier")
    body = to_edition(str(pou.get("body") or ""), edition)
    now = datetime.now(UTC).replace(microsecond=0).isoformat()
    title = project_name if project_name is not None else name
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<project xmlns="{PLCOPEN_NS}" xmlns:xhtml="{XHTML_NS}">',
        f'  <fileHeader companyName="rung" productName="rung" '
        f'productVersion={_attr(_version(), "version")} creationDateTime="{now}" '
        f'contentDescription="IEC 61131-3 edition {edition} POU written by rung (st_code '
        'task)"/>',
        f'  <contentHeader name={_attr(title, "project_name")} modificationDateTime="{now}">',
        '    <coordinateInfo><fbd><scaling x="1" y="1"/></fbd><ld><scaling x="1" y="1"/></ld>'
        '<sfc><scaling x="1" y="1"/></sfc></coordinateInfo>',
        f'    <addDataInfo><info name="{RUNG_DATA}" version="1.0" vendor="urn:rung"/>'
        '</addDataInfo>',
        '  </contentHeader>',
        '  <types>',
        '    <dataTypes/>',
        '    <pous>',
        f'      <pou name="{name}" pouType="{pou_type}">',
        *(f"        {line}" for line in _interface(pou)),
        f'        <body><ST><xhtml:p>{_cdata(body, "body")}</xhtml:p></ST></body>',
        f'        {_rung_data(pou, edition)}',
        f'        {_pou_documentation(pou, edition)}',
        '      </pou>',
        '    </pous>',
        '  </types>',
        '  <instances><configurations/></instances>',
        '</project>',
        ''])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rung")
    except PackageNotFoundError:
        return "unknown"


# --- reading ----------------------------------------------------------------------------

def _q(tag: str, ns: str = PLCOPEN_NS) -> str:
    return f"{{{ns}}}{tag}"


_SECTIONS = {_q(tag): section for section, tag in _VAR_LISTS.items()}
_ELEMENT_TYPES = {_q(element): st for element, st in _FROM_ELEMENT.items()}


def _type_str(el: ET.Element | None, where: str) -> str:
    """The ST spelling of a TC6 ``dataType`` element's content."""
    inner = None if el is None else next(iter(el), None)
    if inner is None:
        raise PlcopenError(f"{where}: no type")
    if inner.tag in (_q("string"), _q("wstring")) and inner.get("length"):
        return f"{_ELEMENT_TYPES[inner.tag]}[{inner.get('length')}]"
    if inner.tag in _ELEMENT_TYPES:
        return _ELEMENT_TYPES[inner.tag]
    if inner.tag == _q("derived") and inner.get("name"):
        return str(inner.get("name"))
    if inner.tag == _q("array"):
        dims = [f"{d.get('lower')}..{d.get('upper')}" for d in inner.findall(_q("dimension"))]
        return f"ARRAY[{', '.join(dims)}] OF {_type_str(inner.find(_q('baseType')), where)}"
    raise PlcopenError(f"{where}: type <{inner.tag.split('}')[-1]}> has no st_code form")


def _value_str(el: ET.Element, where: str) -> str:
    """A TC6 ``value`` as ST literal text: simple, array ``[2(0), 1]``, struct ``(a := 1)``."""
    kind = next(iter(el), None)
    if kind is not None and kind.tag == _q("simpleValue"):
        return kind.get("value") or ""
    if kind is not None and kind.tag == _q("arrayValue"):
        items = []
        for v in kind.findall(_q("value")):
            text, rep = _value_str(v, where), v.get("repetitionValue", "1")
            items.append(text if rep == "1" else f"{rep}({text})")
        return f"[{', '.join(items)}]"
    if kind is not None and kind.tag == _q("structValue"):
        members = (f"{v.get('member')} := {_value_str(v, where)}"
                   for v in kind.findall(_q("value")))
        return f"({', '.join(members)})"
    raise PlcopenError(f"{where}: initial value has no simpleValue, arrayValue or structValue")


def _formatted(el: ET.Element | None) -> str | None:
    """The text of a ``formattedText`` element (its one XHTML element), None when absent."""
    if el is None:
        return None
    xhtml = next(iter(el), None)
    return "".join(xhtml.itertext()) if xhtml is not None else (el.text or "").strip()


def _variables(interface: ET.Element, pou_name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for var_list in interface:
        if var_list.tag in (_q("returnType"), _q("addData"), _q("documentation")):
            continue
        section = _SECTIONS.get(var_list.tag)
        kind = var_list.tag.split("}")[-1]
        if section is None:
            raise PlcopenError(f"POU {pou_name}: <{kind}> has no place in an st_code POU "
                               f"(sections {', '.join(SECTION_ORDER)})")
        qualifiers = [a for a in ("constant", "retain", "nonretain", "persistent",
                                  "nonpersistent") if var_list.get(a) in ("true", "1")]
        if qualifiers:
            raise PlcopenError(f"POU {pou_name}: {section} {qualifiers[0].upper()} has no "
                               "place in an st_code POU")
        for var in var_list.findall(_q("variable")):
            where = f"POU {pou_name}, variable {var.get('name')}"
            v: dict[str, Any] = {"section": section, "name": var.get("name") or "",
                                 "type": _type_str(var.find(_q("type")), where)}
            if (initial := var.find(_q("initialValue"))) is not None:
                v["initial"] = _value_str(initial, where)
            if (comment := _formatted(var.find(_q("documentation")))) is not None:
                v["comment"] = comment
            out.append(v)
    return out


def _st_body(pou: ET.Element, name: str) -> str:
    bodies = pou.findall(_q("body"))
    if not bodies:
        raise PlcopenError(f"POU {name} has no body")
    language = next(iter(bodies[0]), None)
    if language is None or language.tag != _q("ST"):
        kind = "no" if language is None else f"a {language.tag.split('}')[-1]}"
        raise PlcopenError(f"POU {name} has {kind} body: rung reads Structured Text only")
    return _formatted(language) or ""


def _one_pou(root: ET.Element, name: str | None) -> ET.Element:
    pous = root.findall(f"{_q('types')}/{_q('pous')}/{_q('pou')}")
    if name is not None:
        pous = [p for p in pous if p.get("name") == name]
    if len(pous) != 1:
        names = ", ".join(str(p.get("name")) for p in root.iter(_q("pou"))) or "none"
        which = "POUs" if name is None else f"POUs named {name!r}"
        raise PlcopenError(f"the document holds {len(pous)} {which} (POUs: {names})",
                           "name the one to read")
    return pous[0]


def from_plcopen_xml(text: str | bytes, *, name: str | None = None) -> dict[str, Any]:
    """The POU object (``st_code`` shape) of a PLCopen TC6 XML 2.01 document.

    ``name`` picks the POU when the document holds several. ``assumptions`` come back only
    from a document rung wrote (its ``addData``); a body written for edition 2 comes back
    as written.

    Raises:
        PlcopenError: not XML, not a TC6 2.01 project, no such single POU, or a POU an
            ``st_code`` object cannot hold (a graphical body, VAR CONSTANT, VAR_GLOBAL...).
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise PlcopenError(f"not an XML document: {e}") from e
    if root.tag != _q("project"):
        raise PlcopenError(f"root element is {root.tag!r}, not a PLCopen TC6 2.01 project "
                           f"(namespace {PLCOPEN_NS})")
    pou = _one_pou(root, name)
    pou_name = pou.get("name") or ""
    kinds = {v: k for k, v in _POU_TYPES.items()}
    if pou.get("pouType") not in kinds:
        raise PlcopenError(f"POU {pou_name}: pouType {pou.get('pouType')!r} is not one of "
                           f"{', '.join(kinds)}")
    out: dict[str, Any] = {"pou_type": kinds[str(pou.get("pouType"))], "name": pou_name}
    interface = pou.find(_q("interface"))
    if interface is not None and (ret := interface.find(_q("returnType"))) is not None:
        out["return_type"] = _type_str(ret, f"POU {pou_name}, return type")
    out["variables"] = [] if interface is None else _variables(interface, pou_name)
    out["body"] = _st_body(pou, pou_name)
    data = pou.find(f"{_q('addData')}/{_q('data')}[@name='{RUNG_DATA}']/{_q('pou', RUNG_DATA)}")
    assumptions = None if data is None else data.find(_q("assumptions", RUNG_DATA))
    if assumptions is not None:
        out["assumptions"] = [a.text or "" for a in assumptions.findall(_q("assumption",
                                                                           RUNG_DATA))]
    return out

