"""Export-time verification: the ONNX graph, run by the real engine with its KV cache, against
the PyTorch model's full causal forward on the same tokens.

Prompts are seeded random token sequences of different lengths, run as one batch (so the
check also covers right padding and per-row past lengths), each followed by greedy decode
steps. Every step's logits are compared with the reference at the same position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rung.engines import Engine
from rung.engines.manifest import Parity
from rung.export.model import RungForCausalLM


@dataclass(frozen=True)
class Tolerance:
    rel_logit: float        # max |onnx - torch| / max(1, max |torch|)
    greedy_agreement: float  # minimum fraction of steps with the same argmax


TOLERANCES = {"fp32": Tolerance(1e-3, 0.95), "fp16": Tolerance(5e-2, 0.75)}


def verify(engine: Engine, model: RungForCausalLM, weights: str, prompts: int = 4,
           steps: int = 12, seed: int = 0) -> Parity:
    """Run ``prompts`` random prompts + ``steps`` greedy steps; return the parity record."""
    rng = np.random.default_rng(seed)
    vocab, max_seq = model.cfg.vocab_size, engine.manifest.dims.max_seq
    lens = [max(2, min(n, max_seq // 2)) for n in (5, 11, 17, 29)[:prompts]]
    seqs = [rng.integers(0, vocab, n).tolist() for n in lens]
    steps = max(1, min(steps, max_seq - max(lens) - 1))
    cache = engine.new_cache(len(seqs))
    tokens = np.zeros((len(seqs), max(lens)), np.int64)
    for b, s in enumerate(seqs):
        tokens[b, :len(s)] = s
    got: list[list[np.ndarray]] = [[] for _ in seqs]
    logits = engine.forward(cache, tokens, np.array(lens, np.int64))
    for _ in range(steps):
        nxt = logits[:, -1].argmax(-1)
        for b, s in enumerate(seqs):
            got[b].append(logits[b, -1])
            s.append(int(nxt[b]))
        logits = engine.forward(cache, nxt[:, None].astype(np.int64),
                                np.ones(len(seqs), np.int64))
    max_abs, scale, agree, total = 0.0, 1.0, 0, 0
    with torch.no_grad():
        for b, s in enumerate(seqs):
            ref = model(torch.tensor([s[:-1]]))[0].numpy()        # [len, V]
            ref = ref[lens[b] - 1:lens[b] - 1 + steps]
            mine = np.stack(got[b])
            max_abs = max(max_abs, float(np.abs(mine - ref).max()))
            scale = max(scale, float(np.abs(ref).max()))
            agree += int((mine.argmax(-1) == ref.argmax(-1)).sum())
            total += len(ref)
    tol = TOLERANCES[weights]
    rel, agreement = max_abs / scale, agree / total
    return Parity(prompts=len(seqs), tokens=total, max_abs_logit_diff=max_abs,
                  max_rel_logit_diff=rel, greedy_agreement=agreement,
                  tolerance_abs=tol.rel_logit * scale,
                  passed=rel <= tol.rel_logit and agreement >= tol.greedy_agreement)
