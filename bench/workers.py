"""Per-engine measurements: one engine per process, greedy decoding, wall-clock timings.

Every engine is driven through the same three calls, so the timed regions match:

    reset(max_len)   fresh KV state for one sequence (untimed)
    prefill(ids)     run the prompt and pick the first token by argmax (timed: prefill, TTFT)
    step(token)      run one token against the cache and pick the next one (timed: decode)

except OpenVINO GenAI, whose pipeline generates a whole sequence per call: it times the same
regions itself (``timed_prefill``, ``timed_decode``; ``OpenVinoRunner``).
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

WARMUP_TOKENS = 16


@dataclass(frozen=True)
class Workload:
    prompt: int          # prefill / TTFT prompt length
    contexts: list[int]  # decode is measured after prefilling this many tokens
    steps: int           # decode steps timed per measurement
    reps: int            # repetitions; the median is reported
    seed: int
    threads: int
    logits_ids: str | None = None   # .npy of token ids: save their logits (quality: KL)
    logits_out: str | None = None   # where (.npy); engines without ``logits`` skip it


class Runner(Protocol):
    def reset(self, max_len: int) -> None: ...
    def prefill(self, ids: np.ndarray) -> int: ...
    def step(self, token: int) -> int: ...


def token_ids(seed: int, vocab: int, n: int) -> np.ndarray:
    """The shared random prompt: the same ``n`` ids for every engine."""
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int64)


# -- engines ---------------------------------------------------------------------------------
class RungRunner:
    """rung's OnnxEngine, called directly (no daemon, no sampler), its session set up as
    the daemon's defaults set it up (``engine.decode: auto``: fp32 weights prepacked where
    auto decodes fast)."""

    def __init__(self, engine_dir: Path, threads: int) -> None:
        from rung.engines import load_engine
        from rung.engines.onnx_engine import EngineOptions

        self.engine = load_engine(engine_dir, "onnx", EngineOptions(threads=threads, decode="auto"))
        self.cache: Any = None

    def reset(self, max_len: int) -> None:
        self.cache = None
        # the engine's whole capacity (its max_seq), as the daemon allocates it: a step's
        # cost must follow the context, not the buffer
        self.cache = self.engine.new_cache(1)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        self.reset(len(ids))
        every = np.arange(len(ids), dtype=np.int64)[None, :]
        out = self.engine.forward(self.cache, ids[None, :], np.array([len(ids)], np.int64),
                                  every)
        return np.asarray(out[0], np.float32)

    def _run(self, ids: np.ndarray, decode: bool = False) -> int:
        logits = self.engine.forward(self.cache, ids[None, :], np.array([len(ids)], np.int64),
                                     allow_skip=decode)
        return int(logits[0, -1].argmax())

    def prefill(self, ids: np.ndarray) -> int:
        return self._run(ids)

    def step(self, token: int) -> int:
        return self._run(np.array([token], np.int64), decode=True)


class HfRunner:
    """transformers, eager attention, fp32, manual loop over ``past_key_values``."""

    def __init__(self, hf_dir: Path, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
        # transformers 5.x renamed ``past_key_values`` to ``cache``
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.past: Any = None

    def reset(self, max_len: int) -> None:
        self.past = None

    def _run(self, ids: np.ndarray) -> int:
        with self.torch.inference_mode():
            out = self.model(input_ids=self.torch.from_numpy(ids)[None, :], use_cache=True,
                             logits_to_keep=1, **{self.cache_arg: self.past})
        self.past = getattr(out, self.cache_arg)
        return int(out.logits[0, -1].argmax())

    def prefill(self, ids: np.ndarray) -> int:
        return self._run(ids)

    def step(self, token: int) -> int:
        return self._run(np.array([token], np.int64))

    def logits(self, ids: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            out = self.model(input_ids=self.torch.from_numpy(ids)[None, :])
        return np.asarray(out.logits[0].float().numpy(), np.float32)


class GenaiRunner:
    """onnxruntime-genai: ``append_tokens`` runs the prompt, ``generate_next_token`` picks a
    token (right after ``append_tokens`` it only selects; afterwards it first runs the
    previously selected token through the model, then selects)."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(str(model_dir))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        self.model = og.Model(config)
        self.vocab = int(json.loads((model_dir / "genai_config.json").read_text())
                         ["model"]["vocab_size"])
        self.gen: Any = None

    def reset(self, max_len: int) -> None:
        self.gen = None
        params = self.og.GeneratorParams(self.model)
        # min_length = max_length: an EOS never ends the run early (random weights)
        params.set_search_options(max_length=max_len, min_length=max_len, do_sample=False)
        self.gen = self.og.Generator(self.model, params)

    def _next(self) -> int:
        self.gen.generate_next_token()
        return int(self.gen.get_next_tokens()[0])

    def prefill(self, ids: np.ndarray) -> int:
        self.gen.append_tokens(ids.astype(np.int32))
        return self._next()

    def step(self, token: int) -> int:
        return self._next()  # greedy: the generator feeds the token it selected itself

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """Every position's logits, one appended token at a time (the generator's
        ``logits`` output holds the last step's)."""
        self.reset(len(ids) + 1)
        rows = []
        for token in ids:
            self.gen.append_tokens(np.array([token], np.int32))
            rows.append(np.asarray(self.gen.get_output("logits"), np.float32).reshape(-1)[
                -self.vocab:].copy())
        return np.stack(rows)


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python: ``eval`` runs tokens into its KV cache (the
    prompt in batches of 512); the last token's logits come from ``llama_get_logits_ith``
    (the wrapper's ``scores`` keeps only ``n_batch`` rows); greedy is argmax."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import llama_cpp

        self.lib = llama_cpp
        # llama-cpp-python 0.3.36 as pip builds it here crashes in ``decode`` on batches of
        # quantized tokens on AMX CPUs: quantized files run one token per batch (their
        # prefill is then decode-bound; the result says so)
        amx = "amx_tile" in Path("/proc/cpuinfo").read_text()
        self.token_batches = amx and not model_dir.name.endswith("f32")
        batch = 1 if self.token_batches else 512
        self.llm = llama_cpp.Llama(str(model_dir / "model.gguf"), n_ctx=4096,
                                   n_threads=threads, n_threads_batch=threads, n_batch=batch,
                                   n_ubatch=batch, verbose=False)
        self.vocab = self.llm.n_vocab()

    def reset(self, max_len: int) -> None:
        self.llm.reset()

    def _next(self) -> int:
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.llm.ctx, -1),
                                       shape=(self.vocab,))
        return int(np.argmax(logits))

    def prefill(self, ids: np.ndarray) -> int:
        self.llm.eval([int(t) for t in ids])
        return self._next()

    def step(self, token: int) -> int:
        self.llm.eval([token])
        return self._next()

    def logits(self, ids: np.ndarray) -> np.ndarray:
        self.llm.reset()
        rows = []
        for token in ids:   # one at a time: every position's logits, as decode sees them
            self.llm.eval([int(token)])
            rows.append(np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.llm.ctx, -1),
                                              shape=(self.vocab,)).copy())
        return np.stack(rows).astype(np.float32)


