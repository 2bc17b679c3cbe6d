"""What a decode rate means on this machine: the memory bandwidth measured in the same run,
the bytes each engine reads per decode step, and the quality its precision costs.

- ``bandwidth_gbs``: reading a 1 GiB array with the bench's thread count (numpy sums,
  one slice per thread; numpy releases the GIL), best of 5: the roofline's denominator.
- ``weight_bytes``: the weights a decode step streams. ONNX engines (rung,
  onnxruntime-genai): every initializer except those only gathered from (the embedding
  where the LM head has its own matrix, RoPE tables: a decode step reads one row of them);
  GGUF (llama.cpp): every tensor except ``token_embd`` unless the model has no ``output``
  tensor (tied embeddings: the LM head reads it whole). KV reads are left out (at 128
  tokens of context they are under 1 % of the weights).
- ``quality``: mean KL(reference || engine) of the next-token distributions and greedy
  agreement, teacher-forced over the same held-out real text (``rung.export.prompts``),
  against the fp32 reference (transformers where it ran, else rung fp32).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def bandwidth_gbs(threads: int, gib: float = 1.0, runs: int = 5) -> float:
    data = np.ones(int(gib * 2**30) // 4, np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    for _ in range(runs):
        workers = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return data.nbytes / best / 1e9


def _onnx_bytes(model_dir: Path) -> int:
    import onnx

    total = 0
    for path in model_dir.glob("*.onnx"):
        graph = onnx.load(str(path), load_external_data=False).graph
        readers: dict[str, set[str]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, set()).add(node.op_type)
        for t in graph.initializer:
            if readers.get(t.name, set()) <= {"Gather"} or t.name.startswith("rope_"):
                continue   # only gathered from (an embedding, a RoPE table): one row a step
            ext = {e.key: e.value for e in t.external_data}
            total += int(ext["length"]) if "length" in ext else len(t.raw_data)
    return total


def _gguf_bytes(path: Path) -> int:
    from gguf import GGUFReader

    tensors = GGUFReader(str(path)).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors
               if t.name != "token_embd.weight" or tied)


def weight_bytes(model_dir: Path) -> int | None:
    """Bytes of weights one decode step reads, or None where the format is not known."""
    gguf = model_dir / "model.gguf"
    if gguf.is_file():
        return _gguf_bytes(gguf)
    if any(model_dir.glob("*.onnx")):
        return _onnx_bytes(model_dir)
    return None


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def quality(reference: np.ndarray, engine: np.ndarray) -> dict[str, float]:
    """Mean KL(reference || engine) in nats and the share of positions with the same
    argmax, over every position of the teacher-forced text."""
    p_log, q_log = _log_softmax(reference.astype(np.float64)), _log_softmax(
        engine.astype(np.float64))
    kl = (np.exp(p_log) * (p_log - q_log)).sum(axis=-1)
    agree = (reference.argmax(-1) == engine.argmax(-1)).mean()
    return {"mean_kl": float(kl.mean()), "greedy_agreement": float(agree)}


def held_out_ids(hf_dir: Path, n: int = 256) -> np.ndarray:
    """The held-out real text as the checkpoint's tokenizer cuts it, ``n`` tokens."""
    from tokenizers import Tokenizer

    from rung.export.prompts import HELD_OUT

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    ids = tok.encode("\n\n".join(HELD_OUT), add_special_tokens=False).ids
    while len(ids) < n:
        ids = ids + ids
    return np.array(ids[:n], np.int64)


def section(record: dict[str, Any]) -> str:
    """Markdown: per engine, decode rate, bytes per step, share of the roofline, quality."""
    bw = record.get("bandwidth_gbs")
    ctx = str(record["workload"]["contexts"][0])
    rows = [f"Memory bandwidth measured in this run: {bw:.1f} GB/s "
            f"({record['workload']['threads']} threads reading 1 GiB, best of 5).\n"
            if bw else "",
            f"| engine | weights read per step MB | decode tok/s @{ctx} | GB/s | "
            "share of roofline | mean KL vs fp32 | greedy agreement |",
            "|---|---|---|---|---|---|---|"]
    for name, res in record["results"].items():
        if "error" in res:
            continue
        rate = float(res["decode"][ctx]["tok_s"])
        wb, q = res.get("weight_bytes"), res.get("quality") or {}
        gbs = rate * wb / 1e9 if wb else None
        rows.append(
            f"| {name} | {wb / 1e6:.0f} | {rate:.1f} | " if wb else f"| {name} | n/a | "
            f"{rate:.1f} | ")
        rows[-1] += (f"{gbs:.1f} | {gbs / bw:.0%} | " if gbs and bw else "n/a | n/a | ")
        rows[-1] += (f"{q['mean_kl']:.2e} | {q['greedy_agreement']:.2f} |" if q
                     else "n/a | n/a |")
    return "\n".join(rows) + "\n"
