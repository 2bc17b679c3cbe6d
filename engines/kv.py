"""The hot KV cache: preallocated per-layer buffers the engine reads and writes in place.

Layout per layer and for K and V: ``[max_seq, batch, kv_heads, head_dim]`` (position-major).
The first P positions of every row form one contiguous block, so the graph's ``past`` input
is a view, never a copy; new positions are written at each row's own offset.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rung.engines.errors import EngineError

_DTYPES = {"float32": np.float32, "float16": np.float16}


class KVCache:
    """KV buffers for ``batch`` sequences of up to ``max_seq`` tokens each."""

    def __init__(self, num_layers: int, batch: int, max_seq: int, kv_heads: int,
                 head_dim: int, dtype: str = "float32") -> None:
        if dtype not in _DTYPES:
            raise EngineError(f"KV dtype {dtype!r} is not supported by this engine",
                              f"supported: {', '.join(_DTYPES)}")
        shape = (max_seq, batch, kv_heads, head_dim)
        np_dtype = _DTYPES[dtype]
        self.keys = [np.zeros(shape, np_dtype) for _ in range(num_layers)]
        self.values = [np.zeros(shape, np_dtype) for _ in range(num_layers)]
        self.lengths = np.zeros(batch, np.int64)
        self.max_seq = max_seq
        self.batch = batch

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of one sequence occupies across all layers, K and V."""
        return self.nbytes // (self.max_seq * self.batch)

    def past_len(self) -> int:
        """How many positions the graph must see (at least one; masked by lengths)."""
        return max(int(self.lengths.max(initial=0)), 1)

    def past(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Contiguous views ``[P, B, Hkv, D]`` of layer ``layer``'s K and V."""
        p = self.past_len()
        return self.keys[layer][:p], self.values[layer][:p]

    def room(self) -> int:
        """Free positions in the fullest row."""
        return self.max_seq - int(self.lengths.max(initial=0))

    def append(self, new_keys: Sequence[np.ndarray], new_values: Sequence[np.ndarray],
               n_new: np.ndarray) -> None:
        """Write each row's first ``n_new[b]`` new positions after its current length.

        Args:
            new_keys, new_values: per layer ``[S, B, Hkv, D]``.
            n_new: [B] valid new positions per row (rows are right-padded).
        """
        ends = self.lengths + n_new
        if int(ends.max(initial=0)) > self.max_seq:
            raise EngineError(f"KV cache full: {int(ends.max())} positions > max_seq "
                              f"{self.max_seq}", "shorten the prompt or max_tokens")
        for b in range(self.batch):
            start, n = int(self.lengths[b]), int(n_new[b])
            if n == 0:
                continue
            for layer, (k, v) in enumerate(zip(new_keys, new_values, strict=True)):
                self.keys[layer][start:start + n, b] = k[:n, b]
                self.values[layer][start:start + n, b] = v[:n, b]
        self.lengths = ends

    def reset(self) -> None:
        self.lengths[:] = 0
