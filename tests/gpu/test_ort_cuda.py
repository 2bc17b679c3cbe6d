"""ONNX Runtime's CUDA execution provider, the second GPU path: the same engine directory
gives the CPU's logits and tokens. Runs only where onnxruntime-gpu and a GPU are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rung.engines import engine_options, load_engine
from rung.engines.generate import generate
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from tests.gpu.conftest import ort_cuda_missing

WHY = ort_cuda_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=str(WHY))]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cuda_provider_matches_cpu(generic_engines: dict[str, Path], arch: str) -> None:
    cpu = load_engine(generic_engines[arch], "onnx", engine_options("onnx"))
    cuda = load_engine(generic_engines[arch], "onnx", engine_options("onnx", "cuda"))
    assert "CUDAExecutionProvider" in cuda.session.get_providers()
    ids = np.random.default_rng(0).integers(3, 290, (1, 24))
    every = np.arange(24)[None]
    ref = cpu.forward(cpu.new_cache(1), ids, np.array([24]), every)
    got = cuda.forward(cuda.new_cache(1), ids, np.array([24]), every)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3 * np.abs(ref).max())


def test_cuda_provider_generates_the_cpu_tokens(generic_engines: dict[str, Path]) -> None:
    d = generic_engines["qwen3"]
    out = []
    for provider in ("cpu", "cuda"):
        engine = load_engine(d, "onnx", engine_options("onnx", provider))
        tok = Tokenizer.load(d, engine.manifest.tokenizer)
        (g,) = generate(engine, tok, [tok.encode("The pump is running.")],
                        SamplingParams(max_tokens=16))
        out.append(g.token_ids)
    assert out[0] == out[1]
