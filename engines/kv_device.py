"""The hot KV cache in GPU memory, for the TensorRT engine.

Same names, dtypes and position-major layout as ``KVCache`` (engines/kv.py): K and V are
``[max_seq, B, Hkv, D]`` per layer (fp8 as its raw bytes), fp8 scales ``[max_seq, B, Hkv]``.
The first P positions of a buffer are one contiguous block, so the plan's ``past`` inputs
are the buffers' own addresses; new positions are copied device to device to each row's
offset. A block of one row leaves and enters in ``KVCache.read_block``'s host format
(``[n, Hkv, D]`` per buffer), so the cold tier (kv_store, prefix_cache) works unchanged.

Every copy of a row's positions is one strided 2D copy: positions of a row lie
``B * row_bytes`` apart in a buffer. ``Copy2D`` and the functions that plan them are pure
(tested on the CPU against ``KVCache``); ``DeviceKVCache`` runs them with cuda-python and is
untested without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rung.engines import gpu
from rung.engines.errors import EngineError
from rung.engines.kv import SCALED, STORAGE, RowLengths


@dataclass(frozen=True)
class Copy2D:
    """``height`` rows of ``width`` bytes: source rows ``src_pitch`` bytes apart from
    ``src_off``, destination rows ``dst_pitch`` apart from ``dst_off``."""

    dst_off: int
    dst_pitch: int
    src_off: int
    src_pitch: int
    width: int
    height: int


def buffer_specs(num_layers: int, kv_heads: int, head_dim: int,
                 dtype: str) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """Buffer name -> (shape of one position of one row, storage dtype), as in KVCache."""
    if dtype not in STORAGE:
        raise EngineError(f"KV dtype {dtype!r} is not supported by this engine",
                          f"supported: {', '.join(STORAGE)}")
    specs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
    for i in range(num_layers):
        for part in ("key", "value"):
            specs[f"{part}_{i}"] = ((kv_heads, head_dim), np.dtype(STORAGE[dtype]))
            if dtype in SCALED:
                specs[f"{part}_{i}_scale"] = ((kv_heads,), np.dtype(np.float32))
    return specs


def block_copy(row: int, start: int, n: int, batch: int, row_bytes: int) -> Copy2D:
    """Positions ``[start, start + n)`` of ``row`` in a cache buffer <-> a dense ``[n, ...]``
    host block (``dst`` is the host side; swap for the way in)."""
    pitch = batch * row_bytes
    return Copy2D(0, row_bytes, (start * batch + row) * row_bytes, pitch, row_bytes, n)


def append_copies(lengths: np.ndarray, n_new: np.ndarray, batch: int,
                  row_bytes: int) -> list[Copy2D]:
    """Each row's first ``n_new[b]`` positions of a graph output ``[S, B, ...]`` to the cache
    buffer ``[max_seq, B, ...]`` after the row's current length (rows with none skipped)."""
    pitch = batch * row_bytes
    return [Copy2D((int(lengths[b]) * batch + b) * row_bytes, pitch, b * row_bytes, pitch,
                   row_bytes, int(n_new[b]))
            for b in range(batch) if int(n_new[b]) > 0]


