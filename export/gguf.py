"""Read a GGUF file (llama.cpp's model format) as a checkpoint: config, weights, tokenizer.

Read with llama.cpp's own ``gguf`` package (MIT): the metadata becomes a Hugging Face
``config.json`` dict, every tensor is dequantized to float32 under its Hugging Face name
(``gguf.quants.dequantize``, which knows every GGML block type), and the tokenizer and chat
template come from the metadata (``export/gguf_tokenizer.py``). What each linear layer was
stored as (``Q4_K``, ``Q6_K``, ...) is kept, so that the export can make a 4-bit GGUF a
4-bit engine (``GGML_TYPES``: the bits and block size each type becomes).

llama.cpp's converter reorders the rows of a Llama model's q/k projections for its own
rotary layout (interleaved pairs instead of halves); reading undoes that
(``ArchRow.permuted_qk``), as transformers' GGUF loader does.

A GGUF file is untrusted input: every count, length and size it states is checked against
the file before anything is built from it. ``check_layout`` walks the header (metadata
arrays and strings, tensor dims, types and data offsets) against the file's size before
``GGUFReader`` parses it (the reader loops over whatever array length a file claims), and
the metadata is checked against itself and the tensors (``_config``, ``_check_tensors``:
types, heads, head size, layers and vocabulary against the tensors' dims;
``_check_tokenizer``: token list, types, merges, special ids inside the vocabulary) before
a tensor is dequantized or a model is built from the config. Each lie is one
``CheckpointError`` naming the field.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from rung.engines.errors import CheckpointError
from rung.export.gguf_tokenizer import tokenizer_files


@dataclass(frozen=True)
class ArchRow:
    hf_class: str
    model_type: str
    permuted_qk: bool  # the converter reordered q/k rows for llama.cpp's rotary layout


ARCHITECTURES = {
    "llama": ArchRow("LlamaForCausalLM", "llama", True),
    "qwen2": ArchRow("Qwen2ForCausalLM", "qwen2", False),
    "qwen3": ArchRow("Qwen3ForCausalLM", "qwen3", False),
}

# GGUF tensor name (after "blk.N.") -> Hugging Face module path (after "model.layers.N.")
LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
               "output": "lm_head"}


@dataclass(frozen=True)
class GgmlType:
    """What a GGML storage type becomes in a quantized engine: ``bits`` (4 or 8) and the
    block of input channels sharing one scale; ``None`` bits: a float type."""

    bits: int | None
    block: int
    bits_per_weight: float


# Types narrower than 5 bits become 4-bit blocks, wider ones 8-bit; block 32 (K-quants'
# sub-blocks of 32; Q6_K's 16-wide sub-blocks at 8 bits lose nothing measurable at 32).
GGML_TYPES = {
    "F32": GgmlType(None, 0, 32.0), "F16": GgmlType(None, 0, 16.0),
    "BF16": GgmlType(None, 0, 16.0),
    "Q8_0": GgmlType(8, 32, 8.5), "Q6_K": GgmlType(8, 32, 6.5625),
    "Q5_0": GgmlType(8, 32, 5.5), "Q5_1": GgmlType(8, 32, 6.0), "Q5_K": GgmlType(8, 32, 5.5),
    "Q4_0": GgmlType(4, 32, 4.5), "Q4_1": GgmlType(4, 32, 5.0), "Q4_K": GgmlType(4, 32, 4.5),
    "Q3_K": GgmlType(4, 16, 3.4375), "Q2_K": GgmlType(4, 16, 2.625),
}


@dataclass
class GgufCheckpoint:
    """A GGUF file read into Hugging Face terms."""

    config: dict[str, Any]                # config.json
    state: dict[str, torch.Tensor]        # HF tensor name -> float32
    storage: dict[str, str]               # linear module name -> GGML type name
    files: dict[str, str]                 # tokenizer.json, tokenizer_config.json
    generation: dict[str, Any]            # generation_config.json


# What a file may state before it is refused: far above any real model of the architectures
# read here (vocabularies of ~262k tokens, ~500k merges, a few hundred tensors), far below
# what the reader's per-value objects (a few hundred bytes each) would need to fill a box.
MAX_KEYS = 1 << 16            # metadata entries
MAX_VALUES = 1 << 22          # metadata values in all, each array entry one
MAX_TENSORS = 1 << 16
MAX_NESTING = 3               # arrays of arrays of ...
MAX_DIMS = 4                  # GGML_MAX_DIMS
# GGUF value types as the spec numbers them: a scalar's size in bytes; 8 a string, 9 an array
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
UINT32, STRING, ARRAY = 4, 8, 9
LEAST_BYTES = {**SCALAR_BYTES, STRING: 8, ARRAY: 12}  # the smallest a value of each type takes
DEFAULT_ALIGNMENT = 32
CORRUPT = "the file is truncated or corrupt; copy or download it again"
RECONVERT = "the file is malformed; convert the model to GGUF again"
INCOMPLETE = "the file is incomplete; convert the model to GGUF again"
SPECIAL_IDS = ("bos", "eos", "padding", "unknown")  # tokenizer.ggml.{name}_token_id, read
# a decoder layer's tensors every supported architecture has (after "blk.N.")
REQUIRED_LAYER_TENSORS = ("attn_norm.weight", "ffn_norm.weight", "attn_q.weight",
                          "attn_k.weight", "attn_v.weight", "attn_output.weight",
                          "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def check_layout(path: Path) -> None:
    """Check the header of GGUF file ``path`` against the file's size before anything is
    parsed from it: the counts, every metadata string and array length, every tensor's
    dims, type and data extent. ``GGUFReader`` trusts them (it loops over any array length
    a file claims), so a lying header is refused here first.

    Raises:
        CheckpointError: a count, length or extent the file cannot hold, naming the field.
    """
    where = str(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise CheckpointError(f"{where}: not a readable GGUF file ({size} bytes, "
                                      "shorter than a GGUF header)", CORRUPT)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _Header(buf, size, where).walk()
    except OSError as e:
        raise CheckpointError(f"{where}: cannot be read ({e.strerror or e})",
                              "check the path and its permissions") from e


class _Header:
    """A cursor over a GGUF header that checks each length against the bytes left."""

    def __init__(self, buf: Any, size: int, where: str) -> None:
        self.buf, self.size, self.where = buf, size, where
        self.pos, self.order, self.values = 0, "<", 0
        self.alignment = DEFAULT_ALIGNMENT

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: not a readable GGUF file: {what}", CORRUPT)

    def left(self) -> int:
        return self.size - self.pos

    def take(self, fmt: str, what: str) -> tuple[Any, ...]:
        n = struct.calcsize(self.order + fmt)
        if n > self.left():
            raise self.fail(f"{what} runs past the end of the file ({self.size} bytes)")
        out = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += n
        return out

    def string(self, what: str) -> int:
        """Skip a string; its offset."""
        n: int
        (n,) = self.take("Q", what)
        if n > self.left():
            raise self.fail(f"{what} claims a string of {n} bytes, but {self.left()} bytes "
                            "are left in the file")
        self.pos += n
        return self.pos - n

    def name(self, what: str) -> str:
        start = self.string(what)
        try:
            return bytes(self.buf[start:self.pos]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def walk(self) -> None:
        if self.buf[:4] != b"GGUF":
            raise self.fail("it does not start with the GGUF magic")
        (version,) = struct.unpack_from("<I", self.buf, 4)
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order = ">"
            (version,) = struct.unpack_from(">I", self.buf, 4)
        if version not in (2, 3):
            raise self.fail(f"GGUF version {version} (versions 2 and 3 are read)")
        self.pos = 8
        n_tensors, n_keys = self.take("QQ", "the header")
        for count, what, most in ((n_keys, "metadata entries", MAX_KEYS),
                                  (n_tensors, "tensors", MAX_TENSORS)):
            if count > most:
                raise self.fail(f"the header counts {count} {what}; at most {most} are read")
        if n_keys * 13 + n_tensors * 32 > self.left():  # the least each one takes
            raise self.fail(f"the header counts {n_keys} metadata entries and {n_tensors} "
                            f"tensors, more than the {self.size}-byte file can hold")
        keys: set[str] = set()
        for i in range(n_keys):
            key = self.name(f"metadata key #{i}")
            if key in keys:
                raise self.fail(f"metadata {key} appears twice")
            keys.add(key)
            (vtype,) = self.take("I", f"metadata {key}")
            if key == "general.alignment":
                if vtype != UINT32:
                    raise self.fail(f"metadata {key} must be a uint32 (type {vtype})")
                (self.alignment,) = self.take("I", f"metadata {key}")
                if self.alignment == 0 or self.alignment & (self.alignment - 1):
                    raise self.fail(f"metadata {key} {self.alignment} is not a power of two")
            else:
                self.value(key, vtype, 0)
        infos = []
        for i in range(n_tensors):
            name = self.name(f"the name of tensor #{i}")
            (n_dims,) = self.take("I", f"tensor {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise self.fail(f"tensor {name} claims {n_dims} dimensions (GGUF allows 1 to "
                                f"{MAX_DIMS})")
            dims = [int(d) for d in self.take("Q" * n_dims, f"tensor {name}")]
            code, offset = self.take("IQ", f"tensor {name}")
            infos.append((name, dims, int(code), int(offset)))
        self.check_extents(infos)

    def value(self, key: str, vtype: int, depth: int) -> None:
        self.values += 1
        if self.values > MAX_VALUES:
            raise self.fail(f"the metadata holds more than {MAX_VALUES} values (at {key})")
        if vtype in SCALAR_BYTES:
            self.take(f"{SCALAR_BYTES[vtype]}x", f"metadata {key}")
        elif vtype == STRING:
            self.string(f"metadata {key}")
        elif vtype == ARRAY:
            if depth >= MAX_NESTING:
                raise self.fail(f"metadata {key} nests arrays more than {MAX_NESTING} deep")
            itype, n = self.take("IQ", f"metadata {key}")
            least = LEAST_BYTES.get(itype)
            if least is None:
                raise self.fail(f"metadata {key} is an array of unknown value type {itype}")
            if n > self.left() // least:
                raise self.fail(f"metadata {key} claims {n} values, but the {self.left()} "
                                f"bytes left in the file hold at most {self.left() // least}")
            if self.values + n > MAX_VALUES:
                raise self.fail(f"metadata {key} holds {n} values; at most {MAX_VALUES} are "
                                "read")
            if itype in SCALAR_BYTES:
                self.values += n
                self.pos += n * least
            else:
                for _ in range(n):
                    self.value(key, itype, depth + 1)
        else:
            raise self.fail(f"metadata {key} has unknown value type {vtype}")

    def check_extents(self, infos: list[tuple[str, list[int], int, int]]) -> None:
        """Every tensor's data, as its dims and type size it, inside the file."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        start = self.pos + (-self.pos) % self.alignment
        names: set[str] = set()
        for name, dims, code, offset in infos:
            if name in names:
                raise self.fail(f"tensor {name} appears twice")
            names.add(name)
            try:
                kind = GGMLQuantizationType(code)
                block, type_bytes = GGML_QUANT_SIZES[kind]
            except (ValueError, KeyError):
                raise self.fail(f"tensor {name} has unknown GGML type {code}") from None
            if dims[0] % block:
                raise self.fail(f"tensor {name} ({kind.name}) has rows of {dims[0]} values, "
                                f"not a multiple of its block of {block}")
            nbytes = math.prod(dims) // block * type_bytes
            if start + offset + nbytes > self.size:
                raise self.fail(f"tensor {name} ({kind.name}, dims {dims}) needs {nbytes} "
                                f"bytes at data offset {offset}, past the end of the file "
                                f"({self.size} bytes)")


