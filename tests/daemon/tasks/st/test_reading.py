"""The body reads every setpoint (``st.reading``): while a setpoint code declared from the
request's values is unused, the body cannot close; a setpoint read anywhere the body grammar
lets a value stand (a condition, an operand, a function's argument, an FB's input, a FOR
bound, a CASE selector, a nested statement) counts, and so does the value written as a
literal, as the ``relevance`` check counts it. Followed token by token as the runner
follows it, with the restage after every ``;``; random walks through the grammar close
never meet a restage that refuses what they wrote."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import llguidance
import numpy as np
import pytest

from rung.daemon.request import Request
from rung.daemon.tasks.runner import Prepared, RetryPolicy, TaskResult, TaskRunner
from rung.daemon.tasks.shaping import compact
from rung.daemon.tasks.st import grammar as st_grammar
from rung.daemon.tasks.st import request as st_request
from rung.daemon.tasks.task import load_tasks
from rung.engines import load_engine
from rung.engines.grammar import GrammarError, Lark
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from rung.tools.corpus import generate as corpus

ST = load_tasks()["st_code"]
VENT = {"description": "Open the vent valve when the tank pressure exceeds 6.5 bar and close "
                       "it again below 5.8 bar, after a 3 s delay."}
MODEL = Path(__file__).resolve().parents[4] / "models" / "edge-tiny"
# what the model declares after code's setpoints (rOpen 6.5, rClose 5.8, tDelay 3 s)
MORE = [{"section": "VAR_INPUT", "name": "rPressure", "type": "REAL"},
        {"section": "VAR_OUTPUT", "name": "bVent", "type": "BOOL"},
        {"section": "VAR", "name": "tmr", "type": "TON"},
        {"section": "VAR", "name": "i", "type": "INT"},
        {"section": "VAR", "name": "rLimited", "type": "REAL"}]


@pytest.fixture(scope="module")
def shape() -> Any:
    return ST.kind.shape(ST.output_schema, VENT)


@pytest.fixture(scope="module")
def setpoints(shape: Any) -> list[str]:
    """The setpoints' names, as code declares them in the answer's start."""
    head = json.loads(shape.prefix + "]}")
    names = [v["name"] for v in head["variables"]]
    assert len(names) == 3 and [v["type"] for v in head["variables"]] == ["REAL", "REAL",
                                                                          "TIME"]
    return names


def _answer(shape: Any, body: str) -> str:
    more = "".join("," + compact(v) for v in MORE)
    return f'{shape.prefix}{more}],"body":{json.dumps(body)}}}'


def _stages(shape: Any, text: str) -> list[tuple[int, Lark]]:
    """The grammars the answer is written under, restaged as the runner restages (after
    each character of ``restage_at``), each with how much of ``text`` was written when it
    took over."""
    stages: list[tuple[int, Lark]] = []
    for i, ch in enumerate(text):
        if ch in shape.restage_at:
            g = shape.restage(text[:i + 1])
            if isinstance(g, Lark) and (not stages or g != stages[-1][1]):
                stages.append((i + 1, g))
    return stages


def _viable(tok: llguidance.LLTokenizer, grammar: Lark, text: str, whole: bool) -> bool:
    m = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar.text))
    ids = tok.tokenize_str(text)
    return m.try_consume_tokens(ids) == len(ids) and (m.is_accepting() or not whole)


def _written_under(tok: llguidance.LLTokenizer, shape: Any, text: str) -> bool:
    """Each stage accepts what is written while it holds (to where the next takes over),
    and the last the whole answer."""
    stages = _stages(shape, text)
    ends = [at for at, _ in stages[1:]] + [len(text)]
    return all(_viable(tok, g, text[:end], whole=end == len(text))
               for (_, g), end in zip(stages, ends, strict=True))


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer((MODEL / "tokenizer.json").read_text(encoding="utf-8"),
                                  n_vocab=2048, eos_token=[2])


def _accepts(tok: llguidance.LLTokenizer, grammar: Lark, text: str) -> bool:
    m = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar.text))
    ids = tok.tokenize_str(text)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


READING = [
    # hysteresis in one IF, the delay in the timer's PT
    "tmr(IN := rPressure > {0}, PT := {2});\nIF tmr.Q THEN bVent := TRUE;\n"
    "ELSIF rPressure < {1} THEN bVent := FALSE; END_IF;",
    # nested, in an assignment, in a function's arguments, a comparison of durations
    "IF rPressure > 0.0 THEN\n  IF rPressure >= {0} THEN bVent := TRUE; END_IF;\nEND_IF;\n"
    "rLimited := LIMIT({1}, rPressure, {0});\nbVent := bVent AND tmr.ET < {2} "
    "OR rLimited > {1};",
    # SEL, a FOR bound, a CASE selector, WHILE
    "rLimited := SEL(bVent, {0}, {1});\nFOR i := 0 TO REAL_TO_INT({0}) DO rLimited := "
    "rLimited - 1.0; END_FOR;\nCASE REAL_TO_INT({1}) OF 5: bVent := FALSE; END_CASE;\n"
    "tmr(IN := bVent, PT := {2} * 2);",
    # the operand before the live side, ELSE, a value written as its literal
    "IF {0} - rPressure < 0.0 THEN bVent := TRUE; ELSE IF rPressure < 5.8 THEN bVent := "
    "FALSE; END_IF; END_IF;\ntmr(IN := bVent, PT := {2});",
]


@pytest.mark.parametrize("body", READING)
def test_a_body_that_reads_every_setpoint_is_accepted_at_every_stage(
        shape: Any, setpoints: list[str], tokenizer: llguidance.LLTokenizer,
        body: str) -> None:
    text = _answer(shape, body.format(*setpoints))
    pou = json.loads(text)
    assert st_request.values_used(st_request.read(VENT), pou)["ok"]
    assert len(_stages(shape, text)) >= 3   # narrowed while setpoints were unread, widened
    assert _written_under(tokenizer, shape, text)


UNREAD = [
    ("IF rPressure > {0} THEN bVent := TRUE; ELSIF rPressure < {1} THEN bVent := FALSE; "
     "END_IF;", "3 s"),   # the delay never used
    ("tmr(IN := rPressure > {0}, PT := {2});\nbVent := tmr.Q;", "5.8 bar"),
    # a setpoint named only in a comment, or assigned to a variable never read, is not read
    ("// {1}\ntmr(IN := rPressure > {0}, PT := {2});\nbVent := tmr.Q;", "5.8 bar"),
]


@pytest.mark.parametrize(("body", "missing"), UNREAD)
def test_the_body_cannot_close_while_a_setpoint_is_unread(
        shape: Any, setpoints: list[str], tokenizer: llguidance.LLTokenizer, body: str,
        missing: str) -> None:
    text = _answer(shape, body.format(*setpoints))
    result = st_request.values_used(st_request.read(VENT), json.loads(text))
    assert [e["message"] for e in result["errors"]] == [
        f"the request states {missing}; the POU does not use it"]
    end = text.rindex('"')   # the body's closing quote
    in_force = [g for at, g in _stages(shape, text) if at <= end][-1]
    assert not _viable(tokenizer, in_force, text[:end + 1], whole=False)
    # ... yet it may go on: the text so far is a start of a body the grammar accepts
    assert _viable(tokenizer, in_force, text[:end], whole=False)


def test_every_stage_accepts_the_corpus_answers() -> None:
    """No ST the model was taught is refused by a stage: 150 corpus answers, each restaged
    as the runner restages, every stage accepting what is written while it holds."""
    tok = llguidance.LLTokenizer((MODEL / "tokenizer.json").read_text(encoding="utf-8"),
                                 n_vocab=2048, eos_token=[2])
    samples = [s for s in corpus(450, seed=11) if s["task"] == "st_code"]
    narrowed = 0
    for s in samples:
        text = compact(s["output"])
        if not st_request.values_used(st_request.read(s["input"]), s["output"])["ok"]:
            continue
        plain = st_grammar.head_pou(text[:text.index(st_grammar.BODY_MARK)
                                         + len(st_grammar.BODY_MARK)])
        assert plain is not None
        shape = ST.kind.shape(ST.output_schema, s["input"])
        stages = _stages(shape, text)
        if not _accepts(tok, stages[-1][1], text):
            continue   # a number the request does not state (test_grammar's _invents)
        narrowed += len(stages) > 1
        assert _written_under(tok, shape, text), (s["kind"], text)
    assert narrowed >= 50


@pytest.fixture(scope="module")
def runner(edge_engine: Path) -> TaskRunner:
    engine = load_engine(edge_engine)
    return TaskRunner(engine, Tokenizer.load(edge_engine, engine.manifest.tokenizer),
                      load_tasks(), edge_engine)


def test_followed_token_by_token_the_closing_quote_waits(
        runner: TaskRunner, shape: Any, setpoints: list[str]) -> None:
    """As the runner follows it: the body that has not used 5.8 bar cannot take its
    closing quote; the one that has can, and the answer closes."""
    for body, closes in ((UNREAD[1][0], False), (READING[0], True)):
        text = _answer(shape, body.format(*setpoints))
        constraint, prefix_ids, _ = runner._shaped(ST, VENT)
        ids = runner.tokenizer.encode(text, add_bos=False)
        assert ids[:len(prefix_ids)] == prefix_ids
        written = len(ids)
        for n, t in enumerate(ids[len(prefix_ids):], len(prefix_ids)):
            if not constraint.allowed()[t]:
                written = n
                break
            try:
                constraint.consume(t)
            except GrammarError as e:
                raise AssertionError(runner.tokenizer.decode(ids[:n + 1])) from e
        if closes:
            assert written == len(ids) and constraint.accepting
        else:
            seen = runner.tokenizer.decode(ids[:written])
            assert seen.endswith(("bVent := tmr.Q", "bVent := tmr.Q;")), seen[-40:]
            assert not constraint.accepting
            assert constraint.restages >= 2


def _follow(constraint: Any, runner: TaskRunner, text: str, skip: int) -> int:
    """Feed ``text``'s tokens after the first ``skip`` while the grammar allows them: how
    many tokens of it were written."""
    ids = runner.tokenizer.encode(text, add_bos=False)
    for n, t in enumerate(ids[skip:], skip):
        if not constraint.allowed()[t]:
            return n
        constraint.consume(t)
    return len(ids)


def test_a_retry_after_running_out_of_tokens_may_close_without_reading(
        runner: TaskRunner, shape: Any, setpoints: list[str]) -> None:
    """A model that goes on writing where it may not close runs out of tokens; its retry
    takes the looser shape (``Shape.looser``: the body grammar without the reading rule),
    so it can close and be judged by ``relevance``; a retry after any other failure keeps
    the reading rule."""
    assert shape.looser is not None and shape.looser.prefix == shape.prefix
    text = _answer(shape, UNREAD[1][0].format(*setpoints))
    ids = runner.tokenizer.encode(text, add_bos=False)
    p = runner.prepare("st_code", VENT, SamplingParams())
    assert isinstance(p, Prepared)
    skip = len(runner._shaped(ST, VENT)[1])
    assert _follow(p.constraint, runner, text, skip) < len(ids)
    req = Request("st_code", VENT, 0.0, 0.0)
    policy = RetryPolicy()
    for code, closes in (("truncated", True), ("invalid_output", False)):
        failed = TaskResult(req, False, code, "x")
        again = runner.retry(p, policy, failed)
        written = _follow(again.constraint, runner, text, skip)
        assert (written == len(ids) and again.constraint.accepting) == closes, code
    # a request whose values have no setpoints has no looser shape: nothing to loosen
    assert ST.kind.shape(ST.output_schema, {"description": "Latch the alarm."}).looser is None


def test_no_restage_refuses_what_a_random_walk_wrote(runner: TaskRunner) -> None:
    """Random walks through the request's grammar from the answer's start, restaged as the
    runner restages (the body's grammar from the ``]`` that closes the declarations, then
    after every ``;``): no restage refuses the answer so far, whatever tokens it took (one
    walk once crossed from ``"body":`` into the body's text with the single token
    ``":["``), and every answer that closes uses every stated value."""
    tok = runner.tokenizer
    texts = tok.token_texts()
    vocab = runner.engine.manifest.dims.vocab_size
    ending = np.array([any(c in x for c in '";]}') or "END" in x for x in texts]
                      + [False] * (vocab - len(texts)))
    stated = st_request.read(VENT)
    bodies = 0
    for walk in range(12):
        rng = random.Random(walk)
        constraint, _, _ = runner._shaped(ST, VENT)
        while not constraint.accepting and len(constraint.tokens) < 1500:
            ids = np.flatnonzero(constraint.allowed())
            marks = ids[ending[ids]]
            constraint.consume(int(rng.choice(marks if len(marks) and rng.random() < 0.5
                                              else ids)))
        text = tok.decode(constraint.tokens)
        bodies += st_grammar.BODY_MARK in text and constraint.restages >= 1
        if constraint.accepting:
            assert st_request.values_used(stated, json.loads(text))["ok"], text
    assert bodies >= 8


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_model_reads_the_setpoints(runner: TaskRunner) -> None:
    """Description-only requests to the demo model: every answer that closes uses every
    value the request states (``relevance``)."""
    requests = [VENT, {"description": "Start the cooling fan when the cabinet temperature "
                                      "rises above 45 degC and stop it below 38 degC."}]
    for request in requests:
        (r,) = runner.run([("st_code", request)], SamplingParams(temperature=0.0))
        if r.output is None:
            assert r.error is not None and r.error["code"] == "truncated", r.error
            continue
        assert r.validation["relevance"]["ok"], r.validation["relevance"]  # type: ignore[index]
