"""GGUF files that lie (export/gguf.py): every count, length and size a file states is
checked against the file and its tensors before anything is built from it, and each lie
ends in one ``CheckpointError`` naming the field, which ``rung export`` prints as its usual
one-line error (exit 1, never the internal error's 70).

The files are a tiny honest Llama GGUF written here with ``gguf.GGUFWriter``, then told one
lie each: a metadata value replaced (the writer), or a length in the header patched in the
bytes. That each lie is refused *before* the big allocation is asserted, not timed: a lie in
the header is refused before ``GGUFReader`` (which loops over any array length a file
claims) is even built, a lie in the metadata before a single tensor is dequantized (and
so before a model is shaped from the config).
"""

from __future__ import annotations

import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from rung.daemon.cli import main
from rung.engines.errors import CheckpointError
from rung.export.exporter import ExportOptions, export
from rung.export.gguf import read_gguf

HIDDEN, HEADS, KV_HEADS, HEAD, FFN, LAYERS = 8, 2, 1, 4, 16, 2
TOKENS = ["<|endoftext|>", "a", "b", "ab", "Ġ", "Ġa"]
TYPES = [3, 1, 1, 1, 1, 1]
MERGES = ["a b", "Ġ a"]


def _metadata() -> dict[str, tuple[Any, ...]]:
    """key -> (value, type[, array item type]): an honest tiny Llama."""
    return {
        "llama.block_count": (LAYERS, V.UINT32), "llama.context_length": (64, V.UINT32),
        "llama.embedding_length": (HIDDEN, V.UINT32),
        "llama.feed_forward_length": (FFN, V.UINT32),
        "llama.attention.head_count": (HEADS, V.UINT32),
        "llama.attention.head_count_kv": (KV_HEADS, V.UINT32),
        "llama.rope.freq_base": (10000.0, V.FLOAT32),
        "llama.attention.layer_norm_rms_epsilon": (1e-5, V.FLOAT32),
        "llama.vocab_size": (len(TOKENS), V.UINT32),
        "tokenizer.ggml.model": ("gpt2", V.STRING), "tokenizer.ggml.pre": ("default", V.STRING),
        "tokenizer.ggml.tokens": (TOKENS, V.ARRAY, V.STRING),
        "tokenizer.ggml.token_type": (TYPES, V.ARRAY, V.INT32),
        "tokenizer.ggml.merges": (MERGES, V.ARRAY, V.STRING),
        "tokenizer.ggml.bos_token_id": (0, V.UINT32), "tokenizer.ggml.eos_token_id": (0, V.UINT32),
        "general.tags": ([7, 7, 7], V.ARRAY, V.UINT8),  # a byte array, for the header lies
    }


def _tensors(vocab: int = len(TOKENS)) -> dict[str, tuple[int, ...]]:
    """name -> PyTorch shape (GGUF dims are its reverse)."""
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, HIDDEN),
                                       "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        out.update({
            f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_q.weight": (HEADS * HEAD, HIDDEN),
            f"blk.{i}.attn_k.weight": (KV_HEADS * HEAD, HIDDEN),
            f"blk.{i}.attn_v.weight": (KV_HEADS * HEAD, HIDDEN),
            f"blk.{i}.attn_output.weight": (HIDDEN, HEADS * HEAD),
            f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)})
    return out


def tiny_gguf(path: Path, meta: dict[str, tuple[Any, ...] | None] | None = None,
              tensors: dict[str, tuple[int, ...] | None] | None = None) -> Path:
    """The honest tiny GGUF with ``meta`` and ``tensors`` laid over it (None: left out)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, v in {**_metadata(), **(meta or {})}.items():
        if v is not None:
            w.add_key_value(key, v[0], v[1], sub_type=v[2] if len(v) > 2 else None)
    rng = np.random.default_rng(0)
    for name, shape in {**_tensors(), **(tensors or {})}.items():
        if shape is not None:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _patched(path: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))
    return path


def _value_at(path: Path, key: str) -> int:
    """The offset of metadata ``key``'s value (after its key string and type)."""
    return gguf.GGUFReader(str(path)).fields[key].offset + 8 + len(key.encode()) + 4


def _dims_at(path: Path, name: str) -> int:
    """The offset of tensor ``name``'s dims in the header (after its name and n_dims)."""
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    return t.field.offset + 8 + len(name.encode()) + 4


def _array_length(key: str, n: int) -> Callable[[Path], Path]:
    return lambda p: _patched(tiny_gguf(p), _value_at(p, key) + 4, "<Q", n)


def _string_length(key: str, n: int) -> Callable[[Path], Path]:
    return lambda p: _patched(tiny_gguf(p), _value_at(p, key), "<Q", n)


