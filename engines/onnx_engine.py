"""The ONNX Runtime engine: one session over the exported decoder graph.

Two graph forms, told apart by the manifest's KV layout: the generic graph reads views of a
position-major cache and returns the new positions, which the engine appends; the fused
graph (``GroupQueryAttention``) takes the head-major cache buffers whole, bound through
IO binding as both its ``past`` inputs and its ``present`` outputs, and appends in place.
Either way the manifest is checked against the graph's own declarations at load
(``graph_check``): a manifest that disagrees is refused before any buffer is sized by it.

CPU by default; the CUDA execution provider is selectable by options (``provider="cuda"``)
but is not tested without a GPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from rung.engines import DEFAULT_MEMORY_BUDGET_MB, parted
from rung.engines.drafts import multi_token
from rung.engines.errors import EngineError
from rung.engines.graph_check import check_manifest, session_signature
from rung.engines.kv import KVCache
from rung.engines.manifest import ATTENTION_POSITIONS, HEAD_MAJOR, Manifest

FP8 = 17  # onnx.TensorProto.FLOAT8E4M3FN (onnx itself is not a serving dependency)
PREPACKED_WEIGHTS = ("int8", "int4")   # weight precisions whose kernels need prepacking
# peak RSS over (weights + the whole KV cache) with float weights packed and left unpacked
# (0.5B fp32, docs/benchmarks/startup.md, "Memory and load time"; export/defaults.py's
# PEAK_FACTOR holds the packed one)
PEAK_PACKED, PEAK_UNPACKED = 1.33, 1.06
MIB = 1 << 20
log = logging.getLogger("rung.engine")
PROVIDERS = {"cpu": ["CPUExecutionProvider"],
             "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


@dataclass(frozen=True)
class EngineOptions:
    """Session settings. ``threads`` 0 lets ONNX Runtime choose (one per physical core).
    ``prepack`` lets ONNX Runtime repack weight matrices into private memory at load (a
    second copy of the weights, seconds of load); off, the weights stay in the external
    data file, mapped and paged in as used. None (default) chooses: on for int8/int4,
    whose MatMulNBits kernels need their packed layout (0.7 tok/s without it); for
    fp32/fp16 on where the caller runs steps of several tokens: ``max_batch`` (the rows it
    runs together) above one, or ``decode`` (its decoding: plain|fast|auto) fast on this
    engine (drafts checked in the step, ``drafts.multi_token``). Unpacked fp32 weights cost
    1.06x of weights + KV in peak RSS instead of 1.33x, but every step of several tokens
    packs them again (0.5B bench model, fused graph: a step of 2 tokens 1.8x the time of
    one unpacked, 1.04x packed), and one row decodes slower too (0.5B: 112 against 70 ms a
    step; SmolLM2-135M: 24.3 against 19.6 ms; docs/benchmarks/startup.md, "Memory and load
    time"). ``load_parts``: the graph built as this many sessions at once (``parted``): 1 or
    2; 0 (default) chooses 2 where packing is on, a second core is free and the engine's
    files weigh ``PARTED_LOAD_BYTES`` or more (packing then dominates the load).
    ``memory_budget_mb``: where None chooses packing for float weights, they stay unpacked
    if the engine's estimated peak packed would not fit this budget (``choose_packing``)."""

    provider: str = "cpu"
    threads: int = 0
    prepack: bool | None = None
    max_batch: int = 1
    decode: str = "plain"
    load_parts: int = 0
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB


@dataclass(frozen=True)
class Packing:
    """Whether the engine's weights were packed at load, what chose it (``flag``: the
    caller's ``prepack``; ``weights``: int8/int4 kernels need it; ``steps``: one token a
    step, float weights read as they lie; ``budget``: the estimated peak against the memory
    budget), and why, in words."""

    packed: bool
    chosen_by: str
    reason: str


def estimated_peak_mb(engine_dir: Path, manifest: Manifest, max_batch: int,
                      packed: bool) -> float:
    """The engine's estimated peak RSS in MiB: (the graph's files + a full KV cache of
    ``max_seq`` x ``max_batch`` tokens) x the peak factor measured packed or unpacked."""
    weights = sum((Path(engine_dir) / f).stat().st_size for f in manifest.artifacts
                  if f.startswith(manifest.graph_file) and (Path(engine_dir) / f).is_file())
    cache = manifest.kv.bytes_per_token(manifest.dims) * manifest.dims.max_seq * max_batch
    return (weights + cache) * (PEAK_PACKED if packed else PEAK_UNPACKED) / MIB


def choose_packing(engine_dir: Path, manifest: Manifest, options: EngineOptions,
                   gated: bool) -> Packing:
    """``prepack`` resolved (``EngineOptions``): float weights are packed where steps hold
    several tokens and the estimated peak packed fits ``memory_budget_mb``; over it they
    stay unpacked (steps of several tokens then repack them on the fly, slower)."""
    if options.prepack is not None:
        return Packing(options.prepack, "flag", f"prepack set to {options.prepack}")
    if manifest.weights in PREPACKED_WEIGHTS:
        return Packing(True, "weights", f"{manifest.weights} kernels need packed weights")
    if not (options.max_batch > 1 or multi_token(options.decode, manifest.weights, gated,
                                                 manifest.kv.layout)):
        return Packing(False, "steps", "one token a step: weights read as they lie")
    peak = estimated_peak_mb(engine_dir, manifest, options.max_batch, packed=True)
    budget = options.memory_budget_mb
    if peak <= budget:
        return Packing(True, "budget", f"estimated peak {peak:.0f} MiB packed, within the "
                       f"{budget} MiB memory budget")
    unpacked = estimated_peak_mb(engine_dir, manifest, options.max_batch, packed=False)
    return Packing(False, "budget", f"estimated peak {peak:.0f} MiB packed, over the "
                   f"{budget} MiB memory budget: weights left unpacked (~{unpacked:.0f} "
                   "MiB; steps of several tokens run slower)")


# engines whose files weigh less than this load as one session: below it a parted load's
# probe session and second session cost about what the parallel packing saves, and every
# step pays for running two parts (measured: docs/benchmarks/startup.md, "two sessions at
# once")
PARTED_LOAD_BYTES = 768 * 2**20


def _parallel_load_pays(engine_dir: Path, manifest: Manifest) -> bool:
    """Whether building the graph as two sessions at once shortens the load here: packing
    is on (the caller checks), there is a second core, and the weights are large."""
    size = sum((Path(engine_dir) / f).stat().st_size for f in manifest.artifacts
               if (Path(engine_dir) / f).is_file())
    return len(os.sched_getaffinity(0)) > 1 and size >= PARTED_LOAD_BYTES


class OnnxEngine:
    """Runs the decoder graph; the caller owns ``KVCache`` objects made by ``new_cache``."""

    backend = "onnx"

    def __init__(self, engine_dir: Path, manifest: Manifest,
                 options: EngineOptions | None = None) -> None:
        options = options or EngineOptions()
        if options.provider not in PROVIDERS:
            raise EngineError(f"unknown provider {options.provider!r}",
                              f"choose one of {', '.join(PROVIDERS)}")
        self.manifest = manifest
        self.dims = manifest.dims
        self.fused = manifest.kv.layout == HEAD_MAJOR
        if self.fused and options.provider != "cpu":
            # the fused graph's KV is bound in host memory and appended in place; on a GPU it
            # would have to live in device memory (not in this version)
            raise EngineError(f"the fused graph runs on provider cpu, not {options.provider}",
                              "export the engine with --graph generic for ONNX Runtime's "
                              f"{options.provider} provider")
        gated = any(o.name == "ffn_skipped" for o in manifest.outputs)
        self.packing = choose_packing(engine_dir, manifest, options, gated)
        prepack = self.packing.packed
        if self.packing.chosen_by == "budget" and not prepack:
            log.warning("engine %s: %s", manifest.engine_id, self.packing.reason)

        def session_options() -> ort.SessionOptions:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if options.threads:
                so.intra_op_num_threads = options.threads
            so.inter_op_num_threads = 1
            if not prepack:
                so.add_session_config_entry("session.disable_prepacking", "1")
            return so

        path = Path(engine_dir) / manifest.graph_file
        parts = options.load_parts or (2 if prepack and _parallel_load_pays(engine_dir, manifest)
                                       else 1)
        try:
            self.session = parted.load(path, session_options, PROVIDERS[options.provider], parts)
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise EngineError(f"{path}: ONNX Runtime cannot load the graph ({e})",
                              "re-export the engine") from e
        check_manifest(manifest, session_signature(self.session, path), str(path))
        self.output_names = [o.name for o in manifest.outputs]
        # the export's step plan: lone tokens padded to two positions (widened inside the
        # graph) so a row's logits never depend on the step's shape (drafts.PADDED_WEIGHTS)
        self.min_positions = manifest.step.min_positions
        # FFN skip counters: one-token decode steps run, and skips per layer among them
        self.ffn_steps = 0
        self.ffn_skips: np.ndarray | None = (
            np.zeros(self.dims.num_layers, np.int64) if gated else None)

    def new_cache(self, batch: int, max_seq: int | None = None) -> KVCache:
        """Preallocate KV buffers for ``batch`` sequences."""
        d = self.dims
        seq = min(max_seq or d.max_seq, d.max_seq)
        return KVCache(d.num_layers, batch, seq, d.num_kv_heads, d.head_dim,
                       self.manifest.kv.dtype, self.manifest.kv.layout)

    def forward(self, cache: KVCache, tokens: np.ndarray, n_new: np.ndarray,
                logits_index: np.ndarray | None = None,
                allow_skip: bool = False) -> np.ndarray:
        """Run the graph on new tokens and append their KV to ``cache``.

        Args:
            cache: the rows' KV buffers (batch must equal ``tokens.shape[0]``).
            tokens: [B, S] int64, right-padded.
            n_new: [B] valid tokens per row (0 = the row is idle this step).
            logits_index: [B, K] positions (within the S new ones) to score; default the last
                valid one per row.
            allow_skip: this is a decode step: FFN gates may skip (one token of one sequence
                only; prefill never skips, so cached KV never depends on the gates).
        Returns:
            logits [B, K, V] float32.
        """
        b, s = tokens.shape
        if b != cache.batch:
            raise EngineError(f"batch {b} does not match the cache's {cache.batch}")
        kv = self.manifest.kv
        if (cache.dtype, cache.layout) != (kv.dtype, kv.layout):
            raise EngineError(f"KV cache holds {cache.dtype} {cache.layout}, this engine's "
                              f"graph reads {kv.dtype} {kv.layout}",
                              "allocate it with new_cache()")
        n_new = np.asarray(n_new, dtype=np.int64)
        if logits_index is None:
            logits_index = np.maximum(n_new - 1, 0).astype(np.int64)[:, None]
        if self.min_positions > 1:
            return self._padded(cache, tokens, n_new, logits_index, allow_skip)
        return self._step(cache, tokens, n_new, logits_index, allow_skip)

    def _padded(self, cache: KVCache, tokens: np.ndarray, n_new: np.ndarray,
                logits_index: np.ndarray, allow_skip: bool) -> np.ndarray:
        """A step in which every row feeding one token runs a second position (the same
        token, not scored), whose KV is dropped after the step: ONNX Runtime's kernels take
        their one-query paths for a row of one new token, which round otherwise than their
        several-query paths; so padded, a row gets the same logits bit for bit alone or in
        a batch, token by token or with drafts (drafts.PADDED_WEIGHTS). A row with no room
        for the second position (the cache's last one) runs as it is. The graph repeats the
        position inside (``attention_positions``), after the weight products; in a step of
        several columns the row's second column carries the token."""
        pad = (n_new == 1) & (cache.lengths + 2 <= cache.max_seq)
        if not pad.any():
            return self._step(cache, tokens, n_new, logits_index, allow_skip)
        if tokens.shape[1] >= 2:
            tokens = tokens.copy()
            tokens[pad, 1] = tokens[pad, 0]
        logits = self._step(cache, tokens, n_new + pad, logits_index, allow_skip)
        cache.rollback(pad)   # the second position's KV is free again
        return logits

    def _step(self, cache: KVCache, tokens: np.ndarray, n_new: np.ndarray,
              logits_index: np.ndarray, allow_skip: bool) -> np.ndarray:
        b, s = tokens.shape
        if int((cache.lengths + n_new).max()) > cache.max_seq:
            raise EngineError(f"sequence would exceed max_seq {cache.max_seq}",
                              "shorten the prompt or max_tokens")
        if self.fused:
            scores, skipped = self._fused(cache, tokens, n_new, logits_index, allow_skip)
            self._count_skips(skipped, allow_skip, b * s)
            return scores
        # padded positions past a row's end are never stored; keep them inside the RoPE table
        positions = np.minimum(cache.lengths[:, None] + np.arange(s, dtype=np.int64),
                               self.dims.max_seq - 1)
        feeds: dict[str, np.ndarray | ort.OrtValue] = {
            "input_ids": np.ascontiguousarray(tokens, dtype=np.int64),
            "position_ids": positions,
            "past_lengths": cache.lengths.copy(),
            "logits_index": np.ascontiguousarray(logits_index, dtype=np.int64),
        }
        if self.ffn_skips is not None:
            feeds["ffn_allow_skip"] = np.array(allow_skip)
        fp8 = cache.dtype == "float8_e4m3fn"
        for name, view in cache.past().items():
            feeds[f"past_{name}"] = (
                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(view, FP8)  # zero-copy
                if fp8 and not name.endswith("_scale") else view)
        try:
            outs = self.session.run(self.output_names, feeds)
        except Exception as e:  # onnxruntime raises untyped errors (memory, shapes)
            raise EngineError(f"ONNX Runtime failed on a step of {b}x{s} tokens ({e})") from e
        results = dict(zip(self.output_names, outs, strict=True))
        cache.append({name[4:]: out for name, out in results.items()
                      if name.startswith("new_")}, n_new.astype(np.int64))
        self._count_skips(results.get("ffn_skipped"), allow_skip, b * s)
        logits: np.ndarray = results["logits"]
        return logits

    def _count_skips(self, skipped: np.ndarray | None, allow_skip: bool, tokens: int) -> None:
        if self.ffn_skips is not None and skipped is not None and allow_skip and tokens == 1:
            self.ffn_steps += 1
            self.ffn_skips += skipped

    def _fused(self, cache: KVCache, tokens: np.ndarray, n_new: np.ndarray,
               logits_index: np.ndarray, allow_skip: bool
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """A step of the fused graph. The kernel needs room for the whole padded chunk in
        every row (length + S <= max_seq); where a short row near its end (or an empty idle
        row beside a full-length chunk) shares a step with a longer chunk, the rows with new
        tokens run one at a time instead, each on its own slice."""
        s = self._attended(tokens, n_new)
        # positions each row holds before the step, as the kernel counts them: an empty idle
        # row counts one (its seqlens_k cannot go below 0)
        before = np.maximum(cache.lengths + n_new, 1) - n_new
        if int((before + s).max()) <= cache.max_seq:
            logits, skipped = self._run_fused(cache.buffers, cache.lengths, tokens, n_new,
                                              logits_index, allow_skip, owner=cache)
        else:
            logits = np.zeros((*logits_index.shape, self.dims.vocab_size), np.float32)
            skipped = None
            for row in np.flatnonzero(n_new):
                n, sl = int(n_new[row]), slice(row, row + 1)
                logits[sl], skipped = self._run_fused(
                    {name: buf[sl] for name, buf in cache.buffers.items()},
                    cache.lengths[sl], tokens[sl, :n], n_new[sl],
                    np.minimum(logits_index[sl], n - 1), allow_skip)
        cache.advance(n_new)
        return logits, skipped

    @staticmethod
    def _attended(tokens: np.ndarray, n_new: np.ndarray) -> int:
        """Positions the attention runs per row: the step's S, or more where a widening
        graph's rows hold more (a lone token's second position)."""
        return max(tokens.shape[1], int(n_new.max(initial=0)))

    def _run_fused(self, buffers: dict[str, np.ndarray], lengths: np.ndarray,
                   tokens: np.ndarray, n_new: np.ndarray, logits_index: np.ndarray,
                   allow_skip: bool, owner: KVCache | None = None
                   ) -> tuple[np.ndarray, np.ndarray | None]:
        """One run of the fused graph; ``owner``: the cache whose buffers these are, whose
        bindings the session keeps between its steps (none for row slices)."""
        total = lengths + n_new
        inputs = {
            "input_ids": np.ascontiguousarray(tokens, dtype=np.int64),
            # rows idle this step keep their cache; an empty idle row still counts one position
            "seqlens_k": np.maximum(total - 1, 0).astype(np.int32),
            "query_seqlens": n_new.astype(np.int32),
            "total_sequence_length": np.array(max(int(total.max(initial=0)), 1), np.int32),
            "logits_index": np.ascontiguousarray(logits_index, dtype=np.int64)}
        if self.manifest.step.min_positions > 1:   # the graph has the input
            inputs[ATTENTION_POSITIONS] = np.array(self._attended(tokens, n_new), np.int64)
        if self.ffn_skips is not None:
            inputs["ffn_allow_skip"] = np.array(allow_skip)
        wanted = ["logits", *(["ffn_skipped"] if self.ffn_skips is not None else [])]
        # [B, K, V]: written by the graph where it stands, no copy out of ONNX Runtime
        logits = np.empty((*logits_index.shape, self.dims.vocab_size), np.float32)
        try:   # the cache's memory, no copy: read as past_X, written in place as present_X
            outs = self.session.run_bound(inputs, buffers, wanted, {"logits": logits}, owner)
        except Exception as e:  # onnxruntime raises untyped errors (memory, shapes)
            raise EngineError(f"ONNX Runtime failed on a step of {tokens.shape[0]}x"
                              f"{tokens.shape[1]} tokens ({e})") from e
        return outs["logits"], outs.get("ffn_skipped")


if TYPE_CHECKING:   # mypy checks that the class is an Engine over host KV buffers
    from rung.engines import Engine

    def _conforms(engine: OnnxEngine) -> Engine[KVCache]:
        return engine
