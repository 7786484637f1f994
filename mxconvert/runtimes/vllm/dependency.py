"""What every module of the vLLM plugin needs of its surroundings: the load format's name and the
error a missing vLLM raises.

It lives here, not in the package `__init__`, so that the plugin's modules import this concrete module
and never the package, whose `register()` imports the loader back (an import cycle; issue 21,
tests/test_architecture.py).
"""

from __future__ import annotations

from mxconvert.target.releases import release_key

#: `vllm serve ARTIFACT --load-format mxconvert`
LOAD_FORMAT = "mxconvert"

#: Runtime revision row -> the vLLM releases the plugin is proven in under that row: those where
#: tests_vllm runs the release's own loading and post-processing next to the plugin's and finds
#: them equal (path A = path B; tests_vllm/test_release_0_26.py and the 0.33.0 suite). The plugin
#: loads into these releases only. A row's `releases` (what `convert --runtime vllm==X.Y.Z` may
#: claim) is not enough: a new row for 0.30.0 proves the bytes, not the plugin's hooks into 0.30.0's
#: internals. adapters.py holds one adapter per row here (what differs between their internals).
PLUGIN_PROVEN: dict[str, tuple[str, ...]] = {"vllm-0.33": ("0.33.0",), "vllm-0.26": ("0.26.0",)}

#: The rows of `PLUGIN_PROVEN`, newest first.
PLUGIN_ROWS = tuple(PLUGIN_PROVEN)


def served_releases() -> str:
    """`0.26.0, 0.33.0`: the vLLM releases the plugin loads into, oldest first."""
    return ", ".join(sorted((r for releases in PLUGIN_PROVEN.values() for r in releases), key=release_key))


def missing_vllm(exc: ImportError) -> ImportError:
    """The error every guarded vLLM import of the plugin raises: what is missing, what to install."""
    return ImportError(
        f"the mxconvert vLLM plugin needs vLLM {served_releases()} ({exc}); install it with: "
        "pip install 'mxconvert[vllm]' (vLLM 0.33.0), or install mxconvert next to vLLM 0.26.0"
    )
