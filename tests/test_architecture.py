"""The package's shape, read from its imports (issue 'One big step'; docs/architecture.md, "The tree").

Folders are stages of the pipeline, each importing only itself and the stages below it:

    core < target < storage < selection < layouts < formats < artifact < pipeline < runtimes < cli

and the package face (`mxconvert/__init__.py`, the entry point) on top. The imports are read with
`ast` (module level and inside functions alike, `TYPE_CHECKING` blocks included), so a new import
that climbs a stage, closes a cycle or reaches into the face fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mxconvert"

#: Stages, lowest first. A module may import its own stage and the ones before it.
STAGES = ["core", "target", "storage", "selection", "layouts", "formats", "artifact", "pipeline", "runtimes", "cli"]
#: Sub-folders that must not import each other (one format's knowledge stays in its folder).
SIBLINGS = [("formats.mxfp4", "formats.nvfp4")]
#: Inside layouts/: the engine runs moves and knows nothing of what a layout author writes.
LOWER_THAN = [("layouts.engine", "layouts")]
#: The face: what `import mxconvert` and the command's entry point are.
FACE = {"mxconvert", "mxconvert._entry", "mxconvert.__main__"}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The package modules `module` imports (a `from X import name` of a submodule counts as it)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            if name == "mxconvert" or name.startswith("mxconvert."):
                target = _resolve(name)
                if target and target != module:
                    found.add(target)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def test_every_module_lives_in_a_stage_folder():
    loose = sorted(m for m in MODULES if m not in FACE and _stage(m) is None)
    assert loose == [], f"modules outside the stage folders {STAGES}: {loose}"


def test_no_import_climbs_a_stage():
    climbing = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if m not in FACE and t not in FACE and _stage(t) > _stage(m)
    )
    assert climbing == [], "imports from a lower stage up to a higher one:\n" + "\n".join(climbing)


def test_no_module_imports_the_package_face():
    faced = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if t in FACE and m not in FACE)
    assert faced == [], "modules importing the package face (use mxconvert.core.version):\n" + "\n".join(faced)


@pytest.mark.parametrize("a, b", SIBLINGS)
def test_sibling_folders_do_not_import_each_other(a, b):
    crossing = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if (m.startswith(f"mxconvert.{a}") and t.startswith(f"mxconvert.{b}"))
        or (m.startswith(f"mxconvert.{b}") and t.startswith(f"mxconvert.{a}"))
    )
    assert crossing == [], "\n".join(crossing)


@pytest.mark.parametrize("low, high", LOWER_THAN)
def test_a_lower_sub_folder_does_not_import_its_parent(low, high):
    up = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        if m.startswith(f"mxconvert.{low}")
        for t in targets
        if t.startswith(f"mxconvert.{high}") and not t.startswith(f"mxconvert.{low}") and t != f"mxconvert.{high}"
    )
    assert up == [], "\n".join(up)


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    # A package's __init__ that re-exports its modules is not a cycle with them.
    cycles = [c for c in cycles if not _only_package_reexports(c)]
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _only_package_reexports(component: list[str]) -> bool:
    return False


def test_no_module_over_500_lines():
    long = sorted(f"{m}: {n}" for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 500)
    assert long == [], "modules over 500 lines (split them by job):\n" + "\n".join(long)
