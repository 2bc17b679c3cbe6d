"""Random-weight checkpoints in Hugging Face layout, from a table of presets.

Used by ``rung demo`` (until the shipped model exists) and by the benchmarks: the files are
exactly what ``save_pretrained`` writes (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``), so rung's
exporter, transformers and onnxruntime-genai's builder all read the same checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rung.export.arch import parse_config
from rung.export.model import RungForCausalLM

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

PRESETS: dict[str, dict[str, Any]] = {
    # a few hundred thousand parameters: the demo and smoke tests
    "demo-tiny": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512,
                      hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=True),
    # the dimensions of Qwen2.5-0.5B (the benchmark model)
    "qwen2.5-0.5b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                         vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True,
                         use_sliding_window=False, max_window_layers=21),
}

CORPUS = [
    "Start the motor when START is pressed and STOP is not; latch until STOP or a fault.",
    "IF oil_temp > 85.0 THEN alarm := TRUE; pump_run := FALSE; END_IF;",
    "The hydraulic press reports low pressure and high oil temperature on line 3.",
    "FUNCTION_BLOCK FB_Motor VAR_INPUT start : BOOL; stop : BOOL; END_VAR",
    "Tank level control: open the inlet valve below 20 % and close it above 80 %.",
    "Vibration on the bearing housing rose to 7.1 mm/s; inspect the drive end bearing.",
]


def build_tokenizer(vocab_size: int, texts: Sequence[str] | None = None) -> Tokenizer:
    """Byte-level BPE with ChatML special tokens trained on ``texts`` (default: a few
    automation sentences), deterministic, at most ``vocab_size`` tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4 if texts is None else texts, trainer)
    return tok


def make_random_checkpoint(preset: str, out_dir: Path, seed: int = 0,
                           std: float = 0.02) -> Path:
    """Write a random-weight checkpoint for ``preset`` into ``out_dir`` (HF layout)."""
    cfg_dict = dict(PRESETS[preset], bos_token_id=None, hidden_act="silu", dtype="float32")
    tok = build_tokenizer(min(cfg_dict["vocab_size"], 4096))
    eos = tok.token_to_id("<|im_end|>")
    cfg_dict.update(eos_token_id=eos, pad_token_id=tok.token_to_id("<|endoftext|>"))
    cfg = parse_config(cfg_dict)
    torch.manual_seed(seed)
    model = RungForCausalLM(cfg, max_seq=16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos, "pad_token_id": cfg_dict["pad_token_id"]}, indent=2))
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False,
         "chat_template": CHATML, "model_max_length": cfg_dict["max_position_embeddings"]},
        indent=2))
    return out_dir
