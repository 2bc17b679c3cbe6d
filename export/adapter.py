"""A LoRA adapter in the form ``peft`` writes it, merged into the base before export.

``rung export BASE --adapter DIR`` reads ``DIR/adapter_config.json`` and
``DIR/adapter_model.safetensors`` and adds ``scale * B @ A`` to each targeted linear
weight of the imported model (``scale`` = ``lora_alpha / r``, or ``lora_alpha / sqrt(r)``
with ``use_rslora``), for a Hugging Face directory and a GGUF file alike. The engine is
then exported and verified against the merged model like any checkpoint. What does not fit
the base is refused with the field named: a module the base lacks (``target_modules``), a
weight of another shape (the adapter was trained on another base), a tensor whose rank is
not ``r``, a variant rung does not merge (DoRA, biases, ``modules_to_save``, per-module
ranks). The manifest records the adapter: name, sha256, rank, alpha, targets, modules.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from rung.engines.errors import CheckpointError
from rung.engines.manifest import sha256_file
from rung.export.model import RungForCausalLM

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_REFUSED = {   # adapter_config.json field -> the value rung merges
    "use_dora": False, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
    "rank_pattern": {}, "alpha_pattern": {}, "layer_replication": None,
    "trainable_token_indices": None, "target_parameters": None}


@dataclass(frozen=True)
class Adapter:
    path: Path
    rank: int
    alpha: float
    scale: float
    targets: tuple[str, ...]
    sha256: str
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]   # module -> (A [r, in], B [out, r])

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of the adapter."""
        return {"name": self.path.name, "sha256": self.sha256, "rank": self.rank,
                "alpha": self.alpha, "targets": list(self.targets),
                "modules": len(self.pairs)}


def _fail(path: Path, what: str, hint: str) -> CheckpointError:
    return CheckpointError(f"{path}: {what}", hint)


def _config(path: Path) -> dict[str, Any]:
    cfg_path = path / CONFIG_NAME
    if not cfg_path.is_file():
        raise _fail(path, f"no {CONFIG_NAME}", "give the folder peft's save_pretrained wrote")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(cfg_path, f"corrupt JSON ({e})", "restore the file") from e
    if not isinstance(cfg, dict):
        raise _fail(cfg_path, "expected a JSON object", "restore the file")
    if cfg.get("peft_type") != "LORA":
        raise _fail(cfg_path, f"peft_type {cfg.get('peft_type')!r}: only LORA adapters merge",
                    "train a LoRA adapter")
    for key, merged in _REFUSED.items():
        if cfg.get(key) not in (merged, None):
            raise _fail(cfg_path, f"{key} {cfg[key]!r}: rung merges only {key} = {merged!r}",
                        "train the adapter without it")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _fail(cfg_path, f"r {r!r} is not a positive integer", "restore the file")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0:
        raise _fail(cfg_path, f"lora_alpha {alpha!r} is not a positive number",
                    "restore the file")
    return cfg


def read_adapter(path: Path) -> Adapter:
    """Read and check an adapter folder; raises ``CheckpointError`` naming the field."""
    path = Path(path)
    cfg = _config(path)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise _fail(path, f"no {WEIGHTS_NAME}", "give the folder peft's save_pretrained wrote")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise _fail(weights, f"unreadable or truncated safetensors file ({e})",
                    "copy the adapter again") from e
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        stem = key.removeprefix(_PREFIX)
        for part in ("lora_A", "lora_B"):
            if f".{part}." in stem:
                module = stem.split(f".{part}.", 1)[0]
                pairs.setdefault(module, {})[part] = t
                break
        else:
            raise _fail(weights, f"tensor {key!r} is not a LoRA A or B matrix",
                        "only LoRA matrices merge (modules_to_save, embeddings: not)")
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise _fail(weights, f"{module}: lora_A or lora_B missing", "copy the adapter again")
        a, b = ab["lora_A"], ab["lora_B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != r or b.shape[1] != r:
            raise _fail(weights, f"{module}: rank {a.shape[0]} x {b.shape[-1]} but r is {r} "
                        f"(lora_A {tuple(a.shape)}, lora_B {tuple(b.shape)})",
                        f"{CONFIG_NAME} and the weights disagree (r)")
        out[module] = (a.float(), b.float())
    if not out:
        raise _fail(weights, "no LoRA matrices", "copy the adapter again")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    return Adapter(path, r, alpha, scale, tuple(sorted(targets)), sha256_file(weights), out)


def merge(model: RungForCausalLM, adapter: Adapter) -> dict[str, Any]:
    """Add the adapter to ``model``'s weights in place; returns the manifest record."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    leaves = {name.rsplit(".", 1)[-1] for name in linears}
    for target in adapter.targets:
        if target not in leaves and target not in linears:
            raise _fail(adapter.path / CONFIG_NAME,
                        f"target_modules: {target!r} is no linear layer of the base "
                        f"(it has {', '.join(sorted(leaves))})",
                        "train the adapter on this base")
    for module, (a, b) in adapter.pairs.items():
        layer = linears.get(module)
        if layer is None:
            raise _fail(adapter.path / WEIGHTS_NAME, f"{module}: no such linear layer in the "
                        f"base (target_modules)", "train the adapter on this base")
        out_f, in_f = layer.weight.shape
        if a.shape[1] != in_f or b.shape[0] != out_f:
            raise _fail(adapter.path / WEIGHTS_NAME,
                        f"{module}: the adapter maps {a.shape[1]} -> {b.shape[0]}, the base's "
                        f"weight is {in_f} -> {out_f} (base shape)",
                        "train the adapter on this base")
    if "lm_head" in adapter.pairs and model.cfg.tie_word_embeddings:
        raise _fail(adapter.path / WEIGHTS_NAME, "lm_head: the base ties its head to the "
                    "embeddings, a merged head would change both (target_modules)",
                    "train the adapter without lm_head")
    with torch.no_grad():
        for module, (a, b) in adapter.pairs.items():
            weight = linears[module].weight
            weight.add_((b @ a).mul_(adapter.scale).to(weight.dtype))
    return adapter.record()
