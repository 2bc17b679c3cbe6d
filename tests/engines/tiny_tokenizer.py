"""A real, tiny, deterministic byte-level BPE tokenizer for tests.

``build_tiny_tokenizer`` trains a byte-level BPE with the ``tokenizers`` library and writes
``tokenizer.json`` and ``tokenizer_config.json`` (with a chat template) into a directory,
the way a Hugging Face checkpoint holds them. The initial alphabet covers all 256 bytes, so
any text encodes; the training corpus is fixed, so the same ``vocab_size`` always gives the
same files.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, USER, ASSISTANT]  # ids 0..4, in this order

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

SENTENCES = [
    "Öltemperatur 85 °C — 温度",
    "Die Öltemperatur liegt bei 85 °C, der Druck bei 3,5 bar.",
    "The pump is running; motor current 12.4 A.",
    "温度传感器报告 85 °C。",
    "Température de l'huile : 85 °C — alarme ❗",
    "Émoji check: 🙂 ok",
]

_SYLLABLES = ["ka", "to", "mi", "re", "su", "ne", "lo", "pa", "di", "gu",
              "ve", "zo", "ri", "ba", "fe", "qu", "xi", "yo", "wa", "hu"]


def _corpus() -> list[str]:
    """Fixed training text: the sentences (weighted) plus many pseudo-words for merges."""
    words = ["".join(p) for p in itertools.product(_SYLLABLES, repeat=3)]
    lines = [" ".join(words[i:i + 50]) for i in range(0, len(words), 50)]
    return SENTENCES * 20 + lines


def build_tiny_tokenizer(dir: Path, vocab_size: int = 300) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of a tiny BPE into ``dir``.

    Special tokens get ids 0..4: ``<|bos|>``, ``<|eos|>``, ``<|pad|>``, ``<|user|>``,
    ``<|assistant|>``. The config sets ``add_bos_token: true`` and a chat template that
    starts with ``bos_token`` and calls ``raise_exception`` for roles other than user and
    assistant. ``vocab_size`` counts special tokens and the 256 byte tokens (minimum 261).
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(dir / "tokenizer.json"))
    config = {
        "add_bos_token": True,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
