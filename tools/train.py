"""Train the shipped demo model (``models/edge-tiny``) from the task corpus, on CPU.

    python -m rung.tools.train --out models/edge-tiny [--samples 6000] [--minutes 45]
    python -m rung.tools.train --out NEW --init models/edge-tiny [--gates]   # continue

``--init DIR`` continues from a checkpoint this script wrote (its tokenizer and weights; the
model's shape is the checkpoint's), on a corpus generated afresh. FFN skip gates are trained
only with ``--gates``: a model without them decodes several tokens per step exactly
(``docs/benchmarks``), one with them takes one ``If`` decision per step and decodes plain.

1. Corpus: ``rung.tools.corpus.generate`` (seeded) -> chats rendered from the built-in task
   definitions (system prompt, user prompt template) with the answer as compact JSON.
2. Tokenizer: byte-level BPE trained with ``tokenizers`` on those chats, ChatML special
   tokens and chat template.
3. Model: rung's own Llama-architecture decoder (``rung.export.model``) with FFN gates
   trained jointly: soft skip decisions on the answer tokens with a sparsity term, the gate
   temperature annealed towards a hard decision.
4. Output in Hugging Face layout: config.json, model.safetensors (gates included),
   tokenizer.json, tokenizer_config.json, generation_config.json, training_log.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from rung.daemon.tasks.task import Task, load_tasks
from rung.export.arch import parse_config
from rung.export.model import RungForCausalLM
from rung.export.presets import CHATML, build_tokenizer
from rung.tools.corpus import TASKS


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    samples: int = 6000
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 704
    num_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 4
    max_seq: int = 1024
    batch_tokens: int = 6144          # tokens per optimizer step (padded)
    lr: float = 3e-3
    warmup_steps: int = 50
    minutes: float = 45.0             # wall-clock budget; the schedule follows it
    max_steps: int = 100_000
    sparsity: float = 0.02            # weight of the skip reward
    gate_temperature: tuple[float, float] = (1.0, 0.05)
    threads: int = 2
    gates: bool = False               # train FFN skip gates jointly
    init: str | None = None           # continue from this checkpoint (tokenizer, weights)
    tasks: tuple[str, ...] = TASKS    # dealt round-robin (the corpus generator)


def chat_text(task: Task, data: dict[str, Any], answer: dict[str, Any] | None) -> str:
    """The ChatML text the model is trained on and served with."""
    msgs = task.messages(data)
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    text += "<|im_start|>assistant\n"
    if answer is not None:
        text += json.dumps(answer, separators=(",", ":"), ensure_ascii=False) + "<|im_end|>"
    return text


def encode_samples(tok: Tokenizer, tasks: dict[str, Task], samples: Sequence[dict[str, Any]],
                   max_seq: int) -> list[tuple[list[int], int]]:
    """(token ids, index where the answer starts); samples longer than max_seq dropped."""
    out = []
    for s in samples:
        task = tasks[s["task"]]
        prompt = tok.encode(chat_text(task, s["input"], None)).ids
        full = tok.encode(chat_text(task, s["input"], s["output"])).ids
        if len(full) <= max_seq:
            out.append((full, len(prompt)))
    return out


def model_config(cfg: TrainConfig, tok: Tokenizer) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": tok.get_vocab_size(), "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "max_position_embeddings": cfg.max_seq, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu",
            "bos_token_id": None, "eos_token_id": tok.token_to_id("<|im_end|>"),
            "pad_token_id": tok.token_to_id("<|endoftext|>"), "dtype": "float32"}


def batches(data: list[tuple[list[int], int]], batch_tokens: int,
            rng: random.Random) -> list[list[int]]:
    """Index batches of similar lengths, each at most ``batch_tokens`` padded tokens."""
    order = sorted(range(len(data)), key=lambda i: (len(data[i][0]), rng.random()))
    out, cur, longest = [], [], 0
    for i in order:
        longest_if = max(longest, len(data[i][0]))
        if cur and longest_if * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest_if = [], len(data[i][0])
        cur.append(i)
        longest = longest_if
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(data: list[tuple[list[int], int]], idx: list[int],
            pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = max(len(data[i][0]) for i in idx)
    ids = torch.full((len(idx), n), pad, dtype=torch.long)
    answer = torch.zeros((len(idx), n), dtype=torch.bool)
    mask = torch.zeros((len(idx), n), dtype=torch.long)
    for row, i in enumerate(idx):
        toks, start = data[i]
        ids[row, :len(toks)] = torch.tensor(toks)
        answer[row, start:len(toks)] = True
        mask[row, :len(toks)] = 1
    return ids, answer, mask


def train(cfg: TrainConfig, samples: Sequence[dict[str, Any]], out: Path,
          log: Any = sys.stderr) -> dict[str, Any]:
    """Train and write the checkpoint to ``out``; returns the training log."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    tasks = dict(load_tasks())
    texts = [chat_text(tasks[s["task"]], s["input"], s["output"]) for s in samples]
    if cfg.init is None:
        tok = build_tokenizer(cfg.vocab_size, texts)
        hf_cfg = model_config(cfg, tok)
    else:
        tok = Tokenizer.from_file(str(Path(cfg.init) / "tokenizer.json"))
        hf_cfg = json.loads((Path(cfg.init) / "config.json").read_text())
    data = encode_samples(tok, tasks, samples, cfg.max_seq)
    model = RungForCausalLM(parse_config(hf_cfg), cfg.max_seq)
    if cfg.gates:
        model.add_ffn_gates(cfg.gate_temperature[0])
    if cfg.init is None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith("norm.weight"):
                    p.normal_(0.0, 0.02)
    else:
        warm_start(model, Path(cfg.init))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    pad = hf_cfg["pad_token_id"]
    history: list[dict[str, float]] = []
    t0, step, epoch = time.perf_counter(), 0, 0
    budget = cfg.minutes * 60
    while step < cfg.max_steps and time.perf_counter() - t0 < budget:
        epoch += 1
        for idx in batches(data, cfg.batch_tokens, rng):
            frac = min((time.perf_counter() - t0) / budget, 1.0)
            if frac >= 1.0 or step >= cfg.max_steps:
                break
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5 * (
                1 + math.cos(math.pi * frac))
            for g in opt.param_groups:
                g["lr"] = lr
            t_hi, t_lo = cfg.gate_temperature
            for layer in model.model.layers:
                if layer.mlp.ffn_gate is not None:
                    layer.mlp.ffn_gate.temperature = t_hi * (t_lo / t_hi) ** frac
            ids, answer, mask = collate(data, idx, pad)
            logits = model(ids, attention_mask=mask, gate_positions=answer)
            target = answer[:, 1:]
            ce = torch.nn.functional.cross_entropy(logits[:, :-1][target], ids[:, 1:][target])
            probs = model.skip_probs()
            skip = torch.stack([(p * answer).sum() / answer.sum() for p in probs]).mean() \
                if probs else torch.zeros(())
            loss = ce - cfg.sparsity * skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 10 == 0 or step == 1:
                rec = {"step": step, "epoch": epoch, "loss": float(ce.detach()),
                       "skip": float(skip.detach()), "lr": lr,
                       "minutes": (time.perf_counter() - t0) / 60}
                history.append(rec)
                print(f"train: {json.dumps(rec)}", file=log, flush=True)
    model.eval()
    result = {"config": asdict(cfg), "steps": step, "epochs": epoch,
              "train_samples": len(data), "parameters": sum(p.numel()
                                                           for p in model.parameters()),
              "minutes": (time.perf_counter() - t0) / 60, "history": history}
    save(model, tok, hf_cfg, out, result)
    return result


