"""The TensorRT engine: the plan built by ``rung export --target trt``, KV in GPU memory.

One CUDA stream, one execution context per optimization profile of the plan (``decode``:
one new token per row; ``prefill``: up to ``prefill_chunk`` tokens), sharing the stream so
that steps never overlap. The graph and its semantics are the ONNX engine's (I/O table in
engines/manifest.py): ``forward`` takes and returns host arrays, the KV stays on the device
(``DeviceKVCache``), past inputs are the cache buffers' own addresses and new positions are
copied to each row's offset on the device. With one row whose new positions fit, the plan
writes them straight into the cache. Prompts longer than a chunk run as successive chunks.

``tensorrt`` and ``cuda`` are imported when an engine is constructed, never at import time.
Untested without a GPU, except the refusals and the chunk plan (a pure function).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rung.engines import gpu
from rung.engines.errors import EngineError
from rung.engines.kv_device import DeviceKVCache
from rung.engines.manifest import KV_LAYOUT, Manifest

IO_ALIGN = 256  # bytes: the alignment TensorRT asks of I/O tensor addresses
# TensorRT DataType names of the KV dtypes the manifest may name
TRT_KV = {"float32": "FLOAT", "float16": "HALF", "float8_e4m3fn": "FP8"}


@dataclass(frozen=True)
class TrtOptions:
    """``device``: the CUDA device index (CUDA_VISIBLE_DEVICES applies first)."""

    device: int = 0


@dataclass(frozen=True)
class Chunk:
    """One call of a long prefill: new tokens ``[start, start + width)`` of every row."""

    start: int
    width: int
    n_new: np.ndarray          # [B] valid tokens of each row inside this chunk
    logits_index: np.ndarray   # [B, K] indices into the chunk (0 where outside)
    inside: np.ndarray         # [B, K] which requested positions this chunk scores


def chunk_plan(s: int, chunk: int, n_new: np.ndarray, logits_index: np.ndarray) -> list[Chunk]:
    """Split a step of ``s`` new tokens into calls of at most ``chunk`` tokens; each requested
    logit is taken from the call whose tokens hold its position."""
    plan = []
    for start in range(0, s, chunk):
        width = min(chunk, s - start)
        local = logits_index - start
        inside = (local >= 0) & (local < width)
        plan.append(Chunk(start, width, np.clip(n_new - start, 0, width).astype(np.int64),
                          np.where(inside, local, 0).astype(np.int64), inside))
    return plan


def import_tensorrt() -> Any:
    try:
        import tensorrt as trt
    except ImportError as e:
        raise EngineError("the TensorRT backend needs the tensorrt Python package, which is "
                          "not installed", gpu.INSTALL_HINT) from e
    return trt


class TrtEngine:
    """Runs a TensorRT plan; the caller owns ``DeviceKVCache`` objects made by ``new_cache``."""

    backend = "trt"

    def __init__(self, engine_dir: Path, manifest: Manifest,
                 options: TrtOptions | None = None) -> None:
        options = options or TrtOptions()
        plan = manifest.trt
        if plan is None:
            raise EngineError(f"{engine_dir}: the engine has no TensorRT plan",
                              "export it with `rung export ... --target trt` on the GPU box")
        if manifest.kv.layout != KV_LAYOUT:
            raise EngineError(f"{engine_dir}: TensorRT plans read the {KV_LAYOUT} KV layout, "
                              f"not {manifest.kv.layout}", "re-export with --target trt")
        self.manifest, self.dims, self.plan = manifest, manifest.dims, plan
        trt = import_tensorrt()
        gpu.set_device(options.device)
        self._check_device(trt, options.device)
        self.stream = gpu.new_stream()
        self.engine = self._deserialize(trt, Path(engine_dir) / plan.plan_file)
        self.contexts = self._contexts(list(plan.profiles))
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names
                       if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dynamic = {n for n in self.inputs if -1 in tuple(self.engine.get_tensor_shape(n))}
        self.itemsize = {n: int(self.engine.get_tensor_dtype(n).itemsize) for n in names}
        self.host_dtype = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n)))
                           for n in self.inputs if not n.startswith("past_")}
        self._check_kv_dtype(trt)
        self.scratch: dict[str, tuple[int, int]] = {}   # name -> (address, capacity)
        gated = "ffn_skipped" in self.outputs
        self.ffn_steps = 0
        self.ffn_skips: np.ndarray | None = (
            np.zeros(self.dims.num_layers, np.int64) if gated else None)

    # -- loading -----------------------------------------------------------------------
    def _check_device(self, trt: Any, device: int) -> None:
        """A plan runs only on the GPU architecture and TensorRT version it was built for."""
        name, cc = gpu.device_info(device)
        built = self.plan.compute_capability
        if f"{cc[0]}.{cc[1]}" != built or trt.__version__ != self.plan.tensorrt_version:
            raise EngineError(
                f"the TensorRT plan was built for compute capability {built} with TensorRT "
                f"{self.plan.tensorrt_version}; this is {name} ({cc[0]}.{cc[1]}) with "
                f"TensorRT {trt.__version__}", "rebuild it here: rung export ... --target trt")

    def _deserialize(self, trt: Any, path: Path) -> Any:
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise EngineError(f"{path}: TensorRT cannot deserialize the plan (the log above "
                              "says why)", "rebuild it: rung export ... --target trt")
        return engine

    def _contexts(self, profiles: list[str]) -> dict[str, Any]:
        """One execution context per optimization profile, each bound to its profile."""
        contexts = {}
        for index, name in enumerate(profiles):
            ctx = self.engine.create_execution_context()
            if ctx is None:
                raise EngineError("TensorRT cannot create an execution context (GPU memory?)")
            if index and not ctx.set_optimization_profile_async(index, int(self.stream)):
                raise EngineError(f"TensorRT refused optimization profile {index} ({name})")
            contexts[name] = ctx
        gpu.sync(self.stream)
        return contexts

    def _check_kv_dtype(self, trt: Any) -> None:
        got = self.engine.get_tensor_dtype("past_key_0")
        want = getattr(trt.DataType, TRT_KV.get(self.manifest.kv.dtype, "FLOAT"))
        if got != want:
            raise EngineError(f"the plan's KV input is {got}, the manifest says "
                              f"{self.manifest.kv.dtype}", "rebuild the plan: --target trt")

    # -- the Engine protocol -------------------------------------------------------------
    def new_cache(self, batch: int, max_seq: int | None = None) -> DeviceKVCache:
        """Allocate KV buffers for ``batch`` sequences in GPU memory."""
        if batch > self.plan.max_batch:
            raise EngineError(f"batch {batch} exceeds the plan's max batch "
                              f"{self.plan.max_batch}", "lower engine.max_batch or re-export "
                              f"with --trt-max-batch {batch}")
        d = self.dims
        seq = min(max_seq or d.max_seq, d.max_seq)
        return DeviceKVCache(d.num_layers, batch, seq, d.num_kv_heads, d.head_dim,
                             self.manifest.kv.dtype, self.stream)

    def forward(self, cache: DeviceKVCache, tokens: np.ndarray, n_new: np.ndarray,
                logits_index: np.ndarray | None = None,
                allow_skip: bool = False) -> np.ndarray:
        """Run new tokens and append their KV to ``cache``; the semantics of
        ``OnnxEngine.forward`` (tokens [B, S] right-padded, n_new [B], logits_index [B, K],
        returns logits [B, K, V] float32)."""
        if not isinstance(cache, DeviceKVCache):
            raise EngineError("the TensorRT engine runs on its own device caches",
                              "allocate the cache with new_cache()")
        b, s = tokens.shape
        if b != cache.batch:
            raise EngineError(f"batch {b} does not match the cache's {cache.batch}")
        n_new = np.asarray(n_new, dtype=np.int64)
        if logits_index is None:
            logits_index = np.maximum(n_new - 1, 0)[:, None]
        logits_index = np.asarray(logits_index, dtype=np.int64)
        if int((cache.lengths + n_new).max()) > cache.max_seq:
            raise EngineError(f"sequence would exceed max_seq {cache.max_seq}",
                              "shorten the prompt or max_tokens")
        if s <= self.plan.prefill_chunk:
            return self._step(cache, tokens, n_new, logits_index, allow_skip)
        out = np.zeros((*logits_index.shape, self.dims.vocab_size), np.float32)
        for c in chunk_plan(s, self.plan.prefill_chunk, n_new, logits_index):
            part = self._step(cache, tokens[:, c.start:c.start + c.width], c.n_new,
                              c.logits_index, False)
            out = np.where(c.inside[..., None], part, out)
        return out

    # -- one call of the plan ------------------------------------------------------------
    def _step(self, cache: DeviceKVCache, tokens: np.ndarray, n_new: np.ndarray,
              logits_index: np.ndarray, allow_skip: bool) -> np.ndarray:
        b, s = tokens.shape
        ctx = self.contexts["decode" if s == 1 and logits_index.shape[1] == 1 else "prefill"]
        # padded positions past a row's end are never stored; keep them inside the RoPE table
        positions = np.minimum(cache.lengths[:, None] + np.arange(s, dtype=np.int64),
                               self.dims.max_seq - 1)
        host = {"input_ids": tokens, "position_ids": positions,
                "past_lengths": cache.lengths.copy(), "logits_index": logits_index}
        if self.ffn_skips is not None:
            host["ffn_allow_skip"] = np.array(allow_skip)
        held = [self._bind_host(ctx, name, arr) for name, arr in host.items()]
        p = cache.past_len()
        for name, (shape, _) in cache.specs.items():
            ctx.set_input_shape(f"past_{name}", (p, b, *shape))
            ctx.set_tensor_address(f"past_{name}", cache.ptrs[name])
        start = int(cache.lengths[0])
        # one row whose padded chunk fits after a non-empty past: the plan writes its new
        # positions into the cache itself (an empty past would alias the P = 1 past input;
        # TensorRT wants I/O addresses aligned to 256 bytes)
        direct = b == 1 and start >= 1 and start + s <= cache.max_seq and all(
            cache.position_ptr(name, 0, start) % IO_ALIGN == 0 for name in cache.specs)
        new: dict[str, int] = {}
        for name in self.outputs:
            shape = tuple(ctx.get_tensor_shape(name))
            if direct and name.startswith("new_"):
                address = cache.position_ptr(name[4:], 0, start)
            else:
                address = self._buffer(name, int(np.prod(shape)) * self.itemsize[name])
            ctx.set_tensor_address(name, address)
            if name.startswith("new_"):
                new[name[4:]] = address
        if not ctx.execute_async_v3(int(self.stream)):
            raise EngineError(f"TensorRT failed on a step of {b}x{s} tokens")
        logits = np.empty(tuple(ctx.get_tensor_shape("logits")), np.float32)
        gpu.d2h(logits, self.scratch["logits"][0], self.stream)
        if direct:
            cache.advance(n_new)
        else:
            cache.append_from(new, n_new)
        skipped = None
        if self.ffn_skips is not None:
            skipped = np.empty(self.dims.num_layers, np.bool_)
            gpu.d2h(skipped, self.scratch["ffn_skipped"][0], self.stream)
        gpu.sync(self.stream)
        del held
        if self.ffn_skips is not None and skipped is not None and allow_skip and b * s == 1:
            self.ffn_steps += 1
            self.ffn_skips += skipped
        return logits

    def _bind_host(self, ctx: Any, name: str, arr: np.ndarray) -> np.ndarray:
        """Copy a host input to its device buffer and bind it; returns the host array, which
        must stay alive until the stream is synchronized."""
        arr = np.ascontiguousarray(arr, dtype=self.host_dtype[name])
        if name in self.dynamic:
            ctx.set_input_shape(name, arr.shape)
        address = self._buffer(name, arr.nbytes)
        gpu.h2d(address, arr, self.stream)
        ctx.set_tensor_address(name, address)
        return arr

    def _buffer(self, name: str, nbytes: int) -> int:
        """A device buffer of at least ``nbytes`` for I/O tensor ``name``, grown on demand
        (every step ends with a stream sync, so no copy still uses the old one)."""
        address, capacity = self.scratch.get(name, (0, 0))
        if nbytes > capacity:
            if address:
                gpu.free(address)
            capacity = max(nbytes, 2 * capacity)
            address = gpu.malloc(capacity)
            self.scratch[name] = (address, capacity)
        return address

    def close(self) -> None:
        """Free the I/O buffers (caches free their own)."""
        scratch, self.scratch = self.scratch, {}
        for address, _ in scratch.values():
            gpu.free(address)



if TYPE_CHECKING:   # mypy checks that the class is an Engine over device KV buffers
    from rung.engines import Engine

    def _conforms(engine: TrtEngine) -> Engine[DeviceKVCache]:
        return engine
