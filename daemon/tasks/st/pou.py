"""IEC 61131-3 Structured Text POUs: render the task's POU object to text and check it.

The ``st_pou`` task answers with a JSON object (``pou_type``, ``name``, ``variables``, ``body``,
...). This module turns it into the text an engineer pastes into the PLC IDE and checks that
text before it leaves the daemon:

* ``render_pou`` / ``render_pou_with_map``: header, one ``VAR_*`` block per section, the body
  indented by 4 spaces, the ``END_*`` line. The map is the 0-based line where the body starts.
* ``check_syntax``: parse with the tree-sitter IEC 61131-3 ST grammar (MIT,
  ``tree-sitter-iec61131-3-st``). tree-sitter never raises on bad input; it builds ERROR and
  MISSING nodes, which are reported with 1-based line and column (characters, not bytes).
* ``check_identifiers``: every identifier in the body is declared, the POU's own name
  (FUNCTION result), a standard function, a named call argument, or a member of a declared
  instance that its standard FB type actually has; duplicate and reserved variable names.
* ``validate_pou``: the rendered text and both checks, from one parse.

Where the grammar (0.1.2) and IEC part ways, this module follows IEC: ``STRING[n]``, bit
access (``word.3``) and direct addresses in statements (``%IX0.1``) are rewritten, byte for
byte, in the copy handed to the parser; a missing ``;`` after ``END_IF``/``END_CASE``/...
(tolerated by the grammar and by CODESYS, not by strict compilers) and an assignment to a
non-variable (``5 := x;``) are reported as syntax errors.

The parser is built once per process (lazily) and shared behind a lock: validation runs per
request, and a tree-sitter ``Parser`` is not safe to use from two threads at once. When the
grammar is not installed every check fails loudly; it never passes unchecked text.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tree_sitter import Node, Parser, Tree

__all__ = [
    "SECTION_ORDER",
    "check_identifiers",
    "check_syntax",
    "render_pou",
    "render_pou_with_map",
    "to_body_position",
    "validate_pou",
]

INDENT = "    "
SECTION_ORDER = ("VAR_INPUT", "VAR_OUTPUT", "VAR_IN_OUT", "VAR", "VAR_TEMP")
_END = {"FUNCTION_BLOCK": "END_FUNCTION_BLOCK", "PROGRAM": "END_PROGRAM",
        "FUNCTION": "END_FUNCTION"}
_MAX_ERRORS = 50
_NO_PARSER = ("no ST parser installed: the checks need the tree-sitter IEC 61131-3 ST grammar "
              "(pip install 'tree-sitter>=0.25' tree-sitter-iec61131-3-st==0.1.2)")

# --- IEC vocabulary (upper case; IEC identifiers and keywords are case-insensitive) ---------


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


ELEMENTARY_TYPES = _names("""
    BOOL BYTE WORD DWORD LWORD SINT INT DINT LINT USINT UINT UDINT ULINT REAL LREAL
    TIME LTIME DATE LDATE TIME_OF_DAY LTIME_OF_DAY TOD LTOD DATE_AND_TIME LDATE_AND_TIME DT LDT
    STRING WSTRING CHAR WCHAR
""")
_GENERIC_TYPES = _names("""
    ANY ANY_DERIVED ANY_ELEMENTARY ANY_MAGNITUDE ANY_NUM ANY_REAL ANY_INT ANY_UNSIGNED
    ANY_SIGNED ANY_DURATION ANY_BIT ANY_CHARS ANY_STRING ANY_CHAR ANY_DATE
