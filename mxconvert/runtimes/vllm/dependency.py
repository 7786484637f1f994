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

#: Runtime revision row -> format -> the vLLM releases the plugin is proven in under that row: those
#: where tests_vllm runs the release's own loading and post-processing next to the plugin's and finds
#: them equal (path A = path B: the 0.33.0 suite for both formats, tests_vllm/test_release_0_26.py for
#: MXFP4 in 0.26.0). The plugin loads into these releases only, and only artifacts of these formats.
#: A row's `releases` (what `convert --runtime vllm==X.Y.Z` may claim) is not enough: a new row for
#: 0.30.0 proves the bytes, not the plugin's hooks into 0.30.0's internals. adapters.py holds one
#: adapter per row here (what differs between their internals).
PLUGIN_PROVEN: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm-0.33": {"mxfp4": ("0.33.0",), "nvfp4": ("0.33.0",)},
    "vllm-0.32": {"mxfp4": ("0.32.0",)},
    "vllm-0.31": {"mxfp4": ("0.31.0",)},
    "vllm-0.30": {"mxfp4": ("0.30.0",)},
    "vllm-0.29": {"mxfp4": ("0.29.0",)},
    "vllm-0.27": {"mxfp4": ("0.27.0", "0.27.1", "0.28.0")},
    "vllm-0.26": {"mxfp4": ("0.26.0",)},
    "vllm-0.25": {"mxfp4": ("0.25.0", "0.25.1")},
    "vllm-0.24": {"mxfp4": ("0.24.0",)},
}

#: The rows of `PLUGIN_PROVEN`, newest first.
PLUGIN_ROWS = tuple(PLUGIN_PROVEN)


def proven_releases(row: str) -> set[str]:
    """The vLLM releases the plugin is proven in under `row`, for any format."""
    return {release for releases in PLUGIN_PROVEN.get(row, {}).values() for release in releases}


def served_releases() -> str:
    """`0.26.0, 0.33.0`: the vLLM releases the plugin loads into, oldest first."""
    return ", ".join(sorted(set().union(*(proven_releases(row) for row in PLUGIN_ROWS)), key=release_key))


def missing_vllm(exc: ImportError) -> ImportError:
    """The error every guarded vLLM import of the plugin raises: what is missing, what to install."""
    return ImportError(
        f"the mxconvert vLLM plugin needs vLLM {served_releases()} ({exc}); install it with: "
        "pip install 'mxconvert[vllm]' (vLLM 0.33.0), or install mxconvert next to vLLM 0.26.0"
    )
