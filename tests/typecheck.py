"""``make typecheck``: mypy over the packages that pyproject.toml's ``[tool.mypy] packages``
lists, by the names setuptools gives them.

The folders ``engines/``, ``daemon/``, ``export/``... are the packages ``rung.engines``,
``rung.daemon``, ``rung.export``... only through ``[tool.setuptools.package-dir]``, which
mypy does not read (and an editable install reaches them through an import hook that mypy
does not run either). So this hands mypy every source file with its module name taken from
that same mapping: the files of the packages to check, and the rest of rung's sources so
that imports between packages resolve to their real types. Options (strict, overrides) come
from ``[tool.mypy]`` as for a plain ``mypy`` run; errors name the files in the tree.

    python -m tests.typecheck [PACKAGE ...]    # default: [tool.mypy] packages
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "pyproject.toml"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every Python module of the distribution: module name -> file, by the package-dir
    mapping (a sub-package in a mapped folder takes its folder's dotted name)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools["package-dir"]
    out: dict[str, Path] = {}
    for package in setuptools["packages"]:
        # the nearest mapped ancestor (the package itself included) gives the folder
        parts = package.split(".")
        for i in range(len(parts), 0, -1):
            base = ".".join(parts[:i])
            if base in mapping:
                folder = root / mapping[base] / Path(*parts[i:])
                break
        else:
            raise SystemExit(f"{package}: no folder in [tool.setuptools.package-dir]")
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from mypy import build
    from mypy.errors import CompileError
    from mypy.main import process_options
    from mypy.modulefinder import BuildSource

    files = module_files()
    # mypy reads its own options as it would for `mypy FILE...`; the module names it would
    # make up from the folders are replaced by the mapped ones
    _, options = process_options(["--config-file", str(CONFIG),
                                  *(str(p) for p in files.values())])
    wanted = tuple(argv) if argv else tuple(options.packages or ())
    if not wanted:
        print("tests/typecheck.py: no packages to check ([tool.mypy] packages)",
              file=sys.stderr)
        return 2
    unknown = [w for w in wanted if not any(m == w or m.startswith(w + ".") for m in files)]
    if unknown:
        print(f"tests/typecheck.py: not packages of rung: {', '.join(unknown)}",
              file=sys.stderr)
        return 2
    options.packages = options.modules = options.files = None
    checked = {m for m in files if any(m == w or m.startswith(w + ".") for w in wanted)}
    # every module goes in, so that imports resolve to their real types; only the checked
    # packages' findings are reported
    sources = [BuildSource(str(path), m) for m, path in sorted(files.items())]
    try:
        result = build.build(sources, options)
    except CompileError as e:
        print("\n".join(e.messages), file=sys.stderr)
        return 2
    reported = {str(files[m]) for m in checked}
    lines = [line for line in result.errors if line.split(":", 1)[0] in reported]
    for line in lines:
        print(line)
    n = len({line.split(":", 1)[0] for line in lines if ": error:" in line})
    errors = sum(": error:" in line for line in lines)
    if errors:
        print(f"Found {errors} errors in {n} files (checked {len(checked)} modules)")
        return 1
    print(f"Success: no issues found in {len(checked)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
