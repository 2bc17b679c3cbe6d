"""Export each supported architecture and compare the engine with transformers itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rung.engines import load_engine
from rung.engines.errors import ExportError
from rung.engines.generate import generate
from rung.engines.manifest import load_manifest
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from rung.export.exporter import ExportOptions, export
from tests.checkpoints import CASES

pytestmark = pytest.mark.integration
PROMPT = "The pump is running; motor current 12.4 A. Öltemperatur 85 °C"


def _hf_logits(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = hf(torch.tensor([ids])).logits[0].numpy()
    return out


@pytest.mark.parametrize("arch", list(CASES))
def test_logits_match_transformers(arch: str, checkpoints: dict[str, tuple[Path, Any]],
                                   engines: dict[str, Path]) -> None:
    _, hf = checkpoints[arch]
    engine = load_engine(engines[arch])
    tok = Tokenizer.load(engines[arch], engine.manifest.tokenizer)
    ids = tok.encode(PROMPT)
    cache = engine.new_cache(1)
    every = np.arange(len(ids), dtype=np.int64)[None]
    mine = engine.forward(cache, np.array([ids]), np.array([len(ids)]), every)[0]
    ref = _hf_logits(hf, ids)
    assert mine.shape == ref.shape
    np.testing.assert_allclose(mine, ref, atol=1e-4 * max(1.0, np.abs(ref).max()), rtol=0)


@pytest.mark.parametrize("arch", list(CASES))
def test_32_greedy_tokens_equal_transformers_generate(
        arch: str, checkpoints: dict[str, tuple[Path, Any]], engines: dict[str, Path]) -> None:
    _, hf = checkpoints[arch]
    engine = load_engine(engines[arch])
    tok = Tokenizer.load(engines[arch], engine.manifest.tokenizer)
    ids = tok.encode(PROMPT)
    (g,) = generate(engine, tok, [ids], SamplingParams(max_tokens=32))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                          eos_token_id=None)[0, len(ids):].tolist()
    if g.finish_reason == "stop":  # stopped on EOS: transformers emitted the same prefix
        assert ref[:len(g.token_ids)] == g.token_ids
    else:
        assert g.token_ids == ref and len(ref) == 32


@pytest.mark.parametrize("arch", list(CASES))
def test_manifest_records_parity_and_dims(arch: str, engines: dict[str, Path]) -> None:
    m = load_manifest(engines[arch])
    assert m.parity is not None and m.parity.passed
    assert m.parity.greedy_agreement == 1.0
    assert m.parity.max_rel_logit_diff < 1e-4
    assert m.dims.hf_architecture == CASES[arch][1]
    assert m.dims.max_seq == 128
    assert set(m.artifacts) >= {"model.onnx", "model.onnx.data", "tokenizer.json"}


def test_qwen3_explicit_head_dim_and_tied_head(engines: dict[str, Path]) -> None:
    m = load_manifest(engines["qwen3"])
    assert m.dims.head_dim == 32 and m.dims.hidden_size == 64
    assert m.dims.tie_word_embeddings


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_fp16_weights_export_within_tolerance(kv: str, checkpoints: dict[str, tuple[Path, Any]],
                                              tmp_path: Path) -> None:
    path, hf = checkpoints["llama"]
    m = export(path, tmp_path, ExportOptions(kv=kv, weights="fp16", max_seq=64))
    assert m.weights == "fp16" and m.parity is not None and m.parity.passed
    assert m.kv.layout == "position_major_SBHD"   # fp16 weights: the generic graph
    fp32_size = sum(p.numel() for p in hf.parameters()) * 4
    assert (tmp_path / "model.onnx.data").stat().st_size < 0.6 * fp32_size


def test_sharded_checkpoint_exports(tmp_path: Path) -> None:
    from tests.checkpoints import save_checkpoint

    save_checkpoint("qwen2", tmp_path / "hf", max_shard_size="50KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    m = export(tmp_path / "hf", tmp_path / "engine", ExportOptions(kv="fp32", max_seq=64))
    assert m.parity is not None and m.parity.passed


def test_verification_failure_fails_the_export(checkpoints: dict[str, tuple[Path, Any]],
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import rung.export.exporter as exporter

    def broken(real: Any) -> Any:  # a graph whose final norm weights are off by 10 %
        def build(model: Any, **kwargs: Any) -> Any:
            with torch.no_grad():
                model.model.norm.weight.mul_(1.1)
            try:
                return real(model, **kwargs)
            finally:
                with torch.no_grad():
                    model.model.norm.weight.div_(1.1)
        return build

    for name in ("build_graph", "build_fused_graph"):
        monkeypatch.setattr(exporter, name, broken(getattr(exporter, name)))
    for graph in ("fused", "generic"):
        with pytest.raises(ExportError, match="verification failed"):
            export(checkpoints["mistral"][0], tmp_path / graph,
                   ExportOptions(kv="fp32", max_seq=64, graph=graph))
        assert not (tmp_path / graph / "manifest.json").exists()
