"""Conditional FFN branches: gates in the model and graph, calibration, runtime counting."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from rung.engines import AnyEngine, load_engine
from rung.engines.errors import ExportError
from rung.engines.manifest import load_manifest
from rung.export import exporter
from rung.export.checkpoint import load_checkpoint
from rung.export.exporter import ExportOptions, export
from rung.export.verify import logit_metrics
from tests.engines.tiny_tokenizer import SENTENCES

pytestmark = pytest.mark.integration


def _export_with_gates(hf: Path, out: Path, bias: float,
                       monkeypatch: pytest.MonkeyPatch, zero_ffn: bool = False,
                       graph: str = "auto") -> Path:
    """Export with every gate forced (bias > 0: always skip; < 0: never), or a plain export
    of the model with its FFNs zeroed."""
    real = exporter.prepare_gates

    def forced(ckpt: Any, opts: ExportOptions, held: Any = None
               ) -> tuple[dict[str, Any] | None, dict[str, str]]:
        model = ckpt.model
        if zero_ffn:
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.mlp.down_proj.weight.zero_()
            return real(ckpt, opts, held)
        model.add_ffn_gates()
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.ffn_gate.proj.bias.fill_(bias)
        return {"mode": "forced"}, {"requested": "forced", "mode": "forced", "reason": "test"}

    monkeypatch.setattr(exporter, "prepare_gates", forced)
    export(hf, out, ExportOptions(kv="fp32", max_seq=64, graph=graph))
    monkeypatch.setattr(exporter, "prepare_gates", real)
    return out


def _decode(engine: AnyEngine, prompt: list[int], steps: int,
            skip_prefill: bool = False) -> np.ndarray:
    cache = engine.new_cache(1)
    logits = [engine.forward(cache, np.array([prompt]), np.array([len(prompt)]),
                             allow_skip=skip_prefill)[0, -1]]
    for _ in range(steps):
        nxt = np.array([[logits[-1].argmax()]])
        logits.append(engine.forward(cache, nxt, np.ones(1, np.int64), allow_skip=True)[0, -1])
    return np.stack(logits)


def _op_types(engine_dir: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(engine_dir / "model.onnx"),
                                         load_external_data=False).graph.node}


def test_skip_all_equals_zeroed_ffns(checkpoints: dict[str, tuple[Path, Any]],
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = checkpoints["qwen3"][0]
    gated = load_engine(_export_with_gates(hf, tmp_path / "g", 1e4, monkeypatch))
    zeroed = load_engine(_export_with_gates(hf, tmp_path / "z", 0, monkeypatch, True))
    # a one-token prompt run as a decode step too: every step skips
    np.testing.assert_allclose(_decode(gated, [7], 12, skip_prefill=True),
                               _decode(zeroed, [7], 12), atol=1e-5, rtol=0)
    assert gated.ffn_steps == 13 and gated.ffn_skips is not None
    assert gated.ffn_skips.tolist() == [13, 13]


@pytest.mark.parametrize("graph", ["fused", "generic"])
def test_skip_none_equals_plain_export_bit_for_bit(
        graph: str, checkpoints: dict[str, tuple[Path, Any]], engines: dict[str, Path],
        generic_engines: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gated_dir = _export_with_gates(checkpoints["llama"][0], tmp_path / "g", -1e4, monkeypatch,
                                   graph=graph)
    plain_dir = (engines if graph == "fused" else generic_engines)["llama"]
    assert "If" in _op_types(gated_dir) and "If" not in _op_types(plain_dir)
    assert ("GroupQueryAttention" in _op_types(gated_dir)) == (graph == "fused")
    gated, plain = load_engine(gated_dir), load_engine(plain_dir)
    prompt = list(range(10, 21))
    np.testing.assert_array_equal(_decode(gated, prompt, 15), _decode(plain, prompt, 15))
    assert gated.ffn_steps == 15 and gated.ffn_skips is not None
    assert gated.ffn_skips.sum() == 0


def test_prefill_and_batches_never_skip(checkpoints: dict[str, tuple[Path, Any]],
                                        engines: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gated = load_engine(_export_with_gates(checkpoints["llama"][0], tmp_path / "g", 1e4,
                                           monkeypatch))
    plain = load_engine(engines["llama"])
    tokens = np.array([[11, 12, 13, 14], [21, 22, 23, 0]])
    outs = []
    for engine in (gated, plain):
        cache = engine.new_cache(2)
        first = engine.forward(cache, tokens, np.array([4, 3]))             # prefill, B=2
        step = engine.forward(cache, np.array([[5], [6]]), np.array([1, 1]),
                              allow_skip=True)                             # decode, B=2
        one = engine.new_cache(1)
        pre = engine.forward(one, tokens[:1], np.array([4]), allow_skip=True)  # prefill, B=1
        single = engine.forward(one, np.array([[9]]), np.array([1]))       # suffix prefill
        outs.append((first, step, pre, single))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert gated.ffn_steps == 0 and gated.ffn_skips is not None
    assert gated.ffn_skips.sum() == 0


@pytest.fixture(scope="module")
def calib_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    words = " ".join(SENTENCES).split()
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(30))
                              for _ in range(120)), encoding="utf-8")
    return path


@pytest.mark.slow
def test_calibration_stays_within_budget_on_held_out_text(
        checkpoints: dict[str, tuple[Path, Any]], engines: dict[str, Path], calib_text: Path,
        tmp_path: Path) -> None:
    budget = 0.2
    m = export(checkpoints["llama"][0], tmp_path, ExportOptions(kv="fp32",
        max_seq=128, ffn_skip="calibrate", calib_text=calib_text, quality_budget=budget))
    gate = m.ffn_gate
    assert gate is not None and gate["mode"] == "calibrate"
    assert len(gate["skip_rate"]) == 2 and gate["skip_rate_mean"] > 0.02
    assert gate["quality"]["mean_kl"] <= budget
    assert m.parity is not None and m.parity.passed
    # independently, on the engines: held-out text decoded one token at a time
    from rung.engines.tokenizer import Tokenizer

    gated, plain = load_engine(tmp_path), load_engine(engines["llama"])
    tok = Tokenizer.load(tmp_path, m.tokenizer)
    ids = tok.encode(calib_text.read_text(), add_bos=False)[-120:]
    got, ref = [], []
    for engine, out in ((gated, got), (plain, ref)):
        cache = engine.new_cache(1)
        out.append(engine.forward(cache, np.array([ids[:1]]), np.array([1]))[0, -1])
        for t in ids[1:]:
            out.append(engine.forward(cache, np.array([[t]]), np.ones(1, np.int64),
                                      allow_skip=True)[0, -1])
    quality = logit_metrics(np.stack(ref), np.stack(got))
    assert quality["mean_kl"] <= budget, quality
    assert gated.ffn_skips is not None and gated.ffn_skips.sum() > 0


def test_calibration_errors(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="needs --calib-text"):
        export(checkpoints["llama"][0], tmp_path, ExportOptions(kv="fp32", ffn_skip="calibrate"))
    short = tmp_path / "short.txt"
    short.write_text("too short")
    with pytest.raises(ExportError, match="at least"):
        export(checkpoints["llama"][0], tmp_path, ExportOptions(kv="fp32",
            ffn_skip="calibrate", calib_text=short))
    with pytest.raises(ExportError, match="has no FFN gates"):
        export(checkpoints["llama"][0], tmp_path, ExportOptions(kv="fp32", ffn_skip="trained"))


def test_gates_train_with_a_sparsity_term(checkpoints: dict[str, tuple[Path, Any]]) -> None:
    model = load_checkpoint(checkpoints["mistral"][0], max_seq=64).model
    model.add_ffn_gates(temperature=0.5)
    model.train()
    ids = torch.randint(5, 300, (2, 16))
    positions = torch.ones_like(ids, dtype=torch.bool)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if "ffn_gate" in n], lr=1.0)
    before = None
    for _ in range(3):
        logits = model(ids, gate_positions=positions)
        lm = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 300),
                                               ids[:, 1:].reshape(-1))
        skip = torch.stack([p.mean() for p in model.skip_probs()]).mean()
        before = float(skip.detach()) if before is None else before
        opt.zero_grad()
        (lm - 1.0 * skip).backward()  # the sparsity term rewards skipping
        opt.step()
    assert float(skip.detach()) > before


def test_trained_gates_load_from_a_checkpoint(checkpoints: dict[str, tuple[Path, Any]],
                                              tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    hf = tmp_path / "hf"
    shutil.copytree(checkpoints["qwen2"][0], hf)
    state = load_file(hf / "model.safetensors")
    for i in range(2):
        state[f"model.layers.{i}.mlp.ffn_gate.proj.weight"] = torch.zeros(1, 64)
        state[f"model.layers.{i}.mlp.ffn_gate.proj.bias"] = torch.tensor([1.0 if i else -1.0])
    save_file(state, hf / "model.safetensors")
    m = export(hf, tmp_path / "e", ExportOptions(kv="fp32", max_seq=64, ffn_skip="trained"))
    assert m.ffn_gate == {"mode": "trained"}
    engine = load_engine(tmp_path / "e")
    _decode(engine, [5, 6, 7], 4)
    assert engine.ffn_skips is not None and engine.ffn_skips.tolist() == [0, 4]
    # the default (auto) keeps the gates the checkpoint carries where dropping them costs
    # more than the budget (layer 1 always skipping: measured far over 0.05); off drops them
    auto = export(hf, tmp_path / "a", ExportOptions(kv="fp32", max_seq=64))
    assert auto.ffn_gate == {"mode": "trained"} and auto.ffn_skip is not None
    assert "over the budget 0.05" in auto.ffn_skip["reason"]
    plain = export(hf, tmp_path / "p", ExportOptions(kv="fp32", max_seq=64, ffn_skip="off"))
    assert plain.ffn_gate is None and "If" not in _op_types(tmp_path / "p")
    assert load_manifest(tmp_path / "p").outputs[1].name != "ffn_skipped"
    # a checkpoint without gates exports without them under the default
    assert export(checkpoints["qwen2"][0], tmp_path / "n",
                  ExportOptions(kv="fp32", max_seq=64)).ffn_gate is None
