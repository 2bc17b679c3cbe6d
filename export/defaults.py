"""What an export gets without flags, and why: ``--kv auto`` and ``--ffn-skip auto``.

**KV dtype** (``choose_kv``): the KV cache dtype an export gets without ``--kv``.

fp8 KV (e4m3, per-token-per-head scales) pays only where attention reads it in place. On
the ONNX target there is no such kernel (ONNX Runtime's ``GroupQueryAttention`` takes
fp32/fp16 caches, on the CPU and on CUDA), so fp8 runs the generic graph, which
dequantizes the whole past every step: on a 2-core AVX-512 Xeon the demo model answers its
demo requests 1.9x slower with fp8 than with fp16 on the fused graph, 10 of 15 answers as
with fp32 KV against 15 of 15 (the issue behind ``auto`` reported the Qwen2.5-0.5B shape
at less than half the fp16 rate, greedy prefix agreement 0.49 against 1.00), for a cache
of 50 MB per 4,096-token sequence at fp16 on that shape (docs/benchmarks/ffn-and-defaults.md,
"Defaults measured"). So:

1. a target with a fused fp8 attention path takes fp8: TensorRT on compute capability 8.9
   and newer (Ada, Hopper, Blackwell, Jetson Thor), where the plan reads fp8 in place;
2. elsewhere fp16 (the fused graph where it applies), unless the engine would not fit the
   memory budget with an fp16 cache of ``max_seq`` x ``max_batch`` tokens: then fp8, which
   takes 0.53x of fp16's bytes per token on the 0.5B shape (scales included).

The engine's peak is estimated as the weights (as the graph stores them: fp32, fp16, or
int8/int4 blocks with their scales and zero points; a tied LM head that int8/int4 quantize
counted twice) plus the whole cache, times the peak RSS measured over that sum: 1.33 for
float weights (ONNX Runtime packs them at load where steps hold several tokens, which
fast decoding and batching make the usual case), 1.0 for int8/int4 (docs/benchmarks/startup.md,
"Memory and load time"). ``max_batch`` is an export-time assumption (``--max-batch``,
default 4: the rows a box decodes together, ``engine.max_batch``); with ``--target trt`` it
is the plan's own ``--trt-max-batch``.

**FFN gates** (``auto_gates``): a checkpoint without gates gets none. A checkpoint's trained
gates (the shipped demo model's) cost fast decoding: its drafts run every FFN, so it
answers exactly as plain decoding only on an engine without gates (``engines/drafts.py``).
Where fast decoding would apply without them (float weights, or int8/int4 on the fused
graph) ``auto`` measures what dropping them costs, the ungated model against the gated one
on held-out text, teacher-forced (``ungated_cost``), and drops them only within the
export's quality budget (mean KL, ``--quality-budget``): gates trained with the model are
part of it. On the demo model they are not dispensable: without them mean KL 0.79 on the
held-out text (greedy agreement 0.48), 0.13 on its task answers, first-try valid st_code
answers 75 % instead of 100 %; so its default engine keeps them and decodes plain, and
``--ffn-skip off`` gives the fast engine with other answers (docs/benchmarks/ffn-and-defaults.md,
"Defaults measured"). Where fast decoding would not be exact anyway (int8/int4 on the generic
graph) the gates are kept unmeasured: skipping is the only saving left there.

The choices are pure functions (a GPU's compute capability and the gates' cost are given);
both are recorded in the manifest with their reason (``kv.chosen_by``/``kv.reason``,
``ffn_skip``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rung.engines.drafts import inexact
from rung.engines.manifest import HEAD_MAJOR, KV_LAYOUT

if TYPE_CHECKING:
    import numpy.typing as npt

    from rung.export.model import RungForCausalLM
    from rung.export.quantize import QuantSpec

DEFAULT_MAX_BATCH = 4
# the engine's share of an 8 GB edge box (Jetson Orin Nano 8GB's shared memory, a typical
# industrial PC), half left to the system, the daemon's KV cold tier and other processes;
# the fp32 Qwen2.5-0.5B shape at 4,096 tokens x 4 rows estimates 2.7 GiB with fp16 KV
DEFAULT_MEMORY_BUDGET_MB = 4096
FP8_CC = (8, 9)                  # FP8 in TensorRT: Ada, Hopper and newer
PEAK_FACTOR = {"fp32": 1.33, "fp16": 1.33, "int8": 1.0, "int4": 1.0}
MIB = 1 << 20
AUTO, FLAG = "auto", "flag"      # the manifest's kv.chosen_by
NO_GATES = "the checkpoint has no FFN gates"   # --ffn-skip auto's reason where none to drop


@dataclass(frozen=True)
class KVChoice:
    """The KV dtype of an export (``fp32`` | ``fp16`` | ``fp8``), who chose it (``auto``
    or ``flag``) and why: the manifest's ``kv.chosen_by`` and ``kv.reason``."""

    kv: str
    chosen_by: str
    reason: str


