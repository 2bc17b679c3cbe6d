"""Blockwise weight quantization to ONNX Runtime's ``MatMulNBits`` layout, in numpy.

A weight ``[N, K]`` (output x input channels) is cut into blocks of ``block`` input channels
per output row; each block stores ``bits``-bit codes ``q``, one float32 ``scale`` and one
integer zero point ``z``, and means ``scale * (q - z)``:

- symmetric: ``z`` fixed at ``2^(bits-1)`` (no zero point stored), the grid centred on 0;
- asymmetric: ``z`` chosen per block (stored as uint8, two to a byte at 4 bits), so a block
  whose values lean to one side uses all ``2^bits`` levels. Real weights do lean: on
  SmolLM2-135M symmetric int4 costs about 10x the KL of asymmetric
  (docs/benchmarks/real-checkpoints.md).

Scales are searched, not just taken from the block's range, as llama.cpp's K-quants do
(``make_qkx2_quants``): several candidate scales around ``range / levels``, for each the
codes rounded and then scale (and zero point) refitted by least squares, keeping per block
the candidate with the least error. The error is weighted by ``importance`` per input
channel (the mean square of the activations that meet it, from calibration text), so
rounding lands where the inputs are small, as with llama.cpp's importance matrix.

ONNX Runtime's CPU kernels take only uint8 zero points (float zero points run ~40x slower
at 4 bits and are refused at 8), hence integer ``z``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

ROWS_PER_CHUNK = 2048  # bounds the search's temporaries: rows x K x candidates


@dataclass(frozen=True)
class Blocks:
    """A quantized weight: ``q`` uint8 [N, nb, block], ``scale`` float32 [N, nb],
    ``zero`` uint8 [N, nb] (``None``: symmetric, ``2^(bits-1)``)."""

    q: npt.NDArray[np.uint8]
    scale: npt.NDArray[np.float32]
    zero: npt.NDArray[np.uint8] | None
    bits: int
    block: int
    k: int  # input channels before padding to whole blocks

    def dequantize(self) -> npt.NDArray[np.float32]:
        """float32 [N, K]."""
        z = (np.float32(2 ** (self.bits - 1)) if self.zero is None
             else self.zero.astype(np.float32)[..., None])
        w = (self.q.astype(np.float32) - z) * self.scale[..., None]
        return w.reshape(len(w), -1)[:, :self.k]

    def matmulnbits(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32],
                                   npt.NDArray[np.uint8] | None]:
        """``MatMulNBits`` inputs B (uint8 [N, nb, block*bits/8]), scales (float32 [N*nb])
        and zero points (uint8 [N * ceil(nb*bits/8)], or None); 4-bit values two to a byte,
        low nibble first."""
        n, nb, _ = self.q.shape
        packed = self.q if self.bits == 8 else (self.q[..., 0::2] | (self.q[..., 1::2] << 4))
        zero = None
        if self.zero is not None:
            z: npt.NDArray[np.integer[Any]] = self.zero
            if self.bits == 4:
                if nb % 2:
                    z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
                z = z[:, 0::2] | (z[:, 1::2] << 4)
            zero = np.ascontiguousarray(z, np.uint8).reshape(-1)
        return (np.ascontiguousarray(packed, np.uint8),
                np.ascontiguousarray(self.scale, np.float32).reshape(-1), zero)


def concat(parts: list[Blocks]) -> Blocks:
    """Blocks of weights stacked by output rows (a packed projection from its parts)."""
    first = parts[0]
    zero = (None if first.zero is None
            else np.concatenate([p.zero for p in parts if p.zero is not None]))
    return Blocks(np.concatenate([p.q for p in parts]),
                  np.concatenate([p.scale for p in parts]), zero, first.bits, first.block,
                  first.k)


def quantize(w: npt.NDArray[np.floating[Any]], bits: int, block: int, symmetric: bool = False,
             importance: npt.NDArray[np.float32] | None = None,
             candidates: int | None = None) -> Blocks:
    """Quantize ``w`` [N, K] (float) to ``bits`` in blocks of ``block`` input channels.

    ``importance`` [K]: weight of each input channel in the rounding error (default equal).
    ``candidates``: scales tried per block (default 11 at 4 bits, 5 at 8).
    """
    w = np.asarray(w, np.float32)
    n, k = w.shape
    nb = -(-k // block)
    pad = nb * block - k
    imp = np.ones(k, np.float32) if importance is None else np.asarray(importance, np.float32)
    imp = imp / max(float(imp.mean()), 1e-30) + 1e-3  # no channel weightless
    if pad:
        w = np.pad(w, ((0, 0), (0, pad)))
        imp = np.pad(imp, (0, pad))  # padded channels: zero weight in the error
    imp_b = imp.reshape(1, nb, block)
    steps = candidates or (11 if bits <= 4 else 5)
    parts = [_search(w[r:r + ROWS_PER_CHUNK].reshape(-1, nb, block), imp_b, bits,
                     symmetric, steps) for r in range(0, n, ROWS_PER_CHUNK)]
    q = np.concatenate([p[0] for p in parts])
    scale = np.concatenate([p[1] for p in parts])
    zero = None if symmetric else np.concatenate([p[2] for p in parts])
    return Blocks(q, scale, zero, bits, block, k)


def _search(x: npt.NDArray[np.float32], imp: npt.NDArray[np.float32], bits: int, symmetric: bool,
            steps: int
            ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """Best (codes, scale, zero) per block of ``x`` [R, nb, block] over ``steps``
    candidate scales, weighted squared error."""
    top = 2 ** bits - 1
    if symmetric:
        # llama.cpp's Q4_0 convention: the value of largest magnitude maps to the end code
        # -2^(b-1) exactly, whatever its sign (the scale takes the sign)
        at = np.abs(x).argmax(-1)[..., None]
        base = np.take_along_axis(x, at, -1)[..., 0] / -(2 ** (bits - 1))
        zero = np.full(base.shape, 2 ** (bits - 1), np.float32)
    else:
        lo, hi = np.minimum(x.min(-1), 0.0), np.maximum(x.max(-1), 0.0)
        base = (hi - lo) / top
    base = np.where(base == 0, np.float32(1e-30), base).astype(np.float32)
    best_err = np.full(base.shape, np.inf, np.float32)
    best_q = np.zeros(x.shape, np.uint8)
    best_s = base.copy()
    best_z = np.zeros(base.shape, np.float32) if not symmetric else zero
    # candidate scales: base * top / (top + d), d from -1 to +1 levels (llama.cpp's grid)
    for d in np.linspace(-1.0, 1.0, steps) if steps > 1 else [0.0]:
        s = base * top / (top + d)
        z = zero if symmetric else np.clip(np.round(-lo / s), 0, top)
        q = np.clip(np.round(x / s[..., None]) + z[..., None], 0, top)
        s = _refit(x, imp, q - z[..., None], s)
        if not symmetric:  # the refitted scale moves the best zero point
            z = np.clip(np.round(-lo / s), 0, top)
        q = np.clip(np.round(x / s[..., None]) + z[..., None], 0, top)
        err = (imp * (s[..., None] * (q - z[..., None]) - x) ** 2).sum(-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_z = np.where(better, z, best_z)
        best_q = np.where(better[..., None], q.astype(np.uint8), best_q)
    return best_q, best_s.astype(np.float32), best_z.astype(np.uint8)


def _refit(x: npt.NDArray[np.float32], imp: npt.NDArray[np.float32],
           c: npt.NDArray[np.floating[Any]], s: npt.NDArray[np.floating[Any]]
           ) -> npt.NDArray[np.floating[Any]]:
    """Least-squares scale for fixed centred codes ``c``: argmin_s sum imp (s c - x)^2."""
    num = (imp * c * x).sum(-1)
    den = (imp * c * c).sum(-1)
    ok = den > 0
    return np.where(ok, num / np.where(ok, den, 1.0), s).astype(np.float32)
