"""The export <-> engine contract: ``manifest.json`` in every engine directory.

Written once by ``rung export``, read by every engine backend. It is versioned: an engine
loads the one format this rung writes and refuses any other with a message to re-export
(older) or upgrade (newer), so every key a backend reads is present and there is one way to
run a step. Every artifact it names is checked against its digest before use.

``step`` is the step plan the export decided and the engine follows without deciding again:
the graph form and how many positions a lone token's step runs (``StepPlan``).

Layout of the generic graph (``kv.layout`` ``position_major_SBHD``):

    inputs   input_ids      int64  [B, S]
             position_ids   int64  [B, S]       absolute position of each new token
             past_lengths   int64  [B]          valid past entries per sequence
             logits_index   int64  [B, K]       which of the S new positions to score
             past_key_{i}   kv     [P, B, Hkv, D]   read-only view of the engine's buffer
             past_value_{i} kv     [P, B, Hkv, D]
             past_key_{i}_scale, past_value_{i}_scale  float32 [P, B, Hkv]   (fp8 KV only)
             ffn_allow_skip bool   []           a decode step: gates may skip (gated only)
    outputs  logits         float32 [B, K, V]
             new_key_{i}    kv     [S, B, Hkv, D]   only the new positions
             new_value_{i}  kv     [S, B, Hkv, D]
             new_key_{i}_scale, new_value_{i}_scale    float32 [S, B, Hkv]   (fp8 KV only)
             ffn_skipped    bool   [L]          which layers skipped their FFN (gated only)

The KV layout is position-major so that the first P positions of a buffer
``[max_seq, B, Hkv, D]`` are one contiguous block: the engine hands the graph a view of its
buffer and writes the new positions in place, never copying the whole cache per step.

Layout of the fused graph (``kv.layout`` ``head_major_BHSD``; ``GroupQueryAttention``,
fp32/fp16 KV; the manifest's ``inputs``/``outputs`` list it the same way):

    inputs   input_ids       int64  [B, S]
             seqlens_k       int32  [B]      tokens in each row after the step, minus 1
             query_seqlens   int32  [B]      valid new tokens per row (0: idle this step)
             total_sequence_length int32 []  the longest row after the step
             logits_index    int64  [B, K]
             attention_positions int64 []    the attention's rows per sequence, >= S: a
                                             lone token's last row repeated (where
                                             ``step.min_positions`` is 2)
             past_key_{i}, past_value_{i}  kv [B, Hkv, C, D]   the engine's whole buffer
             ffn_allow_skip  bool   []       (gated only)
    outputs  logits          float32 [B, K, V]
             present_key_{i}, present_value_{i}  kv [B, Hkv, C, D]   bound to the same
                                             memory as the past: appended in place
             ffn_skipped     bool   [L]      (gated only)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rung.engines.errors import ManifestError

# the one format loaded: an engine written by another rung is re-exported, not fed as it was
FORMAT_VERSION = 9
MANIFEST_NAME = "manifest.json"
KV_LAYOUT = "position_major_SBHD"
HEAD_MAJOR = "head_major_BHSD"   # the fused graph's shared buffers [B, Hkv, C, D]
# the fused graph's input that widens a step's attention past its S new tokens
ATTENTION_POSITIONS = "attention_positions"


@dataclass(frozen=True)
class ModelDims:
    """Dimensions of the exported decoder."""

    hf_architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_seq: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool


@dataclass(frozen=True)
class KVSpec:
    """How the KV cache is stored in the engine's buffers and read by the graph."""

    dtype: str  # "float32" | "float16" | "float8_e4m3fn"
    layout: str = KV_LAYOUT
    scale_layout: str | None = None  # "per_token_per_head" for fp8: float32 amax / 448
    # export-time cost against an fp32 cache: max_rel_logit_err, mean_kl, greedy_agreement
    accuracy: dict[str, float] | None = None
    # "auto" (--kv auto chose it) | "flag" (--kv given), and why
    chosen_by: str | None = None
    reason: str | None = None

    def bytes_per_token(self, dims: ModelDims) -> int:
        """Bytes one token occupies in the cache (K and V, all layers, scales included)."""
        width = {"float32": 4, "float16": 2, "float8_e4m3fn": 1}[self.dtype]
        per_layer = 2 * dims.num_kv_heads * dims.head_dim * width
        if self.scale_layout == "per_token_per_head":
            per_layer += 2 * dims.num_kv_heads * 4
        return per_layer * dims.num_layers


