"""The hot KV cache: preallocated per-layer buffers the engine reads and writes in place.

Two layouts, named in the manifest (``KVSpec.layout``):

- position-major (``position_major_SBHD``, the generic graph): K and V are
  ``[max_seq, B, Hkv, D]`` in the cache dtype (fp8 stored as its raw bytes, ``uint8``), and
  an fp8 cache adds one float32 scale per token and KV head, ``[max_seq, B, Hkv]``. The
  first P positions of every buffer are one contiguous block, so the graph's ``past``
  inputs are views, never copies; new positions are written (``append``) at each row's own
  offset.
- head-major (``head_major_BHSD``, the fused graph): K and V are ``[B, Hkv, max_seq, D]``,
  float32 or float16, handed whole to the graph, whose attention kernel appends to them in
  place; the engine only moves ``lengths``. A row is the contiguous block ``[b:b + 1]``.

Either way a block of positions of one row leaves and enters the cache in one format,
``[n, Hkv, D]`` per buffer (``read_block``/``write_block``): the cold tier never sees the
layout.

Buffer names are the graph's input/output names without their ``past_`` / ``new_``
prefix: ``key_{i}``, ``value_{i}``, and for fp8 ``key_{i}_scale``, ``value_{i}_scale``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rung.engines.errors import EngineError
from rung.engines.manifest import HEAD_MAJOR, KV_LAYOUT

# cache dtype -> numpy storage dtype
STORAGE: dict[str, type[np.generic]] = {
    "float32": np.float32, "float16": np.float16, "float8_e4m3fn": np.uint8}
SCALED = ("float8_e4m3fn",)


class KVCache:
    """KV buffers for ``batch`` sequences of up to ``max_seq`` tokens each."""

    def __init__(self, num_layers: int, batch: int, max_seq: int, kv_heads: int,
                 head_dim: int, dtype: str = "float32", layout: str = KV_LAYOUT) -> None:
        if dtype not in STORAGE:
            raise EngineError(f"KV dtype {dtype!r} is not supported by this engine",
                              f"supported: {', '.join(STORAGE)}")
        if layout not in (KV_LAYOUT, HEAD_MAJOR) or (layout == HEAD_MAJOR and dtype in SCALED):
            raise EngineError(f"KV layout {layout!r} with {dtype} is not supported by this "
                              "engine", "re-export the engine with this version of rung")
        self.dtype = dtype
        self.layout = layout
        self.head_major = layout == HEAD_MAJOR
        self.max_seq = max_seq
        self.batch = batch
        self.num_layers = num_layers
        self.lengths = np.zeros(batch, np.int64)
        self.buffers: dict[str, np.ndarray] = {}
        for i in range(num_layers):
            for part in ("key", "value"):
                shape = ((batch, kv_heads, max_seq, head_dim) if self.head_major
                         else (max_seq, batch, kv_heads, head_dim))
                self.buffers[f"{part}_{i}"] = np.zeros(shape, STORAGE[dtype])
                if dtype in SCALED:
                    self.buffers[f"{part}_{i}_scale"] = np.zeros(
                        (max_seq, batch, kv_heads), np.float32)

    @property
    def keys(self) -> list[np.ndarray]:
        return [self.buffers[f"key_{i}"] for i in range(self.num_layers)]

    @property
    def values(self) -> list[np.ndarray]:
        return [self.buffers[f"value_{i}"] for i in range(self.num_layers)]

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers (scales included)."""
        return sum(a.nbytes for a in self.buffers.values())

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of one sequence occupies across all layers, K and V and scales."""
        return self.nbytes // (self.max_seq * self.batch)

    def past_len(self) -> int:
        """How many positions the graph must see (at least one; masked by lengths)."""
        return max(int(self.lengths.max(initial=0)), 1)

    def past(self) -> dict[str, np.ndarray]:
        """Contiguous views ``[P, B, ...]`` of every buffer, keyed by buffer name
        (position-major)."""
        self._position_major("past")
        p = self.past_len()
        return {name: buf[:p] for name, buf in self.buffers.items()}

    def read_block(self, row: int, start: int, n: int) -> dict[str, np.ndarray]:
        """A copy of positions ``[start, start + n)`` of ``row``: buffer name -> ``[n, ...]``
        (the cold tier's block format, the same for every layout and device)."""
        if self.head_major:
            return {name: np.ascontiguousarray(buf[row, :, start:start + n].swapaxes(0, 1))
                    for name, buf in self.buffers.items()}
        return {name: buf[start:start + n, row].copy() for name, buf in self.buffers.items()}

    def write_block(self, row: int, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Store ``arrays`` (as ``read_block`` returns them) at ``start`` in ``row``."""
        for name, buf in self.buffers.items():
            src = arrays[name]
            if self.head_major:
                buf[row, :, start:start + len(src)] = src.swapaxes(0, 1)
            else:
                buf[start:start + len(src), row] = src

    def append(self, new: Mapping[str, np.ndarray], n_new: np.ndarray) -> None:
        """Write each row's first ``n_new[b]`` new positions after its current length.

        Args:
            new: buffer name -> ``[S, B, ...]`` new positions (every buffer must be given).
            n_new: [B] valid new positions per row (rows are right-padded).
        """
        self._position_major("append")
        ends = self.lengths + n_new
        if int(ends.max(initial=0)) > self.max_seq:
            raise EngineError(f"KV cache full: {int(ends.max())} positions > max_seq "
                              f"{self.max_seq}", "shorten the prompt or max_tokens")
        for name, buf in self.buffers.items():
            src = new[name]
            if src.dtype != buf.dtype:
                raise EngineError(f"KV output {name!r} has dtype {src.dtype}, the cache "
                                  f"stores {buf.dtype}", "re-export the engine")
            for b in range(self.batch):
                start, n = int(self.lengths[b]), int(n_new[b])
                if n:
                    buf[start:start + n, b] = src[:n, b]
        self.lengths = ends


    def _position_major(self, what: str) -> None:
        if self.head_major:
            raise EngineError(f"KVCache.{what} is for position-major caches; the fused "
                              "graph appends to head-major buffers itself")
