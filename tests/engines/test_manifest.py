"""The manifest contract: one format loaded, malformed files, the step plan and artifact
checksums."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rung.engines import load_engine
from rung.engines.errors import ManifestError
from rung.engines.manifest import (
    FORMAT_VERSION,
    StepPlan,
    TrtPlan,
    load_manifest,
    sha256_file,
    xxh3_file,
)


@pytest.fixture
def engine_dir(engines: dict[str, Path], tmp_path: Path) -> Path:
    dst = tmp_path / "engine"
    shutil.copytree(engines["qwen2"], dst)
    return dst


def _edit(engine_dir: Path, fn: object) -> None:
    path = engine_dir / "manifest.json"
    data = json.loads(path.read_text())
    fn(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


def test_round_trip(engine_dir: Path) -> None:
    m = load_manifest(engine_dir)
    assert m.format_version == FORMAT_VERSION and len(m.engine_id) == 16
    assert m.kv.dtype == "float32" and m.kv.layout == "head_major_BHSD"
    assert [t.name for t in m.inputs[:5]] == ["input_ids", "seqlens_k", "query_seqlens",
                                              "total_sequence_length", "logits_index"]
    assert m.to_json() == load_manifest(engine_dir).to_json()


def test_newer_format_version(engine_dir: Path) -> None:
    _edit(engine_dir, lambda d: d.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(ManifestError, match="newer than this rung understands") as e:
        load_manifest(engine_dir)
    assert "upgrade rung" in str(e.value)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest"):
        load_manifest(tmp_path)


def test_not_json(engine_dir: Path) -> None:
    (engine_dir / "manifest.json").write_text("{")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(engine_dir)


def test_missing_key_is_named(engine_dir: Path) -> None:
    _edit(engine_dir, lambda d: d["dims"].pop("head_dim"))
    with pytest.raises(ManifestError, match="'dims' lacks key 'head_dim'"):
        load_manifest(engine_dir)


def test_unknown_key_is_named(engine_dir: Path) -> None:
    _edit(engine_dir, lambda d: d["kv"].update(bits=3))
    with pytest.raises(ManifestError, match="'kv' has unknown key 'bits'"):
        load_manifest(engine_dir)


def _flip(path: Path, at: int = 100) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_corrupt_artifact_detected(engine_dir: Path) -> None:
    m = load_manifest(engine_dir)
    assert sorted(m.xxh3) == sorted(m.artifacts)
    assert m.xxh3["model.onnx.data"] == xxh3_file(engine_dir / "model.onnx.data")
    _flip(engine_dir / "model.onnx.data")
    with pytest.raises(ManifestError, match="XXH3 differs"):
        load_manifest(engine_dir)


@pytest.mark.parametrize("name", ["model.onnx.data", "model.onnx", "tokenizer.json"])
def test_load_engine_refuses_a_corrupt_file(engine_dir: Path, name: str) -> None:
    """The check runs beside the session's creation; a flipped byte anywhere (weights the
    session loads fine, a graph it cannot parse, the tokenizer it never reads) is reported
    as corruption and no engine is returned."""
    _flip(engine_dir / name, at=(engine_dir / name).stat().st_size // 2)
    with pytest.raises(ManifestError, match=f"{name}: XXH3 differs"):
        load_engine(engine_dir)


def test_digests_must_cover_the_artifacts(engine_dir: Path) -> None:
    _edit(engine_dir, lambda d: d["xxh3"].pop("tokenizer.json"))
    with pytest.raises(ManifestError, match="xxh3 lists other files than artifacts"):
        load_manifest(engine_dir)


def test_missing_artifact(engine_dir: Path) -> None:
    (engine_dir / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match="listed in the manifest but missing"):
        load_manifest(engine_dir)


@pytest.mark.parametrize("version", [1, 5, 8])
def test_an_earlier_format_is_refused_with_the_way_out(engine_dir: Path, version: int) -> None:
    """An engine written by an earlier rung is not fed as it was: the message names the
    format and says to re-export, whatever else the file holds."""
    _edit(engine_dir, lambda d: d.update(format_version=version))
    with pytest.raises(ManifestError, match=f"manifest format {version} was written by an "
                       "earlier rung") as e:
        load_manifest(engine_dir)
    assert "re-export the engine with this rung" in str(e.value)
    with pytest.raises(ManifestError, match="earlier rung"):
        load_engine(engine_dir)


def test_the_step_plan_is_the_exports(engines: dict[str, Path], tmp_path: Path) -> None:
    """Written at export, read at load: the graph form and the lone token's positions; a
    plan this rung does not run is refused (one that does not fit its graph is refused by
    the graph check, tests/engines/test_graph_check.py)."""
    m = load_manifest(engines["qwen2"])
    assert m.step == StepPlan("fused", 1)            # fp32: steps run as they come
    generic = load_manifest(engines["llama"])
    assert generic.step.graph == ("fused" if generic.kv.layout == "head_major_BHSD"
                                  else "generic")
    engine = load_engine(engines["qwen2"])
    assert engine.min_positions == m.step.min_positions  # type: ignore[attr-defined]
    dst = tmp_path / "engine"
    shutil.copytree(engines["qwen2"], dst)
    _edit(dst, lambda d: d["step"].update(min_positions=3))
    with pytest.raises(ManifestError, match="step plan .* is not one this rung runs"):
        load_manifest(dst)
    _edit(dst, lambda d: d["step"].update(min_positions=1, graph="sparse"))
    with pytest.raises(ManifestError, match="graph fused or generic"):
        load_manifest(dst)
    _edit(dst, lambda d: d.pop("step"))
    with pytest.raises(ManifestError, match="lacks key 'step'"):
        load_manifest(dst)


PLAN = TrtPlan(plan_file="model.plan", tensorrt_version="10.3.0", compute_capability="8.7",
               device_name="Orin", weights="fp16", kv_requested="fp8",
               kv_reason="Orin (compute capability 8.7) has no FP8: fp16 KV",
               max_batch=4, prefill_chunk=64,
               profiles={"decode": {"input_ids": [[1, 1], [1, 1], [4, 1]]},
                         "prefill": {"input_ids": [[1, 1], [1, 64], [4, 64]]}},
               parity={"max_abs_logit_diff": 0.01, "argmax_agreement": 1.0})


@pytest.fixture
def plan_dir(engine_dir: Path) -> Path:
    """The engine with a trt record and its file (not a real plan: only the manifest's
    handling of it is under test here)."""
    (engine_dir / "model.plan").write_bytes(b"serialized TensorRT engine stand-in")

    def add(d: dict[str, Any]) -> None:
        d["artifacts"]["model.plan"] = sha256_file(engine_dir / "model.plan")
        d["xxh3"]["model.plan"] = xxh3_file(engine_dir / "model.plan")
        d["trt"] = dataclasses.asdict(PLAN)

    _edit(engine_dir, add)
    return engine_dir


def test_trt_record_round_trip(plan_dir: Path) -> None:
    m = load_manifest(plan_dir)
    assert m.trt == PLAN and m.format_version == FORMAT_VERSION
    assert m.to_json() == load_manifest(plan_dir).to_json()
    m.save(plan_dir)
    assert load_manifest(plan_dir).trt == PLAN


def test_tampered_plan_detected(plan_dir: Path) -> None:
    (plan_dir / "model.plan").write_bytes(b"serialized TensorRT engine stand-In")
    with pytest.raises(ManifestError, match="model.plan: XXH3 differs"):
        load_manifest(plan_dir)


def test_trt_record_unknown_key_is_named(plan_dir: Path) -> None:
    _edit(plan_dir, lambda d: d["trt"].update(int8_calibrator="x"))
    with pytest.raises(ManifestError, match="'trt' has unknown key 'int8_calibrator'"):
        load_manifest(plan_dir)


def test_the_manifest_records_why_the_kv_and_gates_are_what_they_are(engine_dir: Path) -> None:
    m = load_manifest(engine_dir)   # exported with --kv fp32, --ffn-skip auto
    assert (m.kv.chosen_by, m.kv.reason) == ("flag", "--kv fp32 as asked")
    assert m.ffn_skip is not None and m.ffn_skip["requested"] == "auto"
    assert m.ffn_skip["mode"] == "off" and m.ffn_gate is None
