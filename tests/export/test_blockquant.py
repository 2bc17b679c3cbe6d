"""Blockwise quantization (export/blockquant.py): the codes ONNX Runtime's MatMulNBits runs
are the weights the exporter meant, at every bit width, block size and zero-point layout."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rung.export.blockquant import concat, quantize
from rung.export.quantize import dequantize


def _run_matmulnbits(x: np.ndarray, w: np.ndarray, bits: int, block: int,
                     symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Runtime's MatMulNBits (accuracy level 0: float activations) on ``w`` quantized;
    returns (its output, x @ the dequantized weight)."""
    q = quantize(w, bits, block, symmetric)
    packed, scales, zero = q.matmulnbits()
    n, k = w.shape
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")]
    inputs = ["A", "B", "S"]
    if zero is not None:
        inits.append(numpy_helper.from_array(zero, "Z"))
        inputs.append("Z")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block, accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "A", TensorProto.FLOAT, ["M", k])], [helper.make_tensor_value_info(
            "Y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": x})[0], x @ q.dequantize().T


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("symmetric", [True, False])
def test_onnx_runtime_computes_the_dequantized_weight(bits: int, block: int,
                                                      symmetric: bool) -> None:
    rng = np.random.default_rng(bits * block)
    # K = 288: 9 blocks of 32 (an odd count: zero points padded per row), 4.5 of 64
    w = (rng.standard_normal((48, 288)) * 0.05 + 0.02).astype(np.float32)
    x = rng.standard_normal((3, 288)).astype(np.float32)
    got, want = _run_matmulnbits(x, w, bits, block, symmetric)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_packed_layout_reads_back() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((20, 96)).astype(np.float32)
    for bits, symmetric in ((4, False), (4, True), (8, False)):
        q = quantize(w, bits, 32, symmetric)
        packed, scales, zero = q.matmulnbits()
        back = dequantize(packed, scales, bits, 96, 20, 32, zero)
        np.testing.assert_array_equal(back, q.dequantize())


def test_asymmetric_blocks_fit_one_sided_weights() -> None:
    """Weights that lean to one side waste half of a symmetric grid."""
    rng = np.random.default_rng(2)
    w = np.abs(rng.standard_normal((64, 256))).astype(np.float32)
    err = {sym: float(np.sqrt(((quantize(w, 4, 32, sym).dequantize() - w) ** 2).mean()))
           for sym in (True, False)}
    assert err[False] < 0.6 * err[True], err


def test_importance_moves_the_error_to_unimportant_channels() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    imp = np.ones(64, np.float32)
    imp[:8] = 100.0  # eight channels carry most of the signal
    plain = quantize(w, 4, 32, False).dequantize() - w
    weighted = quantize(w, 4, 32, False, importance=imp).dequantize() - w
    assert (weighted[:, :8] ** 2).mean() < 0.8 * (plain[:, :8] ** 2).mean()
    assert (imp * weighted ** 2).sum() < (imp * plain ** 2).sum()


def test_search_beats_the_range_scale() -> None:
    """The searched scale is never worse than range / levels (one of its candidates)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    searched = quantize(w, 4, 32, False).dequantize()
    single = quantize(w, 4, 32, False, candidates=1).dequantize()
    assert ((searched - w) ** 2).sum() < ((single - w) ** 2).sum()


def test_concat_stacks_rows() -> None:
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((n, 64)).astype(np.float32) for n in (6, 10))
    both = concat([quantize(a, 4, 32), quantize(b, 4, 32)])
    np.testing.assert_array_equal(both.dequantize(),
                                  np.concatenate([quantize(a, 4, 32).dequantize(),
                                                  quantize(b, 4, 32).dequantize()]))
