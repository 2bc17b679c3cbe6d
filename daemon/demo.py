"""``rung demo``: the main job on embedded defaults, on this machine.

Exports the shipped demo model (``models/edge-tiny``, trained by rung; FFN gates as
trained) once into the cache directory, then answers one request of each built-in task
with it: a Structured Text POU (rendered, parsed, identifiers checked), a fault tree (cut
sets and top-event probability) and a diagnosis. Without the shipped model (an install
without the repository), a small random-weight model stands in and the text is noise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from rung.engines.errors import RungError

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "edge-tiny"
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("st_code", {"description": "Write a function block for a conveyor motor: start and "
                                "stop push buttons, an emergency stop interlock and an "
                                "overload trip that latches until reset.",
                 "pou_type": "FUNCTION_BLOCK"}),
    ("fault_tree", {"top_event": "Hydraulic unit loses system pressure",
                    "system": "Hydraulic power unit of press 1, line 3",
                    "points": [{"name": "oil_temp", "value": 82.5, "unit": "degC"},
                               {"name": "pressure", "value": 61.0, "unit": "bar"},
                               {"name": "pump_current", "value": 14.2, "unit": "A"}]}),
    ("diagnosis", {"asset": "Centrifugal pump P-101",
                   "points": [{"name": "bearing_temp", "value": 78.0, "unit": "degC",
                               "limits": {"alert": 70, "alarm": 85}},
                              {"name": "vibration_rms", "value": 7.4, "unit": "mm/s",
                               "limits": {"alert": 4.5, "alarm": 7.1}},
                              {"name": "flow", "value": 41.0, "unit": "m3/h",
                               "limits": {"low_alert": 35, "low_alarm": 25}}]}),
]


ATTEMPTS = 5


def _requests() -> dict[str, list[dict[str, Any]]]:
    """Per task, held-out instructions from the corpus generator (a seed training never
    used: the demo model knows these plants' point names), else the hand-written one."""
    try:
        from rung.tools.corpus import generate
    except ImportError:
        return {task: [data] for task, data in REQUESTS}
    picked: dict[str, list[dict[str, Any]]] = {task: [] for task, _ in REQUESTS}
    for sample in generate(3 * ATTEMPTS, seed=4242):
        picked[sample["task"]].append(sample["input"])
    return picked


def cache_dir() -> Path:
    root = os.environ.get("RUNG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rung")
    return Path(root)


def _engine_dir() -> tuple[Path, str]:
    """Export (once) the shipped model, or a random stand-in; returns (dir, what)."""
    try:
        from rung.export.exporter import ExportOptions, export
        from rung.export.presets import make_random_checkpoint
    except ImportError as e:
        raise RungError(f"the demo exports its model with the [export] extra ({e.name} is "
                        "missing)", "run `make demo`, or pip install 'rung[export]'") from e
    from rung.engines.errors import ManifestError
    from rung.engines.manifest import FORMAT_VERSION, load_manifest, sha256_file
    from rung.export.exporter import RUNG_VERSION

    if (SHIPPED / "model.safetensors").is_file():
        # one export per model content and rung version: a retrained model or a new
        # exporter gets a fresh engine, never a stale one
        key = sha256_file(SHIPPED / "model.safetensors")[:12]
        engine = cache_dir() / "edge-tiny" / f"{key}-v{RUNG_VERSION}-f{FORMAT_VERSION}"
        try:
            load_manifest(engine)
        except ManifestError:
            export(SHIPPED, engine, ExportOptions(ffn_skip="trained"))
        return engine, f"shipped demo model {SHIPPED}"
    ckpt, engine = cache_dir() / "demo-tiny" / "hf", cache_dir() / "demo-tiny" / "engine"
    if not (ckpt / "model.safetensors").is_file():
        make_random_checkpoint("demo-tiny", ckpt, seed=0, std=0.2)
    try:
        load_manifest(engine)
    except ManifestError:
        export(ckpt, engine, ExportOptions(max_seq=1024))
    return engine, "random-weight stand-in (no models/edge-tiny here): answers are noise"


def _summary(task: str, output: Any, validation: dict[str, Any]) -> str:
    if task == "st_code":
        return str(validation.get("pou_text", ""))
    if task == "fault_tree":
        ft = validation.get("fault_tree") or {}
        return (json.dumps(output, indent=2, ensure_ascii=False) + f"\ntop event "
                f"{output.get('top')}: P = {ft.get('top_probability')}; minimal cut sets: "
                f"{ft.get('minimal_cut_sets')}")
    return json.dumps(output, indent=2, ensure_ascii=False)


def run(max_tokens: int | None = None) -> int:
    """Answer the demo requests; 0 unless something failed outside the model's answers."""
    from rung.daemon.task_runner import TaskRunner
    from rung.daemon.tasks import load_tasks
    from rung.engines import load_engine
    from rung.engines.sampler import SamplingParams
    from rung.engines.tokenizer import Tokenizer

    engine_dir, what = _engine_dir()
    engine = load_engine(engine_dir)
    m = engine.manifest
    print(f"rung demo: {what}\n  {m.dims.hf_architecture}, {m.dims.num_layers} layers, "
          f"{m.weights} weights, KV {m.kv.dtype} {m.kv.bytes_per_token(m.dims)} bytes/token, "
          f"FFN gates {'on' if m.ffn_gate else 'off'}", file=sys.stderr)
    if m.parity is not None:
        print(f"  export verified: max logit error {m.parity.max_abs_logit_diff:.1e}, greedy "
              f"agreement {m.parity.greedy_agreement:.2f}", file=sys.stderr)
    runner = TaskRunner(engine, Tokenizer.load(engine_dir, m.tokenizer), load_tasks(),
                        engine_dir)
    # one request at a time: batch 1 is where the trained FFN gates act
    for task, inputs in _requests().items():
        results = [runner.run([(task, data)], SamplingParams(), max_tokens)[0]
                   for data in inputs]
        shown = next((r for r in results if r.ok), results[0])
        data = inputs[results.index(shown)]
        print(f"\n=== {task}: {next(iter(data.values()))}")
        if shown.output is not None and shown.validation is not None:
            print(_summary(task, shown.output, shown.validation))
        error = shown.error or {"code": "?", "message": ""}
        print("--- valid" if shown.ok else f"--- not valid: {error['code']}: {error['message']}")
        print(f"--- {sum(r.ok for r in results)} of {len(results)} answers to held-out "
              f"{task} instructions passed every check")
        g = shown.generation
        if g is not None:
            print(f"    {g.prompt_tokens} prompt + {len(g.token_ids)} answer tokens, ttft "
                  f"{g.ttft_ms:.0f} ms, {g.decode_tok_s:.0f} tok/s, FFN skipped "
                  f"{g.ffn_skip_ratio or 0:.0%}", file=sys.stderr)
    return 0
