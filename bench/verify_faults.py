"""What the export's lossy-path bounds can tell apart on real weights: the mean KL and greedy
agreement that small faults (a norm or a projection off by a few percent) and fp8 KV
itself leave on the held-out real text, in PyTorch. The verification bounds
(export/verify.py, ``LOSSY``) sit between the kernels' own rounding and these.

    python bench/verify_faults.py [HF_DIR ...]    # default: SmolLM2-135M, 4 and 30 layers
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rung.engines.tokenizer import Tokenizer  # noqa: E402
from rung.export.checkpoint import load_checkpoint  # noqa: E402
from rung.export.model import RungForCausalLM  # noqa: E402
from rung.export.prompts import HELD_OUT, text_rows, text_stream  # noqa: E402
from rung.export.verify import logit_metrics  # noqa: E402
from tests import real_checkpoint  # noqa: E402

FAULTS: dict[str, Callable[[RungForCausalLM], None]] = {
    "final norm x1.1": lambda m: m.model.norm.weight.mul_(1.1),
    "final norm x1.02": lambda m: m.model.norm.weight.mul_(1.02),
    "layer 1 o_proj x1.1": lambda m: m.model.layers[1].self_attn.o_proj.weight.mul_(1.1),
    "layer 1 down_proj x1.1": lambda m: m.model.layers[1].mlp.down_proj.weight.mul_(1.1),
    "layer 1 input norm x1.1": lambda m: m.model.layers[1].input_layernorm.weight.mul_(1.1),
    "fp8 KV (no fault)": lambda m: m.set_kv_dtype("float8_e4m3fn"),
}


class _Plain:
    """A tokenizer's ``encode`` without BOS."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok

    def encode_plain(self, text: str) -> list[int]:
        return self.tok.encode(text, add_bos=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoints", nargs="*", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    dirs = args.checkpoints or [real_checkpoint.cut_hf_dir(4),
                                real_checkpoint.cut_hf_dir(real_checkpoint.LAYERS)]
    for hf in dirs:
        with tempfile.TemporaryDirectory() as side:
            ckpt = load_checkpoint(hf, 256, workdir=Path(side))
        tok = _Plain(Tokenizer.load(ckpt.path, ckpt.tokenizer))
        vocab = ckpt.config.vocab_size
        rows = text_rows(text_stream(tok.encode_plain, HELD_OUT, vocab), 64, 12)
        ids = torch.from_numpy(rows)
        with torch.no_grad():
            ref = ckpt.model(ids).reshape(-1, vocab).numpy()
            for name, fault in FAULTS.items():
                model = copy.deepcopy(ckpt.model)
                fault(model)
                got = logit_metrics(ref, model(ids).reshape(-1, vocab).numpy())
                print(json.dumps({"checkpoint": str(hf), "layers": ckpt.config.num_layers,
                                  "fault": name, "mean_kl": got["mean_kl"],
                                  "greedy_agreement": got["greedy_agreement"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
