"""Import a local Hugging Face checkpoint directory, or a GGUF file, into rung's PyTorch model.

Reads ``config.json``, single or sharded ``*.safetensors`` (with
``model.safetensors.index.json``), the tokenizer files and ``generation_config.json``. A
``.gguf`` file is read by ``export/gguf.py`` into the same terms; its config and tokenizer
files are written to a small side directory (the engine copies its tokenizer from there),
its weights stay in memory. Every failure is a ``CheckpointError`` that names the file and
the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open

from rung.engines.errors import CheckpointError, TokenizerError
from rung.engines.manifest import TokenizerSpec
from rung.engines.tokenizer import read_tokenizer_spec
from rung.export.arch import ModelConfig, parse_config
from rung.export.model import RungForCausalLM

T = TypeVar("T")

INDEX_NAME = "model.safetensors.index.json"
# Tensors a checkpoint may carry that the model recomputes.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Projections a checkpoint may keep packed (Phi-3) -> the model's layers, rows in order
PACKED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


@dataclass
class Checkpoint:
    """An imported checkpoint: typed config, loaded model, tokenizer and generation config."""

    path: Path
    config: ModelConfig
    model: RungForCausalLM
    tokenizer: TokenizerSpec
    generation: dict[str, Any]
    # a GGUF source: linear module name (layers.3.mlp.down_proj, lm_head) -> GGML type
    storage: dict[str, str] | None = None


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path}: missing",
                                  "point at a Hugging Face model directory (save_pretrained)")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt JSON ({e})", "restore the file") from e
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e})", "check permissions") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", "restore the file")
    return data


def weight_files(hf_dir: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it."""
    index = hf_dir / INDEX_NAME
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map", "restore the index file")
        files = {name: hf_dir / f for name, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise CheckpointError(f"{f}: shard named in {INDEX_NAME} is missing",
                                      "download or copy all shards")
        return files
    single = hf_dir / "model.safetensors"
    if not single.is_file():
        found = sorted(p.name for p in hf_dir.glob("*.safetensors"))
        hint = (f"found {found} but no {INDEX_NAME}" if found
                else "only safetensors weights are read; save with safe_serialization=True")
        raise CheckpointError(f"{hf_dir}: no model.safetensors", hint)
    names = _open(single, lambda f: list(f.keys()))
    return dict.fromkeys(names, single)


def _open(path: Path, fn: Callable[[Any], T]) -> T:
    try:
        with safe_open(str(path), framework="pt") as f:
            return fn(f)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable or truncated safetensors file ({e})",
                              "download or copy the file again") from e


def load_state(hf_dir: Path) -> dict[str, torch.Tensor]:
    files = weight_files(hf_dir)
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    state: dict[str, torch.Tensor] = {}
    for f, names in by_file.items():
        state.update(_open(f, partial(_read, names=names, path=f)))
    return state


def _read(handle: Any, names: list[str], path: Path) -> dict[str, torch.Tensor]:
    present = set(handle.keys())
    out = {}
    for n in names:
        if n not in present:
            raise CheckpointError(f"{path}: tensor {n!r} named in the index is not in the file",
                                  "download or copy the shard again")
        out[n] = handle.get_tensor(n)
    return out


def load_weights(model: RungForCausalLM, state: dict[str, torch.Tensor], where: Path) -> None:
    """Copy checkpoint tensors into the model, checking names and shapes.

    A checkpoint trained by rung carries FFN gates (``mlp.ffn_gate.proj.*``); they are
    created on the model before loading.
    """
    if any(".mlp.ffn_gate." in k for k in state) and not model.has_ffn_gates:
        model.add_ffn_gates()
    expected = dict(model.named_parameters())
    state = unpack({k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)},
                   expected, where)
    if model.cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{where}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} in all)",
            "config.json does not match the weights (architecture, bias or norm flags)")
    missing = sorted(set(expected) - set(state))
    if missing:
        hint = ("set tie_word_embeddings: true in config.json if the head is tied"
                if missing == ["lm_head.weight"] else "the checkpoint is incomplete")
        raise CheckpointError(f"{where}: missing tensor {missing[0]!r} ({len(missing)} in all)",
                              hint)
    with torch.no_grad():
        for name, param in expected.items():
            t = state[name]
            if tuple(t.shape) != tuple(param.shape):
                raise CheckpointError(
                    f"{where}: tensor {name!r} has shape {tuple(t.shape)}, config.json implies "
                    f"{tuple(param.shape)}", "config.json and the weights disagree")
            param.copy_(t.to(torch.float32))


