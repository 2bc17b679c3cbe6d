"""What a row costs in ONNX Runtime's 4-bit ``MatMulNBits`` as the rows of a step grow.

    cd bench && ../.venv/bin/python nbits_rows.py [--k 896] [--n 9728] [--tag NAME]

Drafts are checked in the step that feeds a row's last token, so each draft is one more
row through every weight matrix. One ``MatMul`` of a random [K, N] fp32 weight, quantized
by ONNX Runtime's own ``MatMulNBitsQuantizer`` as rung's int4 export does (4 bits, block
32, asymmetric, accuracy level 4: int8 activations), run on 1, 2, 4, 9, 16 and 64 rows
with 1 and 2 intra-op threads (weights packed at load, as the engine loads them); the
median of 40 runs after 5. A kernel that unpacked the weights once per step would make a
row cheaper the more rows share a step; the per-row figures show whether it does (an
fp32 ``MatMul`` of the same shape beside it, its weights packed at load, for comparison).
Default shape: the 0.5B bench model's FFN up+gate (896 x 9,728). Writes
``bench/results/<date>-nbits-rows.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import report
from machine import machine_info
from onnx import TensorProto, helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

RESULTS = Path(__file__).resolve().parent / "results"
ROWS = (1, 2, 4, 9, 16, 64)


def fp32(k: int, n: int) -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.02
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [onnx.numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def quantized(k: int, n: int) -> onnx.ModelProto:
    q = MatMulNBitsQuantizer(fp32(k, n), block_size=32, is_symmetric=False,
                             accuracy_level=4, bits=4)
    q.process()
    return q.model.model


def measure(model: onnx.ModelProto, k: int, threads: int) -> dict[int, float]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), so)
    rng = np.random.default_rng(1)
    out: dict[int, float] = {}
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        for _ in range(5):
            session.run(None, {"x": x})
        times = []
        for _ in range(40):
            t = time.perf_counter()
            session.run(None, {"x": x})
            times.append((time.perf_counter() - t) * 1e3)
        out[m] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=896)
    ap.add_argument("--n", type=int, default=9728)
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    args = ap.parse_args(argv)
    logging.disable(logging.INFO)   # the quantizer's progress lines
    int4, reference = quantized(args.k, args.n), fp32(args.k, args.n)
    results = {f"int4, {threads} thread{'s' if threads > 1 else ''}": measure(int4, args.k, threads)
               for threads in (1, 2)}
    # a kernel that shares the unpacked weights across rows, for comparison: fp32 MatMul,
    # its weights packed at load (8x the bytes of int4)
    results["fp32 reference, 2 threads"] = measure(reference, args.k, 2)
    stamp = time.strftime("%Y-%m-%d") + "-nbits-rows" + (f"-{args.tag}" if args.tag else "")
    record: dict[str, Any] = {
        "stamp": stamp, "command": shlex.join(["python", *sys.orig_argv[1:]]),
        "machine": machine_info(), "k": args.k, "n": args.n, "onnxruntime": ort.__version__,
        "results": {t: {str(m): ms for m, ms in r.items()} for t, r in results.items()}}
    lines = [f"# MatMulNBits by rows {stamp} ({args.k} x {args.n}, int4, block 32, "
             "accuracy level 4)", "", f"Command: `{record['command']}`", "",
             *report.by_size("weights, threads", lambda m: f"{m} row{'s' if m > 1 else ''}",
                             ROWS, results,
                             lambda ms, m: f"{ms[m]:.3f} ms ({ms[m] / m:.3f} a row)")]
    report.publish(RESULTS, record, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
