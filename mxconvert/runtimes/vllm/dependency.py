"""What every module of the vLLM plugin needs of its surroundings: the load format's name and the
error a missing vLLM raises.

It lives here, not in the package `__init__`, so that the plugin's modules import this concrete module
and never the package, whose `register()` imports the loader back (an import cycle; issue 21,
tests/test_architecture.py).
"""

from __future__ import annotations

from mxconvert.target.releases import release_key
from mxconvert.target.revisions import REVISIONS

#: `vllm serve ARTIFACT --load-format mxconvert`
LOAD_FORMAT = "mxconvert"

#: The runtime revision rows whose reference vLLM release (the row's `versions`) the plugin loads
#: into, newest first; adapters.py holds one adapter per row (what differs between their internals).
PLUGIN_ROWS = ("vllm-0.33", "vllm-0.26")


def served_releases() -> str:
    """`0.26.0, 0.33.0`: the vLLM releases the plugin loads into, oldest first."""
    return ", ".join(sorted((REVISIONS[name].versions for name in PLUGIN_ROWS), key=release_key))


def missing_vllm(exc: ImportError) -> ImportError:
    """The error every guarded vLLM import of the plugin raises: what is missing, what to install."""
    return ImportError(
        f"the mxconvert vLLM plugin needs vLLM {served_releases()} ({exc}); install it with: "
        "pip install 'mxconvert[vllm]' (vLLM 0.33.0), or install mxconvert next to vLLM 0.26.0"
    )
