"""What the numbers were measured on: CPU, memory, package versions, source revision."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("rung", "onnxruntime", "onnxruntime-genai", "llama-cpp-python", "openvino",
            "openvino-genai", "torch", "transformers", "numpy")
REPO = Path(__file__).resolve().parent.parent


def _proc_field(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    except OSError:
        return None
    return None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_revision() -> dict[str, Any]:
    """Commit and whether the tree had local changes (read-only git calls)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def machine_info() -> dict[str, Any]:
    flags = (_proc_field("/proc/cpuinfo", "flags") or "").split()
    return {
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "simd": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
                 if f in flags],
        "mem_total": _proc_field("/proc/meminfo", "MemTotal"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions(),
        "git": git_revision(),
    }
