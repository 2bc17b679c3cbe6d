"""The ST answer's grammar over its own declarations (``st_grammar``): it accepts the ST the
corpus teaches, refuses what the validators refuse (undeclared names, broken syntax, open
comments, duplicate names), and the demo model, sampled hot under it, writes only POUs the
validators pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from rung.daemon.tasks import st_grammar
from rung.daemon.tasks.runner import TaskRunner
from rung.daemon.tasks.shaping import compact, shape
from rung.daemon.tasks.st import validate_pou
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.grammar import Lark
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from rung.tools.corpus import generate as corpus

ST = load_tasks()["st_code"]
MODEL = Path(__file__).resolve().parents[3] / "models" / "edge-tiny"
POU = {"pou_type": "FUNCTION_BLOCK", "name": "FB_Fill", "variables": [
    {"section": "VAR_INPUT", "name": "rLevel", "type": "REAL"},
    {"section": "VAR_INPUT", "name": "bDrainOpen", "type": "BOOL"},
    {"section": "VAR_OUTPUT", "name": "bValve", "type": "BOOL"},
    {"section": "VAR", "name": "tmrFill", "type": "TON"},
    {"section": "VAR", "name": "aLog", "type": "ARRAY[0..9] OF REAL"},
    {"section": "VAR", "name": "i", "type": "INT"}]}


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer((MODEL / "tokenizer.json").read_text(encoding="utf-8"),
                                  n_vocab=2048, eos_token=[2])


def _restage(data: dict[str, Any]) -> Any:
    s = shape(ST.output_schema, ST.validators, data)
    assert s.restage is not None and s.restage_at == '"'
    return s.restage


def _accepts(tok: llguidance.LLTokenizer, grammar: Lark, text: str) -> bool:
    m = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar.text))
    ids = tok.tokenize_str(text)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


def _with_body(body: str, pou: dict[str, Any] = POU) -> str:
    return compact({**pou, "body": body})


def _body_grammar(pou: dict[str, Any] = POU) -> Lark:
    restage = _restage({"description": "d"})
    text = _with_body("", pou)
    grammar = restage(text[:text.index(st_grammar.BODY_MARK) + len(st_grammar.BODY_MARK)])
    assert isinstance(grammar, Lark)
    return grammar


def test_every_corpus_answer_is_accepted_from_its_own_declarations(
        tokenizer: llguidance.LLTokenizer) -> None:
    """The grammar does not refuse the ST the model was taught: 150 corpus answers (every
    archetype, every naming style), each whole answer replayed through both stages."""
    samples = [s for s in corpus(450, seed=11) if s["task"] == "st_code"]
    assert len({s["kind"] for s in samples}) >= 15
    for s in samples:
        text = compact(s["output"])
        restage = _restage(s["input"])
        for stage_at in (text.index(st_grammar.BODY_MARK) + len(st_grammar.BODY_MARK),
                         text.rindex(st_grammar.NAME_MARK, 0, text.index(
                             st_grammar.BODY_MARK)) + len(st_grammar.NAME_MARK)):
            grammar = restage(text[:stage_at])
            assert isinstance(grammar, Lark), (s["kind"], text[:stage_at])
            assert _accepts(tokenizer, grammar, text), (s["kind"], text)


@pytest.mark.parametrize("body", [
    "IF rLevel < 20.0 AND NOT bDrainOpen THEN\n    bValve := TRUE;\nELSIF rLevel > 80.0 "
    "THEN\n    bValve := FALSE;\nEND_IF;",
    "tmrFill(IN := bValve, PT := T#30s);\n// fill timeout\nIF tmrFill.Q THEN bValve := "
    "FALSE; END_IF;",
    "FOR i := 0 TO 9 BY 1 DO\n    aLog[i] := LIMIT(0.0, rLevel, 100.0);\nEND_FOR;",
    "CASE i OF\n    0, 1: bValve := TRUE; (* open *)\n    2..5: bValve := FALSE;\n"
    "ELSE\n    i := INT_TO_INT(0);\nEND_CASE;",
    "tmrFill(IN := bValve, PT := T#1m30s, Q => bValve, ET => tmrFill.PT);",
])
def test_valid_bodies_pass_the_grammar_and_the_validators(
        tokenizer: llguidance.LLTokenizer, body: str) -> None:
    assert _accepts(tokenizer, _body_grammar(), _with_body(body))
    v = validate_pou({**POU, "body": body})
    assert v["st_syntax"]["ok"] and v["identifiers"]["ok"], v


# where the grammar is stricter than the validators (what a type checker would refuse, or
# a comment form it keeps to one line)
STRICTER = {"a block comment over lines", "an FB instance as a value",
            "an array without its index", "a WSTRING literal"}


@pytest.mark.parametrize(("body", "why"), [
    ("bValve := bPump;", "undeclared identifier"),
    ("IF bDrainOpen THEN bValve := FALSE; END_IF", "END_IF without ;"),
    ("bValve := TRUE", "statement without ;"),
    ("IF bDrainOpen bValve := FALSE; END_IF;", "IF without THEN"),
    ("bValve := (rLevel > 20.0;", "unbalanced parenthesis"),
    ("bValve := TRUE; (* left open", "open comment"),
    ("bValve := TRUE; (* two\nlines *)", "a block comment over lines"),
    ("tmrFill.Q := TRUE;", "an FB output assigned"),
    ("bValve := tmrFill.Done;", "no such member"),
    ("tmrFill(bValve, T#5s);", "FB inputs by position"),
    ("tmrFill(IN := bValve, CLK := TRUE);", "an input the FB type lacks"),
    ("bValve := tmrFill;", "an FB instance as a value"),
    ("aLog := 1.0;", "an array without its index"),
    ("bValve := NOTbDrainOpen;", "a keyword run into a name"),
    ('bValve := "x";', "a WSTRING literal"),
    ("rLevel := FOO_TO_REAL(i);", "no such conversion"),
    ("tmrFill(IN := bValve, PT := T#1h_30m);", "a TIME with '_' between its units"),
    ("i := 28_;", "a number ending in '_'"),
])
def test_broken_bodies_cannot_be_generated(
        tokenizer: llguidance.LLTokenizer, body: str, why: str) -> None:
    assert not _accepts(tokenizer, _body_grammar(), _with_body(body)), why
    v = validate_pou({**POU, "body": body})
    assert not (v["st_syntax"]["ok"] and v["identifiers"]["ok"]) or why in STRICTER, (why, v)


def test_a_function_assigns_its_own_name(tokenizer: llguidance.LLTokenizer) -> None:
    fn = {"pou_type": "FUNCTION", "name": "FC_Clamp", "return_type": "REAL", "variables": [
        {"section": "VAR_INPUT", "name": "x", "type": "REAL"}]}
    assert _accepts(tokenizer, _body_grammar(fn), _with_body("FC_Clamp := x * 2.0;", fn))
    fb = dict(fn, pou_type="FUNCTION_BLOCK")
    assert not _accepts(tokenizer, _body_grammar(fb), _with_body("FC_Clamp := x;", fb))


def test_a_variable_name_is_taken_once(tokenizer: llguidance.LLTokenizer) -> None:
    """At each variable's name: no earlier variable's (case-insensitively), no keyword or
    type name, not the POU's."""
    restage = _restage({"description": "d"})
    head = compact(POU)[:-2] + ',{"section":"VAR","name":"'
    grammar = restage(head)
    assert isinstance(grammar, Lark)
    rest = '","type":"BOOL"}],"body":"bValve := TRUE;"}'
    assert _accepts(tokenizer, grammar, head + "bFresh" + rest)
    for name in ("bValve", "BVALVE", "tmrFill", "END_IF", "TON", "FB_Fill"):
        assert not _accepts(tokenizer, grammar, head + name + rest), name
    assert restage(head[:-len('"name":"')]) is None   # not at a name yet


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      {"st_code": ST}, edge_engine)