""")
# Standard function blocks: inputs and outputs, with their types (IEC 61131-3 ed. 3, 6.6.3).
FB_INPUTS: dict[str, dict[str, str]] = {
    "TON": {"IN": "BOOL", "PT": "TIME"}, "TOF": {"IN": "BOOL", "PT": "TIME"},
    "TP": {"IN": "BOOL", "PT": "TIME"},
    "R_TRIG": {"CLK": "BOOL"}, "F_TRIG": {"CLK": "BOOL"},
    "CTU": {"CU": "BOOL", "R": "BOOL", "PV": "INT"},
    "CTD": {"CD": "BOOL", "LD": "BOOL", "PV": "INT"},
    "CTUD": {"CU": "BOOL", "CD": "BOOL", "R": "BOOL", "LD": "BOOL", "PV": "INT"},
    "SR": {"S1": "BOOL", "R": "BOOL"}, "RS": {"S": "BOOL", "R1": "BOOL"},
}
FB_OUTPUTS: dict[str, dict[str, str]] = {
    "TON": {"Q": "BOOL", "ET": "TIME"}, "TOF": {"Q": "BOOL", "ET": "TIME"},
    "TP": {"Q": "BOOL", "ET": "TIME"},
    "R_TRIG": {"Q": "BOOL"}, "F_TRIG": {"Q": "BOOL"},
    "CTU": {"Q": "BOOL", "CV": "INT"}, "CTD": {"Q": "BOOL", "CV": "INT"},
    "CTUD": {"QU": "BOOL", "QD": "BOOL", "CV": "INT"},
    "SR": {"Q1": "BOOL"}, "RS": {"Q1": "BOOL"},
}
STANDARD_FB_MEMBERS: dict[str, tuple[str, ...]] = {
    fb: (*FB_INPUTS[fb], *FB_OUTPUTS[fb]) for fb in FB_INPUTS}
STANDARD_FUNCTIONS = _names("""
    ABS SQRT LN LOG EXP SIN COS TAN ASIN ACOS ATAN ATAN2 EXPT
    ADD SUB MUL DIV MOD MOVE
    SHL SHR ROL ROR AND OR XOR NOT
    SEL MAX MIN LIMIT MUX GT GE EQ LE LT NE
    LEN LEFT RIGHT MID CONCAT INSERT DELETE REPLACE FIND
    TRUNC ROUND
    ADD_TIME ADD_TOD_TIME ADD_DT_TIME SUB_TIME SUB_DATE_DATE SUB_TOD_TIME SUB_TOD_TOD
    SUB_DT_TIME SUB_DT_DT MUL_TIME DIV_TIME CONCAT_DATE_TOD CONCAT_DATE CONCAT_TOD CONCAT_DT
    SPLIT_DATE SPLIT_TOD SPLIT_DT DAY_OF_WEEK
    LOWER_BOUND UPPER_BOUND REF SIZEOF ADR
""")
CONVERSION_TYPES = ELEMENTARY_TYPES | {"BCD"}
KEYWORDS = _names("""
    ABSTRACT ACTION END_ACTION AND ARRAY AT BY CASE END_CASE CLASS END_CLASS CONFIGURATION
    END_CONFIGURATION CONSTANT CONTINUE DO ELSE ELSIF END_FOR END_IF END_REPEAT END_WHILE EXIT
    EXTENDS F_EDGE FALSE FINAL FOR FROM FUNCTION END_FUNCTION FUNCTION_BLOCK END_FUNCTION_BLOCK
    IF IMPLEMENTS INITIAL_STEP STEP END_STEP INTERFACE END_INTERFACE INTERNAL INTERVAL METHOD
    END_METHOD MOD NAMESPACE END_NAMESPACE NON_RETAIN NOT NULL OF OR OVERRIDE PRIORITY PRIVATE
    PROGRAM END_PROGRAM PROPERTY END_PROPERTY PROTECTED PUBLIC READ_ONLY READ_WRITE REF_TO
    REPEAT RESOURCE END_RESOURCE RETAIN RETURN R_EDGE SINGLE STRUCT END_STRUCT SUPER TASK
    END_TASK THEN THIS TO TRANSITION END_TRANSITION TRUE TYPE END_TYPE UNTIL USING VAR END_VAR
    VAR_ACCESS VAR_CONFIG VAR_EXTERNAL VAR_GLOBAL VAR_INPUT VAR_IN_OUT VAR_OUTPUT VAR_TEMP WHILE
    WITH XOR
