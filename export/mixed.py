"""Mixed precision for int4 exports: which weights stay at 8 bits, measured, within a budget.

A 4-bit export does not hurt every matrix alike: on a small real model a few matrices
carry most of the damage (llama.cpp's K-quant mixes keep ``attn_v`` and ``ffn_down`` of
some layers at 6 bits for that reason). Here the choice is measured instead of fixed:

1. Calibration text (``export/prompts.py``, or ``--calib-text``) runs through the fp32
   model once: the reference logits, each layer's input hidden states, and per linear
   layer the mean square of its input channels (the rounding weights of
   ``export/blockquant.py``, an importance matrix as llama.cpp calls it).
2. Every unit (per layer: the q/k/v projections, ``o_proj``, gate/up, ``down_proj``; and
   the LM head when it is 4-bit) is quantized alone at its planned bits; the layers from
   its own on rerun on the cached hidden states, and the mean KL of the next-token
   distributions against the reference is the unit's sensitivity.
3. Units are ranked by sensitivity per byte that 8 bits would add. The fewest top-ranked
   units that bring the whole quantized model within ``target`` mean KL on the calibration
   text (binary search; each probe one forward) go to 8 bits. A model already within
   ``target`` with every unit at its planned bits skips steps 2 and 3.

The export then measures the engine itself on held-out text (``export/exporter.py``) and
refuses when the budget is not met.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rung.export.blockquant import Blocks, quantize
from rung.export.model import RungForCausalLM

# Per decoder layer, the weights that share one graph node in the fused graph (and so one
# precision): q/k/v and gate/up are packed there.
LAYER_UNITS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "o": ("self_attn.o_proj",), "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
               "down": ("mlp.down_proj",)}
SENSITIVITY_ROWS = 4  # calibration rows each unit alone is measured on (the ranking only)


@dataclass(frozen=True)
class Unit:
    name: str                  # layers.3.gate_up, lm_head
    parts: tuple[str, ...]     # module names under model.model (or "lm_head")
    layer: int                 # first layer its change reaches (num_layers: the head)
    params: int


@dataclass(frozen=True)
class Choice:
    """The manifest's ``quantization.mixed`` record."""

    target_mean_kl: float
    calibration_tokens: int
    promoted: list[str]              # units moved to 8 bits, most sensitive first
    mean_kl_all_low: float           # calibration text, every unit at its planned bits
    mean_kl: float                   # calibration text, after the promotions
    sensitivity: dict[str, float]    # unit -> mean KL with that unit alone quantized

    def to_manifest(self) -> dict[str, Any]:
        return asdict(self)


def units(model: RungForCausalLM, with_head: bool) -> list[Unit]:
    out = []
    for i, layer in enumerate(model.model.layers):
        for name, parts in LAYER_UNITS.items():
            out.append(Unit(f"layers.{i}.{name}", tuple(f"layers.{i}.{p}" for p in parts), i,
                            sum(layer.get_parameter(f"{p}.weight").numel() for p in parts)))
    if with_head:
        out.append(Unit("lm_head", ("lm_head",), len(model.model.layers),
                        model.lm_head.weight.numel()))
    return out


def module(model: RungForCausalLM, name: str) -> torch.nn.Linear:
    found = model.lm_head if name == "lm_head" else model.model.get_submodule(name)
    assert isinstance(found, torch.nn.Linear)
    return found