def read_metadata(reader: Any, where: str = "GGUF file") -> dict[str, Any]:
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            out[name] = field.contents()
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{where}: metadata {name} holds a string that is not "
                                  f"UTF-8 ({e.reason} at byte {e.start})", CORRUPT) from e
    return out


def read_gguf(path: Path, layers: int | None = None) -> GgufCheckpoint:
    """Read ``path``; ``layers``: keep only the first N decoder layers (tests, probes).

    Raises:
        CheckpointError: unreadable or self-contradicting file (a count, length, size or
            type that the file or its tensors belie, naming the field), unsupported
            architecture, tensor type or tokenizer.
    """
    import gguf

    path = Path(path)
    where = str(path)
    check_layout(path)  # before GGUFReader builds anything from the header's lengths
    try:
        reader = gguf.GGUFReader(where)
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})",
                              "copy or download the file again") from e
    meta = read_metadata(reader, where)
    arch = str(meta.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported",
                              f"supported: {', '.join(ARCHITECTURES)}")
    row = ARCHITECTURES[arch]
    _check_tokenizer(meta, where)
    files = tokenizer_files(meta, where)
    tensors = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    config = _config(meta, arch, row, tensors, where)  # metadata against the tensors' dims
    if "rope_freqs.weight" in tensors:
        raise CheckpointError(f"{path}: per-frequency RoPE factors (rope_freqs) are not "
                              "supported", "export the Hugging Face checkpoint directory")
    n_layers = config["num_hidden_layers"] if layers is None else min(
        layers, config["num_hidden_layers"])
    config["num_hidden_layers"] = n_layers
    state: dict[str, torch.Tensor] = {}
    storage: dict[str, str] = {}
    for t in reader.tensors:
        hf = _hf_name(t.name, n_layers)
        if hf is None:
            continue
        kind = t.tensor_type.name
        if kind not in GGML_TYPES:
            raise CheckpointError(f"{path}: tensor {t.name} is stored as {kind}, which is not "
                                  "read here",
                                  f"readable types: {', '.join(GGML_TYPES)}; requantize the "
                                  "GGUF (e.g. Q4_K_M) or export the original checkpoint")
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if row.permuted_qk and hf.endswith(("q_proj.weight", "q_proj.bias")):
            w = unpermute(w, config["num_attention_heads"])
        elif row.permuted_qk and hf.endswith(("k_proj.weight", "k_proj.bias")):
            w = unpermute(w, config["num_key_value_heads"])
        state[hf] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))
        if hf.endswith("_proj.weight") or hf == "lm_head.weight":
            storage[hf.removesuffix(".weight")] = kind
    config["tie_word_embeddings"] = "lm_head.weight" not in state
    if config["tie_word_embeddings"]:
        storage["lm_head"] = _type_of(reader, "token_embd.weight")
    config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in state
    tok = meta.get
    generation = {k: v for k, v in (("bos_token_id", tok("tokenizer.ggml.bos_token_id")),
                                     ("eos_token_id", tok("tokenizer.ggml.eos_token_id")),
                                     ("pad_token_id", tok("tokenizer.ggml.padding_token_id")))
                  if isinstance(v, int)}
    config.update(generation)
    return GgufCheckpoint(config, state, storage, files, generation)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, str):
        return f"the string {_clip(value)}"
    if isinstance(value, list):
        return f"an array of {len(value)} values"
    return f"the {type(value).__name__} {value!r}"


