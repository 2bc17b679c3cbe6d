"""The graph built as two sessions at once (``engines/parted.py``) answers as the whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from rung.engines import load_engine, parted
from rung.engines.onnx_engine import EngineOptions, OnnxEngine
from tests.conftest import GATED


def _steps(engine: OnnxEngine, allow_skip: bool = False) -> tuple[list[np.ndarray],
                                                                  list[np.ndarray]]:
    """Logits of a ragged 2-row prefill and three decode steps (one with a draft), and the
    KV buffers after them."""
    rng = np.random.default_rng(0)
    cache = engine.new_cache(2, 64)
    tokens = rng.integers(3, engine.dims.vocab_size, (2, 12))
    out = [engine.forward(cache, tokens, np.array([12, 7]))]
    for n in (1, 3, 1):
        out.append(engine.forward(cache, rng.integers(3, engine.dims.vocab_size, (2, n)),
                                  np.array([n, 1]), _scored(n),
                                  allow_skip=allow_skip))
    kv = [np.array(b) for b in (cache.buffers.values() if engine.fused
                                else (*cache.keys, *cache.values))]
    return out, kv


def _scored(n: int) -> np.ndarray:
    """Positions scored in a step of ``n`` tokens on row 0 and one on row 1: only positions
    a row holds (row 1's each read its one token)."""
    return np.stack([np.arange(n), np.zeros(n, np.int64)])


def _same(a: OnnxEngine, b: OnnxEngine, allow_skip: bool = False) -> None:
    (la, ka), (lb, kb) = _steps(a, allow_skip), _steps(b, allow_skip)
    # only positions a row holds are scored (a position past a row's end in a longer step
    # is never read, and holds whatever the kernel left there); equal_nan for the cache's
    # positions no row has written
    assert all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(ka, kb, strict=True))


def _load(engine_dir: Path, parts: int) -> OnnxEngine:
    e = load_engine(engine_dir, options=EngineOptions(load_parts=parts, prepack=True))
    assert isinstance(e, OnnxEngine)
    return e


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_graph_in_two_parts_answers_as_one(arch: str, engines: dict[str, Path]) -> None:
    whole, two = _load(engines[arch], 1), _load(engines[arch], 2)
    assert len(whole.session.parts) == 1 and len(two.session.parts) == 2
    _same(whole, two)


def test_generic_graph_in_two_parts_answers_as_one(generic_engines: dict[str, Path]) -> None:
    whole, two = _load(generic_engines["llama"], 1), _load(generic_engines["llama"], 2)
    assert len(two.session.parts) == 2
    _same(whole, two)


def test_gated_graph_in_two_parts_skips_as_one(gated_engine: Path) -> None:
    """The FFN gates' If branches read tensors of the outer graph: the cut carries those
    too, and the parts skip the same FFNs as the whole graph."""
    whole, two = _load(gated_engine, 1), _load(gated_engine, 2)
    assert len(two.session.parts) == 2
    _same(whole, two, allow_skip=True)
    assert whole.ffn_skips is not None and two.ffn_skips is not None
    assert whole.ffn_steps == two.ffn_steps
    assert np.array_equal(whole.ffn_skips, two.ffn_skips)


def test_parts_show_the_whole_graphs_signature(engines: dict[str, Path]) -> None:
    whole, two = _load(engines["llama"], 1), _load(engines["llama"], 2)

    def sig(args: list) -> dict:   # type: ignore[type-arg]
        return {a.name: (a.type, tuple(a.shape)) for a in args}
    assert sig(two.session.get_inputs()) == sig(whole.session.get_inputs())
    assert sig(two.session.get_outputs()) == sig(whole.session.get_outputs())
    # the carried tensors are the second part's only inputs the first part makes
    first, second = two.session.parts
    made = {a.name for a in first.get_outputs()}
    assert set(two.session.carried[0]) == made & {a.name for a in second.get_inputs()} != set()


def test_cut_halves_the_packed_weights(engines: dict[str, Path]) -> None:
    graph = onnx.load(str(engines["llama"] / "model.onnx"), load_external_data=False).graph
    cut = parted.find_cut(graph)
    assert cut is not None
    at, crossing = cut
    inits = {i.name: i for i in graph.initializer}

    w = [sum(int(np.prod(inits[x].dims)) for x in n.input if x in inits)
         if n.op_type in parted.PACKED_OPS else 0 for n in graph.node]
    halving = next(i for i in range(len(w)) if 2 * sum(w[:i + 1]) >= sum(w))
    # just past the node where the packed weights reach half, or a few nodes on
    assert halving < at <= halving + parted.CUT_SLACK
    assert sum(w[:at]) and sum(w[at:])
    assert crossing and all(any(x in n.input for n in graph.node[at:]) for x in crossing)
    # the residual stream's type is read off the graph: no probe session is needed
    assert parted._traced(graph, crossing) == {x: (1, None) for x in crossing}


