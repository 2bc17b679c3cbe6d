"""GGUF in (export/gguf.py, export/gguf_tokenizer.py): SmolLM2-135M's own GGUF read against
transformers' GGUF loader, and exported at the file's own precision and at others."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest
import torch

from rung.engines import load_engine
from rung.engines.errors import CheckpointError
from rung.engines.generate import generate
from rung.engines.sampler import SamplingParams
from rung.engines.tokenizer import Tokenizer
from rung.export.exporter import ExportOptions, export
from rung.export.gguf import read_gguf, unpermute
from tests import real_checkpoint
from tests.export.conftest import CUT_LAYERS

pytestmark = pytest.mark.integration
TEXTS = ["Hello world! 12345 apples, Öltemperatur 85 °C\n\n  def f(x):\n\treturn x**2",
         "<|im_start|>user\nWhat's up?<|im_end|>\n<|im_start|>assistant\n",
         "IF oil_temp > 85.0 THEN alarm := TRUE; END_IF; // 3.14159"]


@pytest.mark.slow
def test_reader_matches_transformers_gguf_loader(smollm2_gguf: Path) -> None:
    """Every tensor (q/k rows unpermuted), the config and the tokenizer, against the
    independent reader transformers ships."""
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = read_gguf(smollm2_gguf)
    theirs = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32)
    state = theirs.state_dict()
    assert set(ours.state) == set(state) - {"lm_head.weight"}  # tied: no copy of the head
    for name, tensor in ours.state.items():
        assert torch.equal(tensor, state[name]), name
    cfg = theirs.config
    assert (ours.config["num_hidden_layers"], ours.config["num_key_value_heads"],
            ours.config["rope_theta"], ours.config["tie_word_embeddings"]) == (
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.rope_parameters["rope_theta"],
        cfg.tie_word_embeddings)
    tok = HFTokenizer.from_str(ours.files["tokenizer.json"])
    ref = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == ref.encode(
            text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    assert '"chat_template": "{% for message in messages %}' in ours.files[
        "tokenizer_config.json"]


def test_unpermute_inverts_the_converters_permutation() -> None:
    """llama.cpp's converter: ``w.reshape(heads, 2, d/2, ...).swapaxes(1, 2)``."""
    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)
    permuted = w.reshape(6, 2, 4, 3).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute(permuted, 6), w)


@pytest.mark.slow
def test_q4_1_gguf_becomes_an_int4_engine(smollm2_cut_gguf: Path, tmp_path: Path) -> None:
    m = export(smollm2_cut_gguf, tmp_path, ExportOptions(kv="fp16", max_seq=256))
    q = m.quantization
    assert m.weights == "int4" and q is not None and q["bits"] == 4
    assert q["source"] == {"format": "gguf", "types": {"Q4_1": 7 * CUT_LAYERS, "Q8_0": 1}}
    assert q["lm_head_bits"] == 8  # the GGUF's head (its tied embedding) is Q8_0
    assert q["scheme"] == "asymmetric"
    # the cost of 4-bit blocks with integer zero points against Q4_1's float minimums,
    # measured against the GGUF's dequantized weights, within the budget
    assert 0 < q["accuracy"]["mean_kl"] <= q["budget_mean_kl"]
    # four of thirty layers predict less sharply than the whole model (0.92 there)
    assert q["accuracy"]["greedy_agreement"] >= 0.85
    assert m.parity is not None and m.parity.passed
    assert m.tokenizer.chat_template is not None and "<|im_start|>" in m.tokenizer.chat_template
    engine = load_engine(tmp_path)
    tok = Tokenizer.load(tmp_path, engine.manifest.tokenizer)
    ids = tok.encode_chat([{"role": "user", "content": "Name a colour."}])
    assert ids[:3] == tok.encode("<|im_start|>system\n", add_bos=False)
    (g,) = generate(engine, tok, [ids], SamplingParams(max_tokens=8))
    assert len(g.token_ids) >= 1


@pytest.mark.parametrize(("kind", "weights"), [("F16", "fp32"), ("Q8_0", "int8"),
                                                ("Q4_0", "int4")])
@pytest.mark.slow
def test_gguf_types_become_engine_precisions(kind: str, weights: str, tmp_path: Path) -> None:
    path = real_checkpoint.cut_gguf(CUT_LAYERS, kind)
    m = export(path, tmp_path, ExportOptions(kv="fp32", max_seq=128))
    assert m.weights == weights and m.parity is not None and m.parity.passed
    if weights == "fp32":
        assert m.quantization is None and m.parity.tolerance_rel == 1e-3
        return
    q = m.quantization
    # the tied head stays the file's Q8_0 embedding
    assert q is not None and q["source"]["types"] == dict(
        Counter({kind: 7 * CUT_LAYERS}) + Counter({"Q8_0": 1}))
    # Q8_0 and Q4_0 blocks are symmetric grids of 32: 8-bit and 4-bit blocks with a zero
    # point hold them with (almost) nothing lost
    assert q["accuracy"]["mean_kl"] < {"int8": 2e-3, "int4": 0.02}[weights]


@pytest.mark.slow
def test_a_mixed_gguf_keeps_its_mix(tmp_path: Path) -> None:
    """8-bit ``attn_v``/``ffn_down`` in every other layer, 4-bit elsewhere, as K-quant "M"
    files mix them: the engine keeps each matrix's precision; q/k/v share one node in the
    fused graph, so a layer whose v is 8-bit has its q and k at 8 bits too."""
    path = real_checkpoint.cut_gguf(CUT_LAYERS, "MIX")
    m = export(path, tmp_path, ExportOptions(kv="fp16", max_seq=128))
    q = m.quantization
    assert m.weights == "int4" and q is not None and q["mixed"]["promoted"] == []
    assert q["source"]["types"] == {"Q4_0": 5 * CUT_LAYERS + CUT_LAYERS, "Q8_0": CUT_LAYERS + 1}
    eight = {f"layers.{i}.{p}" for i in range(0, CUT_LAYERS, 2)
             for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                       "mlp.down_proj")}
    assert q["layers"] == dict.fromkeys(sorted(eight), 8)
    nodes = {n.input[1].split(".weight_t")[0]: next(a.i for a in n.attribute
                                                    if a.name == "bits")
             for n in onnx.load(str(tmp_path / "model.onnx"), load_external_data=False
                                ).graph.node if n.op_type == "MatMulNBits"}
    assert {k for k, b in nodes.items() if b == 8} == {"lm_head"} | {
        f"layers.{i}.{p}" for i in range(0, CUT_LAYERS, 2)
        for p in ("self_attn.qkv_proj", "mlp.down_proj")}
    assert q["accuracy"]["mean_kl"] <= q["budget_mean_kl"]


def _write_gguf(path: Path, arch: str, tokenizer_model: str) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tokenizer_model(tokenizer_model)
    w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((2, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="GGUF architecture 'gemma3' is not supported"):
        read_gguf(_write_gguf(tmp_path / "a.gguf", "gemma3", "gpt2"))
    with pytest.raises(CheckpointError, match="tokenizer kind 'llama' is not supported"):
        read_gguf(_write_gguf(tmp_path / "b.gguf", "llama", "llama"))
    (tmp_path / "c.gguf").write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        read_gguf(tmp_path / "c.gguf")