""")
# Names a variable may not take: keywords, type names, standard FB type names.
RESERVED_NAMES = KEYWORDS | ELEMENTARY_TYPES | _GENERIC_TYPES | frozenset(FB_INPUTS)

_ARRAY_RE = re.compile(r"^ARRAY\s*\[.*\]\s*OF\s+(.+)$", re.DOTALL)
# Three IEC forms the grammar lacks are rewritten, byte for byte (so every position is
# unchanged), in the text handed to the parser; messages quote the original text:
#   STRING[n] -> STRING(n)      the grammar knows only the parenthesised length
#   %IX0.1    -> _IX0_1         direct addresses in statements (it has them only after AT)
#   word.3    -> word._         bit access (the member becomes an identifier)
_STRING_LEN_RE = re.compile(r"(?i)\b(W?STRING)(\s*)\[([^\]\n]*)\]")
_DIRECT_RE = re.compile(r"%[IQM][XBWDL]?\d+(?:\.\d+)*")
_BIT_RE = re.compile(r"(\b[A-Za-z_]\w*|\])\.(\d)")
_BIT_WIDTH = {"BYTE": 8, "WORD": 16, "DWORD": 32, "LWORD": 64, "SINT": 8, "USINT": 8,
              "INT": 16, "UINT": 16, "DINT": 32, "UDINT": 32, "LINT": 64, "ULINT": 64}
INTEGER_TYPES = frozenset(_BIT_WIDTH)   # integers and bit strings (FOR counters, bit access)
_ASSIGN_EQ_RE = re.compile(r"^[A-Za-z_][\w.]*(?:\[[^\]]*\][\w.]*)*\s*=(?![=>])")
_OPENERS = {"IF": "THEN", "ELSIF": "THEN", "WHILE": "DO", "FOR": "DO", "CASE": "OF"}
_ASSIGNABLE = frozenset({"identifier", "member_access_expression", "index_expression",
                         "dereference_expression"})
# IEC statement lists end every statement with ';', END_IF included; the grammar (like CODESYS)
# lets `END_IF` without it through, strict compilers (Siemens SCL) do not: checked here.
_COMPOUND = frozenset({"if_statement", "case_statement", "for_statement", "while_statement",
                       "repeat_statement"})
_VAR_BLOCKS = frozenset({"var_input", "var_output", "var_in_out", "var_block", "var_temp",
                         "var_external", "var_global", "var_access", "var_config"})


# --- parser cache -----------------------------------------------------------------------------

_LOCK = threading.Lock()
_PARSER: list[Parser | None] = []  # empty: not tried yet; [None]: no usable grammar
_PARSER_PROBLEM: list[str] = []  # why not, for the error message


def _parser() -> Parser | None:
    """The shared parser, built on first use; None when the grammar is missing or unusable."""
    if not _PARSER:
        try:
            import tree_sitter
            import tree_sitter_iec61131_3_st
        except ImportError as e:
            _PARSER_PROBLEM.append(f"{e.name or 'tree_sitter'} is not importable")
            _PARSER.append(None)
        else:
            try:  # e.g. a tree-sitter older than the grammar's ABI (15: needs >= 0.25)
                lang = tree_sitter.Language(tree_sitter_iec61131_3_st.language())
                _PARSER.append(tree_sitter.Parser(lang))
            except (ValueError, TypeError) as e:
                _PARSER_PROBLEM.append(f"the grammar does not load: {e}")
                _PARSER.append(None)
    return _PARSER[0]


def _for_parser(text: str) -> str:
    """``text`` with the forms the grammar lacks rewritten, character for character."""
    text = _STRING_LEN_RE.sub(lambda m: f"{m[1]}{m[2]}({m[3]})", text)
    text = _DIRECT_RE.sub(lambda m: "_" + m[0][1:].replace(".", "_"), text)
    return _BIT_RE.sub(lambda m: f"{m[1]}._", text)


def _parse(text: str) -> tuple[Tree, bytes] | None:
    """Parse ``text``: the tree and the original bytes its positions index, or None."""
    source = text.encode("utf-8")
    rewritten = _for_parser(text).encode("utf-8")
    if len(rewritten) != len(source):  # cannot happen: every rewrite is ASCII for ASCII
        rewritten = source
    with _LOCK:
        parser = _parser()
        if parser is None:
            return None
        return parser.parse(rewritten), source


# --- rendering --------------------------------------------------------------------------------

@dataclass
class _Rendered:
    text: str
    body_start: int  # 0-based line of the first body line
    body_end: int  # 0-based line of the END_* line
    var_lines: list[int] = field(default_factory=list)  # 0-based line of each variable


def _one_line(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return " ".join(str(value).split())


def _render(pou: Mapping[str, Any]) -> _Rendered:
    pou_type = str(pou["pou_type"]).upper()
    name = str(pou["name"])
    header = f"{pou_type} {name}"
    if pou_type == "FUNCTION" and pou.get("return_type"):
        header += f" : {_one_line(pou['return_type'])}"
    lines = [header]
    variables = list(pou.get("variables") or [])
    var_lines = [-1] * len(variables)
    for section in SECTION_ORDER:
        members = [i for i, v in enumerate(variables) if str(v["section"]).upper() == section]
        if not members:
            continue
        lines.append(section)
        for i in members:
            v = variables[i]
            line = f"{INDENT}{v['name']} : {_one_line(v['type'])}"
            if v.get("initial") is not None and str(v["initial"]).strip():
                line += f" := {_one_line(v['initial'])}"
            line += ";"
            comment = _one_line(v.get("comment") or "")
            if comment:
                line += f" // {comment}"
            var_lines[i] = len(lines)
            lines.append(line)
        lines.append("END_VAR")
    body_start = len(lines)
    body = str(pou.get("body") or "").replace("\r\n", "\n").replace("\r", "\n").strip("\n")
    if body:
        lines.extend(INDENT + ln if ln.strip() else "" for ln in body.split("\n"))
    body_end = len(lines)
    lines.append(_END.get(pou_type, f"END_{pou_type}"))
    return _Rendered("\n".join(lines) + "\n", body_start, body_end, var_lines)


def render_pou_with_map(pou: Mapping[str, Any]) -> tuple[str, int]:
    """Render a POU object to ST text; also return the 0-based line where the body starts.

    Body line ``i`` (0-based, after stripping leading/trailing blank lines) is rendered line
    ``offset + i``, indented by 4 spaces (blank lines stay empty). Variables are grouped into
    VAR_INPUT, VAR_OUTPUT, VAR_IN_OUT, VAR, VAR_TEMP blocks in that order, keeping their order
    within a section; empty sections are left out.
    """
    r = _render(pou)
    return r.text, r.body_start


def render_pou(pou: Mapping[str, Any]) -> str:
    """Render a POU object (``pou_type``, ``name``, ``variables``, ``body``...) to ST text."""
    return _render(pou).text


def to_body_position(line: int, column: int, body_start: int) -> tuple[int, int] | None:
    """Map a 1-based (line, column) in the rendered text to a 1-based one in the raw body.

    ``body_start`` is the offset from ``render_pou_with_map``. None when the position lies
    outside the body (header, declarations, END line). Columns in the indentation map to 1.
    """
    body_line = line - 1 - body_start
    if body_line < 0:
        return None
    return body_line + 1, max(1, column - len(INDENT))


# --- tree helpers -----------------------------------------------------------------------------

class _Positions:
    """Byte positions from tree-sitter to 1-based line and character column."""

    def __init__(self, source: bytes) -> None:
        self.source = source
        self.lines = source.split(b"\n")

    def text(self, node: Node | None) -> str:
        """The original text of ``node`` (the parser saw a rewritten copy)."""
        if node is None:
            return ""
        return self.source[node.start_byte:node.end_byte].decode("utf-8", errors="replace")

    def at(self, row: int, byte_col: int) -> tuple[int, int]:
        line = self.lines[row] if row < len(self.lines) else b""
        return row + 1, len(line[:byte_col].decode("utf-8", errors="replace")) + 1

    def error(self, node: Node, message: str, end: bool = False) -> dict[str, Any]:
        point = node.end_point if end else node.start_point
        line, column = self.at(point.row, point.column)
        return {"line": line, "column": column, "message": message}


def _walk(root: Node) -> Iterator[Node]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def _text(node: Node | None) -> str:
    """The text the parser saw (identifiers are never rewritten)."""
    if node is None or node.text is None:
        return ""
    return node.text.decode("utf-8", errors="replace")


def _is(node: Node | None, other: Node) -> bool:
    return node is not None and node.id == other.id


def _snippet(text: str, limit: int = 40) -> str:
    first = text.strip().split("\n", 1)[0].strip()
    return first if len(first) <= limit else first[: limit - 3] + "..."


# --- syntax -----------------------------------------------------------------------------------

_FOREIGN_OPERATORS = (("==", "compare with '='"), ("!=", "use '<>'"), ("&&", "use AND"),
                      ("||", "use OR"), ("!", "use NOT"))


def _error_hint(node: Node, text: str, prev_leaf: Node | None, pos: _Positions) -> str:
    around = pos.source[max(0, node.start_byte - 1):node.start_byte + 2].decode(
        "utf-8", errors="replace")
    for op, advice in _FOREIGN_OPERATORS:
        if op in around:
            return f": '{op}' is not ST, {advice}"
    words = re.findall(r"[A-Za-z_]\w*", text.split(";", 1)[0])
    opener = words[0].upper() if words else ""
    if opener in {"ELSEIF", "ELSE_IF"}:
        return ": use ELSIF"
    wanted = _OPENERS.get(opener)
    if wanted and wanted not in (w.upper() for w in words[1:]):
        return f": {opener} without {wanted}"
    if _ASSIGN_EQ_RE.match(text.strip()):
        return ": use ':=' for assignment ('=' compares)"
    if (prev_leaf is not None and prev_leaf.end_point.row < node.start_point.row
            and (prev_leaf.is_named or prev_leaf.type in {")", "]", "END_IF", "END_CASE",
                                                            "END_FOR", "END_WHILE",
                                                            "END_REPEAT"})):
        return f": missing ';' at the end of line {prev_leaf.end_point.row + 1}?"
    return ""


def _unterminated(node: Node) -> str | None:
    """For a compound statement not followed by ';': its last keyword (END_IF...)."""
    if node.type not in _COMPOUND or node.has_error:
        return None
    nxt = node.next_sibling
    while nxt is not None and nxt.type in {"comment", "pragma"}:
        nxt = nxt.next_sibling
    if nxt is not None and nxt.type in {"empty_statement", ";", "ERROR"}:
        return None
    return node.children[-1].type if node.children else node.type


def _has_else_if(if_statement: Node) -> bool:
    for clause in if_statement.named_children:
        if clause.type == "else_clause":
            body = [c for c in clause.named_children if c.type not in {"comment", "pragma"}]
            return bool(body) and body[0].type == "if_statement"
    return False


def _syntax_errors(tree: Tree, pos: _Positions) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    leaves: list[Node] = []
    candidates: list[Node] = []
    for node in _walk(tree.root_node):
        if node.type == "comment":
            continue
        if node.is_error or node.is_missing or (
                node.type == "assignment_statement" and not node.has_error
                and (left := node.child_by_field_name("left")) is not None
                and left.type not in _ASSIGNABLE):
            candidates.append(node)
        elif node.type in _COMPOUND:
            candidates.append(node)  # checked for the ';' after its END_*
        if node.child_count == 0:
            leaves.append(node)
    starts = [leaf.start_byte for leaf in leaves]
    inside_error: list[tuple[int, int]] = []
    for node in candidates:
        if any(a <= node.start_byte and node.end_byte <= b for a, b in inside_error):
            continue  # already reported by an enclosing ERROR
        if node.type in _COMPOUND:
            if (end := _unterminated(node)) is not None:
                errors.append(pos.error(node, f"missing ';' after {end}", end=True))
        elif node.is_missing:
            kind = node.type if node.is_named else f"'{node.type}'"
            message = f"missing {kind}"
            parent = node.parent
            if parent is not None and parent.start_point.row != node.start_point.row:
                opener = _snippet(pos.text(parent), 24)
                message += f" (for '{opener}' on line {parent.start_point.row + 1})"
            if node.type == "END_IF" and parent is not None and _has_else_if(parent):
                message += ": 'ELSE IF' opens a nested IF, use ELSIF"
            errors.append(pos.error(node, message))
        elif node.is_error:
            inside_error.append((node.start_byte, node.end_byte))
            text = pos.text(node)
            i = bisect.bisect_left(starts, node.start_byte) - 1
            prev_leaf = leaves[i] if i >= 0 else None
            hint = _error_hint(node, text, prev_leaf, pos)
            errors.append(pos.error(node, f"syntax error at '{_snippet(text)}'{hint}"))
        else:
            left = node.child_by_field_name("left")
            errors.append(pos.error(node, f"cannot assign to '{_snippet(pos.text(left))}': the "
                                          "left side of ':=' must be a variable"))
    errors.sort(key=lambda e: (e["line"], e["column"]))
    return errors[:_MAX_ERRORS]


def check_syntax(text: str) -> dict[str, Any]:
    """Parse ST ``text``: ``{"ok": bool, "errors": [{"line", "column", "message"}]}``.

    Lines and columns are 1-based, columns count characters. ``ok`` is False (with one error
    saying so) when no ST parser is installed: unchecked text never passes.
    """
    parsed = _parse(text)
    if parsed is None:
        return _no_parser()
    tree, source = parsed
    errors = _syntax_errors(tree, _Positions(source))
    return {"ok": not errors, "errors": errors}


def _no_parser() -> dict[str, Any]:
    message = _NO_PARSER + "".join(f" ({p})" for p in _PARSER_PROBLEM[:1])
    return {"ok": False, "errors": [{"line": 1, "column": 1, "message": message}]}


# --- identifiers ------------------------------------------------------------------------------

def _norm_type(type_text: Any) -> str:
    return " ".join(str(type_text).upper().split())


def _is_conversion(name: str) -> bool:
    if "_TO_" in name:
        src, dst = name.split("_TO_", 1)
        return src in CONVERSION_TYPES and dst in CONVERSION_TYPES
    if name.startswith("TO_"):
        return name[3:] in CONVERSION_TYPES
    if "TRUNC_" in name:
        src, _, dst = name.rpartition("TRUNC_")
        return dst in CONVERSION_TYPES and (not src or src[:-1] in CONVERSION_TYPES)
    return False


def _is_function(name: str) -> bool:
    return name in STANDARD_FUNCTIONS or _is_conversion(name)


def reserved_kind(name: str) -> str | None:
    """What IEC 61131-3 already calls ``name`` (case-insensitively), so a POU cannot take
    it: "a keyword", "a type name", "a standard function block", "a standard function"
    (conversions such as INT_TO_REAL included); None for a name of its own."""
    key = name.upper()
    for kind, table in (("a keyword", KEYWORDS),
                        ("a type name", ELEMENTARY_TYPES | _GENERIC_TYPES),
                        ("a standard function block", frozenset(FB_INPUTS))):
        if key in table:
            return kind
    return "a standard function" if _is_function(key) else None


def _has_no_members(type_name: str) -> bool:
    base = re.split(r"[\[(\s]", type_name, maxsplit=1)[0]
    return base in ELEMENTARY_TYPES or base == "ARRAY"


class _Scope:
    """Declared names of one POU, with the type lookups the member checks need."""

    def __init__(self, pou: Mapping[str, Any]) -> None:
        self.pou_type = str(pou["pou_type"]).upper()
        self.pou_name = str(pou["name"]).upper()
        self.types: dict[str, str] = {}
        for v in pou.get("variables") or []:
            self.types.setdefault(str(v["name"]).upper(), _norm_type(v["type"]))
        if self.pou_type == "FUNCTION" and self.pou_name not in self.types:
            self.types[self.pou_name] = _norm_type(pou.get("return_type") or "")

    def type_of(self, node: Node | None) -> str | None:
        """The declared type of an expression, upper case; None when unknown."""
        if node is None:
            return None
        if node.type == "identifier":
            return self.types.get(_text(node).upper())
        if node.type == "parenthesized_expression":
            inner = [c for c in node.children if c.is_named and c.type != "comment"]
            return self.type_of(inner[0]) if len(inner) == 1 else None
        if node.type == "index_expression":
            outer = self.type_of(node.child_by_field_name("object"))
            m = _ARRAY_RE.match(outer or "")
            return m[1].strip() if m else None
        if node.type == "member_access_expression":
            outer = self.type_of(node.child_by_field_name("object"))
            member = _text(node.child_by_field_name("member")).upper()
            if outer in FB_INPUTS:
                return FB_INPUTS[outer].get(member) or FB_OUTPUTS[outer].get(member)
        return None


def _variable_errors(pou: Mapping[str, Any], r: _Rendered) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    pou_name = str(pou["name"]).upper()
    for i, v in enumerate(pou.get("variables") or []):
        name = str(v["name"])
        key = name.upper()
        line = r.var_lines[i] + 1
        where = {"line": line, "column": len(INDENT) + 1}
        if key in seen:
            errors.append({**where, "message": f"duplicate variable '{name}' (first declared "
                                               f"on line {seen[key]})"})
        else:
            seen[key] = line
        if key in RESERVED_NAMES:
            errors.append({**where, "message": f"variable name '{name}' is a reserved "
                                               "keyword or type name"})
        elif key == pou_name:
            errors.append({**where, "message": f"variable '{name}' has the name of the POU"})
    return errors


def _prev_token(node: Node) -> str:
    prev = node.prev_sibling
    while prev is not None and prev.type == "comment":
        prev = prev.prev_sibling
    return prev.type if prev is not None else ""


def _next_token(node: Node) -> str:
    nxt = node.next_sibling
    while nxt is not None and nxt.type == "comment":
        nxt = nxt.next_sibling
    return nxt.type if nxt is not None else ""


def _compared_param(arg: Node, scope: _Scope) -> Node | None:
    """``NAME = expr`` as a positional argument, NAME undeclared: a mistyped ``NAME := expr``.

    ``=`` binds tighter than AND/OR, so ``IN = a AND b`` is ``(IN = a) AND b``: the
    comparison is looked for down the left spine.
    """
    node: Node | None = arg
    while node is not None and node.type == "binary_expression":
        left = node.child_by_field_name("left")
        if (left is not None and left.type == "identifier"
                and any(c.type == "=" for c in node.children)):
            return None if _text(left).upper() in scope.types else left
        node = left
    return None


def _call_errors(call: Node, scope: _Scope, pos: _Positions,
                 handled: set[int]) -> list[dict[str, Any]]:
    """A call's target must be a function or an FB instance; standard FB parameters exist.

    Adds to ``handled`` the ids of identifiers reported here (not to report them twice).
    """
    errors: list[dict[str, Any]] = []
    args_node = call.child_by_field_name("arguments")
    args = [a for a in (args_node.named_children if args_node is not None else [])
            if a.type not in {"comment", "pragma"}]
    for arg in args:
        if (param := _compared_param(arg, scope)) is not None:
            handled.add(param.id)
            errors.append(pos.error(arg, f"'{pos.text(param)} = ...' compares: pass the "
                                         f"parameter with '{pos.text(param)} := ...'"))
    target = call.child_by_field_name("function")
    if target is None or target.type != "identifier":
        return errors
    name = pos.text(target)
    key = name.upper()
    declared = scope.types.get(key)
    if declared is None:
        if key in FB_INPUTS:
            errors.append(pos.error(target, f"'{name}' is a function block type: declare an "
                                            f"instance (e.g. inst : {key};) and call that"))
        elif not _is_function(key) and key not in KEYWORDS:
            errors.append(pos.error(target, f"undeclared identifier '{name}'"))
        return errors
    if key == scope.pou_name and scope.pou_type == "FUNCTION":
        return errors  # recursion: not IEC, but the name is declared; leave it to the IDE
    if _has_no_members(declared):
        errors.append(pos.error(target, f"'{name}' is a {declared}, not a function block "
                                        "instance: it cannot be called"))
        return errors
    if declared not in FB_INPUTS:
        return errors
    positional = [a for a in args if a.type != "named_argument"
                  and _compared_param(a, scope) is None]
    if positional:
        errors.append(pos.error(positional[0], f"'{name}' is a {declared}: pass its inputs by "
                                               f"name ({', '.join(FB_INPUTS[declared])} := ...)"))
    for arg in args:
        if arg.type != "named_argument":
            continue
        param = arg.child_by_field_name("name")
        if param is None:
            continue
        pname = pos.text(param).upper()
        is_output = any(c.type == "=>" for c in arg.children)
        table = FB_OUTPUTS[declared] if is_output else FB_INPUTS[declared]
        if pname not in table:
            kind = "output" if is_output else "input"
            valid = ", ".join(table)
            errors.append(pos.error(param, f"'{pos.text(param)}' is not an {kind} of {declared} "
                                           f"({kind}s: {valid})"))
    return errors


def _member_errors(access: Node, scope: _Scope, pos: _Positions) -> list[dict[str, Any]]:
    member = access.child_by_field_name("member")
    if member is None or member.type != "identifier":
        return []
    outer = scope.type_of(access.child_by_field_name("object"))
    if outer is None:
        return []  # unknown or user-defined type: nothing to check against
    name = pos.text(member)
    if name[:1].isdigit():  # bit access, word.3
        width = _BIT_WIDTH.get(outer)
        if width is None:
            if _has_no_members(outer) or outer in STANDARD_FB_MEMBERS:
                return [pos.error(member, f"bit access '.{name}' on a {outer}: it needs an "
                                          "integer or bit-string variable")]
        elif int(name) >= width:
            return [pos.error(member, f"bit '.{name}' is out of range for a {outer} "
                                      f"(bits 0..{width - 1})")]
        return []
    if outer in STANDARD_FB_MEMBERS:
        if name.upper() not in STANDARD_FB_MEMBERS[outer]:
            valid = ", ".join(STANDARD_FB_MEMBERS[outer])
            return [pos.error(member, f"'{name}' is not a member of {outer} ({valid})")]
        parent = access.parent
        if (parent is not None and parent.type == "assignment_statement"
                and _is(parent.child_by_field_name("left"), access)
                and name.upper() in FB_OUTPUTS[outer]):
            return [pos.error(member, f"'{name}' is an output of {outer}: it cannot be "
                                      "assigned")]
        return []
    if _has_no_members(outer):
        return [pos.error(member, f"'{name}': the {outer} before the '.' has no members")]
    return []


def _reference_error(ident: Node, scope: _Scope, pos: _Positions) -> dict[str, Any] | None:
    """An identifier used as a value or assignment target: it must be declared."""
    name = pos.text(ident)
    if name.startswith("%"):
        return None  # direct address, %IX0.1
    key = name.upper()
    if key in scope.types or key in KEYWORDS or key in _GENERIC_TYPES:
        return None
    parent = ident.parent
    if parent is not None and parent.is_error:
        # Flattened by error recovery: `.` member, `name :=` / `name =>` argument.
        if _prev_token(ident) == "." or (_next_token(ident) in {":=", "=>"}
                                         and _prev_token(ident) in {"(", ","}):
            return None
        if _next_token(ident) == "(" and (_is_function(key) or key in FB_INPUTS):
            return None
    return pos.error(ident, f"undeclared identifier '{name}'")


def _identifier_errors(tree: Tree, r: _Rendered, scope: _Scope,
                       pos: _Positions) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    handled: set[int] = set()
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in _VAR_BLOCKS and node.start_point.row >= r.body_start:
            errors.append(pos.error(node, "declarations belong in 'variables', not in the body"))
        if node.type in _VAR_BLOCKS or node.type in {"comment", "pragma"}:
            continue
        if node.end_point.row < r.body_start or node.start_point.row >= r.body_end:
            continue
        stack.extend(reversed(node.children))
        if node.type == "call_expression":
            errors += _call_errors(node, scope, pos, handled)
        elif node.type == "member_access_expression":
            errors += _member_errors(node, scope, pos)
        elif (node.type == "identifier" and node.start_point.row >= r.body_start
              and node.id not in handled):
            parent = node.parent
            if parent is not None and (
                    (parent.type == "member_access_expression"
                     and _is(parent.child_by_field_name("member"), node))
                    or (parent.type == "named_argument"
                        and _is(parent.child_by_field_name("name"), node))
                    or (parent.type == "call_expression"
                        and _is(parent.child_by_field_name("function"), node))
                    or parent.type == "typed_literal"):
                continue  # member / parameter / call target (checked above) / literal's type
            err = _reference_error(node, scope, pos)
            if err is not None:
                errors.append(err)
    return errors


def _check_identifiers(pou: Mapping[str, Any], r: _Rendered,
                       parsed: tuple[Tree, bytes] | None) -> dict[str, Any]:
    errors = _variable_errors(pou, r)
    if parsed is None:
        errors.append(_no_parser()["errors"][0])
    else:
        tree, source = parsed
        errors += _identifier_errors(tree, r, _Scope(pou), _Positions(source))
    errors.sort(key=lambda e: (e["line"], e["column"]))
    errors = errors[:_MAX_ERRORS]
    return {"ok": not errors, "errors": errors}


def check_identifiers(pou: Mapping[str, Any]) -> dict[str, Any]:
    """Check names in a POU object: ``{"ok": bool, "errors": [{"line", "column", "message"}]}``.

    Every identifier in the body must be declared in ``variables``, be the FUNCTION's own
    name, a standard or conversion function (``LIMIT``, ``INT_TO_REAL``...), a named call
    argument, or the member of a declared instance (``tmr.Q``; for standard FB types the
    member must exist). Calls to declared non-FB variables, standard FB calls with unknown
    parameters, writes to standard FB outputs, duplicate variable names and variables named
    like keywords or types are errors too. Names compare case-insensitively; positions are
    1-based in the rendered text (``render_pou``). Works on partly broken syntax as far as the
    error-tolerant parse allows.
    """
    r = _render(pou)
    return _check_identifiers(pou, r, _parse(r.text))


def validate_pou(pou: Mapping[str, Any]) -> dict[str, Any]:
    """Render and check a POU object: ``{"text", "st_syntax", "identifiers"}``, one parse.

    ``st_syntax`` and ``identifiers`` have the shape of ``check_syntax`` and
    ``check_identifiers``; identifiers are checked even when the syntax check fails.
    """
    r = _render(pou)
    parsed = _parse(r.text)
    if parsed is None:
        syntax = _no_parser()
    else:
        tree, source = parsed
        errors = _syntax_errors(tree, _Positions(source))
        syntax = {"ok": not errors, "errors": errors}
    return {"text": r.text, "st_syntax": syntax,
            "identifiers": _check_identifiers(pou, r, parsed)}


def _writes(text: str) -> tuple[list[str], list[str]]:
    """The variables a POU's body assigns (``x := ...;``, ``x[i] := ...;``) and those an FB
    call's outputs go to (``tmr(IN := x, Q => bDone)``), each in order. Empty when the
    text does not parse."""
    parsed = _parse(text)
    if parsed is None:
        return [], []
    tree, _ = parsed
    assigned: list[str] = []
    bound: list[str] = []
    for node in _walk(tree.root_node):
        if node.type == "assignment_statement" and node.children:
            target, into = node.children[0], assigned
        elif (node.type == "named_argument" and len(node.children) == 3
              and node.children[1].type == "=>"):
            target, into = node.children[2], bound
        else:
            continue
        while target.type != "identifier" and target.children:
            target = target.children[0]
        if target.type == "identifier":
            into.append(_text(target))
    return assigned, bound


def written_names(text: str) -> list[str]:
    """The variables a POU's body writes: those it assigns (``assigned_names``), then those
    an FB call's outputs go to (``Q => bDone``). Empty when the text does not parse."""
    assigned, bound = _writes(text)
    return assigned + bound


def assigned_names(text: str) -> list[str]:
    """The variables a POU's body assigns (``x := ...;``, ``x[i] := ...;``), in order; FB
    call arguments (``IN := ...``) are not assignments. Empty when the text does not
    parse."""
    return _writes(text)[0]
