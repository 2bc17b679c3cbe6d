"""The KV cache codecs as the graph writes them, against references (ml_dtypes), and the
FP8 trap on the outlier model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import rung.export.model as model_mod
from rung.export.checkpoint import load_checkpoint
from rung.export.onnx_graph import IR_VERSION, KV_ONNX, OPSET, Builder, kv_load, kv_store
from rung.export.verify import logit_metrics

FP8 = ml_dtypes.float8_e4m3fn


def _codec_session(kv: str) -> ort.InferenceSession:
    """x [S,B,H,D] -> stored (+ scale) and the float view attention reads back."""
    g = Builder()
    back = kv_store(g, "x", kv, "stored")
    g.op("Identity", back, out="back")
    outs = [helper.make_tensor_value_info("stored", KV_ONNX[kv], None),
            helper.make_tensor_value_info("back", TensorProto.FLOAT, None)]
    if kv == "float8_e4m3fn":
        outs.append(helper.make_tensor_value_info("stored_scale", TensorProto.FLOAT, None))
    graph = helper.make_graph(g.nodes, "codec", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["S", "B", "H", "D"])], outs, initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = IR_VERSION
    return ort.InferenceSession(proto.SerializeToString())


def _vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (5, 2, 3, 16)).astype(np.float32)
    x[0, 0, 0] = 0.0                                   # an all-zero vector
    x[1, 0, 0, :4] = [1000.0, -1000.0, 3e-3, -7.5]     # beyond 448: scale takes it
    x[2, 1, 2] *= 1e-6                                 # tiny magnitudes
    x[3, 0, 1, 0] = 448.0 * 1.5
    return x


def test_fp8_round_trip_matches_ml_dtypes_reference() -> None:
    x = _vectors()
    stored, back, scale = _codec_session("float8_e4m3fn").run(None, {"x": x})
    assert stored.dtype == np.uint8 and scale.shape == (5, 2, 3)
    amax = np.abs(x).max(-1)
    ref_scale = np.maximum(amax / np.float32(448.0), np.float32(1e-30))
    np.testing.assert_array_equal(scale, ref_scale)
    # saturating cast: ml_dtypes gives NaN past 448, ONNX Cast saturates; clip the reference
    ratio = np.clip(x / ref_scale[..., None], -448, 448)
    ref_q = ratio.astype(FP8)
    np.testing.assert_array_equal(stored, ref_q.view(np.uint8))
    np.testing.assert_array_equal(back, ref_q.astype(np.float32) * ref_scale[..., None])
    assert not np.isnan(back).any()
    assert (back[0, 0, 0] == 0).all()                          # zeros stay zeros
    # every non-zero vector's largest element lands on +-448
    qmax = np.abs(stored.view(FP8).astype(np.float32)).max(-1)
    assert (qmax[amax > 0] == 448).all()
    np.testing.assert_allclose(back[1, 0, 0, :2], [1000.0, -1000.0], rtol=1e-6)
    nz = np.abs(x) > amax[..., None] / 64                      # inside e4m3's normal range
    assert (np.abs(back - x)[nz] <= np.abs(x)[nz] * 2.0 ** -4 + 1e-30).all()


def test_cast_saturates_at_448() -> None:
    g = Builder()
    g.op("Cast", g.op("Cast", "x", to=TensorProto.FLOAT8E4M3FN), to=TensorProto.FLOAT,
         out="y")
    graph = helper.make_graph(g.nodes, "sat", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N"])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = IR_VERSION
    x = np.array([448.0, 449.0, 1e6, -1e6, 0.0, -0.0], np.float32)
    (y,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, [448, 448, 448, -448, 0, 0])


def test_fp16_round_trip() -> None:
    x = _vectors()[1:]
    stored, back = _codec_session("float16").run(None, {"x": x})
    assert stored.dtype == np.float16
    np.testing.assert_array_equal(stored, x.astype(np.float16))
    np.testing.assert_array_equal(back, x.astype(np.float16).astype(np.float32))


def test_load_reads_what_store_wrote() -> None:
    g = Builder()
    g.op("Identity", kv_load(g, "past", "float8_e4m3fn"), out="y")
    graph = helper.make_graph(g.nodes, "load", [
        helper.make_tensor_value_info("past", TensorProto.FLOAT8E4M3FN, ["P", "B", "H", "D"]),
        helper.make_tensor_value_info("past_scale", TensorProto.FLOAT, ["P", "B", "H"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = IR_VERSION
    x = _vectors()
    stored, back, scale = _codec_session("float8_e4m3fn").run(None, {"x": x})
    past = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(stored, TensorProto.FLOAT8E4M3FN)
    (y,) = ort.InferenceSession(proto.SerializeToString()).run(
        None, {"past": past, "past_scale": scale})
    np.testing.assert_array_equal(y, back)


def _fixed_scale_round_trip(x: torch.Tensor, kv: str) -> torch.Tensor:
    """FP8 with a fixed scale of 1.0 (saturating), the configuration known to fail."""
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype)


def test_per_token_scales_survive_the_qwen2_outlier_trap(
        checkpoints: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_checkpoint(checkpoints["qwen2"][0], max_seq=128).model
    k_bias = model.model.layers[0].self_attn.k_proj.bias
    assert k_bias.abs().max() > 448  # the trap is armed
    ids = torch.tensor(np.random.default_rng(0).integers(5, 300, (8, 64)))
    with torch.no_grad():
        ref = model(ids).reshape(-1, 300).numpy()
        model.set_kv_dtype("float8_e4m3fn")
        per_token = logit_metrics(ref, model(ids).reshape(-1, 300).numpy())
        monkeypatch.setattr(model_mod, "kv_round_trip", _fixed_scale_round_trip)
        fixed = logit_metrics(ref, model(ids).reshape(-1, 300).numpy())
    assert per_token["mean_kl"] < 0.01 and per_token["greedy_agreement"] >= 0.9
    assert fixed["mean_kl"] > 5 * per_token["mean_kl"]
    assert fixed["greedy_agreement"] < per_token["greedy_agreement"] - 0.05
