"""A GGUF file's tokenizer as Hugging Face files: ``tokenizer.json`` and
``tokenizer_config.json`` (chat template included), written from the GGUF metadata.

GGUF keeps a byte-level BPE tokenizer (``tokenizer.ggml.model`` ``gpt2``) as its token list,
merges and token types, and names the pre-tokenizer (the regex that splits text before BPE)
by a short key, ``tokenizer.ggml.pre``. llama.cpp maps that key to its own regexes; the
table ``PRE_TOKENIZERS`` below does the same for the keys of the supported architectures'
common checkpoints. An unknown key is refused: guessing it would tokenize some text
differently from the model's training, silently.

SentencePiece vocabularies (``tokenizer.ggml.model`` ``llama``, Llama 2 and Mistral 7B
GGUFs) are not read yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from rung.engines.errors import CheckpointError

# GPT-2's split: contractions, letters, digits, other symbols, whitespace (byte-level BPE)
GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
# Llama 3 and Qwen2: case-insensitive contractions, digits in runs of at most three
LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
          "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
         "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# tokenizer.ggml.pre -> the pre-tokenizer, as the model's own tokenizer.json has it
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2, "gpt-2": _gpt2,
    # SmolLM / StarCoder: every digit alone, then GPT-2's split
    "smollm": _digits_then_gpt2, "starcoder": _digits_then_gpt2, "refact": _digits_then_gpt2,
    "llama-bpe": lambda: _split(LLAMA3), "llama3": lambda: _split(LLAMA3),
    "qwen2": lambda: _split(QWEN2),
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types that are added (special) tokens


def tokenizer_files(meta: dict[str, Any], where: str) -> dict[str, str]:
    """``{"tokenizer.json": ..., "tokenizer_config.json": ...}`` from the GGUF metadata
    ``meta`` (field name -> value).

    Raises:
        CheckpointError: no tokenizer, or one of a kind or pre-tokenizer not read here.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(
            f"{where}: tokenizer kind {kind!r} is not supported",
            "GGUF files with a byte-level BPE tokenizer (tokenizer.ggml.model gpt2) are read; "
            "export the Hugging Face checkpoint directory instead")
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{where}: pre-tokenizer {pre!r} is not known here",
                              f"known: {', '.join(PRE_TOKENIZERS)}; export the Hugging Face "
                              "checkpoint directory instead")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               ignore_merges=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED])

    def name(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name("bos"),
              "eos_token": name("eos"), "pad_token": name("padding"),
              "unk_token": name("unknown"),
              "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
              "chat_template": meta.get("tokenizer.chat_template")}
    return {"tokenizer.json": tok.to_str(),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}
