"""CUDA from Python without torch: cuda-python's runtime bindings, imported on first use.

The TensorRT engine and its device KV cache allocate, copy and synchronize through these
few functions; every CUDA call goes through ``_call``, which turns a CUDA error into an
``EngineError``. Nothing imports this module on the CPU path, and this module imports
``cuda`` only inside ``runtime()``. ``require_ort_cuda`` checks ONNX Runtime's CUDA
execution provider (the second GPU path) and needs no cuda-python.

Untested without a GPU, except where cuda-python or the CUDA provider is missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rung.engines.errors import EngineError

INSTALL_HINT = ("pip install 'rung[trt]' (x86-64); on Jetson install JetPack's TensorRT "
                "(python3-libnvinfer) and pip install cuda-python for its CUDA (docs/jetson.md)")
_RT: Any = None


def runtime() -> Any:
    """cuda-python's runtime module (``cudart``), imported once."""
    global _RT
    if _RT is None:
        try:
            from cuda.bindings import runtime as rt
        except ImportError:
            try:  # cuda-python before 12.6 (the module moved)
                from cuda import cudart as rt
            except ImportError as e:
                raise EngineError("the GPU path needs cuda-python, which is not installed",
                                  INSTALL_HINT) from e
        _RT = rt
    return _RT


def _call(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(error, *values)`` tuple, raising on an error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise EngineError(f"CUDA {what} failed: {err}",
                          "check the GPU with nvidia-smi (tegrastats on Jetson) and the "
                          "service's device access (systemd/rung.service)")
    return values[0] if len(values) == 1 else tuple(values) or None


def device_info(device: int = 0) -> tuple[str, tuple[int, int]]:
    """(name, compute capability) of CUDA device ``device``.

    Raises:
        EngineError: cuda-python missing, no CUDA device visible, or no such device.
    """
    rt = runtime()
    try:
        count = _call(rt.cudaGetDeviceCount(), "device count")
    except EngineError as e:
        raise EngineError(f"no CUDA GPU is visible ({e.message})",
                          "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES") from None
    if not 0 <= device < count:
        raise EngineError(f"CUDA device {device} does not exist ({count} visible)")
    prop = _call(rt.cudaGetDeviceProperties(device), "device properties")
    name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
    return name.rstrip("\x00"), (int(prop.major), int(prop.minor))


def set_device(device: int) -> None:
    _call(runtime().cudaSetDevice(device), "set device")


def new_stream() -> Any:
    return _call(runtime().cudaStreamCreate(), "stream creation")


def sync(stream: Any) -> None:
    _call(runtime().cudaStreamSynchronize(stream), "stream synchronize")


def malloc(nbytes: int) -> int:
    """Device memory of ``nbytes`` (at least one byte), as an integer address."""
    return int(_call(runtime().cudaMalloc(max(nbytes, 1)), f"allocation of {nbytes} bytes"))


def free(ptr: int) -> None:
    _call(runtime().cudaFree(ptr), "free")


def memset(ptr: int, nbytes: int, stream: Any) -> None:
    _call(runtime().cudaMemsetAsync(ptr, 0, nbytes, stream), "memset")


def h2d(dst: int, src: np.ndarray, stream: Any) -> None:
    """Copy a host array to device memory (``src`` must stay alive until ``sync``)."""
    rt = runtime()
    src = np.ascontiguousarray(src)
    _call(rt.cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes,
                             rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "copy to GPU")


def d2h(dst: np.ndarray, src: int, stream: Any) -> None:
    """Copy device memory into a contiguous host array (complete once ``sync`` returns)."""
    rt = runtime()
    _call(rt.cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes,
                             rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream), "copy to host")


def copy_2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
            kind: str, stream: Any) -> None:
    """``height`` rows of ``width`` bytes, rows ``*_pitch`` bytes apart on each side; ``kind``
    is ``h2d``, ``d2h`` or ``d2d``."""
    rt = runtime()
    kinds = {"h2d": rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
             "d2h": rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
             "d2d": rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice}
    _call(rt.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, kinds[kind],
                               stream), f"2D copy ({kind})")


def require_ort_cuda() -> None:
    """Refuse ``provider: cuda`` where ONNX Runtime has no CUDA execution provider (it would
    otherwise fall back to the CPU with only a warning).

    Raises:
        EngineError: naming the providers this ONNX Runtime has.
    """
    import onnxruntime as ort

    have = ort.get_available_providers()
    if "CUDAExecutionProvider" not in have:
        raise EngineError(
            "provider cuda: this ONNX Runtime has no CUDAExecutionProvider (it has "
            f"{', '.join(have)})",
            "replace the onnxruntime package by onnxruntime-gpu of the same version "
            "(docs/jetson.md), or use provider cpu")