def unpack(state: dict[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
           where: Path) -> dict[str, torch.Tensor]:
    """Split packed projections (``PACKED``: Phi-3's ``qkv_proj``, ``gate_up_proj``) into
    the model's layers, by the rows each layer has."""
    out = {}
    for name, t in state.items():
        stem, _, leaf = name.rpartition(".")            # ...layers.3.self_attn.qkv_proj
        parent, _, packed = stem.rpartition(".layers.")
        layer, _, module = packed.partition(".")
        names = [f"{parent}.layers.{layer}.{part}.{leaf}" for part in PACKED.get(module, ())]
        if not names or not all(n in expected for n in names):
            out[name] = t  # not packed, or nothing to unpack into: load_weights names it
            continue
        rows = [expected[n].shape[0] for n in names]
        if sum(rows) != t.shape[0]:
            raise CheckpointError(
                f"{where}: tensor {name!r} has {t.shape[0]} rows, config.json implies "
                f"{sum(rows)} ({' + '.join(map(str, rows))})",
                "config.json and the weights disagree")
        out.update(zip(names, torch.split(t, rows), strict=True))
    return out


def load_checkpoint(hf_dir: Path, max_seq: int | None = None,
                    norm_eps: float | None = None, workdir: Path | None = None) -> Checkpoint:
    """Import ``hf_dir`` (or a ``.gguf`` file) into an fp32 ``RungForCausalLM``.

    Args:
        hf_dir: local directory in Hugging Face layout, or a GGUF file.
        max_seq: longest sequence the exported engine serves (default: the config's
            max_position_embeddings, capped at 4096).
        norm_eps: override every RMSNorm eps.
        workdir: a GGUF file's config and tokenizer files go here (required for GGUF).
    Raises:
        CheckpointError: missing/corrupt files, unsupported architecture, shape mismatch.
    """
    hf_dir = Path(hf_dir)
    if hf_dir.suffix == ".gguf" and hf_dir.is_file():
        from rung.export.gguf import read_gguf, write_hf_dir

        if workdir is None:
            raise CheckpointError(f"{hf_dir}: a GGUF file needs a work directory", "report it")
        gguf = read_gguf(hf_dir)
        side = write_hf_dir(gguf, workdir, weights=False)
        ckpt = _assemble(side, gguf.state, max_seq, norm_eps)
        ckpt.storage = {name.removeprefix("model."): kind
                        for name, kind in gguf.storage.items()}
        return ckpt
    if not hf_dir.is_dir():
        raise CheckpointError(f"{hf_dir}: not a directory",
                              "give a local model directory or a .gguf file")
    return _assemble(hf_dir, None, max_seq, norm_eps)


def _assemble(hf_dir: Path, state: dict[str, torch.Tensor] | None, max_seq: int | None,
              norm_eps: float | None) -> Checkpoint:
    """The checkpoint of ``hf_dir``'s config and tokenizer, with ``state`` as its weights
    (None: read from the directory's safetensors)."""
    cfg = parse_config(read_json(hf_dir / "config.json"), str(hf_dir / "config.json"))
    limit = cfg.max_position
    seq = min(max_seq or min(limit, 4096), limit)
    generation = read_json(hf_dir / "generation_config.json", required=False)
    gen_eos = generation.get("eos_token_id")
    gen_ids = gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in gen_ids):
        raise CheckpointError(f"{hf_dir / 'generation_config.json'}: eos_token_id must be an "
                              f"integer or a list of integers, got {gen_eos!r}",
                              "fix generation_config.json")
    eos = list(cfg.eos_token_ids) + gen_ids
    try:
        tok = read_tokenizer_spec(hf_dir, extra_eos_ids=eos)
    except TokenizerError as e:
        raise CheckpointError(e.message, e.hint) from e
    model = RungForCausalLM(cfg, seq)
    load_weights(model, load_state(hf_dir) if state is None else state, hf_dir)
    if norm_eps is not None:
        model.set_norm_eps(norm_eps)
    model.eval()
    return Checkpoint(hf_dir, cfg, model, tok, generation)
