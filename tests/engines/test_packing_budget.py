"""Weight packing chosen by the memory budget: float weights that several-token steps would
have packed stay unpacked where the estimated peak packed exceeds ``memory_budget_mb``, and
the load says so; the choice is recorded on the engine (``packing``), which the daemon
logs at load and labels ``rung_info`` with (``weights_packed``). Real ONNX Runtime on a
tiny random-weight engine."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from rung.daemon.config import parse_config
from rung.engines import DEFAULT_MEMORY_BUDGET_MB, engine_options, load_engine
from rung.engines.manifest import load_manifest
from rung.engines.onnx_engine import (
    PEAK_PACKED,
    EngineOptions,
    OnnxEngine,
    estimated_peak_mb,
)
from tests.checkpoints import save_checkpoint

ROWS = 64   # a large batch: the cache alone is megabytes, above the smallest budget (1 MiB)


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fp32 engine (fused graph, fp32 KV, 128 positions)."""
    from rung.export.exporter import ExportOptions, export

    hf, out = tmp_path_factory.mktemp("hf-pack"), tmp_path_factory.mktemp("engine-pack")
    save_checkpoint("llama", hf)
    export(hf, out, ExportOptions(kv="fp32", max_seq=128))
    return out


def _packs(engine: OnnxEngine) -> bool:
    """Whether ONNX Runtime was left to prepack the session's weights."""
    try:
        off = engine.session.get_session_options().get_session_config_entry(
            "session.disable_prepacking")
    except RuntimeError:   # never set
        return True
    return off != "1"


def test_over_the_budget_float_weights_load_unpacked_and_say_so(
        engine_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    peak = estimated_peak_mb(engine_dir, load_manifest(engine_dir), ROWS, packed=True)
    budget = math.floor(peak) - 1
    assert budget >= 1, peak
    with caplog.at_level(logging.WARNING, logger="rung.engine"):
        engine = load_engine(engine_dir, options=EngineOptions(max_batch=ROWS,
                                                               memory_budget_mb=budget))
    assert isinstance(engine, OnnxEngine)
    assert not engine.packing.packed and engine.packing.chosen_by == "budget"
    assert f"over the {budget} MiB memory budget" in engine.packing.reason
    assert not _packs(engine)
    said = [r.getMessage() for r in caplog.records if r.name == "rung.engine"]
    assert len(said) == 1 and "weights left unpacked" in said[0], said


def test_within_the_budget_they_are_packed_silently(
        engine_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rung.engine"):
        engine = load_engine(engine_dir, "onnx", engine_options(
            "onnx", max_batch=ROWS, memory_budget_mb=DEFAULT_MEMORY_BUDGET_MB))
    assert isinstance(engine, OnnxEngine)
    assert engine.packing.packed and engine.packing.chosen_by == "budget"
    assert "within the" in engine.packing.reason and _packs(engine)
    assert not [r for r in caplog.records if r.name == "rung.engine"]


def test_an_explicit_prepack_and_one_token_steps_are_not_the_budgets_choice(
        engine_dir: Path) -> None:
    forced = load_engine(engine_dir, options=EngineOptions(max_batch=ROWS, prepack=True,
                                                           memory_budget_mb=1))
    assert isinstance(forced, OnnxEngine)
    assert (forced.packing.packed, forced.packing.chosen_by) == (True, "flag") and _packs(forced)
    plain = load_engine(engine_dir, options=EngineOptions(max_batch=1, decode="plain"))
    assert isinstance(plain, OnnxEngine)
    assert (plain.packing.packed, plain.packing.chosen_by) == (False, "steps")


def test_the_packed_peak_factor_is_the_exports() -> None:
    from rung.export.defaults import PEAK_FACTOR

    assert PEAK_FACTOR["fp32"] == PEAK_FACTOR["fp16"] == PEAK_PACKED


def test_the_budget_is_the_exports_and_a_config_key(tmp_path: Path) -> None:
    from rung.export import defaults

    assert DEFAULT_MEMORY_BUDGET_MB == defaults.DEFAULT_MEMORY_BUDGET_MB
    cfg = parse_config({"engine": {"path": "e"}}, tmp_path, (), {})
    assert cfg.engine.memory_budget_mb == DEFAULT_MEMORY_BUDGET_MB
    cfg = parse_config({"engine": {"path": "e", "memory_budget_mb": 1800}}, tmp_path, (), {})
    assert cfg.engine.memory_budget_mb == 1800
    with pytest.raises(Exception, match="engine.memory_budget_mb"):
        parse_config({"engine": {"path": "e", "memory_budget_mb": 0}}, tmp_path, (), {})