def _clip(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _int(meta: dict[str, Any], key: str, where: str, default: int | None = None,
         least: int = 1) -> int:
    """Metadata ``key``: an integer of at least ``least``; ``default`` where it is absent
    (None: it is required)."""
    value = meta.get(key, default)
    if value is None:
        raise CheckpointError(f"{where}: metadata {key} is missing", INCOMPLETE)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{where}: metadata {key} must be an integer, got "
                              f"{_describe(value)}", RECONVERT)
    if value < least:
        raise CheckpointError(f"{where}: metadata {key} must be at least {least}, got "
                              f"{value}", RECONVERT)
    return value


def _float(meta: dict[str, Any], key: str, where: str, default: float | None = None
           ) -> float:
    """Metadata ``key``: a positive finite number."""
    value = meta.get(key, default)
    if value is None:
        raise CheckpointError(f"{where}: metadata {key} is missing", INCOMPLETE)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise CheckpointError(f"{where}: metadata {key} must be a number, got "
                              f"{_describe(value)}", RECONVERT)
    if not (math.isfinite(value) and value > 0):
        raise CheckpointError(f"{where}: metadata {key} must be a positive number, got "
                              f"{value}", RECONVERT)
    return float(value)


def _config(meta: dict[str, Any], arch: str, row: ArchRow, tensors: dict[str, list[int]],
            where: str) -> dict[str, Any]:
    """The config.json of the metadata, every size checked against the others and against
    the dims of the tensors (``tensors``: name -> GGUF dims) before anything is built of
    it."""
    def key(name: str) -> str:
        return f"{arch}.{name}"

    hidden = _int(meta, key("embedding_length"), where)
    heads = _int(meta, key("attention.head_count"), where)
    kv_heads = _int(meta, key("attention.head_count_kv"), where, heads)
    if heads % kv_heads:
        raise CheckpointError(f"{where}: metadata {key('attention.head_count')} {heads} is "
                              f"not a multiple of {key('attention.head_count_kv')} {kv_heads}",
                              RECONVERT)
    if key("attention.key_length") in meta:
        head_dim = _int(meta, key("attention.key_length"), where)
    elif hidden % heads:
        raise CheckpointError(f"{where}: metadata {key('embedding_length')} {hidden} is not a "
                              f"multiple of {key('attention.head_count')} {heads} (and no "
                              f"{key('attention.key_length')} gives the head size)", RECONVERT)
    else:
        head_dim = hidden // heads
    if head_dim % 2:
        raise CheckpointError(f"{where}: the head size {head_dim} ({key('attention.key_length')}"
                              f" or {key('embedding_length')} / {key('attention.head_count')}) "
                              "is odd; RoPE rotates pairs of channels", RECONVERT)
    for name in ("attention.value_length", "rope.dimension_count"):
        if key(name) in meta and _int(meta, key(name), where) != head_dim:
            raise CheckpointError(f"{where}: metadata {key(name)} {meta[key(name)]} differs "
                                  f"from the head size {head_dim}; that is not supported",
                                  "export the Hugging Face checkpoint directory")
    layers = _int(meta, key("block_count"), where)
    ffn = _int(meta, key("feed_forward_length"), where)
    vocab = _check_tensors(tensors, where, key, hidden, heads * head_dim,
                           kv_heads * head_dim, head_dim, ffn, layers)
    if key("vocab_size") in meta and _int(meta, key("vocab_size"), where) != vocab:
        raise CheckpointError(f"{where}: metadata {key('vocab_size')} {meta[key('vocab_size')]}"
                              f" does not match the {vocab} rows of tensor token_embd.weight",
                              RECONVERT)
    n_tokens = len(meta["tokenizer.ggml.tokens"])  # a list of strings (_check_tokenizer)
    if n_tokens != vocab:
        raise CheckpointError(f"{where}: metadata tokenizer.ggml.tokens holds {n_tokens} "
                              f"tokens, but tensor token_embd.weight has {vocab} rows",
                              RECONVERT)
    cfg: dict[str, Any] = {
        "architectures": [row.hf_class], "model_type": row.model_type,
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_act": "silu",
        # at least the shortest engine the export makes (--max-seq 8)
        "max_position_embeddings": _int(meta, key("context_length"), where, 4096, least=8),
        "rms_norm_eps": _float(meta, key("attention.layer_norm_rms_epsilon"), where, 1e-6),
        "rope_theta": _float(meta, key("rope.freq_base"), where, 10000.0), "dtype": "float32",
    }
    scaling = meta.get(key("rope.scaling.type"))
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise CheckpointError(f"{where}: RoPE scaling {scaling!r} is not supported",
                                  "export the Hugging Face checkpoint directory")
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": _float(meta, key("rope.scaling.factor"), where)}
    return cfg


