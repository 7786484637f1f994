"""What every module of the vLLM plugin needs of its surroundings: the load format's name and the
error a missing vLLM raises.

It lives here, not in the package `__init__`, so that the plugin's modules import this concrete module
and never the package, whose `register()` imports the loader back (an import cycle; issue 21,
tests/test_architecture.py).
"""

from __future__ import annotations

#: `vllm serve ARTIFACT --load-format mxconvert`
LOAD_FORMAT = "mxconvert"


def missing_vllm(exc: ImportError) -> ImportError:
    """The error every guarded vLLM import of the plugin raises: what is missing, what to install."""
    return ImportError(
        f"the mxconvert vLLM plugin needs vLLM 0.33.0 ({exc}); install it with: pip install 'mxconvert[vllm]'"
    )
