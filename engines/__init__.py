"""rung's runtime: engine backends behind one small interface, chosen by name.

Backends are imported lazily from ``BACKENDS`` so a CPU-only install never imports a GPU
runtime, and nothing here imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from rung.engines.errors import EngineError
from rung.engines.manifest import Manifest, check_artifacts, load_manifest

# the engine's share of memory (MiB) unless configured (engine.memory_budget_mb): the budget
# `rung export --memory-budget-mb` assumes by default (export/defaults.py, the same number;
# tests/engines/test_packing_budget.py keeps them equal); the ONNX engine packs float
# weights only where its estimated peak fits it (onnx_engine.choose_packing)
DEFAULT_MEMORY_BUDGET_MB = 4096


class KVBuffers(Protocol):
    """The KV buffers of ``batch`` rows an engine decodes in, in host memory
    (``kv.KVCache``) or device memory (``kv_device.DeviceKVCache``). What the decode loop
    and the cold tier use: how much each row holds, the operations that alone change it
    (``kv.RowLengths``), and its blocks in the cold tier's format."""

    batch: int
    max_seq: int

    @property
    def lengths(self) -> np.ndarray: ...   # [batch] int64, read-only: positions each row holds

    def advance(self, n_new: np.ndarray) -> None: ...

    def rollback(self, rows: int | np.ndarray, k: int = 1) -> None: ...

    def truncate(self, row: int, n: int) -> None: ...

    def reset(self, row: int) -> None: ...

    def restore(self, row: int, n: int) -> None: ...

    @property
    def nbytes(self) -> int: ...

    def read_block(self, row: int, start: int, n: int) -> dict[str, np.ndarray]: ...

    def write_block(self, row: int, start: int, arrays: Mapping[str, np.ndarray]) -> None: ...


C = TypeVar("C", bound=KVBuffers)


class Engine(Protocol[C]):
    """A decoder that appends to KV buffers it allocates (``C``: its own kind of them).

    ``forward(cache, tokens [B, S], n_new [B], logits_index [B, K] | None) -> logits
    [B, K, V]``: runs the new tokens of each row against the row's cached past, writes their
    KV into ``cache`` in place and returns the logits at the requested positions (default:
    each row's last valid new token). ``allow_skip`` marks a decode step: an engine exported
    with FFN gates may then skip FFNs (one token of one sequence only) and counts, over such
    steps, how often each layer did.

    Raises:
        EngineError: shapes do not match, the cache is full, the runtime fails.
    """

    backend: str
    manifest: Manifest
    ffn_steps: int                  # one-token steps run (where FFN gates may skip)
    ffn_skips: np.ndarray | None    # [layers] FFN skips among them; None = no gates

    def new_cache(self, batch: int, max_seq: int | None = None) -> C: ...

    def forward(self, cache: C, tokens: np.ndarray, n_new: np.ndarray,
                logits_index: np.ndarray | None = None,
                allow_skip: bool = False) -> np.ndarray: ...


AnyEngine = Engine[Any]   # a loaded engine, whichever backend (its buffers are KVBuffers)


# backend name -> "module:factory"; factories take (engine_dir, manifest, options)
BACKENDS: dict[str, str] = {
    "onnx": "rung.engines.onnx_engine:OnnxEngine",
    "trt": "rung.engines.trt_engine:TrtEngine",   # a plan from `rung export --target trt`
}


def load_engine(engine_dir: Path, backend: str = "onnx", options: Any = None) -> AnyEngine:
    """Read the manifest and construct the named backend. The artifacts' digests are
    checked while the backend loads (the hash runs on its own threads, the GIL released;
    both read the same pages): a corrupt or modified file raises ``ManifestError`` and the
    engine built from it is dropped unused."""
    if backend not in BACKENDS:
        raise EngineError(f"unknown engine backend {backend!r}",
                          f"choose one of {', '.join(BACKENDS)}")
    engine_dir = Path(engine_dir)
    manifest = load_manifest(engine_dir, verify_artifacts=False)
    module, _, factory = BACKENDS[backend].partition(":")
    with ThreadPoolExecutor(1, thread_name_prefix="rung-verify") as pool:
        checked = pool.submit(check_artifacts, engine_dir, manifest)
        try:
            cls = getattr(importlib.import_module(module), factory)
            engine: AnyEngine = cls(engine_dir, manifest, options)
        except Exception:
            checked.result()   # a corrupt file is the cause to report, where it is one
            raise
        checked.result()
    return engine


def engine_options(backend: str, provider: str | None = None, threads: int = 0,
                   prepack: bool | None = None, max_batch: int = 1,
                   decode: str = "plain", load_parts: int = 0,
                   memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB) -> Any:
    """The options of ``backend``: ONNX Runtime's (``provider`` cpu by default; cuda only
    where ONNX Runtime has its CUDA execution provider) or TensorRT's.

    Raises:
        EngineError: an unknown backend, a provider with the TensorRT backend, or provider
            cuda without ONNX Runtime's CUDA execution provider.
    """
    if backend not in BACKENDS:
        raise EngineError(f"unknown engine backend {backend!r}",
                          f"choose one of {', '.join(BACKENDS)}")
    if backend == "trt":
        if provider is not None:
            raise EngineError("an execution provider applies to the onnx backend only",
                              "drop the provider: TensorRT always runs on the GPU")
        from rung.engines.trt_engine import TrtOptions
        return TrtOptions()
    if provider == "cuda":
        from rung.engines.gpu import require_ort_cuda
        require_ort_cuda()
    from rung.engines.onnx_engine import EngineOptions
    return EngineOptions(provider=provider or "cpu", threads=threads, prepack=prepack,
                         max_batch=max_batch, decode=decode, load_parts=load_parts,
                         memory_budget_mb=memory_budget_mb)
