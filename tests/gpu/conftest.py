"""GPU tests: TensorRT plans and ONNX Runtime's CUDA provider against the CPU engine.

Every test here is marked ``gpu`` and skipped, with the reason, where TensorRT, cuda-python
or an NVIDIA GPU is missing (ONNX Runtime's CUDA tests: where its CUDA provider is). A GPU
box runs them with bench/gpu_check.sh.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from rung.engines.errors import EngineError


def trt_missing() -> str | None:
    """Why the TensorRT tests cannot run here, or None."""
    if importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed"
    try:
        from rung.engines import gpu

        gpu.device_info(0)
    except EngineError as e:
        return str(e)
    return None


def ort_cuda_missing() -> str | None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "ONNX Runtime has no CUDAExecutionProvider (onnxruntime-gpu not installed)"
    return None


def compute_capability() -> tuple[int, int]:
    from rung.engines import gpu

    return gpu.device_info(0)[1]


@pytest.fixture(scope="session")
def trt_export(checkpoints: dict[str, tuple[Path, Any]],
               tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``(arch, weights, kv, max_seq=128, chunk=16) -> engine dir`` with a plan, built once per
    combination (fp8 falls back to fp16 KV below compute capability 8.9)."""
    from rung.export.exporter import ExportOptions
    from rung.export.trt_build import TrtBuildOptions, export_trt

    built: dict[tuple[str, str, str], Path] = {}

    def make(arch: str = "qwen2", weights: str = "fp16", kv: str = "fp16") -> Path:
        key = (arch, weights, kv)
        if key not in built:
            out = tmp_path_factory.mktemp(f"trt-{arch}-{weights}-{kv}")
            export_trt(checkpoints[arch][0], out,
                       ExportOptions(weights=weights, kv=kv, max_seq=128),
                       TrtBuildOptions(max_batch=4, prefill_chunk=16, kv_fallback="fp16"))
            built[key] = out
        return built[key]

    return make