def _truncated(p: Path) -> Path:
    tiny_gguf(p)
    p.write_bytes(p.read_bytes()[:-100])
    return p


def _meta(**lies: tuple[Any, ...] | None) -> Callable[[Path], Path]:
    """A file whose metadata lies: ``llama__block_count=(...)`` for llama.block_count."""
    return lambda p: tiny_gguf(p, {k.replace("__", "."): v for k, v in lies.items()})


# Lies in the header: refused before GGUFReader is built (it would loop over the claimed
# lengths, each entry a Python object, for minutes and gigabytes).
HEADER_LIES = [
    pytest.param(_array_length("tokenizer.ggml.tokens", 1 << 30),
                 r"metadata tokenizer\.ggml\.tokens claims 1073741824 values, but the \d+ "
                 r"bytes left in the file hold at most \d+", id="token-array-length-2^30"),
    pytest.param(_array_length("general.tags", 1 << 30),
                 r"metadata general\.tags claims 1073741824 values", id="byte-array-length-2^30"),
    pytest.param(_array_length("tokenizer.ggml.merges", 2_000_000_000),
                 r"metadata tokenizer\.ggml\.merges claims 2000000000 values",
                 id="merges-array-length-2e9"),
    pytest.param(_string_length("tokenizer.ggml.pre", 1 << 30),
                 r"metadata tokenizer\.ggml\.pre claims a string of 1073741824 bytes",
                 id="string-length-2^30"),
    pytest.param(lambda p: _patched(tiny_gguf(p), 16, "<Q", 1 << 40),
                 r"the header counts 1099511627776 metadata entries", id="key-count-2^40"),
    pytest.param(lambda p: _patched(tiny_gguf(p), 8, "<Q", 60_000),
                 r"the header counts \d+ metadata entries and 60000 tensors, more than the "
                 r"\d+-byte file can hold", id="tensor-count-60000"),
    pytest.param(lambda p: _patched(tiny_gguf(p), _value_at(p, "general.tags") - 4, "<I", 99),
                 r"metadata general\.tags has unknown value type 99", id="unknown-value-type"),
    pytest.param(lambda p: _patched(tiny_gguf(p), _dims_at(p, "token_embd.weight") + 8, "<Q",
                                    20_000_000),
                 r"tensor token_embd\.weight \(F32, dims \[8, 20000000\]\) needs 640000000 "
                 r"bytes .* past the end of the file", id="tensor-dims-past-the-file"),
    pytest.param(_truncated, r"tensor blk\.1\.ffn_down\.weight .* past the end of the file",
                 id="file-cut-short"),
]