class OpenVinoRunner:
    """OpenVINO GenAI's ``LLMPipeline`` on the CPU, loading llama.cpp's GGUF file (its GGUF
    reader builds the OpenVINO model and tokenizer at load), fed token ids (an ``ov.Tensor``,
    no tokenizer run), greedy, ``min_new_tokens = max_new_tokens`` and ``ignore_eos`` so an
    EOS never ends a run early. The pipeline runs a whole generation per ``generate`` call, so
    the timed regions are cut from inside one call:

    - prefill: wall clock around ``generate(ids, max_new_tokens=1)``: run the prompt, pick
      the first token (as the other engines' ``prefill``); genai's own TTFT is kept beside it;
    - decode: ``generate(ids[:C], max_new_tokens=steps + 1)``; its time stamps of each new
      token (``perf_metrics.raw_metrics.m_new_token_times``, taken in the generation loop
      as each token is selected): the last minus the first = ``steps`` single-token steps,
      each running the previous token and selecting the next (the other engines' ``step``).

    The pipeline is the CPU default, paged attention with continuous batching, but with
    prefix caching off: its default keeps the KV blocks of earlier requests and would serve
    every repeated prompt from them (a scheduler config as its default otherwise:
    unlimited tokens per batch). Device defaults otherwise (KV cache and inference
    precision as the CPU plugin chooses them; recorded in the result)."""

    timed = True

    def __init__(self, model_dir: Path, threads: int) -> None:
        import openvino as ov
        import openvino_genai as ov_genai

        self.ov, self.genai = ov, ov_genai
        sched = ov_genai.SchedulerConfig()
        sched.max_num_batched_tokens = 2**63 - 1   # as the pipeline's latency default
        sched.enable_prefix_caching = False
        self.pipe = ov_genai.LLMPipeline(str(model_dir / "model.gguf"), "CPU",
                                         scheduler_config=sched, INFERENCE_NUM_THREADS=threads)
        core = ov.Core()
        self.info = {"openvino": ov.get_version(), "attention": "paged (continuous batching)",
                     "prefix_caching": False, "inference_num_threads": threads,
                     "cpu_plugin_defaults": {k: _prop(core.get_property("CPU", k)) for k in (
                         "INFERENCE_PRECISION_HINT", "KEY_CACHE_PRECISION",
                         "VALUE_CACHE_PRECISION", "KEY_CACHE_GROUP_SIZE",
                         "VALUE_CACHE_GROUP_SIZE", "DYNAMIC_QUANTIZATION_GROUP_SIZE",
                         "PERFORMANCE_HINT")}}
        self.genai_ttft_ms: list[float] = []   # genai's own TTFT of each timed prefill

    def _generate(self, ids: np.ndarray, new: int) -> Any:
        cfg = self.genai.GenerationConfig()
        cfg.max_new_tokens = cfg.min_new_tokens = new
        cfg.ignore_eos = True
        cfg.do_sample = False
        return self.pipe.generate(self.ov.Tensor(np.ascontiguousarray(ids[None, :])), cfg)

    def timed_prefill(self, ids: np.ndarray) -> float:
        t0 = time.perf_counter()
        res = self._generate(ids, 1)
        wall = time.perf_counter() - t0
        self.genai_ttft_ms.append(float(res.perf_metrics.get_ttft().mean))
        return wall

    def timed_decode(self, ids: np.ndarray, steps: int) -> tuple[float, list[int]]:
        res = self._generate(ids, steps + 1)
        stamps = list(res.perf_metrics.raw_metrics.m_new_token_times)
        tokens = [int(t) for t in res.tokens[0]]
        if len(stamps) != steps + 1 or len(tokens) != steps + 1:
            raise RuntimeError(f"openvino: {len(tokens)} tokens, {len(stamps)} time stamps "
                               f"for {steps + 1} new tokens")
        return stamp_seconds(stamps[-1]) - stamp_seconds(stamps[0]), tokens


