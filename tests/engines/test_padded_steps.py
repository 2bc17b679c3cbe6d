"""Quantized engines on the fused graph run a second, unscored position beside every lone
token (``OnnxEngine._padded``, as the export's step plan says): a row's logits are then the
same bit for bit however its tokens are grouped into steps and whatever rows share them,
which makes fast decoding exact on int8/int4 weights and an answer independent of the batch
it was decoded in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rung.engines import load_engine
from rung.engines.onnx_engine import EngineOptions, OnnxEngine

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def int4_fused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rung.export.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("int4-fused")
    export(ROOT / "models" / "edge-tiny", out, ExportOptions(weights="int4", kv="fp32",
                                                             ffn_skip="off"))
    return out


def _engine(path: Path) -> OnnxEngine:
    engine = load_engine(path, options=EngineOptions(threads=2))
    assert isinstance(engine, OnnxEngine)
    return engine


class _FedTwice:
    """The engine with each lone token fed as two tokens (the second unscored, its KV
    dropped): what the graph's own repetition of the position must equal."""

    def __init__(self, engine: OnnxEngine) -> None:
        self.engine, self.dims, self.new_cache = engine, engine.dims, engine.new_cache

    def forward(self, cache: object, tokens: np.ndarray, n_new: np.ndarray,
                logits_index: np.ndarray | None = None) -> np.ndarray:
        if tokens.shape[1] > 1 or not (n_new == 1).any():
            return self.engine.forward(cache, tokens, n_new, logits_index)  # type: ignore[arg-type]
        pad = n_new == 1
        index = np.zeros((len(n_new), 1), np.int64) if logits_index is None else logits_index
        logits = self.engine._step(cache, np.concatenate([tokens, tokens], axis=1),  # type: ignore[arg-type]
                                   n_new + pad, index, False)
        cache.rollback(pad)   # type: ignore[attr-defined]
        return logits


def _runs(engine: OnnxEngine | _FedTwice) -> dict[str, np.ndarray]:
    """Logits of the same 9 tokens after the same prompt: in one step, split 4 + 5, one at a
    time, and one at a time as the middle row of a batch of three (another row idle)."""
    rng = np.random.default_rng(0)
    v = engine.dims.vocab_size
    prompt, toks = rng.integers(3, v, 40), rng.integers(3, v, 9)

    def fresh(rows: int = 1) -> object:
        cache = engine.new_cache(rows, 128)
        engine.forward(cache, np.tile(prompt, (rows, 1)), np.full(rows, len(prompt)))
        return cache

    out = {}
    cache = fresh()
    out["one step"] = engine.forward(cache, toks[None], np.array([9]), np.arange(9)[None])[0]
    cache = fresh()
    out["4 + 5"] = np.concatenate([
        engine.forward(cache, toks[None, :4], np.array([4]), np.arange(4)[None])[0],
        engine.forward(cache, toks[None, 4:], np.array([5]), np.arange(5)[None])[0]])
    cache = fresh()
    singles = []
    for t in toks:
        before = int(cache.lengths[0])   # type: ignore[attr-defined]
        singles.append(engine.forward(cache, np.array([[t]]), np.array([1]))[0])
        assert int(cache.lengths[0]) == before + 1   # type: ignore[attr-defined]
    out["one at a time"] = np.concatenate(singles)
    cache = fresh(3)
    batched = []
    for i, t in enumerate(toks):
        other = rng.integers(3, v, 1)[0]
        step = np.array([[other], [t], [other]])
        batched.append(engine.forward(cache, step, np.array([1, 1, i % 2]))[1])
    out["in a batch"] = np.concatenate(batched)
    return out


def test_a_rows_logits_do_not_depend_on_how_its_steps_are_shaped(int4_fused: Path) -> None:
    engine = _engine(int4_fused)
    assert engine.min_positions == 2
    runs = _runs(engine)
    for name, logits in runs.items():
        assert np.array_equal(logits, runs["one step"]), name


def test_unpadded_lone_tokens_round_otherwise(int4_fused: Path) -> None:
    """Why the padding is there: without it a lone token takes the attention's one-query
    path and its logits part from the multi-token step's."""
    engine = _engine(int4_fused)
    engine.min_positions = 1
    runs = _runs(engine)
    assert np.array_equal(runs["4 + 5"], runs["one step"])
    assert not np.array_equal(runs["one at a time"], runs["one step"])


def test_float_and_generic_engines_are_not_padded(engines: dict[str, Path],
                                                  tmp_path: Path) -> None:
    from rung.export.exporter import ExportOptions, export

    assert _engine(engines["llama"]).min_positions == 1        # fp32
    export(ROOT / "models" / "edge-tiny", tmp_path, ExportOptions(weights="int4", kv="fp8",
                                                                  ffn_skip="off"))
    assert _engine(tmp_path).min_positions == 1                # int4, generic graph (fp8 KV)


def test_the_graph_repeats_a_lone_tokens_position_after_the_weights(int4_fused: Path) -> None:
    """The second position is made inside the graph: the weight products run the step's
    one row, the attention two (ONNX Runtime's own profile of a step shows the shapes), and
    the logits are those of the token fed twice, bit for bit."""
    import json

    import onnxruntime as ort

    from rung.engines.manifest import ATTENTION_POSITIONS, StepPlan

    engine = _engine(int4_fused)
    assert engine.manifest.step == StepPlan("fused", 2)
    assert ATTENTION_POSITIONS in {t.name for t in engine.manifest.inputs}
    widened = _runs(engine)
    twice = _runs(_FedTwice(engine))
    for name, logits in widened.items():
        assert np.array_equal(logits, twice[name]), name

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(int4_fused.parent / "profile")
    session = ort.InferenceSession(str(int4_fused / engine.manifest.graph_file), so)
    d = engine.dims
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([[5]], np.int64), "seqlens_k": np.array([1], np.int32),
        "query_seqlens": np.array([2], np.int32),
        "total_sequence_length": np.array(2, np.int32),
        "logits_index": np.zeros((1, 1), np.int64),
        ATTENTION_POSITIONS: np.array(2, np.int64)}
    for i in range(d.num_layers):
        for part in ("key", "value"):
            feeds[f"past_{part}_{i}"] = np.zeros((1, d.num_kv_heads, 16, d.head_dim),
                                                 np.float32)
    session.run(["logits"], feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    rows: dict[str, set[int]] = {}
    for e in events:
        args = e.get("args", {})
        if e.get("cat") == "Node" and args.get("op_name") in ("MatMulNBits",
                                                               "GroupQueryAttention"):
            first = next(iter(args["input_type_shape"][0].values()))
            rows.setdefault(args["op_name"], set()).add(first[-2])   # [B, S, *]: S
    assert rows["MatMulNBits"] == {1}            # q/k/v, o, gate/up, down: one row
    assert rows["GroupQueryAttention"] == {2}    # the attention: two
