"""The drawn public API (issue 21, item 4): `mxconvert/__init__.py` exports what a Python user needs,
each function documented with Args / Returns / Raises / Example sections (the way the safetensors
API documents `save_file`), imported on first use, and nothing internal.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
from helpers import ROOT

import mxconvert

#: The names the issue draws; `__all__` must hold exactly these.
DRAWN = {
    "plan",
    "convert",
    "verify",
    "describe",
    "diff",
    "load_artifact",
    "LoadedArtifact",
    "DeviceProfile",
    "get_profile",
    "RuntimeRevision",
    "get_revision",
    "MxconvertError",
    "InputError",
    "UnsupportedError",
    "MismatchError",
    "__version__",
}
#: The sections every public function's docstring has, each as a line of its own ("Args:").
SECTIONS = ("Args", "Returns", "Raises", "Example")


def _resolved() -> tuple[dict[str, object], list[str]]:
    """Every name of `__all__` looked up on the package; the names that failed, with why."""
    found, failed = {}, []
    for name in mxconvert.__all__:
        try:
            found[name] = getattr(mxconvert, name)
        except Exception as exc:  # an ImportError of a missing module, an AttributeError of a missing name
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return found, failed


def test_all_is_the_drawn_api():
    assert len(mxconvert.__all__) == len(set(mxconvert.__all__)), "a name listed twice in __all__"
    assert set(mxconvert.__all__) == DRAWN, {
        "missing": sorted(DRAWN - set(mxconvert.__all__)),
        "extra": sorted(set(mxconvert.__all__) - DRAWN),
    }


def test_every_public_name_resolves():
    _, failed = _resolved()
    assert failed == [], "public names that do not resolve:\n" + "\n".join(failed)


def test_every_public_function_documents_args_returns_raises_example():
    found, _ = _resolved()
    functions = {name: obj for name, obj in found.items() if inspect.isfunction(obj)}
    assert functions, "no public function resolved (see test_every_public_name_resolves)"
    lacking = []
    for name, func in sorted(functions.items()):
        doc = inspect.getdoc(func) or ""
        missing = [s for s in SECTIONS if not re.search(rf"^{s}:\s*$", doc, re.MULTILINE)]
        if missing:
            where = f"{func.__module__}.{func.__qualname__}"
            lacking.append(f"{name} ({where}): no {', '.join(s + ':' for s in missing)} section")
    unresolved = sorted(DRAWN - set(found) - {"__version__"})
    assert lacking == [], (
        "public functions whose docstring lacks sections:\n"
        + "\n".join(lacking)
        + (f"\n(not checked, unresolved: {unresolved})" if unresolved else "")
    )


def test_public_functions_and_classes_come_from_their_own_modules():
    """`mxconvert.plan` is the function itself, not a wrapper: its module is a stage folder's."""
    found, _ = _resolved()
    for name, obj in found.items():
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__name__ == name and obj.__module__.startswith("mxconvert."), (name, obj.__module__)
    assert isinstance(found.get("__version__"), str) and found["__version__"]


def test_errors_share_one_base():
    found, _ = _resolved()
    for name in ("InputError", "UnsupportedError", "MismatchError"):
        if name in found:
            assert isinstance(found[name], type) and issubclass(found[name], mxconvert.MxconvertError), name


def test_dir_lists_exactly_the_public_names():
    listed = set(dir(mxconvert))
    assert set(mxconvert.__all__) <= listed, sorted(set(mxconvert.__all__) - listed)
    assert listed == set(mxconvert.__all__), sorted(listed - set(mxconvert.__all__))


def test_no_internal_module_is_exported():
    """Neither `__all__`, `dir()` nor attribute access hands out a module: the stage folders and their
    modules are reached by their full import path only, never as `mxconvert.<name>` of the API."""
    found, _ = _resolved()
    modules = sorted(name for name, obj in found.items() if inspect.ismodule(obj))
    assert modules == [], f"modules in __all__: {modules}"
    namespace: dict[str, object] = {}
    exec("from mxconvert import *", namespace)  # noqa: S102 - what a user's star import binds
    assert {k for k in namespace if k != "__builtins__"} <= set(mxconvert.__all__)
    for internal in ("_entry", "cli.main", "pipeline.plan", "storage.source", "artifact.manifest"):
        name = internal.rpartition(".")[2]
        if name not in mxconvert.__all__:
            assert name not in dir(mxconvert), name


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        mxconvert.no_such_thing  # noqa: B018
    assert not hasattr(mxconvert, "Checkpoint") and not hasattr(mxconvert, "verify_artifact")


def test_importing_the_package_imports_no_stage_but_core():
    """`import mxconvert` is light: no torch, numpy or pydantic, and no stage folder beyond what
    `__version__` needs; a public name imports its own module on first use."""
    code = (
        "import sys, mxconvert\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mxconvert', 'torch', 'numpy', 'pydantic', 'typer'))))\n"
        "mxconvert.get_profile\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('mxconvert.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    first, after = out.stdout.splitlines()
    assert set(first.split()) <= {"mxconvert", "mxconvert.core", "mxconvert.core.version"}, first
    assert "mxconvert.target.profiles" in after.split()
