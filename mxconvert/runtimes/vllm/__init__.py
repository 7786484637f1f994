"""vLLM plugin: `vllm serve ARTIFACT --load-format mxconvert` loads an mxconvert artifact.

Registered through the `vllm.general_plugins` entry point (pyproject.toml), which vLLM calls in
every process (engine and workers). Nothing here imports vLLM at module import time: the core
package works without vLLM, and `register()` imports it only when vLLM itself calls the plugin.
The checks (checks.py) are plain data comparisons and import no vLLM either. The plugin's modules
import each other directly, never this package (dependency.py holds what they share).
"""

from __future__ import annotations

from mxconvert.runtimes.vllm.dependency import LOAD_FORMAT, missing_vllm

__all__ = ["LOAD_FORMAT", "missing_vllm", "register"]


def register() -> None:
    """Register the `mxconvert` load format with vLLM's model loader registry (idempotent)."""
    try:
        from vllm.model_executor import model_loader

        from mxconvert.runtimes.vllm.loader import MxconvertModelLoader
    except ImportError as exc:  # vLLM (or a module it needs) is missing: say what to install
        raise missing_vllm(exc) from exc

    _log_with_vllm()
    if model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get(LOAD_FORMAT) is MxconvertModelLoader:
        return
    model_loader.register_model_loader(LOAD_FORMAT)(MxconvertModelLoader)


def _log_with_vllm() -> None:
    """The plugin's log lines (checksums, read-ahead, reconversions) go where vLLM's go, at vLLM's
    level: vLLM configures only its own `vllm` logger, so without this `mxconvert` INFO lines are
    dropped. Left alone when the application configured the `mxconvert` logger itself."""
    import logging

    ours, theirs = logging.getLogger("mxconvert"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False
