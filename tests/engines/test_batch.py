"""Continuous batching on a real engine: sequences that join and leave between steps give
the tokens they give alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from rung.engines import Engine, load_engine
from rung.engines.batch import BatchDecoder
from rung.engines.errors import GenerationError
from rung.engines.generate import generate
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration
TEXTS = ["The pump is running.", "Öltemperatur 85 °C, Druck 3,5",
         "Conveyor 3 stopped on an overload trip at 14:02, reset twice",
         "Valve", "Hydraulic unit: pressure low, filter differential high"]


@pytest.fixture
def loaded(engines: dict[str, Path]) -> tuple[Engine, Tokenizer]:
    engine = load_engine(engines["llama"])
    return engine, Tokenizer.load(engines["llama"], engine.manifest.tokenizer)


def _params(i: int) -> SamplingParams:
    # different lengths, so rows leave at different steps; one sampled row
    return SamplingParams(max_tokens=6 + 5 * i, temperature=0.8 if i == 2 else 0.0, seed=i)


def test_joining_and_leaving_equals_alone(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    prompts = [tok.encode(t) for t in TEXTS]
    alone = [generate(engine, tok, [p], _params(i))[0].token_ids
             for i, p in enumerate(prompts)]
    dec = BatchDecoder(engine, tok, rows=2, prefill_chunk=4)   # chunked prefill as well
    waiting = list(range(len(prompts)))
    got: dict[int, list[int]] = {}
    joined_mid_decode = 0
    while waiting or dec.active:
        while waiting and dec.free:
            i = waiting.pop(0)
            joined_mid_decode += dec.active > 0
            dec.add(i, prompts[i], _params(i))
        for tag, gen in dec.step():
            assert isinstance(tag, int)
            got[tag] = gen.token_ids
            assert gen.prompt_tokens == len(prompts[tag]) and gen.ttft_ms > 0
    assert got == dict(enumerate(alone))
    assert joined_mid_decode >= 2          # rows were filled while others were decoding
    assert dec.free == 2 and not dec.cache.lengths.any()


def test_run_returns_when_a_row_is_wanted(loaded: tuple[Engine, Tokenizer]) -> None:
    import threading

    engine, tok = loaded
    dec = BatchDecoder(engine, tok, rows=2)
    dec.add("a", tok.encode(TEXTS[0]), SamplingParams(max_tokens=30))
    wanted = threading.Event()
    wanted.set()                           # a request is waiting for the free row
    assert dec.run(wanted) == [] and dec.steps == 1
    done = dec.run()                       # no interruption: until the sequence ends
    assert [tag for tag, _ in done] == ["a"] and dec.active == 0


def test_refusals(loaded: tuple[Engine, Tokenizer]) -> None:
    engine, tok = loaded
    dec = BatchDecoder(engine, tok, rows=1)
    with pytest.raises(GenerationError):
        dec.add(0, [], SamplingParams())
    with pytest.raises(GenerationError):
        dec.add(0, [1] * engine.manifest.dims.max_seq, SamplingParams())
    dec.add(0, tok.encode("x"), SamplingParams(max_tokens=2))
    with pytest.raises(GenerationError, match="no free row"):
        dec.add(1, tok.encode("y"), SamplingParams())