@dataclass(frozen=True)
class CacheShape:
    """What the cache's size depends on."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_seq: int


def kv_bytes_per_token(kv: str, shape: CacheShape) -> int:
    """Bytes one token takes in the cache (K and V, all layers; fp8's scales included), as
    ``KVSpec.bytes_per_token`` counts them."""
    width = {"fp32": 4, "fp16": 2, "fp8": 1}[kv]
    per_layer = 2 * shape.num_kv_heads * shape.head_dim * width
    if kv == "fp8":
        per_layer += 2 * shape.num_kv_heads * 4   # one float32 scale per token and KV head
    return per_layer * shape.num_layers


def peak_bytes(weight_bytes: int, weights: str, kv: str, shape: CacheShape,
               max_batch: int) -> int:
    """The engine's estimated peak: (weights + the whole cache) x the measured RSS
    factor."""
    cache = kv_bytes_per_token(kv, shape) * shape.max_seq * max_batch
    return int((weight_bytes + cache) * PEAK_FACTOR.get(weights, 1.33))


def choose_kv(weight_bytes: int, weights: str, shape: CacheShape, *,
              max_batch: int = DEFAULT_MAX_BATCH,
              memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB,
              trt_cc: tuple[int, int] | None = None, fused_fp16: bool = True) -> KVChoice:
    """``--kv auto`` for an engine of ``weight_bytes`` (``weights`` precision) and cache
    ``shape``: on the ONNX target (``trt_cc`` None) or a TensorRT GPU of compute capability
    ``trt_cc``. ``fused_fp16``: fp16 KV takes the fused graph here (for the reason's
    wording)."""
    mib = {kv: peak_bytes(weight_bytes, weights, kv, shape, max_batch) / MIB
           for kv in ("fp16", "fp8")}
    rows = f"max_seq {shape.max_seq} x {max_batch} rows"
    if trt_cc is not None and tuple(trt_cc) >= FP8_CC:
        return KVChoice("fp8", AUTO, f"TensorRT on compute capability {trt_cc[0]}."
                        f"{trt_cc[1]} reads fp8 KV in its fused attention: fp8 (engine "
                        f"~{mib['fp8']:.0f} MB at {rows})")
    path = (f"compute capability {trt_cc[0]}.{trt_cc[1]} has no FP8 (8.9 or newer)"
            if trt_cc is not None else
            "ONNX Runtime has no fused fp8 attention (fp8 KV takes the generic graph, "
            "dequantizing the past every step)")
    fp16 = "fp16 (fused graph)" if fused_fp16 and trt_cc is None else "fp16"
    if mib["fp16"] <= memory_budget_mb:
        return KVChoice("fp16", AUTO, f"{path}; engine ~{mib['fp16']:.0f} MB with fp16 KV at "
                        f"{rows}, within the {memory_budget_mb} MB budget: {fp16}")
    over = (f"engine ~{mib['fp16']:.0f} MB with fp16 KV at {rows}, over the "
            f"{memory_budget_mb} MB budget")
    if trt_cc is not None:   # no FP8 on this GPU: the budget cannot buy it
        return KVChoice("fp16", AUTO, f"{path}; {over}, and fp8 is not available: fp16 "
                        "(lower --max-seq or --trt-max-batch)")
    still = ("" if mib["fp8"] <= memory_budget_mb else
             "; still over it: lower --max-seq or --max-batch, quantize the weights or raise "
             "--memory-budget-mb")
    return KVChoice("fp8", AUTO, f"{over}: fp8 on the generic graph (~{mib['fp8']:.0f} MB"
                    f"{still})")


def flagged(kv: str, reason: str | None = None) -> KVChoice:
    """An explicit ``--kv``: kept (``reason``: where a target changed it, why)."""
    return KVChoice(kv, FLAG, reason or f"--kv {kv} as asked")


def weight_bytes(model: RungForCausalLM, weights: str, spec: QuantSpec | None) -> int:
    """The bytes of weights the graph will store (an estimate for ``--kv auto``): every
    parameter at the float width; with int8/int4 the linear layers as blocks of their bits
    with a float32 scale and a zero point per block, and the embedding table as 8-bit
    blocks of its own (a tied LM head is a second copy)."""
    from rung.export.mixed import LAYER_UNITS
    from rung.export.quantize import EMBED_BITS, embedding_block

    total = sum(p.numel() for p in model.parameters()) * (2 if weights == "fp16" else 4)
    if spec is None:
        return int(total)
    names = [f"layers.{i}.{p}" for i in range(len(model.model.layers))
             for parts in LAYER_UNITS.values() for p in parts]
    for name in [*names, "lm_head"]:
        w = (model.lm_head.weight if name == "lm_head"
             else model.model.get_parameter(f"{name}.weight"))
        n = int(w.numel())
        if name != "lm_head" or model.lm_head.weight is not model.model.embed_tokens.weight:
            total -= 4 * n   # the float copy the quantized one replaces
        block = spec.layer_block(name)
        total += n * spec.layer_bits(name) // 8 + -(-n // block) * 5
    table = model.model.embed_tokens.weight
    block_e = embedding_block(int(table.shape[1]), spec)
    if spec.embeddings != "fp32" and block_e is not None:
        n = int(table.numel())     # the float table becomes 8-bit blocks of its own
        total += -4 * n + n * EMBED_BITS // 8 + -(-n // block_e) * 5
    return int(total)


def fast_without_gates(weights: str, fused: bool) -> bool:
    """Whether fast decoding would apply to an engine without gates: float weights, or
    int8/int4 on the fused graph (``engines/drafts.py``)."""
    return inexact(weights, False, HEAD_MAJOR if fused else KV_LAYOUT) is None


def ungated_cost(model: RungForCausalLM, rows: npt.ArrayLike) -> dict[str, float]:
    """What dropping ``model``'s trained gates costs on ``rows`` [n, L] of held-out text:
    the logits without gates against the gated model's (every position but a row's first
    a decode step, where gates act), teacher-forced: mean KL, greedy agreement."""
    import numpy as np
    import torch

    from rung.export.verify import logit_metrics

    ids = torch.as_tensor(np.asarray(rows))
    steps = torch.ones(ids.shape, dtype=torch.bool)
    steps[:, 0] = False   # a prompt's first token is always prefilled
    vocab = model.cfg.vocab_size
    model.eval()
    with torch.no_grad():
        gated = torch.cat([model(r, gate_positions=s).reshape(-1, vocab)
                           for r, s in zip(torch.split(ids, 4), torch.split(steps, 4),
                                           strict=True)])
        plain = torch.cat([model(r).reshape(-1, vocab) for r in torch.split(ids, 4)])
    cost = logit_metrics(gated.numpy(), plain.numpy())
    return {"mean_kl": cost["mean_kl"], "greedy_agreement": cost["greedy_agreement"]}


def auto_gates(has_gates: bool, weights: str, fused: bool,
               cost: dict[str, float] | None = None,
               budget: float = 0.05) -> tuple[str, str]:
    """``--ffn-skip auto`` on a checkpoint (with trained gates or none) exported with
    ``weights`` on the fused graph or not: (mode, reason). ``cost``: ``ungated_cost`` of
    its gates (measured where fast decoding would apply without them), ``budget`` the
    export's quality budget (mean KL, nats)."""
    if not has_gates:
        return "off", NO_GATES
    graph = f"{weights} weights, {'fused' if fused else 'generic'} graph"
    if not fast_without_gates(weights, fused):
        why = inexact(weights, False, HEAD_MAJOR if fused else KV_LAYOUT)
        return "trained", (f"fast decoding would not be exact on this engine ({why}) with or "
                           "without gates: the trained gates are kept (--ffn-skip off drops "
                           "them)")
    if cost is None:
        return "trained", (f"fast decoding would apply without gates ({graph}), but what "
                           "dropping them costs was not measured: the trained gates are "
                           "kept (--ffn-skip off drops them)")
    measured = (f"without them the model's next-token distribution moves by mean KL "
                f"{cost['mean_kl']:.3g} (greedy agreement {cost['greedy_agreement']:.2f}) "
                f"on held-out text")
    if cost["mean_kl"] <= budget:
        return "off", (f"fast decoding applies without gates ({graph}; it is exact only "
                       f"without them) and {measured}, within the budget {budget}: the "
                       "trained gates are dropped (--ffn-skip trained keeps them)")
    return "trained", (f"fast decoding would apply without gates ({graph}), but {measured}, "
                       f"over the budget {budget}: the gates are the model, kept "
                       "(--ffn-skip off drops them: fast decoding, other answers)")
