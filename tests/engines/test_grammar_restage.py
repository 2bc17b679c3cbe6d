"""A constraint narrowed while decoding (``Constraint.restage``): each new grammar is applied
on the answer so far, again as often as the callback decides, in JSON Schema or Lark; a
grammar that cannot carry the answer so far is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from rung.engines.grammar import GrammarCompiler, GrammarError, Lark

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "edge-tiny" / "tokenizer.json"


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(TOKENIZER, [2], 2048)


def _ids(compiler: GrammarCompiler, text: str) -> list[int]:
    return list(compiler.tokenizer.tokenize_str(text))


def _free_text(compiler: GrammarCompiler) -> str:
    return compiler.compile({"type": "object", "properties": {"a": {"type": "string"}},
                             "required": ["a"], "additionalProperties": False})


def test_restages_apply_again_and_again(compiler: GrammarCompiler) -> None:
    c = compiler.constraint(_free_text(compiler))
    stages = {'{"a":"x': '%llguidance {}\nstart: "{\\"a\\":\\"x" /[xy]+/ "\\"}"',
              '{"a":"xy': '%llguidance {}\nstart: "{\\"a\\":\\"xy" "y"* "\\"}"'}

    def restage(tokens: list[int]) -> str | None:
        text = compiler.tokenizer.decode_str(tokens)
        lark = next((g for head, g in stages.items() if text == head), None)
        return None if lark is None else compiler.compile_lark(Lark(lark))

    c.restage = restage
    for tok in _ids(compiler, '{"a":"x'):
        c.consume(tok)
    assert c.restages == 1
    assert c.valid_prefix(_ids(compiler, "z")) == 0        # [xy]+ now
    for tok in _ids(compiler, "y"):
        c.consume(tok)
    assert c.restages == 2
    assert c.valid_prefix(_ids(compiler, "x")) == 0        # only y from here
    for tok in _ids(compiler, 'yy"}'):
        c.consume(tok)
    assert c.accepting and c.restage_seconds > 0


def test_a_grammar_that_cannot_carry_the_answer_is_refused(compiler: GrammarCompiler) -> None:
    *head, last = _ids(compiler, '{"a":"')
    for bad in ('start: "{\\"b\\":1}"', "start: ("):   # another answer; not Lark at all
        c = compiler.constraint(_free_text(compiler))
        for tok in head:
            c.consume(tok)
        c.restage = lambda tokens, bad=bad: compiler.compile_lark(Lark(bad))
        with pytest.raises(GrammarError, match="does not accept the answer so far"):
            c.consume(last)


def test_first_choice_is_the_greedy_pick_under_the_mask(compiler: GrammarCompiler) -> None:
    """The model's first choice tested on the grammar's bits picks what the sampler picks
    at temperature 0 over the unpacked mask; where the grammar refuses it (or the logits
    hold NaN) it leaves the pick to the sampler."""
    import numpy as np

    from rung.engines.sampler import Sampler, SamplingParams

    rng = np.random.default_rng(3)
    greedy = Sampler(SamplingParams())
    c = compiler.constraint(_free_text(compiler))
    refused = 0
    for step in range(40):
        mask = c.allowed()
        logits = rng.normal(size=2048).astype(np.float32)
        if step % 3 == 0:   # the model's favourite among the allowed ones
            logits[int(rng.choice(np.flatnonzero(mask)))] = 10.0
        if step % 5 == 0:   # ties: the first of equals
            logits[np.flatnonzero(mask)[:2]] = 20.0
        want = greedy.sample(logits, mask)
        got = c.first_choice(logits)
        if got is None:
            refused += 1
            assert not mask[int(np.argmax(logits))]
        else:
            assert got == want
        assert c.allowed().tolist() == mask.tolist()   # the bits stay the position's own
        c.consume(want)
        if c.accepting:
            break
    assert refused > 0
    nan = np.zeros(2048, np.float32)
    nan[5] = np.nan
    assert c.first_choice(nan) is None
    assert c.first_choice(np.zeros((2, 2048), np.float32)) is None   # the sampler refuses it