def _check_tensors(tensors: dict[str, list[int]], where: str, key: Callable[[str], str],
                   hidden: int, q: int, kv: int, head_dim: int, ffn: int, layers: int) -> int:
    """Check every tensor rung reads against the metadata's sizes (``q``, ``kv``: the
    heads' and the KV heads' width), the layers present against ``block_count``; the
    vocabulary size (token_embd's rows)."""
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise CheckpointError(f"{where}: tensor token_embd.weight is missing", INCOMPLETE)
    h = key("embedding_length")
    if len(embd) != 2 or embd[0] != hidden:
        raise CheckpointError(f"{where}: tensor token_embd.weight has dims {embd}, "
                              f"metadata {h} {hidden} implies [{hidden}, vocabulary]",
                              RECONVERT)
    vocab = embd[1]
    nq = f"{key('attention.head_count')} x head size"
    nkv = f"{key('attention.head_count_kv')} x head size"
    f = key("feed_forward_length")
    # GGUF dims: [inputs, outputs], the reverse of PyTorch's shape
    top = {"output.weight": ([hidden, vocab], f"{h}, token_embd.weight's rows"),
           "output_norm.weight": ([hidden], h)}
    leaves = {
        "attn_norm.weight": ([hidden], h), "ffn_norm.weight": ([hidden], h),
        "attn_q.weight": ([hidden, q], f"{h}, {nq}"),
        "attn_k.weight": ([hidden, kv], f"{h}, {nkv}"),
        "attn_v.weight": ([hidden, kv], f"{h}, {nkv}"),
        "attn_output.weight": ([q, hidden], f"{nq}, {h}"),
        "ffn_gate.weight": ([hidden, ffn], f"{h}, {f}"),
        "ffn_up.weight": ([hidden, ffn], f"{h}, {f}"),
        "ffn_down.weight": ([ffn, hidden], f"{f}, {h}"),
        "attn_q.bias": ([q], nq), "attn_k.bias": ([kv], nkv), "attn_v.bias": ([kv], nkv),
        "attn_output.bias": ([hidden], h),
        "attn_q_norm.weight": ([head_dim], "head size"),
        "attn_k_norm.weight": ([head_dim], "head size"),
    }
    present: set[int] = set()
    for name, dims in tensors.items():
        if name in top:
            want, fields = top[name]
        elif name.startswith("blk."):
            _, index, leaf = (name.split(".", 2) + ["", ""])[:3]
            if not (index.isascii() and index.isdecimal()) or str(int(index)) != index:
                raise CheckpointError(f"{where}: tensor {name}: {index!r} is not a layer "
                                      "number", RECONVERT)
            if int(index) >= layers:
                raise CheckpointError(f"{where}: tensor {name} belongs to layer {index}, but "
                                      f"metadata {key('block_count')} is {layers}", RECONVERT)
            present.add(int(index))
            if leaf not in leaves:
                continue
            want, fields = leaves[leaf]
        else:
            continue
        if dims != want:
            raise CheckpointError(f"{where}: tensor {name} has dims {dims}, the metadata "
                                  f"implies {want} ({fields})", RECONVERT)
    if len(present) != layers:  # every index is below block_count: some layers are missing
        held = f" (blk.{min(present)} to blk.{max(present)})" if present else ""
        raise CheckpointError(f"{where}: metadata {key('block_count')} is {layers}, but the "
                              f"file holds tensors of {len(present)} layers{held}", RECONVERT)
    for name in ["output_norm.weight"] + [f"blk.{i}.{leaf}" for i in range(layers)
                                          for leaf in REQUIRED_LAYER_TENSORS]:
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name} is missing", INCOMPLETE)
    return vocab