def warm_start(model: RungForCausalLM, init: Path) -> None:
    """Load ``init``'s weights into ``model``: every weight the model has must be there
    (the tied head aside); gates the checkpoint has and the model does not are left out,
    gates the model has and the checkpoint does not start fresh."""
    from safetensors.torch import load_file

    state = load_file(str(init / "model.safetensors"))
    own = model.state_dict()
    kept = {k: v for k, v in state.items() if k in own}
    missing = [k for k in own if k not in kept and k != "lm_head.weight"
               and ".ffn_gate." not in k]
    if missing:
        raise SystemExit(f"{init}: no weights for {missing[:5]} (another model shape?)")
    model.load_state_dict(kept, strict=False)


def save(model: RungForCausalLM, tok: Tokenizer, hf_cfg: dict[str, Any], out: Path,
         result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": hf_cfg["eos_token_id"], "pad_token_id": hf_cfg["pad_token_id"]},
        indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False,
         "chat_template": CHATML, "model_max_length": hf_cfg["max_position_embeddings"]},
        indent=2) + "\n")
    (out / "training_log.json").write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, help=f"corpus samples (default "
                   f"{TrainConfig.samples}; with --base 4000)")
    p.add_argument("--minutes", type=float, default=TrainConfig.minutes)
    p.add_argument("--max-steps", type=int, default=TrainConfig.max_steps)
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {TrainConfig.lr}; "
                   f"with --base 1e-3)")
    p.add_argument("--init", type=Path, help="continue from this checkpoint")
    p.add_argument("--gates", action="store_true", help="train FFN skip gates jointly")
    p.add_argument("--tasks", help=f"tasks dealt round-robin; a task named twice gets twice "
                   f"the samples (default {','.join(TASKS)}; with --base "
                   f"st_code,fault_tree,st_code,diagnosis)")
    p.add_argument("--base", help="adapt this pretrained base with a LoRA adapter instead "
                   "(a name from rung.export.bases, e.g. smollm2, or a Hugging Face "
                   "directory): rung.tools.train_lora")
    p.add_argument("--examples", type=Path, help="with --base: train on these examples "
                   "(JSONL of task, input, answer), each checked first, not on the corpus")
    p.add_argument("--rank", type=int, default=32, help="with --base: LoRA rank")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="with --base: padded tokens per optimizer step")
    p.add_argument("--save-minutes", type=float, default=10.0,
                   help="with --base: save the adapter this often")
    args = p.parse_args(argv)
    if args.base is not None:
        from rung.tools.train_lora import main as lora_main

        return lora_main(args)
    from rung.tools.corpus import generate

    cfg = TrainConfig(seed=args.seed, samples=args.samples or TrainConfig.samples,
                      minutes=args.minutes, max_steps=args.max_steps,
                      lr=args.lr or TrainConfig.lr, gates=args.gates,
                      init=None if args.init is None else str(args.init),
                      tasks=tuple(t for t in (args.tasks or ",".join(TASKS)).split(",") if t))
    result = train(cfg, generate(cfg.samples, seed=cfg.seed, tasks=cfg.tasks), args.out)
    print(f"train: {result['steps']} steps, {result['parameters']} parameters, "
          f"{result['minutes']:.1f} min -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
