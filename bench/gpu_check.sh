#!/usr/bin/env bash
# The GPU checks of issue 11 (TensorRT and CUDA engines), in one run on a machine with an
# NVIDIA GPU: the marked GPU tests, the CPU tests of the same code, then bench/gpu.py.
# Everything lands under $OUT (default ./gpu-results): env.txt, the test logs and JUnit
# files, gpu-<preset>.json/.md, summary.txt.
#
# Such a machine usually has no internet: nothing here downloads. The Python packages must
# be installed already, or carried as wheels: WHEELS=DIR installs DIR/*.whl with --no-index
# first. Needed: numpy, onnx, onnxruntime (or onnxruntime-gpu for the ONNX Runtime CUDA
# rows), tokenizers, jinja2, ml_dtypes, pyyaml, llguidance, jsonschema, zstandard, torch (the
# CPU build is enough) and safetensors, transformers and pytest for the tests' tiny
# checkpoints, tensorrt 10.x and cuda-python 12.x (docs/jetson.md).
#
#   OUT=/tmp/out bash bench/gpu_check.sh [python]   # under 10 minutes: each step has a
#                                                   # time limit, results are kept per row
set -u
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-python3}}
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

step() {  # step NAME SECONDS CMD...: run with a time limit, log, record the exit status
    local name=$1 limit=$2
    shift 2
    echo "== $name" | tee -a "$SUMMARY"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 3 "$OUT/$name.log" | sed 's/^/   /' >> "$SUMMARY"
    echo "   exit $rc" >> "$SUMMARY"
}

if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/*.whl \
        > "$OUT/wheels.log" 2>&1 || echo "wheel install failed: $OUT/wheels.log" >> "$SUMMARY"
fi
# rung itself from this checkout (no dependencies fetched)
"$PY" -c "import rung.engines" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1

{
    nvidia-smi || true
    "$PY" - <<'PY'
import importlib, platform
print("python", platform.python_version(), platform.machine())
for m in ("tensorrt", "onnxruntime", "numpy", "torch", "transformers"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "MISSING", e)
try:
    import onnxruntime
    print("ort providers", onnxruntime.get_available_providers())
    from rung.engines import gpu
    print("device", gpu.device_info(0))
except Exception as e:
    print("device probe failed:", e)
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >> "$SUMMARY"

step gpu-tests 240 "$PY" -m pytest -q -rs -m gpu tests/gpu --junitxml "$OUT/gpu-tests.xml"
step cpu-tests 90 "$PY" -m pytest -q -rs --junitxml "$OUT/cpu-tests.xml" \
    tests/export/test_trt_graph.py tests/export/test_trt_build.py \
    tests/engines/test_trt_engine.py tests/engines/test_kv_device.py tests/engines/test_gpu.py
step bench-tiny 60 "$PY" bench/gpu.py --preset demo-tiny --out "$OUT" --work "$OUT/work" \
    --prompt 64 --decode 32 --max-seq 256
step bench-0.5b 160 "$PY" bench/gpu.py --preset qwen2.5-0.5b --out "$OUT" \
    --work "$OUT/work" --prompt 128 --decode 64 --max-seq 1024 \
    --only "trt fp16/fp16kv,ort-cuda fp16/fp16kv,trt fp32/fp8kv"
rm -rf "$OUT/work"   # checkpoints and engines: gigabytes, not results
cat "$SUMMARY"