class DeviceKVCache(RowLengths):
    """KV buffers for ``batch`` sequences of up to ``max_seq`` tokens in GPU memory.

    ``lengths`` stays on the host (numpy) and is owned as in ``KVCache`` (``RowLengths``:
    read-only outside, moved by its named operations).
    """

    def __init__(self, num_layers: int, batch: int, max_seq: int, kv_heads: int,
                 head_dim: int, dtype: str, stream: Any) -> None:
        super().__init__(batch, max_seq)
        self.dtype = dtype
        self.num_layers = num_layers
        self.stream = stream
        self.specs = buffer_specs(num_layers, kv_heads, head_dim, dtype)
        self.ptrs: dict[str, int] = {}
        try:
            for name in self.specs:
                self.ptrs[name] = gpu.malloc(self.buffer_bytes(name))
                gpu.memset(self.ptrs[name], self.buffer_bytes(name), stream)
            gpu.sync(stream)
        except EngineError:
            self.close()
            raise

    def row_bytes(self, name: str) -> int:
        """Bytes of one position of one row of buffer ``name``."""
        shape, dtype = self.specs[name]
        return int(np.prod(shape)) * dtype.itemsize

    def buffer_bytes(self, name: str) -> int:
        return self.max_seq * self.batch * self.row_bytes(name)

    def position_ptr(self, name: str, row: int, position: int) -> int:
        """Device address of ``position`` of ``row`` in buffer ``name``."""
        return self.ptrs[name] + (position * self.batch + row) * self.row_bytes(name)

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers (scales included)."""
        return sum(self.buffer_bytes(name) for name in self.specs)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of one sequence occupies across all layers, K and V and scales."""
        return self.nbytes // (self.max_seq * self.batch)

    def past_len(self) -> int:
        """How many positions the graph must see (at least one; masked by lengths)."""
        return max(int(self._lengths.max(initial=0)), 1)

    def read_block(self, row: int, start: int, n: int) -> dict[str, np.ndarray]:
        """A host copy of positions ``[start, start + n)`` of ``row``: buffer name ->
        ``[n, ...]`` (the cold tier's block format, as ``KVCache.read_block``)."""
        out = {}
        for name, (shape, dtype) in self.specs.items():
            host = np.empty((n, *shape), dtype)
            c = block_copy(row, start, n, self.batch, self.row_bytes(name))
            gpu.copy_2d(host.ctypes.data, c.dst_pitch, self.ptrs[name] + c.src_off,
                        c.src_pitch, c.width, c.height, "d2h", self.stream)
            out[name] = host
        gpu.sync(self.stream)
        return out

    def write_block(self, row: int, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Store ``arrays`` (as ``read_block`` returns them) at ``start`` in ``row``."""
        held = []
        for name, (shape, dtype) in self.specs.items():
            src = np.ascontiguousarray(arrays[name], dtype=dtype)
            if src.shape[1:] != shape or start + len(src) > self.max_seq:
                raise EngineError(f"KV block {name!r} of shape {src.shape} does not fit "
                                  f"positions {start}.. of a cache of {shape} x {self.max_seq}")
            c = block_copy(row, start, len(src), self.batch, self.row_bytes(name))
            gpu.copy_2d(self.ptrs[name] + c.src_off, c.src_pitch, src.ctypes.data,
                        c.dst_pitch, c.width, c.height, "h2d", self.stream)
            held.append(src)  # alive until the copies are done
        gpu.sync(self.stream)

    def append_from(self, outputs: Mapping[str, int], n_new: np.ndarray) -> None:
        """Copy each row's first ``n_new[b]`` positions from the device outputs ``[S, B, ...]``
        (buffer name -> address) after its current length, then advance ``lengths``.
        Asynchronous on the cache's stream."""
        ends = self._lengths + n_new
        if int(ends.max(initial=0)) > self.max_seq:
            raise EngineError(f"KV cache full: {int(ends.max())} positions > max_seq "
                              f"{self.max_seq}", "shorten the prompt or max_tokens")
        for name, src in outputs.items():
            for c in append_copies(self._lengths, n_new, self.batch, self.row_bytes(name)):
                gpu.copy_2d(self.ptrs[name] + c.dst_off, c.dst_pitch, src + c.src_off,
                            c.src_pitch, c.width, c.height, "d2d", self.stream)
        self.advance(n_new)

    def close(self) -> None:
        """Free the device buffers (the cache is unusable afterwards)."""
        ptrs, self.ptrs = self.ptrs, {}
        for ptr in ptrs.values():
            gpu.free(ptr)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit CUDA may be gone already
            self.close()
