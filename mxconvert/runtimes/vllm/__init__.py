"""vLLM plugin: `vllm serve ARTIFACT --load-format mxconvert` loads an mxconvert artifact.

Registered through the `vllm.general_plugins` entry point (pyproject.toml), which vLLM calls in
every process (engine and workers). Nothing here imports vLLM at module import time: the core
package works without vLLM, and `register()` imports it only when vLLM itself calls the plugin.
The checks (checks.py) are plain data comparisons and import no vLLM either.
"""

from __future__ import annotations

LOAD_FORMAT = "mxconvert"


def missing_vllm(exc: ImportError) -> ImportError:
    """The error every guarded vLLM import of the plugin raises: what is missing, what to install."""
    return ImportError(
        f"the mxconvert vLLM plugin needs vLLM 0.33.0 ({exc}); install it with: pip install 'mxconvert[vllm]'"
    )


def register() -> None:
    """Register the `mxconvert` load format with vLLM's model loader registry (idempotent)."""
    try:
        from vllm.model_executor import model_loader

        from mxconvert.runtimes.vllm.loader import MxconvertModelLoader
    except ImportError as exc:  # vLLM (or a module it needs) is missing: say what to install
        raise missing_vllm(exc) from exc

    if model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get(LOAD_FORMAT) is MxconvertModelLoader:
        return
    model_loader.register_model_loader(LOAD_FORMAT)(MxconvertModelLoader)
