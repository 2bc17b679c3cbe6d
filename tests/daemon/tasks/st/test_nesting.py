"""The depth bound on a grammar's expressions (``nesting.leveled``), on small grammars
compiled by llguidance as the body's grammar is."""

from __future__ import annotations

from pathlib import Path

import llguidance
import pytest

from rung.daemon.tasks.st.nesting import leveled

MODEL = Path(__file__).resolve().parents[4] / "models" / "edge-tiny"
SUMS = """start: e ";"
e: a (OP a)*
OP: /[-+]/
a: "x" | num | "(" e ")" | "F" "(" e ")"
num: "1" | "2"
"""


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer((MODEL / "tokenizer.json").read_text(encoding="utf-8"),
                                  n_vocab=2048, eos_token=[2])


def _accepts(tok: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar))
    ids = tok.tokenize_str(text)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


@pytest.mark.parametrize(("text", "deep"), [
    ("x;", 0), ("(x+1);", 1), ("F((x)-F(2));", 3), ("((((x))));", 4),
    ("F(F(F(F(1))));", 4), ("F(F(F(F(F(1)))));", 5), ("(((((x)))));", 5),
    ("(1)+((2))+(((x)))+((((1))))+(((((2)))));", 5)])
def test_an_expression_nests_to_the_bound_and_no_deeper(
        tokenizer: llguidance.LLTokenizer, text: str, deep: int) -> None:
    assert _accepts(tokenizer, SUMS, text)   # the grammar as written takes any depth
    assert _accepts(tokenizer, leveled(SUMS, {"e"}, depth=4), text) == (deep <= 4)


def test_a_repetition_is_shorter_from_two_deep(tokenizer: llguidance.LLTokenizer) -> None:
    chains = SUMS.replace("e: a (OP a)*", "e: a (OP a){0,5}")
    short = leveled(chains, {"e"}, depth=4)
    for text, ok in (("x+x+x+x+x+x;", True), ("(x+x+x+x+x+x);", True), ("((x+1+2));", True),
                     ("((x+1+2+x));", False), ("F((x+x+x+x));", False)):
        assert _accepts(tokenizer, short, text) is ok, text


def test_what_the_system_uses_and_what_uses_it_stay_one_rule() -> None:
    text = leveled(SUMS, {"e"}, depth=2)
    rules = {line.split(":")[0] for line in text.splitlines() if ":" in line}
    assert {"e", "e_d1", "e_d2", "a", "a_d1", "a_d2", "num", "start"} <= rules
    assert not any(r.startswith(("num_", "start_", "e_d3")) for r in rules)
    assert "a_d2: \"x\" | num" in text   # the last level opens nothing


def test_a_grammar_whose_rule_cannot_end_within_the_bound_is_kept() -> None:
    """A rule that needs five levels to end would lose its every derivation at four: the
    grammar is handed back as it was, not turned into one that refuses what it took."""
    deep = 'start: a\na: "(" b ")"\nb: "(" c ")"\nc: "(" d ")"\nd: "(" f ")"\n' \
           'f: "(" g ")"\ng: "v" | a\n'
    assert leveled(deep, {"a"}, depth=4) == deep
    assert leveled(deep, {"a"}, depth=5) != deep
