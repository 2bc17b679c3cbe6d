"""Fit the FFN skip gates of an imported model from calibration text, inside a quality budget.

1. Run the model on the calibration text and record, per layer and token, the FFN input
   ``h`` (the normalized hidden state) and the FFN's relative contribution
   ``r = |FFN(h)| / |x|`` to the residual stream ``x`` it is added to.
2. Per layer, fit a ridge regression ``log r ~ w.h + b``: the gate's linear probe.
3. One threshold ``tau`` on the predicted log contribution, shared by all layers (a layer
   whose FFN matters more simply skips less): skip when ``w.h + b < tau``, i.e. the gate
   ``z = -w.h + (tau - b) > 0``. Choose the largest ``tau`` whose quality on held-out text
   stays within the budget: mean KL divergence (nats) of the next-token distribution from
   the unskipped model's, every held-out position treated as a decode step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rung.engines.errors import ExportError
from rung.export.model import RungForCausalLM
from rung.export.verify import logit_metrics

RIDGE = 1e-2
# held-out logits are kept for every evaluation: bound tokens x vocabulary (floats)
HELDOUT_LOGITS = 200_000_000


@dataclass(frozen=True)
class Calibration:
    budget_mean_kl: float
    threshold: float                 # tau, on the predicted log relative contribution
    skip_rate: list[float]           # per layer, held-out
    skip_rate_mean: float
    quality: dict[str, float]        # held-out: mean_kl, greedy_agreement, ... vs unskipped
    fit_r2: list[float]              # per layer: how well the probe predicts log r
    tokens_fit: int
    tokens_heldout: int

    def to_manifest(self) -> dict[str, Any]:
        return {"mode": "calibrate", **asdict(self)}


def _chunks(ids: list[int], length: int) -> torch.Tensor:
    n = len(ids) // length
    return torch.tensor(ids[:n * length]).view(n, length)


def _record(model: RungForCausalLM, batch: torch.Tensor
            ) -> tuple[list[npt.NDArray[np.float32]], list[npt.NDArray[np.float32]]]:
    """Per layer: FFN inputs h [N, H] and log relative contributions [N]."""
    hs: list[list[npt.NDArray[np.float32]]] = [[] for _ in model.model.layers]
    ys: list[list[npt.NDArray[np.float32]]] = [[] for _ in model.model.layers]
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor,
                 i: int = i) -> None:
            h = args[0]
            hs[i].append(h.reshape(-1, h.shape[-1]).numpy())
        def resid(mod: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor,
                  i: int = i) -> None:
            ys[i].append(args[0].reshape(-1, args[0].shape[-1]).norm(dim=-1).numpy())
        hooks.append(layer.mlp.register_forward_hook(hook))
        hooks.append(layer.ffn_norm.register_forward_hook(resid))
    contrib: list[list[npt.NDArray[np.float32]]] = [[] for _ in model.model.layers]
    for i, layer in enumerate(model.model.layers):
        def out_hook(mod: torch.nn.Module, args: tuple[torch.Tensor, ...],
                     out: torch.Tensor, i: int = i) -> None:
            contrib[i].append(out.reshape(-1, out.shape[-1]).norm(dim=-1).numpy())
        hooks.append(layer.mlp.register_forward_hook(out_hook))  # its post norm included
    try:
        with torch.no_grad():
            for row in torch.split(batch, 4):
                model(row)
    finally:
        for h in hooks:
            h.remove()
    h_all = [np.concatenate(h) for h in hs]
    y_all = [np.log(np.concatenate(c) / np.maximum(np.concatenate(r), 1e-12) + 1e-9)
             for c, r in zip(contrib, ys, strict=True)]
    return h_all, y_all


def _fit(h: npt.NDArray[np.float32], y: npt.NDArray[np.float32]
         ) -> tuple[npt.NDArray[np.float64], float, float]:
    """Ridge regression y ~ h.w + b; returns (w, b, r2)."""
    x = np.concatenate([h.astype(np.float64), np.ones((len(h), 1))], axis=1)
    reg = RIDGE * len(h) * np.eye(x.shape[1])
    reg[-1, -1] = 0.0
    coef = np.linalg.solve(x.T @ x + reg, x.T @ y)
    pred = x @ coef
    r2 = 1.0 - float(((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12))
    return coef[:-1], float(coef[-1]), r2


def _set_gates(model: RungForCausalLM, probes: list[tuple[npt.NDArray[np.float64], float]],
               tau: float) -> None:
    with torch.no_grad():
        for layer, (w, b) in zip(model.model.layers, probes, strict=True):
            gate = layer.mlp.ffn_gate
            if gate is None:
                raise ExportError("calibration needs the FFN gates in place")
            gate.proj.weight.copy_(torch.from_numpy(-w).view(1, -1))
            gate.proj.bias.fill_(tau - b)


def _evaluate(model: RungForCausalLM, heldout: torch.Tensor, ref: npt.NDArray[np.float32]
              ) -> tuple[dict[str, float], list[float]]:
    gate_positions = torch.ones(heldout.shape, dtype=torch.bool)
    gate_positions[:, 0] = False  # a prompt's first token is always prefilled
    logits, rates = [], []
    with torch.no_grad():
        for row, pos in zip(torch.split(heldout, 4), torch.split(gate_positions, 4),
                            strict=True):
            logits.append(model(row, gate_positions=pos).reshape(-1, model.cfg.vocab_size))
            rates.append([float(p[:, 1:].mean()) * len(row) for p in model.skip_probs()])
    per_layer = (np.array(rates).sum(0) / len(heldout)).tolist()
    return logit_metrics(ref, torch.cat(logits).numpy()), per_layer


def calibrate(model: RungForCausalLM, ids: list[int], budget: float, chunk: int = 128,
              heldout_frac: float = 0.25, steps: int = 10,
              max_tokens: int = 16384) -> Calibration:
    """Fit gates on ``ids`` (calibration text tokens, at most ``max_tokens`` used), set
    them on ``model``, report.

    Raises:
        ExportError: too little text, or a budget that no threshold can meet.
    """
    chunk = min(chunk, model.max_seq)
    data = _chunks(ids[:max_tokens], chunk)
    if len(data) < 4:
        raise ExportError(f"calibration text gives {len(ids)} tokens; at least {4 * chunk} "
                          "are needed", "give a longer --calib-text file")
    n_held = max(1, int(len(data) * heldout_frac))
    n_held = min(n_held, max(1, HELDOUT_LOGITS // (chunk * model.cfg.vocab_size)))
    fit, held = data[:-n_held], data[-n_held:]
    model.eval()
    h_all, y_all = _record(model, fit)
    fits = [_fit(h, y) for h, y in zip(h_all, y_all, strict=True)]
    probes = [(w, b) for w, b, _ in fits]
    with torch.no_grad():
        ref = torch.cat([model(r).reshape(-1, model.cfg.vocab_size)
                         for r in torch.split(held, 4)]).numpy()
    model.add_ffn_gates()
    preds = np.concatenate([h @ w + b for h, (w, b) in zip(h_all, probes, strict=True)])
    # candidate thresholds: quantiles of the predicted contributions, 0..90 % skipped
    lo, hi = 0, steps
    candidates = np.quantile(preds, np.linspace(0.0, 0.9, steps + 1))
    best: tuple[float, dict[str, float], list[float]] | None = None
    while lo <= hi:  # the largest tau within budget (quality falls as tau grows)
        mid = (lo + hi) // 2
        tau = float(candidates[mid])
        _set_gates(model, probes, tau)
        quality, rates = _evaluate(model, held, ref)
        if quality["mean_kl"] <= budget:
            best, lo = (tau, quality, rates), mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ExportError(f"no FFN skip threshold keeps the mean KL within {budget}",
                          "raise --quality-budget or export with --ffn-skip off")
    tau, quality, rates = best
    _set_gates(model, probes, tau)
    return Calibration(budget_mean_kl=budget, threshold=tau, skip_rate=rates,
                       skip_rate_mean=float(np.mean(rates)), quality=quality,
                       fit_r2=[r2 for _, _, r2 in fits], tokens_fit=int(fit.numel()),
                       tokens_heldout=int(held.numel()))
