"""What an export gets without flags, and why (export/defaults.py): ``--kv auto`` and
``--ffn-skip auto``, chosen and recorded in the manifest."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.cli import main
from rung.engines.errors import ExportError
from rung.engines.manifest import HEAD_MAJOR, KV_LAYOUT, KVSpec, ModelDims, load_manifest
from rung.export.defaults import (
    DEFAULT_MEMORY_BUDGET_MB,
    NO_GATES,
    CacheShape,
    auto_gates,
    choose_kv,
    fast_without_gates,
    flagged,
    kv_bytes_per_token,
    peak_bytes,
    weight_bytes,
)
from rung.export.exporter import KV, ExportOptions, export
from rung.export.quantize import quant_spec

EDGE_TINY = Path(__file__).resolve().parents[2] / "models" / "edge-tiny"
# trained with FFN skip gates (the demo model until 2026-12-02)
GATED = Path(__file__).resolve().parents[1] / "data" / "edge-tiny-gated"
# the Qwen2.5-0.5B shape at 4,096 tokens, fp32 weights (494 M parameters)
QWEN05 = CacheShape(num_layers=24, num_kv_heads=2, head_dim=64, max_seq=4096)
QWEN05_FP32 = 494_032_768 * 4
# the demo model (edge-tiny): 6 layers, 4 KV heads of 32, context 1,024, 4.95 M parameters
TINY = CacheShape(num_layers=6, num_kv_heads=4, head_dim=32, max_seq=1024)
TINY_FP32 = 4_950_000 * 4


# -- the chooser, pure ----------------------------------------------------------------------
def test_kv_bytes_agree_with_the_manifest() -> None:
    dims = ModelDims("LlamaForCausalLM", 100, 64, QWEN05.num_layers, 4, QWEN05.num_kv_heads,
                     QWEN05.head_dim, 128, QWEN05.max_seq, 1e4, 1e-5, True)
    for kv, dtype in KV.items():
        spec = KVSpec(dtype, scale_layout="per_token_per_head" if kv == "fp8" else None)
        assert kv_bytes_per_token(kv, QWEN05) == spec.bytes_per_token(dims)
    assert kv_bytes_per_token("fp16", QWEN05) == 12_288     # docs/benchmarks/kv-cache.md
    assert kv_bytes_per_token("fp8", QWEN05) == 6_528


@pytest.mark.parametrize("weights,shape", [("fp32", TINY), ("fp32", QWEN05), ("int4", QWEN05)])
def test_onnx_target_takes_fp16_within_the_budget(weights: str, shape: CacheShape) -> None:
    size = TINY_FP32 if shape is TINY else QWEN05_FP32 // (1 if weights == "fp32" else 6)
    c = choose_kv(size, weights, shape)
    assert (c.kv, c.chosen_by) == ("fp16", "auto")
    assert "no fused fp8 attention" in c.reason and "fp16 (fused graph)" in c.reason
    assert f"within the {DEFAULT_MEMORY_BUDGET_MB} MB budget" in c.reason
    assert f"max_seq {shape.max_seq} x 4 rows" in c.reason


def test_onnx_target_takes_fp8_where_fp16_would_not_fit() -> None:
    fp16 = peak_bytes(TINY_FP32, "fp32", "fp16", TINY, 4) >> 20
    c = choose_kv(TINY_FP32, "fp32", TINY, memory_budget_mb=fp16 - 1)
    assert c.kv == "fp8" and c.chosen_by == "auto"
    assert f"over the {fp16 - 1} MB budget" in c.reason and "still over" not in c.reason
    tiny = choose_kv(TINY_FP32, "fp32", TINY, memory_budget_mb=1)
    assert tiny.kv == "fp8" and "still over it" in tiny.reason


def test_the_cache_is_sized_by_rows_and_length() -> None:
    """What fits one row need not fit sixteen."""
    one = -(-peak_bytes(QWEN05_FP32, "fp32", "fp16", QWEN05, 1) >> 20)   # rounded up
    assert choose_kv(QWEN05_FP32, "fp32", QWEN05, max_batch=1, memory_budget_mb=one).kv == "fp16"
    c = choose_kv(QWEN05_FP32, "fp32", QWEN05, max_batch=16, memory_budget_mb=one)
    assert c.kv == "fp8" and "x 16 rows" in c.reason


@pytest.mark.parametrize("cc", [(8, 9), (9, 0), (10, 0), (11, 0)])
def test_trt_takes_fp8_from_compute_capability_8_9(cc: tuple[int, int]) -> None:
    c = choose_kv(QWEN05_FP32 // 2, "fp16", QWEN05, trt_cc=cc)
    assert c.kv == "fp8" and c.chosen_by == "auto"
    assert f"compute capability {cc[0]}.{cc[1]}" in c.reason and "fused attention" in c.reason


@pytest.mark.parametrize("cc", [(7, 5), (8, 6), (8, 7)])
def test_trt_below_8_9_takes_fp16_whatever_the_budget(cc: tuple[int, int]) -> None:
    c = choose_kv(QWEN05_FP32 // 2, "fp16", QWEN05, trt_cc=cc)
    assert c.kv == "fp16" and "has no FP8" in c.reason and "fused graph" not in c.reason
    squeezed = choose_kv(QWEN05_FP32 // 2, "fp16", QWEN05, trt_cc=cc, memory_budget_mb=1)
    assert squeezed.kv == "fp16" and "fp8 is not available" in squeezed.reason


def test_a_given_kv_is_kept_as_asked() -> None:
    assert flagged("fp8") == flagged("fp8", None)
    c = flagged("fp16", "Orin has no FP8: fp16 KV (--trt-kv-fallback fp16)")
    assert (c.kv, c.chosen_by) == ("fp16", "flag") and "Orin" in c.reason
    assert flagged("fp32").reason == "--kv fp32 as asked"


def test_weight_bytes_follow_the_precision(checkpoints: dict[str, tuple[Path, Any]]) -> None:
    from rung.export.checkpoint import load_checkpoint

    model = load_checkpoint(checkpoints["llama"][0], 64).model
    params = sum(p.numel() for p in model.parameters())
    assert weight_bytes(model, "fp32", None) == 4 * params
    assert weight_bytes(model, "fp16", None) == 2 * params
    int8 = weight_bytes(model, "int8", quant_spec("int8", None))
    int4 = weight_bytes(model, "int4", quant_spec("int4", None))
    assert int4 < int8 < 4 * params
    # the embedding table as 8-bit blocks of 32 (a byte and 5 bytes of scale and zero point
    # a block) where it used to stay float
    import dataclasses
    float_table = dataclasses.replace(quant_spec("int4", None), embeddings="fp32")
    n = model.model.embed_tokens.weight.numel()
    assert weight_bytes(model, "int4", float_table) - int4 == 3 * n - n // 32 * 5


def test_gates_dropped_only_where_fast_decoding_applies_within_the_budget() -> None:
    assert auto_gates(False, "fp32", True) == ("off", NO_GATES)
    cheap = {"mean_kl": 0.01, "greedy_agreement": 0.99}
    dear = {"mean_kl": 0.79, "greedy_agreement": 0.48}
    for weights, fused in [("fp32", True), ("fp32", False), ("fp16", False), ("int4", True),
                           ("int8", True)]:
        assert fast_without_gates(weights, fused)
        mode, reason = auto_gates(True, weights, fused, cheap, 0.05)
        assert mode == "off" and "within the budget 0.05" in reason, (weights, fused)
        mode, reason = auto_gates(True, weights, fused, dear, 0.05)
        assert mode == "trained" and "mean KL 0.79" in reason and "over the budget" in reason
        assert auto_gates(True, weights, fused, None)[0] == "trained"   # not measured
        assert auto_gates(True, weights, fused, dear, 1.0)[0] == "off"
    for weights in ("int8", "int4"):   # fast decoding is not exact there anyway
        assert not fast_without_gates(weights, False)
        mode, reason = auto_gates(True, weights, False, cheap, 0.05)
        assert mode == "trained" and "generic graph" in reason


# -- the export records the choice ---------------------------------------------------------
@pytest.mark.integration
def test_auto_kv_on_the_cpu_is_fp16_fused_and_says_why(checkpoints: dict[str, tuple[Path, Any]],
                                                        tmp_path: Path) -> None:
    m = export(checkpoints["llama"][0], tmp_path, ExportOptions(max_seq=64))
    assert m.kv.dtype == "float16" and m.kv.layout == HEAD_MAJOR
    assert m.kv.chosen_by == "auto" and m.kv.reason is not None
    assert "no fused fp8 attention" in m.kv.reason and "within the" in m.kv.reason
    assert m.ffn_skip == {"requested": "auto", "mode": "off", "reason": NO_GATES}
    assert load_manifest(tmp_path) == m


@pytest.mark.integration
def test_auto_kv_under_a_tiny_budget_is_fp8(checkpoints: dict[str, tuple[Path, Any]],
                                            tmp_path: Path) -> None:
    """A budget of 1 MiB, and a cache of 64 tokens x 256 rows that needs more at fp16."""
    squeezed = ExportOptions(max_seq=64, max_batch=256, memory_budget_mb=1)
    m = export(checkpoints["llama"][0], tmp_path, squeezed)
    assert KVSpec("float16").bytes_per_token(m.dims) * 64 * 256 > 1 << 20
    assert m.kv.dtype == "float8_e4m3fn" and m.kv.layout == KV_LAYOUT
    assert m.kv.chosen_by == "auto" and "x 256 rows, over the 1 MB budget" in str(m.kv.reason)
    assert m.kv.accuracy is not None   # measured against fp32 KV as an explicit fp8 is
    with pytest.raises(ExportError, match="--graph fused takes fp32/fp16 KV, but --kv auto "
                                          "needs fp8"):
        export(checkpoints["llama"][0], tmp_path / "fused",
               dataclasses.replace(squeezed, graph="fused"))


@pytest.mark.integration
def test_a_given_kv_is_recorded_as_given(checkpoints: dict[str, tuple[Path, Any]],
                                         tmp_path: Path) -> None:
    m = export(checkpoints["llama"][0], tmp_path, ExportOptions(kv="fp8", max_seq=64))
    assert m.kv.dtype == "float8_e4m3fn"
    assert (m.kv.chosen_by, m.kv.reason) == ("flag", "--kv fp8 as asked")


@pytest.mark.parametrize("opts,match", [
    (dict(kv="bf16"), "--kv bf16 is not available"),
    (dict(max_batch=0), "--max-batch 0 is too small"),
    (dict(memory_budget_mb=0), "--memory-budget-mb 0 must be positive"),
])
def test_bad_options_refused(opts: dict[str, Any], match: str, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=match):
        export(EDGE_TINY, tmp_path, ExportOptions(**opts))


@pytest.mark.slow
@pytest.mark.integration
def test_trained_gates_are_kept_where_dropping_them_costs_too_much(tmp_path: Path) -> None:
    """A checkpoint trained with gates: fp16 KV on the fused graph; its trained gates
    measured (dropping them costs far more than the budget) and kept, the reason recorded.
    Within a looser budget ``auto`` drops them; ``--ffn-skip off`` always does."""
    m = export(GATED, tmp_path / "default", ExportOptions(max_seq=256))
    assert m.kv.dtype == "float16" and m.kv.layout == HEAD_MAJOR
    assert m.ffn_gate == {"mode": "trained"} and m.ffn_skip is not None
    assert m.ffn_skip["requested"] == "auto" and m.ffn_skip["mode"] == "trained"
    assert "over the budget 0.05" in m.ffn_skip["reason"]
    assert any(t.name == "ffn_allow_skip" for t in m.inputs)
    loose = export(GATED, tmp_path / "loose",
                   ExportOptions(max_seq=256, quality_budget=5.0, verify=False))
    assert loose.ffn_gate is None and loose.ffn_skip is not None
    assert loose.ffn_skip["mode"] == "off" and "within the budget 5.0" in loose.ffn_skip["reason"]
    assert not any(t.name == "ffn_allow_skip" for t in loose.inputs)
    off = export(GATED, tmp_path / "off", ExportOptions(max_seq=256, ffn_skip="off",
                                                            verify=False))
    assert off.ffn_gate is None
    assert off.ffn_skip == {"requested": "off", "mode": "off", "reason": "--ffn-skip off as asked"}


@pytest.mark.integration
def test_the_demo_model_has_no_gates_its_engine_decodes_fast(tmp_path: Path) -> None:
    """The shipped model is trained without gates: its default engine has none to keep
    (no ``If`` per step), fp16 KV on the fused graph."""
    m = export(EDGE_TINY, tmp_path / "default", ExportOptions(max_seq=256, verify=False))
    assert m.kv.dtype == "float16" and m.kv.layout == HEAD_MAJOR
    assert m.ffn_gate is None
    assert not any(t.name == "ffn_allow_skip" for t in m.inputs)


@pytest.mark.slow
@pytest.mark.integration
def test_export_prints_the_choice_in_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(GATED), "-o", str(tmp_path / "e"), "--max-seq", "256",
                 "--max-batch", "2", "--memory-budget-mb", "64", "--no-verify"]) == 0
    out = capsys.readouterr().out.splitlines()
    kv = [line for line in out if line.startswith("KV cache")]
    assert len(kv) == 1 and kv[0].startswith("KV cache float16 (--kv auto): ")
    assert "max_seq 256 x 2 rows, within the 64 MB budget" in kv[0]
    gates = [line for line in out if line.startswith("FFN gates")]
    assert len(gates) == 1 and gates[0].startswith("FFN gates trained (--ffn-skip auto): ")
    raw = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert raw["kv"]["chosen_by"] == "auto" and raw["ffn_skip"]["mode"] == "trained"
    assert main(["export", str(EDGE_TINY), "-o", str(tmp_path / "f"), "--max-seq", "256",
                 "--memory-budget-mb", "1", "--no-verify"]) == 0
    assert "KV cache float8_e4m3fn (--kv auto)" in capsys.readouterr().out
