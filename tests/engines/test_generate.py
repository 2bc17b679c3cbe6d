"""The generation loop on a real engine: batching, seeds, stop strings, streaming, limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from rung.engines import AnyEngine, load_engine
from rung.engines.errors import GenerationError
from rung.engines.generate import generate
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer

pytestmark = pytest.mark.integration


@pytest.fixture
def loaded(engines: dict[str, Path]) -> tuple[AnyEngine, Tokenizer]:
    engine = load_engine(engines["llama"])
    return engine, Tokenizer.load(engines["llama"], engine.manifest.tokenizer)


def test_batch_equals_alone_greedy_and_sampled(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    prompts = [tok.encode("The pump is running."), tok.encode("Öltemperatur 85 °C, Druck 3,5")]
    for params in (SamplingParams(max_tokens=20),
                   SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=7)):
        batched = generate(engine, tok, prompts, params)
        alone = [generate(engine, tok, [p], params)[0] for p in prompts]
        assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
        assert [g.text for g in batched] == [g.text for g in alone]


def test_seeded_sampling_reproducible_and_seed_sensitive(
        loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    ids = tok.encode("motor current")
    runs = [generate(engine, tok, [ids], SamplingParams(max_tokens=24, temperature=1.5,
                                                        seed=s))[0].token_ids
            for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_length_stop_and_streaming_text(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    ids = tok.encode("The pump")
    pieces: list[str] = []
    (g,) = generate(engine, tok, [ids], SamplingParams(max_tokens=12),
                    on_text=lambda row, text: pieces.append(text))
    assert g.finish_reason in ("length", "stop") and len(g.token_ids) <= 12
    assert "".join(pieces) == g.text
    eos = set(tok.eos_token_ids)
    assert g.text == tok.decode([t for t in g.token_ids if t not in eos])
    assert g.ttft_ms > 0


def test_stop_string_truncates(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    ids = tok.encode("The pump")
    (free,) = generate(engine, tok, [ids], SamplingParams(max_tokens=24))
    assert len(free.text) > 4
    stop = free.text[2:4]
    pieces: list[str] = []
    (g,) = generate(engine, tok, [ids], SamplingParams(max_tokens=24, stop=(stop,)),
                    on_text=lambda row, text: pieces.append(text))
    assert g.finish_reason == "stop"
    assert g.text == free.text[:free.text.index(stop)]
    assert "".join(pieces) == g.text


def test_generation_capped_by_context(engines: dict[str, Path]) -> None:
    engine = load_engine(engines["qwen2"])
    tok = Tokenizer.load(engines["qwen2"], engine.manifest.tokenizer)
    ids = list(range(5, 5 + engine.manifest.dims.max_seq - 3))
    (g,) = generate(engine, tok, [ids], SamplingParams(max_tokens=50))
    assert len(g.token_ids) <= 3
    if g.finish_reason == "length":
        assert len(g.token_ids) == 3


def test_prompt_too_long_or_empty(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    engine, tok = loaded
    with pytest.raises(GenerationError, match="does not fit"):
        generate(engine, tok, [[5] * engine.manifest.dims.max_seq], SamplingParams())
    with pytest.raises(GenerationError, match="empty prompt"):
        generate(engine, tok, [[]], SamplingParams())


def test_a_failing_row_fails_alone(loaded: tuple[AnyEngine, Tokenizer]) -> None:
    """A row whose grammar leaves no token finishes with "error"; its neighbour does not."""
    import numpy as np

    from rung.engines.grammar import Constraint

    class NoToken(Constraint):
        def __init__(self) -> None:
            self.mask_seconds = []

        def allowed(self) -> np.ndarray:
            return np.zeros(engine.manifest.dims.vocab_size, dtype=bool)

    engine, tok = loaded
    prompts = [tok.encode("The pump is running."), tok.encode("Valve")]
    params = SamplingParams(max_tokens=8, temperature=0.5, seed=3)
    (alone,) = generate(engine, tok, [prompts[1]], params)
    failed, ok = generate(engine, tok, prompts, params, constraints=[NoToken(), None])
    assert failed.finish_reason == "error" and failed.token_ids == []
    assert failed.error is not None and "no token is allowed" in failed.error
    assert ok.error is None and ok.token_ids == alone.token_ids