def _prop(value: Any) -> str:
    """An OpenVINO property as text (an element type by its name: ``bf16``, ``u8``)."""
    return str(value.get_type_name() if hasattr(value, "get_type_name") else value)


def stamp_seconds(stamp: float) -> float:
    """A genai token time stamp (ms on a steady clock) as seconds."""
    return float(stamp) / 1e3


RUNNERS: dict[str, Any] = {"hf": HfRunner, "ortgenai": GenaiRunner,
                           "ortgenai-int4": GenaiRunner, "ortgenai-int8": GenaiRunner,
                           "openvino-int4": OpenVinoRunner, "openvino-int8": OpenVinoRunner,
                           "llamacpp-f32": LlamaCppRunner,
                           "llamacpp-q8_0": LlamaCppRunner,
                           "llamacpp-q4_0": LlamaCppRunner,
                           "llamacpp-q4_k_m": LlamaCppRunner,
                           "llamacpp-original": LlamaCppRunner}  # else: rung's engine


# -- measurement -----------------------------------------------------------------------------
def time_prefill(runner: Runner, ids: np.ndarray) -> float:
    if getattr(runner, "timed", False):
        return float(runner.timed_prefill(ids))  # type: ignore[attr-defined]
    runner.reset(len(ids) + 1)
    t0 = time.perf_counter()
    runner.prefill(ids)
    return time.perf_counter() - t0


