"""Shared by convert_timeline.py and verify_timeline.py: time marks per thread, and wrappers that
set them around functions of modules imported later by the command itself."""

from __future__ import annotations

import builtins
import os
import sys
import threading
import time
from collections.abc import Callable

T0 = time.perf_counter()
MARKS: list[tuple[float, str, str]] = []


def mark(what: str) -> None:
    MARKS.append((time.perf_counter() - T0, threading.current_thread().name, what))


def wrap(module, name: str, label: str, first_only: bool = False) -> None:
    """Mark the start and end of `module.name` (the first call only with `first_only`); the first
    argument's file name is shown where it is a path."""
    real = getattr(module, name)
    calls = {"n": 0}

    def marked(*args, **kwargs):
        calls["n"] += 1
        shown = not first_only or calls["n"] == 1
        tag = os.path.basename(str(args[0])) if args and isinstance(args[0], (str, os.PathLike)) else ""
        if shown:
            mark(f"{label} start {tag}")
        try:
            return real(*args, **kwargs)
        finally:
            if shown:
                mark(f"{label} end {tag}")

    setattr(module, name, marked)


def when_imported(module: str, attribute: str, patch: Callable[[], None]) -> None:
    """Run `patch` right after the command's own import of `module` (once it defines `attribute`)."""
    real_import = builtins.__import__
    state = {"done": False}

    def watching(name, *args, **kwargs):
        loaded = real_import(name, *args, **kwargs)
        found = sys.modules.get(module)
        if not state["done"] and found is not None and getattr(found, attribute, None) is not None:
            state["done"] = True
            mark(f"{module} imported")
            patch()
        return loaded

    builtins.__import__ = watching


def run_cli(args: list[str]) -> None:
    from mxconvert._entry import main

    sys.argv = ["mxconvert", *args]
    try:
        main()
    except SystemExit as exc:
        mark(f"exit {exc.code}")
    mark("done")
    print("torch imported:", "torch" in sys.modules)
    for at, thread, what in MARKS:
        print(f"{at:7.3f}  {thread[:26]:26}  {what}")
