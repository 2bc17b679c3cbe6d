"""The device KV cache's copy plans, run on host bytes with numpy: they must move exactly what
``KVCache`` moves (append after each row's length, blocks out and in), so that the GPU
cache and the cold tier agree with the CPU cache byte for byte. The CUDA side of
``DeviceKVCache`` runs in tests/gpu."""

from __future__ import annotations

import numpy as np
import pytest

from rung.engines.kv import KVCache
from rung.engines.kv_device import Copy2D, append_copies, block_copy, buffer_specs

LAYERS, BATCH, SEQ, HEADS, DIM = 2, 3, 16, 2, 4


def _copy(dst: np.ndarray, src: np.ndarray, c: Copy2D) -> None:
    """What cudaMemcpy2DAsync does, on flat uint8 arrays."""
    for r in range(c.height):
        d, s = c.dst_off + r * c.dst_pitch, c.src_off + r * c.src_pitch
        dst[d:d + c.width] = src[s:s + c.width]


def _inward(c: Copy2D) -> Copy2D:
    """A block copy the way in (host -> cache), as DeviceKVCache.write_block runs it."""
    return Copy2D(c.src_off, c.src_pitch, c.dst_off, c.dst_pitch, c.width, c.height)


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _filled(dtype: str, seed: int = 0) -> KVCache:
    cache = KVCache(LAYERS, BATCH, SEQ, HEADS, DIM, dtype)
    rng = np.random.default_rng(seed)
    for buf in cache.buffers.values():
        buf[...] = rng.integers(0, 255, buf.shape).astype(buf.dtype)
    return cache


@pytest.mark.parametrize("dtype", ["float32", "float16", "float8_e4m3fn"])
def test_specs_name_shape_and_store_like_kvcache(dtype: str) -> None:
    cache = KVCache(LAYERS, BATCH, SEQ, HEADS, DIM, dtype)
    specs = buffer_specs(LAYERS, HEADS, DIM, dtype)
    assert list(specs) == list(cache.buffers)
    for name, (shape, storage) in specs.items():
        assert cache.buffers[name].shape == (SEQ, BATCH, *shape)
        assert cache.buffers[name].dtype == storage


@pytest.mark.parametrize("dtype", ["float32", "float8_e4m3fn"])
def test_append_copies_match_kvcache_append(dtype: str) -> None:
    ref, dev = _filled(dtype), _filled(dtype)
    lengths = np.array([3, 0, 9], np.int64)
    n_new = np.array([4, 2, 0], np.int64)
    for b, n in enumerate(lengths.tolist()):
        ref.restore(b, n)
        dev.restore(b, n)
    s = 5
    rng = np.random.default_rng(1)
    new = {name: rng.integers(0, 255, (s, *buf.shape[1:])).astype(buf.dtype)
           for name, buf in ref.buffers.items()}
    ref.append(new, n_new)
    for name, buf in dev.buffers.items():
        row_bytes = int(np.prod(buf.shape[2:])) * buf.dtype.itemsize
        flat, src = _bytes(buf), _bytes(new[name])
        for c in append_copies(lengths, n_new, BATCH, row_bytes):
            _copy(flat, src, c)
        buf[...] = flat.view(buf.dtype).reshape(buf.shape)
    for name in ref.buffers:
        np.testing.assert_array_equal(dev.buffers[name], ref.buffers[name], err_msg=name)


def test_idle_rows_get_no_copy() -> None:
    copies = append_copies(np.array([1, 2, 3]), np.array([0, 1, 0]), 3, 8)
    assert copies == [Copy2D((2 * 3 + 1) * 8, 24, 8, 24, 8, 1)]


@pytest.mark.parametrize("dtype", ["float16", "float8_e4m3fn"])
def test_block_copies_match_read_and_write_block(dtype: str) -> None:
    cache = _filled(dtype, seed=2)
    row, start, n = 1, 5, 7
    expect = cache.read_block(row, start, n)
    other = _filled(dtype, seed=3)
    for name, buf in cache.buffers.items():
        row_bytes = int(np.prod(buf.shape[2:])) * buf.dtype.itemsize
        c = block_copy(row, start, n, BATCH, row_bytes)
        host = np.zeros(n * row_bytes, np.uint8)
        _copy(host, _bytes(buf), c)                             # cache -> host
        block = host.view(buf.dtype).reshape(expect[name].shape)
        np.testing.assert_array_equal(block, expect[name], err_msg=name)
        flat = _bytes(other.buffers[name])
        _copy(flat, host, _inward(c))                           # host -> another cache
        other.buffers[name][...] = flat.view(buf.dtype).reshape(buf.shape)
    got = other.read_block(row, start, n)
    for name in expect:
        np.testing.assert_array_equal(got[name], expect[name], err_msg=name)
    untouched = _filled(dtype, seed=3).read_block(0, 0, SEQ)     # other rows unchanged
    for name, block in other.read_block(0, 0, SEQ).items():
        np.testing.assert_array_equal(block, untouched[name])
