"""Weight quantization schemes on a real checkpoint, measured in PyTorch: every linear layer
of the model rounded as ``export/blockquant.py`` would (no promotion to 8 bits), then the
mean next-token KL and greedy agreement against the fp32 model, teacher-forced on the
export's held-out real text (``export/prompts.py``). This is what chose the export's
defaults (asymmetric, importance-weighted, block 32).

    python bench/quant_variants.py HF_DIR_OR_GGUF [--out bench/results/DATE-quant-variants.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from rung.engines.tokenizer import Tokenizer
from rung.export.blockquant import quantize
from rung.export.checkpoint import load_checkpoint
from rung.export.mixed import importance, module, untied_copy
from rung.export.prompts import CALIBRATION, HELD_OUT, text_rows, text_stream
from rung.export.verify import logit_metrics

# (bits, block, symmetric, importance-weighted, LM head bits)
VARIANTS = [
    (4, 32, True, False, 8), (4, 32, True, True, 8),
    (4, 32, False, False, 8), (4, 32, False, True, 8),
    (4, 16, False, True, 8), (4, 64, False, True, 8), (4, 128, False, True, 8),
    (4, 32, False, True, 4), (8, 32, True, False, 8), (8, 32, False, True, 8),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as side:
        ckpt = load_checkpoint(args.checkpoint, 512, workdir=Path(side))
        tok = Tokenizer.load(ckpt.path, ckpt.tokenizer)

        def encode(t: str) -> list[int]:
            return tok.encode(t, add_bos=False)

        vocab = ckpt.config.vocab_size
        calib = text_rows(text_stream(encode, CALIBRATION, vocab), 64, 12)
        held = text_rows(text_stream(encode, HELD_OUT, vocab), 64, 12)
    model = untied_copy(ckpt.model)
    imp = importance(model, calib)
    ids = torch.from_numpy(held)
    with torch.no_grad():
        ref = model(ids).reshape(-1, vocab).numpy()
    names = [n for n in imp if n != "lm_head"]
    original = {n: module(model, n).weight.detach().clone() for n in [*names, "lm_head"]}
    rows = []
    for bits, block, sym, weighted, head in VARIANTS:
        t0 = time.perf_counter()
        with torch.no_grad():
            for n in [*names, "lm_head"]:
                b = head if n == "lm_head" else bits
                q = quantize(original[n].numpy(), b, block, sym, imp[n] if weighted else None)
                module(model, n).weight.copy_(torch.from_numpy(q.dequantize()))
            got = model(ids).reshape(-1, vocab).numpy()
        m = logit_metrics(ref, got)
        row = {"bits": bits, "block": block, "scheme": "symmetric" if sym else "asymmetric",
               "importance": weighted, "lm_head_bits": head, "mean_kl": m["mean_kl"],
               "greedy_agreement": m["greedy_agreement"], "tokens": int(held.size),
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"checkpoint": str(args.checkpoint), "rows": rows},
                                       indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