def test_parted_load_is_chosen_for_large_packed_engines(
        engines: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from rung.engines import onnx_engine

    small = load_engine(engines["llama"], options=EngineOptions(prepack=True))
    assert len(small.session.parts) == 1           # under PARTED_LOAD_BYTES
    monkeypatch.setattr(onnx_engine, "PARTED_LOAD_BYTES", 0)
    assert len(load_engine(engines["llama"], options=EngineOptions(prepack=True))
               .session.parts) == 2
    # nothing packed, nothing to build in parallel
    assert len(load_engine(engines["llama"], options=EngineOptions(prepack=False))
               .session.parts) == 1


@pytest.mark.parametrize("parts", [1, 2])
def test_caches_taking_turns_answer_as_each_alone(parts: int, engines: dict[str, Path]) -> None:
    """The KV buffers stay bound between steps while a cache keeps stepping; a step on
    another cache (or on row slices of one) binds its own: caches taking turns on one
    engine get what each gets on an engine of its own."""
    alone = [_steps(_load(engines["llama"], parts)) for _ in range(2)]
    shared = _load(engines["llama"], parts)
    rng = np.random.default_rng(0)
    caches = [shared.new_cache(2, 64), shared.new_cache(2, 64)]
    tokens = rng.integers(3, shared.dims.vocab_size, (2, 12))
    got: list[list[np.ndarray]] = [[], []]
    for c, out in zip(caches, got, strict=True):
        out.append(shared.forward(c, tokens, np.array([12, 7])))
    for n in (1, 3, 1):
        step = rng.integers(3, shared.dims.vocab_size, (2, n))
        for c, out in zip(caches, got, strict=True):   # the same steps, in turn
            out.append(shared.forward(c, step, np.array([n, 1]), _scored(n)))
    for (want, kv), out, cache in zip(alone, got, caches, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(want, out, strict=True))
        assert all(np.array_equal(x, np.array(y))
                   for x, y in zip(kv, cache.buffers.values(), strict=True))


@pytest.mark.parametrize("parts", [1, 2])
def test_a_dropped_cache_is_not_kept_alive(parts: int, engines: dict[str, Path]) -> None:
    """The bindings a session keeps for a cache between steps go with the cache: a cache
    dropped after a step frees its buffers (a decoder rebuilt after a failure, or a
    generate call's cache, must not stay in memory through the engine)."""
    import gc
    import weakref

    engine = _load(engines["llama"], parts)
    cache = engine.new_cache(2, 64)
    engine.forward(cache, np.array([[5, 6, 7], [8, 9, 10]]), np.array([3, 2]))
    engine.forward(cache, np.array([[11], [12]]), np.array([1, 1]))   # bindings reused
    buffer = weakref.ref(next(iter(cache.buffers.values())))
    del cache
    gc.collect()
    assert buffer() is None


def test_an_output_asked_for_once_is_not_written_again(tmp_path: Path) -> None:
    """An array an output was written into is the caller's after the step: a later step
    that asks for other outputs binds afresh instead of writing into it again."""
    from rung.export.exporter import ExportOptions, export

    export(GATED, tmp_path / "gated",
           ExportOptions(kv="fp32", ffn_skip="trained"))   # fused graph, FFN gates
    engine = _load(tmp_path / "gated", 2)
    assert engine.fused and engine.ffn_skips is not None
    cache = engine.new_cache(1, 64)

    def inputs(tok: int, length: int) -> dict[str, np.ndarray]:
        return {"input_ids": np.array([[tok]], np.int64),
                "seqlens_k": np.array([length], np.int32),
                "query_seqlens": np.array([1], np.int32),
                "total_sequence_length": np.array(length + 1, np.int32),
                "logits_index": np.zeros((1, 1), np.int64),
                "ffn_allow_skip": np.array(False)}

    first = np.empty((1, 1, engine.dims.vocab_size), np.float32)
    got = engine.session.run_bound(inputs(5, 0), cache.buffers, ["logits", "ffn_skipped"],
                                   {"logits": first}, owner=cache)
    kept = first.copy()
    assert got["logits"] is first
    again = engine.session.run_bound(inputs(9, 1), cache.buffers, ["ffn_skipped"],
                                     owner=cache)
    assert set(again) == {"ffn_skipped"}
    assert np.array_equal(first, kept)   # not written by the second step
