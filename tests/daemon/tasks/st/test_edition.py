"""ST for IEC 61131-3 edition 2 or 3: comments rewritten, code and strings untouched, and
the result read by the project's tree-sitter ST grammar with no ``//`` comment left."""

from __future__ import annotations

import random

import pytest
import tree_sitter
import tree_sitter_iec61131_3_st
from hypothesis import given, settings
from hypothesis import strategies as st

from rung.daemon.tasks.st.edition import EditionError, edition_problems, to_edition
from rung.daemon.tasks.st.pou import check_syntax, render_pou, validate_pou
from rung.tools.corpus_st import ARCHETYPES, st_sample
from tests.daemon.tasks.st.test_pou import GOOD

CASES = [
    ("x := 1; // set", "x := 1; (* set *)"),
    ("s := 'a//b'; // c", "s := 'a//b'; (* c *)"),
    ("s := 'it$'s // no'; // yes", "s := 'it$'s // no'; (* yes *)"),
    ('w := "x // y"; // z', 'w := "x // y"; (* z *)'),
    ("x := 1; // see (* note *) here", "x := 1; (* see ( * note * ) here *)"),
    ("/* block */ y := 2;", "(* block *) y := 2;"),
    ("/* a\n   b */", "(* a\n   b *)"),
    ("(* keep *) x := 1;", "(* keep *) x := 1;"),
    ("(* a (* b *) c := 1;", "(* a ( * b *) c := 1;"),
    ("//) x", "(* ) x *)"),
    ("// ends with (", "(* ends with ( *)"),
    ("//*)", "(** ) *)"),
    ("a := 1; // one\r\nb := 2; // two", "a := 1; (* one *)\r\nb := 2; (* two *)"),
    ("{attribute 'x // y'} a := 1;", "{attribute 'x // y'} a := 1;"),
    ("x := 1; //", "x := 1; (* *)"),
    ("(* open", "(* open*)"),
]


@pytest.mark.parametrize("text,want", CASES)
def test_edition_2_rewrites_comments_only(text: str, want: str) -> None:
    out = to_edition(text, 2)
    assert out == want
    assert edition_problems(out, 2) == []
    assert out.count("\n") == text.count("\n")  # line numbers are kept
    assert to_edition(out, 2) == out  # edition 2 text stays as it is


@pytest.mark.parametrize("text,_want", CASES)
def test_edition_3_is_the_text_itself(text: str, _want: str) -> None:
    assert to_edition(text, 3) == text


def test_problems_name_line_and_column() -> None:
    text = "a := 1;\n  b := 2; // two\n/* three */\n(* x (* y *)\n(* open"
    assert edition_problems(text, 2) == [
        {"line": 2, "column": 11, "message": "'//' comments are IEC 61131-3 edition 3: use "
                                             "(* ... *)"},
        {"line": 3, "column": 1, "message": "'/* */' comments are IEC 61131-3 edition 3: use "
                                            "(* ... *)"},
        {"line": 4, "column": 6, "message": "'(*' inside a comment: edition 2 does not nest "
                                            "comments"},
        {"line": 5, "column": 1, "message": "comment opened with '(*' is never closed"}]
    assert edition_problems(text, 3) == [
        {"line": 5, "column": 1, "message": "comment opened with '(*' is never closed"}]


@pytest.mark.parametrize("edition", [1, 4, True, "2"])
def test_unknown_edition_is_refused(edition: object) -> None:
    with pytest.raises(EditionError, match="edition .* is not offered"):
        to_edition("x := 1;", edition)  # type: ignore[arg-type]
    with pytest.raises(EditionError):
        edition_problems("x := 1;", edition)  # type: ignore[arg-type]


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab ;'\"$/*(){}\n\r", max_size=60))
def test_any_text_comes_out_fit_for_edition_2(text: str) -> None:
    out = to_edition(text, 2)
    assert edition_problems(out, 2) == []
    assert out.count("\n") == text.count("\n") and out.count("\r") == text.count("\r")
    assert to_edition(out, 2) == out


# --- the tree-sitter grammar as an independent reader ---------------------------------------

def _comments(text: str) -> list[str]:
    """The comment nodes the grammar finds; the text must pass the project's syntax check
    (which reads IEC forms the grammar lacks, such as ``STRING[20]``)."""
    assert check_syntax(text)["ok"], (check_syntax(text), text)
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_iec61131_3_st.language()))
    out, stack = [], [parser.parse(text.encode()).root_node]
    while stack:
        node = stack.pop()
        if node.type == "comment":
            out.append((node.text or b"").decode())
        stack.extend(node.children)
    return out


def _pous() -> list[dict[str, object]]:
    rng = random.Random(61131)
    corpus = [st_sample(rng, name)[1] for name in sorted(ARCHETYPES) for _ in range(4)]
    return [*GOOD.values(), *corpus]


def test_rendered_pous_in_edition_2_parse_without_line_comments() -> None:
    """Every good POU rendered (variable comments are ``//`` there too) and rewritten:
    the grammar reads the same number of comments, none a ``//`` one, and the body's
    checks still pass."""
    rewritten = 0
    for pou in _pous():
        text = render_pou(pou)
        before, after = _comments(text), _comments(to_edition(text, 2))
        assert len(after) == len(before)
        assert all(c.startswith("(*") and c.endswith("*)") for c in after), after
        rewritten += sum(c.startswith("//") for c in before)
        ed2 = {**pou, "body": to_edition(str(pou["body"]), 2)}
        result = validate_pou(ed2)
        assert result["st_syntax"]["ok"] and result["identifiers"]["ok"], result
    assert rewritten > 20  # the set holds many // comments, in bodies and declarations
