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
  place; the engine only advances ``lengths``. A row is the contiguous block ``[b:b + 1]``.

Either way a block of positions of one row leaves and enters the cache in one format,
``[n, Hkv, D]`` per buffer (``read_block``/``write_block``): the cold tier never sees the
layout.

Buffer names are the graph's input/output names without their ``past_`` / ``new_``
prefix: ``key_{i}``, ``value_{i}``, and for fp8 ``key_{i}_scale``, ``value_{i}_scale``.

How many positions each row holds (``lengths``) is owned by the cache (``RowLengths``, the
base of this cache and of the device one, kv_device.DeviceKVCache): outside it, ``lengths``
is a read-only view, and the engine, the decode loop and the prefix cache move it only
through the named operations ``advance``, ``rollback``, ``truncate``, ``reset`` and
``restore``, each of which checks its invariants (0 <= length <= max_seq, a truncation
never grows a row, a restore fills only an empty row) and raises ``EngineError``.
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


class RowLengths:
    """The positions each of ``batch`` rows holds, ``0 <= length <= max_seq``: the one
    owner of a KV cache's lengths (as nano-vllm's block manager owns its KV). ``lengths`` is
    a read-only view (a write raises ``ValueError``); these operations are the only way to
    change it, and each raises ``EngineError`` on a violation, changing nothing."""

    def __init__(self, batch: int, max_seq: int) -> None:
        self.batch = batch
        self.max_seq = max_seq
        self._lengths = np.zeros(batch, np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """[batch] int64, read-only: positions each row holds (live: it follows the
        operations)."""
        view = self._lengths.view()
        view.setflags(write=False)
        return view

    def advance(self, n_new: np.ndarray) -> None:
        """After a step: row ``b`` holds ``n_new[b]`` more positions (``n_new`` [batch],
        each >= 0; 0 = idle this step)."""
        given = np.asarray(n_new)
        if given.shape != self._lengths.shape or given.dtype.kind not in "iub":
            raise EngineError(f"KV advance by {given.shape} {given.dtype} for {self.batch} "
                              "rows", "pass one integer count of new positions per row")
        n = given.astype(np.int64, copy=False)
        if self.batch and int(n.min()) < 0:
            raise EngineError(f"KV advance by a negative count {int(n.min())}")
        ends = self._lengths + n
        if int(ends.max(initial=0)) > self.max_seq:
            raise EngineError(f"KV cache full: {int(ends.max())} positions > max_seq "
                              f"{self.max_seq}", "shorten the prompt or max_tokens")
        self._lengths += n

    def rollback(self, rows: int | np.ndarray, k: int = 1) -> None:
        """Free the last ``k`` positions of ``rows`` (a row, row indices or a [batch] mask):
        drafts the model rejected, a padded step's second position."""
        if isinstance(rows, int | np.integer):
            self._row(int(rows))
        held = self._lengths[rows]
        if k < 0 or (np.size(held) and int(np.min(held)) < k):
            raise EngineError(f"KV rollback of {k} positions from a row holding "
                              f"{int(np.min(held)) if np.size(held) else 0}")
        self._lengths[rows] -= k

    def truncate(self, row: int, n: int) -> None:
        """Keep the first ``n`` positions of ``row`` (a hot row continued in place);
        never grows it."""
        self._row(row)
        if not 0 <= n <= self._lengths[row]:
            raise EngineError(f"KV truncate of row {row} to {n} positions: it holds "
                              f"{int(self._lengths[row])} (a truncation never grows a row)")
        self._lengths[row] = n

    def reset(self, row: int) -> None:
        """``row`` holds nothing (its buffers keep their bytes, unread)."""
        self._row(row)
        self._lengths[row] = 0

    def restore(self, row: int, n: int) -> None:
        """``row``, empty, holds the ``n`` positions just written into it (``write_block``:
        a prefix from the cold tier)."""
        self._row(row)
        if self._lengths[row] != 0:
            raise EngineError(f"KV restore into row {row}, which holds "
                              f"{int(self._lengths[row])} positions", "reset the row first")
        if not 0 <= n <= self.max_seq:
            raise EngineError(f"KV restore of {n} positions into a row of max_seq "
                              f"{self.max_seq}")
        self._lengths[row] = n

    def _row(self, row: int) -> None:
        if not 0 <= row < self.batch:
            raise EngineError(f"KV row {row} out of range for {self.batch} rows")


class KVCache(RowLengths):
    """KV buffers for ``batch`` sequences of up to ``max_seq`` tokens each."""

    def __init__(self, num_layers: int, batch: int, max_seq: int, kv_heads: int,
                 head_dim: int, dtype: str = "float32", layout: str = KV_LAYOUT) -> None:
        if dtype not in STORAGE:
            raise EngineError(f"KV dtype {dtype!r} is not supported by this engine",
                              f"supported: {', '.join(STORAGE)}")
        if layout not in (KV_LAYOUT, HEAD_MAJOR) or (layout == HEAD_MAJOR and dtype in SCALED):
            raise EngineError(f"KV layout {layout!r} with {dtype} is not supported by this "
                              "engine", "re-export the engine with this version of rung")
        super().__init__(batch, max_seq)
        self.dtype = dtype
        self.layout = layout
        self.head_major = layout == HEAD_MAJOR
        self.num_layers = num_layers
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
        return max(int(self._lengths.max(initial=0)), 1)

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
        ends = self._lengths + n_new
        if int(ends.max(initial=0)) > self.max_seq:
            raise EngineError(f"KV cache full: {int(ends.max())} positions > max_seq "
                              f"{self.max_seq}", "shorten the prompt or max_tokens")
        for name, buf in self.buffers.items():
            src = new[name]
            if src.dtype != buf.dtype:
                raise EngineError(f"KV output {name!r} has dtype {src.dtype}, the cache "
                                  f"stores {buf.dtype}", "re-export the engine")
            for b in range(self.batch):
                start, n = int(self._lengths[b]), int(n_new[b])
                if n:
                    buf[start:start + n, b] = src[:n, b]
        self.advance(n_new)

    def _position_major(self, what: str) -> None:
        if self.head_major:
            raise EngineError(f"KVCache.{what} is for position-major caches; the fused "
                              "graph appends to head-major buffers itself")