GRAPH_FORMS = ("fused", "generic")


@dataclass(frozen=True)
class StepPlan:
    """How the engine runs a step, decided once by the export.

    ``graph``: ``fused`` (GroupQueryAttention over head-major buffers) or ``generic``.
    ``min_positions``: positions a row's attention runs at the least. 2 where a row feeding
    one token must take the kernels' several-query paths, so that its logits are the same
    alone, batched or with drafts (``drafts.pads_steps``): the graph repeats the token's
    attention row itself (input ``attention_positions``) and the engine drops the second
    position's KV after the step. 1 elsewhere."""

    graph: str
    min_positions: int


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: list[str | int]


@dataclass(frozen=True)
class TokenizerSpec:
    files: list[str]
    chat_template: str | None
    bos_token: str | None
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    add_bos_token: bool


@dataclass(frozen=True)
class Parity:
    """Export-time verification of the graph against the fp32 PyTorch model: the measured
    distance and the tolerance it passed (which depends on the weight and KV precision)."""

    prompts: int
    tokens: int
    max_abs_logit_diff: float
    max_rel_logit_diff: float
    greedy_agreement: float
    tolerance_abs: float
    passed: bool
    # the bounds applied (max relative logit error, min greedy agreement, mean KL) and the
    # mean KL(reference || engine) of the next-token distributions, in nats; tolerance_rel
    # is None where the path is not exact (bounded by KL and greedy agreement alone)
    tolerance_rel: float | None
    min_greedy_agreement: float
    mean_kl: float
    max_mean_kl: float


@dataclass(frozen=True)
class TrtPlan:
    """A TensorRT plan built from the graph by ``rung export --target trt``. A plan runs only
    on the GPU architecture and TensorRT version it was built with; its file is listed in
    ``Manifest.artifacts`` and checked like the others."""

    plan_file: str
    tensorrt_version: str
    compute_capability: str     # of the GPU it was built on, "8.7" (Orin), "8.9" (Ada), ...
    device_name: str
    weights: str                # precision of the plan's weights: "fp16" | "fp32"
    kv_requested: str           # --kv as asked: "auto" | "fp32" | "fp16" | "fp8"
    kv_reason: str              # why the KV dtype is the manifest's (FP8 needs cc 8.9+)
    max_batch: int              # most rows of one cache
    prefill_chunk: int          # most new tokens of one call; longer prompts run in chunks
    # optimization profiles in plan order: name -> input -> [min, opt, max] shapes
    profiles: dict[str, dict[str, list[list[int]]]]
    # the plan's logits against ONNX Runtime on the CPU, measured after the build
    parity: dict[str, float] | None = None


@dataclass(frozen=True)
class Manifest:
    format_version: int
    engine_id: str
    created: str
    rung_version: str
    dims: ModelDims
    graph_file: str
    opset: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: str  # "fp32" | "fp16" | "int8" | "int4"
    kv: KVSpec
    tokenizer: TokenizerSpec
    generation: dict[str, Any]
    parity: Parity | None
    artifacts: dict[str, str]  # file name -> sha256
    step: StepPlan
    # file name -> XXH3-128, what a load checks: a corruption check, not a signature (sha256
    # is the identity); it hashes several times faster than sha256, and a load's checking
    # is most of an engine's start
    xxh3: dict[str, str]
    ffn_gate: dict[str, Any] | None = None
    # int8/int4 weights: method ("MatMulNBits"), bits, block_size, symmetric, accuracy_level,
    # lm_head_bits, embeddings ("int8": GatherBlockQuantized; "fp32" where no block divides
    # the hidden size); None for float weights
    quantization: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    trt: TrtPlan | None = None  # the TensorRT plan, where one was built
    # --ffn-skip resolved: {"requested": "auto", "mode": "off", "reason": "..."}
    # (``ffn_gate`` stays the gates' own record, None without gates)
    ffn_skip: dict[str, str] | None = None
    # a LoRA adapter merged into the weights at export: name, sha256 (of its
    # adapter_model.safetensors), rank, alpha, targets, modules; None without one
    adapter: dict[str, Any] | None = None

    # -- writing -----------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False) + "\n"

    def save(self, engine_dir: Path) -> Path:
        path = Path(engine_dir) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)
        return path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def xxh3_file(path: Path) -> str:
    """XXH3-128 of a file, memory-mapped."""
    import mmap

    import xxhash

    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            return xxhash.xxh3_128().hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return xxhash.xxh3_128(buf).hexdigest()