# Lies in the metadata: refused before any tensor is dequantized or a model is shaped.
METADATA_LIES = [
    pytest.param(_meta(llama__vocab_size=(20_000_000, V.UINT32)),
                 r"metadata llama\.vocab_size 20000000 does not match the 6 rows of tensor "
                 r"token_embd\.weight", id="vocab-size-2e7"),
    pytest.param(_meta(llama__vocab_size=(2_000_000_000, V.UINT32)),
                 r"metadata llama\.vocab_size 2000000000 does not match", id="vocab-size-2e9"),
    pytest.param(_meta(tokenizer__ggml__tokens=(TOKENS[:5], V.ARRAY, V.STRING),
                       tokenizer__ggml__token_type=(TYPES[:5], V.ARRAY, V.INT32),
                       tokenizer__ggml__merges=(MERGES[:1], V.ARRAY, V.STRING),
                       llama__vocab_size=None),
                 r"metadata tokenizer\.ggml\.tokens holds 5 tokens, but tensor "
                 r"token_embd\.weight has 6 rows", id="token-count-vs-embedding-rows"),
    pytest.param(_meta(llama__block_count=(1_000_000_000, V.UINT32)),
                 r"metadata llama\.block_count is 1000000000, but the file holds tensors of 2 "
                 r"layers \(blk\.0 to blk\.1\)", id="block-count-1e9"),
    pytest.param(_meta(llama__block_count=(3, V.UINT32)),
                 r"metadata llama\.block_count is 3, but the file holds tensors of 2 layers",
                 id="block-count-past-the-layers"),
    pytest.param(_meta(llama__block_count=(1, V.UINT32)),
                 r"tensor blk\.1\.\w+\.weight belongs to layer 1, but metadata "
                 r"llama\.block_count is 1", id="block-count-short-of-the-layers"),
    pytest.param(lambda p: tiny_gguf(p, tensors={"blk.1.ffn_up.weight": None}),
                 r"tensor blk\.1\.ffn_up\.weight is missing", id="layer-tensor-missing"),
    pytest.param(_meta(llama__attention__head_count=(0, V.UINT32)),
                 r"metadata llama\.attention\.head_count must be at least 1, got 0",
                 id="head-count-0"),
    pytest.param(_meta(llama__attention__head_count=(3, V.UINT32)),
                 r"metadata llama\.embedding_length 8 is not a multiple of "
                 r"llama\.attention\.head_count 3", id="heads-do-not-divide-hidden"),
    pytest.param(_meta(llama__attention__head_count_kv=(3, V.UINT32)),
                 r"metadata llama\.attention\.head_count 2 is not a multiple of "
                 r"llama\.attention\.head_count_kv 3", id="kv-heads-do-not-divide-heads"),
    pytest.param(_meta(llama__attention__head_count=(4, V.UINT32)),
                 r"tensor blk\.0\.attn_k\.weight has dims \[8, 4\], the metadata implies "
                 r"\[8, 2\] \(llama\.embedding_length, llama\.attention\.head_count_kv x head "
                 r"size\)", id="heads-vs-tensor-dims"),
    pytest.param(_meta(llama__attention__key_length=(3, V.UINT32)),
                 r"the head size 3 .* is odd", id="odd-head-size"),
    pytest.param(_meta(llama__feed_forward_length=(1_000_000, V.UINT32)),
                 r"tensor blk\.0\.ffn_\w+\.weight has dims .* the metadata implies .*1000000.* "
                 r"llama\.feed_forward_length", id="ffn-length-vs-tensor-dims"),
    pytest.param(_meta(llama__embedding_length=(4096, V.UINT32)),
                 r"tensor token_embd\.weight has dims \[8, 6\], metadata "
                 r"llama\.embedding_length 4096", id="hidden-vs-tensor-dims"),
    pytest.param(_meta(llama__context_length=(1, V.UINT32)),
                 r"metadata llama\.context_length must be at least 8, got 1",
                 id="context-length-1"),
    pytest.param(_meta(tokenizer__ggml__token_type=([1, 1], V.ARRAY, V.INT32)),
                 r"metadata tokenizer\.ggml\.token_type has 2 entries for the 6 tokens",
                 id="token-types-short"),
    pytest.param(_meta(tokenizer__ggml__merges=(["a b", "ab"], V.ARRAY, V.STRING)),
                 r"metadata tokenizer\.ggml\.merges\[1\] 'ab' is not two tokens separated by a "
                 r"space", id="merge-without-space"),
    pytest.param(_meta(tokenizer__ggml__merges=([" a"], V.ARRAY, V.STRING)),
                 r"metadata tokenizer\.ggml\.merges\[0\] ' a' is not two tokens",
                 id="merge-of-one-token"),
    pytest.param(_meta(tokenizer__ggml__merges=(["a c"], V.ARRAY, V.STRING)),
                 r"metadata tokenizer\.ggml\.merges\[0\] 'a c': the token 'c' is not in "
                 r"tokenizer\.ggml\.tokens", id="merge-of-unknown-token"),
    pytest.param(_meta(tokenizer__ggml__merges=(["b a"], V.ARRAY, V.STRING)),
                 r"metadata tokenizer\.ggml\.merges\[0\] 'b a': the merged token 'ba' is not in "
                 r"tokenizer\.ggml\.tokens", id="merge-into-unknown-token"),
    pytest.param(_meta(tokenizer__ggml__tokens=None),
                 r"metadata tokenizer\.ggml\.tokens is missing", id="tokens-missing"),
    pytest.param(_meta(tokenizer__ggml__tokens=([1, 2, 3, 4, 5, 6], V.ARRAY, V.INT32)),
                 r"metadata tokenizer\.ggml\.tokens\[0\] must be a string, got the int 1",
                 id="tokens-not-strings"),
    pytest.param(_meta(tokenizer__ggml__token_type=(["1"] * 6, V.ARRAY, V.STRING)),
                 r"metadata tokenizer\.ggml\.token_type\[0\] must be an integer, got the "
                 r"string '1'", id="token-types-not-integers"),
    pytest.param(_meta(llama__block_count=("2", V.STRING)),
                 r"metadata llama\.block_count must be an integer, got the string '2'",
                 id="string-for-block-count"),
    pytest.param(_meta(llama__attention__head_count=(2.0, V.FLOAT32)),
                 r"metadata llama\.attention\.head_count must be an integer, got the float 2\.0",
                 id="float-for-head-count"),
    pytest.param(_meta(tokenizer__ggml__eos_token_id=("0", V.STRING)),
                 r"metadata tokenizer\.ggml\.eos_token_id must be an integer, got the string "
                 r"'0'", id="string-for-eos-id"),
    pytest.param(_meta(llama__attention__layer_norm_rms_epsilon=("1e-5", V.STRING)),
                 r"metadata llama\.attention\.layer_norm_rms_epsilon must be a number, got the "
                 r"string '1e-5'", id="string-for-norm-eps"),
    pytest.param(_meta(tokenizer__ggml__eos_token_id=(99, V.UINT32)),
                 r"metadata tokenizer\.ggml\.eos_token_id 99 is past the vocabulary \(6 "
                 r"tokens", id="eos-id-past-the-vocabulary"),
    pytest.param(_meta(tokenizer__ggml__bos_token_id=(6, V.UINT32)),
                 r"metadata tokenizer\.ggml\.bos_token_id 6 is past the vocabulary \(6 tokens",
                 id="bos-id-one-past-the-vocabulary"),
]