def _array_of(meta: dict[str, Any], key: str, kind: type, where: str) -> list[Any]:
    """Metadata ``key``: an array of ``kind`` (str or int)."""
    what = {str: "string", int: "integer"}[kind]
    value = meta[key]
    if not isinstance(value, list):
        raise CheckpointError(f"{where}: metadata {key} must be an array of {what}s, got "
                              f"{_describe(value)}", RECONVERT)
    for i, item in enumerate(value):
        if not isinstance(item, kind) or isinstance(item, bool):
            article = "an" if what[0] in "aeiou" else "a"
            raise CheckpointError(f"{where}: metadata {key}[{i}] must be {article} {what}, got "
                                  f"{_describe(item)}", RECONVERT)
    return value


def _check_tokenizer(meta: dict[str, Any], where: str) -> None:
    """The tokenizer's metadata, as ``tokenizer_files`` reads it: a token list of strings,
    as many token types, merges of two tokens of the list into a third, special ids inside
    the list."""
    def wrong(key: str, what: str) -> CheckpointError:
        return CheckpointError(f"{where}: metadata {key} {what}", RECONVERT)

    if "tokenizer.ggml.tokens" not in meta:
        raise CheckpointError(f"{where}: metadata tokenizer.ggml.tokens is missing",
                              "the file holds no vocabulary; convert the model to GGUF again")
    tokens = _array_of(meta, "tokenizer.ggml.tokens", str, where)
    if not tokens:
        raise wrong("tokenizer.ggml.tokens", "is empty")
    if "tokenizer.ggml.token_type" in meta:
        types = _array_of(meta, "tokenizer.ggml.token_type", int, where)
        if len(types) != len(tokens):
            raise wrong("tokenizer.ggml.token_type", f"has {len(types)} entries for the "
                        f"{len(tokens)} tokens of tokenizer.ggml.tokens")
    merges = _array_of(meta, "tokenizer.ggml.merges", str, where) if (
        "tokenizer.ggml.merges" in meta) else []
    vocab = set(tokens)
    for i, merge in enumerate(merges):
        pair = merge.split(" ", 1)  # as tokenizer_files splits it
        if len(pair) != 2 or not all(pair):
            raise wrong(f"tokenizer.ggml.merges[{i}]", f"{_clip(merge)} is not two tokens "
                        "separated by a space")
        for part, what in ((pair[0], "token"), (pair[1], "token"),
                           (pair[0] + pair[1], "merged token")):
            if part not in vocab:
                raise wrong(f"tokenizer.ggml.merges[{i}]", f"{_clip(merge)}: the {what} "
                            f"{_clip(part)} is not in tokenizer.ggml.tokens")
    for name in SPECIAL_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key not in meta:
            continue
        value = meta[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong(key, f"must be an integer, got {_describe(value)}")
        if not 0 <= value < len(tokens):
            raise wrong(key, f"{value} is past the vocabulary ({len(tokens)} tokens, ids 0 to "
                        f"{len(tokens) - 1})" if value >= 0 else f"{value} is not a token id")
    for key, kind, what in (("tokenizer.ggml.add_bos_token", bool, "a boolean"),
                            ("tokenizer.ggml.pre", str, "a string"),
                            ("tokenizer.chat_template", str, "a string")):
        if key in meta and not isinstance(meta[key], kind):
            raise wrong(key, f"must be {what}, got {_describe(meta[key])}")


def _hf_name(name: str, layers: int) -> str | None:
    """The Hugging Face name of GGUF tensor ``name``; None: not a weight rung reads, or a
    layer past ``layers``."""
    stem, _, leaf = name.rpartition(".")
    if stem in TOP_TENSORS:
        return f"{TOP_TENSORS[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        i = int(parts[1])
        return None if i >= layers else f"model.layers.{i}.{LAYER_TENSORS[parts[2]]}.{leaf}"
    return None


def _type_of(reader: Any, name: str) -> str:
    return str(next(t.tensor_type.name for t in reader.tensors if t.name == name))


G = TypeVar("G", bound=np.generic)


def unpermute(w: npt.NDArray[G], heads: int) -> npt.NDArray[G]:
    """Undo llama.cpp's q/k row order: per head, rows ``(d/2, 2)`` back to ``(2, d/2)``."""
    half = w.shape[0] // heads // 2
    return np.ascontiguousarray(
        w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def write_hf_dir(ckpt: GgufCheckpoint, out_dir: Path, weights: bool = True) -> Path:
    """Write ``ckpt`` as a Hugging Face directory (what ``save_pretrained`` writes);
    ``weights=False``: everything but ``model.safetensors``."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(ckpt.config, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps(ckpt.generation, indent=2))
    for name, text in ckpt.files.items():
        (out_dir / name).write_text(text, encoding="utf-8")
    if weights:
        save_file({k: v.contiguous() for k, v in ckpt.state.items()},
                  str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
