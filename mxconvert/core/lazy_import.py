"""Heavy modules (torch, numpy) imported on first use.

The layout modules describe every backend's layout at import time and run torch and numpy only
when a layout runs on data. Planning (`select`, `convert --dry-run`, the plan of `convert`) builds
the layouts and computes their shapes without running them (layouts/shapes.py), so it should not
pay for importing torch (seconds) or numpy. A module that writes

    if TYPE_CHECKING:
        import torch
    else:
        from mxconvert.core.lazy_import import torch

keeps its code as it is (`torch.cat(...)` in a function body) and imports torch the first time
such a line runs. The module is not put into `sys.modules` before that, so "is torch loaded?"
keeps its plain meaning (tests/test_startup.py asserts it after `select`).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands in for a module: reading an attribute imports the module (once) and gives the
    module's attribute, which is then kept on the stand-in, so that later reads cost what a plain
    attribute read costs (the layouts read `torch.*` / `np.*` names for every chunk). A module
    attribute rebound after it was first read would not be seen (torch and numpy rebind none)."""

    def __init__(self, name: str) -> None:
        self._lazy_name = name
        self._lazy_module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:  # called only for names not kept yet
        module = self._lazy_module
        if module is None:
            module = self._lazy_module = importlib.import_module(self._lazy_name)
        value = getattr(module, attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        state = "imported" if self._lazy_module is not None else "not imported yet"
        return f"<lazy module {self._lazy_name!r}, {state}>"


torch: Any = LazyModule("torch")
np: Any = LazyModule("numpy")
