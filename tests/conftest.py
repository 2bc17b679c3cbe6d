"""Shared fixtures: tiny checkpoints and their exported engines, built once per session."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints import CASES, save_checkpoint
from tests.lazy import Lazy

# the architecture ``make quick`` runs (-m "not slow"); a test parametrized on another
# ``arch`` is part of the sweep ``make test`` runs
QUICK_ARCH = "llama"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        arch = callspec.params.get("arch") if callspec is not None else None
        if arch is not None and arch != QUICK_ARCH:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, tuple[Path, Any]]:
    """arch -> (checkpoint dir, transformers model), each made when first read."""
    def build(arch: str) -> tuple[Path, Any]:
        path = tmp_path_factory.mktemp(f"hf-{arch}")
        return path, save_checkpoint(arch, path)
    return Lazy(CASES, build)


@pytest.fixture(scope="session")
def engines(checkpoints: Mapping[str, tuple[Path, Any]],
            tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, Path]:
    """arch -> exported fp32 engine dir (verified by the exporter; the fused graph)."""
    from rung.export.exporter import ExportOptions, export

    def build(arch: str) -> Path:
        engine_dir = tmp_path_factory.mktemp(f"engine-{arch}")
        export(checkpoints[arch][0], engine_dir, ExportOptions(kv="fp32", max_seq=128))
        return engine_dir
    return Lazy(CASES, build)


@pytest.fixture(scope="session")
def generic_engines(checkpoints: Mapping[str, tuple[Path, Any]],
                    tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, Path]:
    """arch -> the same fp32 engines as ``engines``, as the generic graph (position-major
    KV, plain ONNX ops) instead of the fused one."""
    from rung.export.exporter import ExportOptions, export

    def build(arch: str) -> Path:
        engine_dir = tmp_path_factory.mktemp(f"generic-{arch}")
        export(checkpoints[arch][0], engine_dir,
               ExportOptions(kv="fp32", max_seq=128, graph="generic"))
        return engine_dir
    return Lazy(CASES, build)


@pytest.fixture(scope="session")
def task_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight engine with room for task prompts and answers (max_seq 1024)."""
    from rung.export.exporter import ExportOptions, export

    hf = tmp_path_factory.mktemp("hf-tasks")
    save_checkpoint("qwen3", hf, config={"max_position_embeddings": 2048,
                                         "initializer_range": 0.05})
    engine_dir = tmp_path_factory.mktemp("engine-tasks")
    export(hf, engine_dir, ExportOptions(kv="fp32", max_seq=1024))
    return engine_dir


@pytest.fixture(scope="session")
def edge_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped demo model (models/edge-tiny) exported as the daemon serves it."""
    from rung.export.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("edge-engine")
    export(Path(__file__).resolve().parents[1] / "models" / "edge-tiny", out, ExportOptions())
    return out


GATED = Path(__file__).resolve().parent / "data" / "edge-tiny-gated"
"""A checkpoint trained with FFN skip gates (the demo model until 2026-12-02)."""


@pytest.fixture(scope="session")
def gated_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gated checkpoint (``GATED``) exported with its trained gates."""
    from rung.export.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("gated-engine")
    export(GATED, out, ExportOptions(ffn_skip="trained"))
    return out
