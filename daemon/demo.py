"""``rung demo``: the main job on embedded defaults, on this machine.

First form: build (once) a small random-weight checkpoint in the cache directory, export it
to an ONNX engine, and answer a prompt with it, streaming the text. The shipped, trained
demo model replaces the random one when it exists in ``models/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rung.engines.errors import RungError


def cache_dir() -> Path:
    root = os.environ.get("RUNG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rung")
    return Path(root)


def run(prompt: str, max_tokens: int) -> int:
    try:
        from rung.export.exporter import ExportOptions, export
        from rung.export.presets import make_random_checkpoint
    except ImportError as e:
        raise RungError(f"the demo builds its model with the [export] extra ({e.name} is "
                        "missing)", "run `make demo`, or pip install 'rung[export]'") from e
    from rung.daemon.cli import main as cli_main
    from rung.engines.manifest import MANIFEST_NAME, load_manifest

    ckpt, engine = cache_dir() / "demo-tiny" / "hf", cache_dir() / "demo-tiny" / "engine"
    if not (ckpt / "model.safetensors").is_file():
        make_random_checkpoint("demo-tiny", ckpt, seed=0, std=0.2)
    if not (engine / MANIFEST_NAME).is_file():
        export(ckpt, engine, ExportOptions(max_seq=512))
    m = load_manifest(engine)
    parity = m.parity
    print(f"rung demo: random-weight demo-tiny engine at {engine} (text is noise until the "
          "trained demo model ships)", file=sys.stderr)
    print(f"  {m.dims.hf_architecture}, {m.dims.num_layers} layers, {m.weights} weights, "
          f"KV {m.kv.dtype} {m.kv.bytes_per_token(m.dims)} bytes/token, max_seq "
          f"{m.dims.max_seq}", file=sys.stderr)
    if parity is not None:
        print(f"  export verified: max logit error {parity.max_abs_logit_diff:.1e}, greedy "
              f"agreement {parity.greedy_agreement:.2f}", file=sys.stderr)
    print(f"prompt: {prompt}\n---", file=sys.stderr)
    status: int = cli_main(["generate", str(engine), "--prompt", prompt, "--max-tokens",
                     str(max_tokens), "--temperature", "0.8", "--seed", "0"])
    return status