def test_the_honest_tiny_file_reads(tmp_path: Path) -> None:
    """Each lie below is the only thing wrong with its file."""
    ckpt = read_gguf(tiny_gguf(tmp_path / "honest.gguf"))
    assert (ckpt.config["vocab_size"], ckpt.config["num_hidden_layers"],
            ckpt.config["num_attention_heads"], ckpt.config["head_dim"]) == (6, 2, 2, 4)
    assert ckpt.generation == {"bos_token_id": 0, "eos_token_id": 0}
    assert tuple(ckpt.state["model.layers.1.mlp.down_proj.weight"].shape) == (HIDDEN, FFN)


def test_the_honest_tiny_file_exports(tmp_path: Path) -> None:
    """And through the command (a graph this small has no tensor big enough for the
    external data file, which the engine still lists)."""
    assert main(["export", str(tiny_gguf(tmp_path / "honest.gguf")), "-o",
                 str(tmp_path / "out"), "--max-seq", "32"]) == 0
    assert (tmp_path / "out" / "manifest.json").is_file()


@pytest.mark.parametrize(("lie", "match"), HEADER_LIES)
def test_a_lying_header_is_refused_before_the_reader_is_built(
        lie: Callable[[Path], Path], match: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = lie(tmp_path / "lie.gguf")

    def no_reader(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("GGUFReader was built from a lying header")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=match) as e:
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "not a readable GGUF file" in e.value.message
    assert peak < 1 << 20  # the header walk keeps nothing of the file


@pytest.mark.parametrize(("lie", "match"), METADATA_LIES)
def test_lying_metadata_is_refused_before_a_tensor_is_built(
        lie: Callable[[Path], Path], match: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = lie(tmp_path / "lie.gguf")

    def no_dequantize(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a tensor was dequantized before the metadata was checked")

    monkeypatch.setattr(gguf.quants, "dequantize", no_dequantize)
    with pytest.raises(CheckpointError, match=match):
        read_gguf(path)


def test_the_export_refuses_a_lying_vocabulary_before_building_a_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewed case: vocab_size 20,000,000 in a file of a few KB once built a 10 GB
    embedding; export() now ends in the reader's error, no model built."""
    import rung.export.checkpoint as checkpoint

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was built from lying metadata")

    monkeypatch.setattr(checkpoint, "RungForCausalLM", no_model)
    path = tiny_gguf(tmp_path / "lie.gguf", {"llama.vocab_size": (20_000_000, V.UINT32)})
    with pytest.raises(CheckpointError, match=r"llama\.vocab_size 20000000"):
        export(path, tmp_path / "out", ExportOptions())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("lie", "match"), HEADER_LIES + METADATA_LIES)
def test_rung_export_prints_one_error_line(lie: Callable[[Path], Path], match: str,
                                           tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = lie(tmp_path / "lie.gguf")
    assert main(["export", str(path), "-o", str(tmp_path / "out")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("rung: ")
              and not line.startswith("rung: loading checkpoint")]
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    assert errors[0].startswith(f"rung: error: {path}: "), errors[0]
    assert "internal error" not in errors[0]


@pytest.mark.parametrize("lie", [
    _meta(llama__vocab_size=(20_000_000, V.UINT32)),
    _array_length("general.tags", 1 << 30),
    _meta(tokenizer__ggml__eos_token_id=(99, V.UINT32)),
], ids=["vocab-size-2e7", "byte-array-length-2^30", "eos-id-past-the-vocabulary"])
@pytest.mark.slow
def test_the_command_exits_1_not_70(lie: Callable[[Path], Path], tmp_path: Path) -> None:
    path = lie(tmp_path / "lie.gguf")
    r = subprocess.run([sys.executable, "-m", "rung.daemon", "export", str(path), "-o",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("rung: error: ")]
    assert len(errors) == 1 and r.stderr.strip().splitlines()[-1] == errors[0]