def test_hot_samples_of_the_demo_model_pass_the_checks(runner: TaskRunner) -> None:
    """The demo model sampled at temperature 1.2 (far from what it was trained to write)
    under the grammar: every answer that closes is a POU the validators pass — the grammar
    is no looser than the checks."""
    inputs = [s["input"] for s in corpus(30, seed=4242) if s["task"] == "st_code"][:8]
    closed = 0
    for i, data in enumerate(inputs):
        (r,) = runner.run([("st_code", data)], SamplingParams(temperature=1.2, seed=i))
        if (r.error or {}).get("code") == "truncated":
            continue
        closed += 1
        assert r.ok, (r.error, r.generation.text if r.generation else None)
        assert r.generation is not None and r.generation.text
    assert closed >= 3


def test_a_schema_that_fixes_names_or_body_keeps_them() -> None:
    """A task whose schema fixes the variables (``prefixItems``, ``items: false``) or the
    body (an enum) is shaped without the grammar stages: they would override it."""
    fixed_vars = {"type": "object", "required": ["pou_type", "name", "variables", "body"],
                  "properties": {
                      "pou_type": {"const": "PROGRAM"}, "name": {"const": "P"},
                      "variables": {"type": "array", "items": False, "prefixItems": [
                          {"type": "object", "properties": {"name": {"const": "x"}}}]},
                      "body": {"enum": ["x := 1;"]}}}
    assert shape(fixed_vars, ("st",), {"description": "d"}).restage is None
    enum_body = json.loads(json.dumps(ST.output_schema))
    enum_body["properties"]["body"] = {"enum": ["x := 1;"]}
    restage = shape(enum_body, ("st",), {"description": "d"}).restage
    assert restage is not None   # names are still narrowed, the body stays the enum
    assert restage(compact(POU)[:-2] + ',{"section":"VAR","name":"') is not None
    assert restage(_with_body("", POU)[:-2]) is None