def importance(model: RungForCausalLM, rows: npt.NDArray[np.int64]
               ) -> dict[str, npt.NDArray[np.float32]]:
    """Per linear layer (``layers.3.mlp.down_proj``, ``lm_head``): the mean square of each
    input channel over ``rows`` [n, L] of calibration tokens."""
    sums: dict[str, torch.Tensor] = {}
    count = [0]
    hooks = []
    names = [n for n, m in model.model.named_modules() if isinstance(m, torch.nn.Linear)
             and "ffn_gate" not in n]
    for name in [*names, "lm_head"]:
        def hook(mod: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor,
                 name: str = name) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
        hooks.append(module(model, name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            for chunk in np.array_split(rows, max(1, len(rows) // 4)):
                model(torch.from_numpy(chunk))
                count[0] += chunk.size
    finally:
        for h in hooks:
            h.remove()
    return {n: (s / count[0]).float().numpy() for n, s in sums.items()}


def choose(model: RungForCausalLM, rows: npt.NDArray[np.int64], bits_of: Callable[[str], int],
           block_of: Callable[[str], int], symmetric: bool,
           imp: dict[str, npt.NDArray[np.float32]], target: float, with_head: bool,
           cache: dict[tuple[str, int, int], Blocks]) -> tuple[dict[str, int], Choice]:
    """Which units go to 8 bits (``{module name: 8}`` for each of their parts) so that the
    model quantized as planned (``bits_of``, ``block_of`` per module) stays within
    ``target`` mean KL of the fp32 model on ``rows``. Works on a copy of ``model``; every
    weight it rounds lands in ``cache`` ((module, bits, block) -> blocks) for the graph."""
    model = untied_copy(model)
    ids = torch.from_numpy(rows)
    frame = model.frame(*ids.shape)
    hidden: list[torch.Tensor] = []  # what enters each layer, then the final norm
    hooks = [m.register_forward_pre_hook(lambda m, a: hidden.append(a[0]))
             for m in [*model.model.layers, model.model.norm]]
    try:
        with torch.no_grad():
            ref = torch.log_softmax(model(ids).reshape(-1, model.cfg.vocab_size), -1)
    finally:
        for h in hooks:
            h.remove()
    probe = min(len(rows), SENSITIVITY_ROWS)  # rows each unit's sensitivity is measured on
    original = {p: module(model, p).weight.detach().clone()
                for u in units(model, with_head) for p in u.parts}
    low = {p: _rounded(cache, p, w, bits_of(p), block_of(p), symmetric, imp.get(p))
           for p, w in original.items() if bits_of(p) < 8}
    candidates = [u for u in units(model, with_head) if any(p in low for p in u.parts)]

    def run(start: int, n: int = len(rows)) -> float:
        with torch.no_grad():
            got = model.forward_from(hidden[start][:n], start, frame.rows(n))
            return mean_kl(ref[:n * rows.shape[1]], got.reshape(-1, model.cfg.vocab_size))

    def load(weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for p, w in weights.items():
                module(model, p).weight.copy_(w)

    high: dict[str, torch.Tensor] = {}
    ranked: list[Unit] = []

    def total(k: int) -> float:
        up = {p for u in ranked[:k] for p in u.parts}
        for p in up - set(high):
            high[p] = _rounded(cache, p, original[p], 8, block_of(p), symmetric, imp.get(p))
        load({p: high[p] if p in up else low.get(p, original[p]) for p in original})
        return run(0)

    kl_all = kl = total(0)
    sensitivity: dict[str, float] = {}
    promoted: list[Unit] = []
    if kl > target:  # measure each unit alone, then promote the fewest that fit
        load(original)
        for u in candidates:
            load({p: low[p] for p in u.parts if p in low})
            sensitivity[u.name] = run(u.layer, probe)
            load({p: original[p] for p in u.parts})
        ranked = sorted(candidates, key=lambda u: -sensitivity[u.name] / u.params)
        lo_k, hi_k = 0, len(ranked)
        kl = total(hi_k)
        while hi_k - lo_k > 1:  # total(lo_k) > target; total(hi_k) <= target or hi_k is all
            mid = (lo_k + hi_k) // 2
            value = total(mid)
            if value <= target:
                hi_k, kl = mid, value
            else:
                lo_k = mid
        promoted = ranked[:hi_k]
    bits = {p: 8 for u in promoted for p in u.parts}
    return bits, Choice(target, int(rows.size), [u.name for u in promoted], kl_all, kl,
                        {k: float(v) for k, v in sensitivity.items()})


def mean_kl(ref_logp: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean KL(ref || softmax(logits)) over rows, in float32 (nats)."""
    logp = torch.log_softmax(logits.float(), -1)
    return float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())


def untied_copy(model: RungForCausalLM) -> RungForCausalLM:
    """A copy of ``model`` whose LM head has its own weight (the graph's embedding table
    stays float whatever happens to the head)."""
    out = copy.deepcopy(model)
    if out.cfg.tie_word_embeddings:
        out.lm_head.weight = torch.nn.Parameter(out.lm_head.weight.detach().clone())
    return out.eval()


def _rounded(cache: dict[tuple[str, int, int], Blocks], name: str, w: torch.Tensor,
             bits: int, block: int, symmetric: bool, imp: npt.NDArray[np.float32] | None
             ) -> torch.Tensor:
    key = (name, bits, block)
    if key not in cache:
        cache[key] = quantize(w.numpy(), bits, block, symmetric, imp)
    return torch.from_numpy(cache[key].dequantize())
