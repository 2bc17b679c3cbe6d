"""Structured Text for a chosen IEC 61131-3 edition: comments are where the editions differ.

Edition 3 (2013) added ``// line`` and ``/* block */`` comments; edition-2 toolchains (matiec
in Beremiz and OpenPLC, older compilers) know only ``(* ... *)`` and reject the rest. rung's
answers are edition 3 and may carry ``//`` comments, so a file meant for such a toolchain is
rewritten by :func:`to_edition`:

* ``// text`` becomes ``(* text *)`` on the same line, ``/* text */`` becomes ``(* text *)``;
* inside any comment, a ``(*`` or ``*)`` that would open or close a comment (edition 2 has no
  nested comments) is split with a space: ``( *``, ``* )``;
* string literals (``'...'``, ``"..."``, with ``$`` escapes) and pragmas (``{...}``) are
  never touched, so ``'http://x'`` keeps its slashes.

Block comments are read as the project's ST grammar reads them (``daemon/tasks/st/pou.py``): a
``(*`` comment ends at the first ``*)``. :func:`edition_problems` lists what an edition's
toolchain would refuse, with 1-based line and column.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from rung.engines.errors import RungError

__all__ = ["EDITIONS", "EditionError", "edition_problems", "to_edition"]

EDITIONS = (2, 3)
_NESTING = re.compile(r"\(\*|\*\)")
_EOL = re.compile(r"[\r\n]")
_CLOSERS = {"block": "*)", "cblock": "*/"}


class EditionError(RungError):
    """An IEC 61131-3 edition rung cannot write."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "code", "string", "pragma", "block" (* *), "cblock" /* */, "line" //
    text: str
    start: int  # offset in the source


def _end_of_string(text: str, i: int) -> int:
    """Offset after the literal opened by the quote at ``i`` (``$`` escapes the next
    character); an unterminated literal runs to the end of its line."""
    quote, j = text[i], i + 1
    while j < len(text):
        c = text[j]
        if c == "$":
            j += 2
            continue
        if c == quote:
            return j + 1
        if c == "\n":
            return j
        j += 1
    return len(text)


def _find_end(text: str, i: int, closer: str) -> int:
    j = text.find(closer, i)
    return len(text) if j < 0 else j + len(closer)


def _tokens(text: str) -> Iterator[_Token]:
    """``text`` cut into code, string literals, pragmas and comments (in order, lossless)."""
    i = code_start = 0
    while i < len(text):
        c, pair = text[i], text[i:i + 2]
        if c in "'\"":
            end, kind = _end_of_string(text, i), "string"
        elif c == "{":
            end, kind = _find_end(text, i + 1, "}"), "pragma"
        elif pair == "(*":
            end, kind = _find_end(text, i + 2, "*)"), "block"
        elif pair == "/*":
            end, kind = _find_end(text, i + 2, "*/"), "cblock"
        elif pair == "//":
            eol = _EOL.search(text, i)
            end, kind = (len(text) if eol is None else eol.start()), "line"
        else:
            i += 1
            continue
        if code_start < i:
            yield _Token("code", text[code_start:i], code_start)
        yield _Token(kind, text[i:end], i)
        i = code_start = end
    if code_start < len(text):
        yield _Token("code", text[code_start:], code_start)


def _defuse(inner: str) -> str:
    """Comment text with no ``(*`` or ``*)`` left in it."""
    while _NESTING.search(inner):
        inner = _NESTING.sub(lambda m: f"{m[0][0]} {m[0][1]}", inner)
    return inner


def _inner(tok: _Token) -> str:
    """A comment's text without its markers (an unterminated one has no closer)."""
    closer = _CLOSERS.get(tok.kind)
    closed = closer is not None and len(tok.text) >= 4 and tok.text.endswith(closer)
    return tok.text[2:-2] if closed else tok.text[2:]


def _edition2(tok: _Token) -> str:
    if tok.kind not in ("line", "block", "cblock"):
        return tok.text
    inner = _defuse(_inner(tok))
    if tok.kind == "line":
        inner += " "
    if inner.startswith(")"):  # `(*)` would read as an opener eating its own star
        inner = " " + inner
    if inner.endswith("("):
        inner += " "
    return f"(*{inner}*)"


def _check(edition: int) -> None:
    if isinstance(edition, bool) or edition not in EDITIONS:
        raise EditionError(f"IEC 61131-3 edition {edition!r} is not offered",
                           "choose 2 (matiec: Beremiz, OpenPLC) or 3 (CODESYS, TwinCAT)")


def to_edition(st_text: str, edition: int) -> str:
    """``st_text`` (edition 3 Structured Text) as the given edition accepts it.

    Edition 3 returns the text unchanged. Edition 2 rewrites ``//`` and ``/* */`` comments
    into ``(* *)`` and defuses comment markers inside comments (see the module docstring);
    code, string literals and pragmas stay byte for byte, and so does every line break, so
    line numbers are kept. An unterminated comment is closed at the end of the text.

    Raises:
        EditionError: ``edition`` is neither 2 nor 3.
    """
    _check(edition)
    if edition == 3:
        return st_text
    return "".join(_edition2(tok) for tok in _tokens(st_text))


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def edition_problems(st_text: str, edition: int) -> list[dict[str, int | str]]:
    """What a toolchain of ``edition`` would refuse in ``st_text`` because of comments:
    ``[{"line", "column", "message"}]`` (1-based), empty when the text fits.

    Edition 2: ``//`` and ``/* */`` comments, comment markers inside a comment, a comment
    left open. Edition 3: a comment left open.
    """
    _check(edition)
    problems: list[dict[str, int | str]] = []

    def add(offset: int, message: str) -> None:
        line, column = _position(st_text, offset)
        problems.append({"line": line, "column": column, "message": message})

    for tok in _tokens(st_text):
        if tok.kind in _CLOSERS and _inner(tok) == tok.text[2:]:
            add(tok.start, f"comment opened with '{tok.text[:2]}' is never closed")
        if edition == 3:
            continue
        if tok.kind == "line":
            add(tok.start, "'//' comments are IEC 61131-3 edition 3: use (* ... *)")
        elif tok.kind == "cblock":
            add(tok.start, "'/* */' comments are IEC 61131-3 edition 3: use (* ... *)")
        elif tok.kind == "block" and (m := _NESTING.search(_inner(tok))):
            add(tok.start + 2 + m.start(), f"'{m[0]}' inside a comment: edition 2 does not "
                                           "nest comments")
    return problems