def artifact_digests(engine_dir: Path, files: list[str]) -> tuple[dict[str, str],
                                                                   dict[str, str]]:
    """(sha256, XXH3-128) of ``files`` in ``engine_dir``: what a manifest records."""
    return ({f: sha256_file(engine_dir / f) for f in files},
            {f: xxh3_file(engine_dir / f) for f in files})


def check_artifacts(engine_dir: Path, m: Manifest) -> None:
    """Every artifact present and as recorded (by XXH3-128).

    Raises:
        ManifestError: a file missing, or its digest differs (corrupt or modified).
    """
    for name in m.artifacts:
        art = Path(engine_dir) / name
        if not art.is_file():
            raise ManifestError(f"{art}: listed in the manifest but missing",
                                "copy the whole engine directory or re-export")
        if xxh3_file(art) != m.xxh3[name]:
            raise ManifestError(f"{art}: XXH3 differs from the manifest (corrupt or "
                                "modified)", "re-export or copy the engine again")


def _build(cls: type[Any], data: Any, where: str) -> Any:
    """Build a dataclass from a dict, naming the offending key on any mismatch."""
    if not isinstance(data, dict):
        raise ManifestError(f"manifest field {where!r} must be an object")
    names = {f.name: f for f in dataclasses.fields(cls)}
    missing = [n for n, f in names.items()
               if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ManifestError(f"manifest field {where!r} lacks key {missing[0]!r}",
                            "re-export the engine with this rung version")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ManifestError(f"manifest field {where!r} has unknown key {unknown[0]!r}",
                            "re-export the engine with this rung version")
    return cls(**{k: data[k] for k in names if k in data})


def load_manifest(engine_dir: Path, verify_artifacts: bool = True) -> Manifest:
    """Read and check ``ENGINE_DIR/manifest.json``.

    Raises:
        ManifestError: missing or malformed file, unknown format version, artifact missing
            or with a different sha256 than recorded.
    """
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{path}: no manifest",
                            "point at a directory written by `rung export`")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: not valid JSON ({e})", "re-export the engine") from e
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: top level must be an object", "re-export the engine")
    version = raw.get("format_version")
    if not isinstance(version, int):
        raise ManifestError(f"{path}: format_version missing or not an integer",
                            "re-export the engine")
    if version > FORMAT_VERSION:
        raise ManifestError(
            f"{path}: manifest format {version} is newer than this rung understands "
            f"(format {FORMAT_VERSION})", "upgrade rung or re-export with this version")
    if version < FORMAT_VERSION:
        raise ManifestError(
            f"{path}: manifest format {version} was written by an earlier rung; this rung "
            f"loads format {FORMAT_VERSION} only",
            "re-export the engine with this rung (`rung export`, same flags)")
    try:
        m: Manifest = _build(Manifest, raw, "manifest")
        m = dataclasses.replace(
            m,
            dims=_build(ModelDims, m.dims, "dims"),
            inputs=[_build(TensorSpec, t, "inputs") for t in m.inputs],
            outputs=[_build(TensorSpec, t, "outputs") for t in m.outputs],
            kv=_build(KVSpec, m.kv, "kv"),
            tokenizer=_build(TokenizerSpec, m.tokenizer, "tokenizer"),
            parity=None if m.parity is None else _build(Parity, m.parity, "parity"),
            trt=None if m.trt is None else _build(TrtPlan, m.trt, "trt"),
            step=_build(StepPlan, m.step, "step"),
        )
    except TypeError as e:
        raise ManifestError(f"{path}: malformed ({e})", "re-export the engine") from e
    if sorted(m.xxh3) != sorted(m.artifacts):
        raise ManifestError(f"{path}: xxh3 lists other files than artifacts",
                            "re-export the engine")
    if m.step.graph not in GRAPH_FORMS or m.step.min_positions not in (1, 2):
        raise ManifestError(f"{path}: step plan {dataclasses.asdict(m.step)} is not one this "
                            f"rung runs (graph {' or '.join(GRAPH_FORMS)}, min_positions 1 "
                            "or 2)", "re-export the engine")
    if verify_artifacts:
        check_artifacts(engine_dir, m)
    return m