def time_decode(runner: Runner, ids: np.ndarray, steps: int) -> tuple[float, list[int]]:
    """Prefill ``ids`` (untimed), then time ``steps`` greedy decode steps."""
    if getattr(runner, "timed", False):
        seconds, tokens = runner.timed_decode(ids, steps)  # type: ignore[attr-defined]
        return float(seconds), list(tokens)
    runner.reset(len(ids) + steps + 1)
    tokens = [runner.prefill(ids)]
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens.append(runner.step(tokens[-1]))
    return time.perf_counter() - t0, tokens


def warm_up(runner: Runner, ids: np.ndarray) -> None:
    time_decode(runner, ids[:WARMUP_TOKENS], 2)


def summarize(times: list[float], tokens: int) -> dict[str, Any]:
    med = statistics.median(times)
    return {"times_s": times, "median_s": med, "tok_s": tokens / med}


def measure(runner: Runner, ids: np.ndarray, w: Workload) -> dict[str, Any]:
    warm_up(runner, ids)
    pre = [time_prefill(runner, ids[:w.prompt]) for _ in range(w.reps)]
    prefill = dict(summarize(pre, w.prompt), tokens=w.prompt)
    prefill["ttft_ms"] = prefill["median_s"] * 1e3
    decode: dict[str, Any] = {}
    for ctx in w.contexts:
        runs = [time_decode(runner, ids[:ctx], w.steps) for _ in range(w.reps)]
        decode[str(ctx)] = dict(summarize([t for t, _ in runs], w.steps), context=ctx,
                                steps=w.steps, greedy_tokens=runs[0][1])
        decode[str(ctx)]["ms_per_token"] = decode[str(ctx)]["median_s"] / w.steps * 1e3
    return {"prefill": prefill, "decode": decode}


def run_worker(engine: str, model_dir: Path, vocab: int, w: Workload) -> dict[str, Any]:
    """Load ``engine`` from ``model_dir`` and measure ``w``; everything JSON-ready."""
    cls = RUNNERS.get(engine, RungRunner)
    ids = token_ids(w.seed, vocab, max([w.prompt, *w.contexts]))
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    runner = cls(model_dir, w.threads)
    load_s = time.perf_counter() - t0
    result = measure(runner, ids, w)
    manifest = getattr(getattr(runner, "engine", None), "manifest", None)
    if manifest is not None:   # rung: what the export chose
        result["engine_info"] = {
            "weights": manifest.weights, "kv": manifest.kv.dtype,
            "kv_chosen_by": manifest.kv.chosen_by, "max_seq": manifest.dims.max_seq,
            "verified": None if manifest.parity is None else manifest.parity.passed}
    if hasattr(runner, "genai_ttft_ms"):   # OpenVINO: its settings, its own TTFT
        result["engine_info"] = runner.info
        result["prefill"]["engine_ttft_ms"] = runner.genai_ttft_ms
    if getattr(runner, "token_batches", False):
        result["prefill"]["note"] = "one token per batch (batched quantized decode crashes)"
    if w.logits_ids and w.logits_out and hasattr(runner, "logits"):
        np.save(w.logits_out, runner.logits(np.load(w.logits_ids)))
        result["logits"] = w.logits_out
    skips = getattr(getattr(runner, "engine", None), "ffn_skips", None)
    if skips is not None:  # FFN gates: share of decode-step FFNs skipped during the run
        steps = runner.engine.ffn_steps
        result["ffn_skip_ratio"] = float(skips.sum() / max(steps * len(skips), 1))
        result["ffn_skip_per_layer"] = (skips / max(steps, 1)).round(3).tolist()
    return dict(engine=engine, model_dir=str(model_dir), workload=asdict(w), load_s=load_s,
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                loadavg_1m=[load0, os.getloadavg()[0]], **result)
