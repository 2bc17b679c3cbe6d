"""GPU plumbing where no GPU is: nothing on the CPU path imports tensorrt or cuda, and the
GPU paths fail with messages that say what to install."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from rung.engines import gpu
from rung.engines.errors import EngineError

HAVE_CUDA_PYTHON = importlib.util.find_spec("cuda") is not None


@pytest.mark.slow
def test_no_module_imports_a_gpu_runtime() -> None:
    """Import every module of rung.engines and rung.daemon, and the TensorRT build modules:
    tensorrt, cuda (cuda-python) and pycuda stay out of sys.modules."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import rung.engines, rung.daemon\n"
        "names = ['rung.export.trt_build', 'rung.export.trt_graph']\n"
        "for pkg in (rung.engines, rung.daemon):\n"
        "    names += [f'{pkg.__name__}.{m.name}' for m in pkgutil.iter_modules(pkg.__path__)\n"
        "              if m.name != '__main__']\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorrt', 'cuda', 'pycuda'))\n"
        "print('LEAK', bad) if bad else print('CLEAN', len(names))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=180)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr
    assert last.startswith("CLEAN"), r.stdout + r.stderr
    assert int(last.split()[1]) > 30  # the walk saw the packages


@pytest.mark.skipif(HAVE_CUDA_PYTHON, reason="cuda-python is installed here")
def test_missing_cuda_python_names_the_install() -> None:
    with pytest.raises(EngineError, match="needs cuda-python") as e:
        gpu.device_info(0)
    assert e.value.hint is not None and "rung[trt]" in e.value.hint
    assert "docs/jetson.md" in e.value.hint
