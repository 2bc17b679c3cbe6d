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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
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


def read_metadata(reader: Any) -> dict[str, Any]:
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        out[name] = value
    return out


def read_gguf(path: Path, layers: int | None = None) -> GgufCheckpoint:
    """Read ``path``; ``layers``: keep only the first N decoder layers (tests, probes).

    Raises:
        CheckpointError: unreadable file, unsupported architecture, tensor type or tokenizer.
    """
    import gguf

    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})",
                              "copy or download the file again") from e
    meta = read_metadata(reader)
    arch = str(meta.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported",
                              f"supported: {', '.join(ARCHITECTURES)}")
    row = ARCHITECTURES[arch]
    files = tokenizer_files(meta, str(path))
    config = _config(meta, arch, row, str(path))
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
    if "rope_freqs.weight" in {t.name for t in reader.tensors}:
        raise CheckpointError(f"{path}: per-frequency RoPE factors (rope_freqs) are not "
                              "supported", "export the Hugging Face checkpoint directory")
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


def _config(meta: dict[str, Any], arch: str, row: ArchRow, where: str) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(f"{where}: metadata {arch}.{key} is missing",
                                  "the file is incomplete; convert the model again")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    cfg: dict[str, Any] = {
        "architectures": [row.hf_class], "model_type": row.model_type,
        "vocab_size": int(vocab), "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": int(get("context_length", 4096)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)), "dtype": "float32",
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise CheckpointError(f"{where}: RoPE scaling {scaling!r} is not supported",
                                  "export the Hugging Face checkpoint directory")
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(get("rope.scaling.factor"))}
    return cfg


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


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
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
