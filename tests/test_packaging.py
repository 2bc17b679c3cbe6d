"""The package layout as setuptools, mypy and readers see it: every folder of rung.* listed
in pyproject.toml, the import map in docs/architecture.md drawn from the source, shipped
data read as package data, and a wheel that leaves the checkout-only tools out."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.typecheck import ROOT, module_files

ARCHITECTURE = ROOT / "docs" / "architecture.md"
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Every folder under a mapped top-level folder that holds files, by dotted name."""
    out: dict[str, Path] = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        if name.count(".") != 1:
            continue   # sub-packages map into their parent's folder anyway
        base = ROOT / folder
        for d in [base, *sorted(p for p in base.rglob("*") if p.is_dir())]:
            rel = d.relative_to(base)
            if "__pycache__" in rel.parts or not any(f.is_file() for f in d.iterdir()):
                continue
            out[".".join([name, *rel.parts])] = d
    return out


def test_every_folder_of_rung_is_a_listed_package() -> None:
    # a folder left out is what setuptools warns about ("absent from the packages
    # configuration") and what a wheel silently drops
    folders = _package_folders()
    listed = set(SETUPTOOLS["packages"])
    assert sorted(set(folders) - listed) == [], "add these to [tool.setuptools] packages"
    assert sorted(listed - set(folders)) == [], "listed packages without a folder of files"


def test_package_dir_entries_point_where_the_mapping_would() -> None:
    # a sub-package entry may only repeat what its parent's mapping gives it
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    for name, folder in mapping.items():
        parent = name.rsplit(".", 1)[0]
        if parent in mapping:
            assert Path(folder) == Path(mapping[parent]) / name.rsplit(".", 1)[1], name


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports for the type checker, never made at run time."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
        and node.test.id == "TYPE_CHECKING"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(dotted name, at import time) for each absolute import of rung in the file (one
    inside a function or under ``if TYPE_CHECKING:`` is not at import time); a name
    imported from a module is given both ways (it may be a sub-module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                and not _type_checking(child)
            if isinstance(child, ast.Import):
                out.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert child.level == 0, f"{path}: relative import (rung uses absolute ones)"
                module = child.module or ""
                out.append((module, top))
                out.extend((f"{module}.{a.name}", top) for a in child.names)
            visit(child, inner)

    visit(tree, True)
    return [(n, t) for n, t in out if n.startswith("rung.")]


# the packages whose top-level modules are each a room of their own, drawn one node per
# module: the daemon's (its wiring and what every adapter shares: config, the request, the
# envelope, the scheduler ...) and the tasks' machinery (the kinds' packages sit between
# the kind object and the registry), so that the map shows which sit below which
SPLIT = ("rung.daemon", "rung.daemon.tasks")


def _node(module: str, path: Path) -> str:
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    return module if package in SPLIT and path.stem != "__init__" else package


def import_map() -> str:
    """Which rung package imports which: one line per package (per module of a ``SPLIT``),
    the imported ones after the arrow, ``*`` where no import is made at import time (inside
    functions, made when needed, or for the type checker only)."""
    files = module_files()
    packages = sorted({_node(m, p) for m, p in files.items()})

    def owner(name: str) -> str | None:
        found = [p for p in packages if name == p or name.startswith(p + ".")]
        return max(found, key=len) if found else None

    edges: dict[str, dict[str, bool]] = {p: {} for p in packages}
    for module, path in files.items():
        source = _node(module, path)
        for name, top in _imports(path):
            target = owner(name)
            # ``from rung.daemon import config`` names the module; a SPLIT package's own
            # __init__ holds nothing to import
            if target is not None and target != source and target not in SPLIT:
                edges[source][target] = edges[source].get(target, False) or top
    width = max(map(len, packages))
    lines = []
    for p in packages:
        targets = ", ".join(t + ("" if top else "*") for t, top in sorted(edges[p].items()))
        lines.append(f"{p:<{width}}  → {targets or '(none)'}")
    return "\n".join(lines)


def test_import_map_in_the_architecture_doc_is_the_source_s() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    found = re.search(r"<!-- import-map -->\n```\n(.*?)\n```\n<!-- /import-map -->", text, re.S)
    assert found, "docs/architecture.md: the import map block is missing"
    assert found.group(1) == import_map(), (
        "docs/architecture.md's import map differs from the source; the block should read:"
        f"\n{import_map()}")


def test_the_import_map_has_no_circles() -> None:
    # every import at import time, as the map draws them: rooms import downwards only
    edges = {line.split()[0]: {t.strip() for t in line.split("→")[1].split(",")
                               if not t.strip().endswith("*") and t.strip() != "(none)"}
             for line in import_map().splitlines()}
    done: set[str] = set()

    def walk(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import circle: {' → '.join((*path, node))}"
        if node in done:
            return
        for target in sorted(edges.get(node, ())):
            walk(target, (*path, node))
        done.add(node)

    for node in sorted(edges):
        walk(node, ())


def test_engines_and_export_import_nothing_of_the_daemon() -> None:
    # the layering the map shows: engines below everything, export on engines only
    edges = {line.split()[0]: line.split("→")[1] for line in import_map().splitlines()}
    assert "rung." not in edges["rung.engines"]
    assert {t.strip().rstrip("*") for t in edges["rung.export"].split(",")} <= {
        "rung.engines"}


def test_shipped_data_is_not_found_through___file__() -> None:
    # package data is read with importlib.resources, which works from a wheel; the one use
    # left is `rung bench`, which runs bench/ scripts of a repository checkout by design
    users = sorted(str(p.relative_to(ROOT)) for p in module_files().values()
                   if "__file__" in p.read_text(encoding="utf-8"))
    assert users == ["daemon/cli.py"], users
