"""What every module of the vLLM plugin needs of its surroundings: the load format's name and the
error a missing vLLM raises.

It lives here, not in the package `__init__`, so that the plugin's modules import this concrete module
and never the package, whose `register()` imports the loader back (an import cycle; issue 21,
tests/test_architecture.py).
"""

from __future__ import annotations

from mxconvert.target.releases import release_ranges

#: `vllm serve ARTIFACT --load-format mxconvert`
LOAD_FORMAT = "mxconvert"

#: Runtime revision row -> format -> the vLLM releases the plugin is proven in under that row: those
#: where tests_vllm runs the release's own loading and post-processing next to the plugin's and finds
#: them equal (path A = path B: the 0.33.0 suite for both formats; tests_vllm/test_release_rows.py for
#: MXFP4 in every release listed, each run recorded in tests/golden/plugin/vllm-X.Y.Z-mxfp4.json by
#: tools/vllm_releases/plugin_check.py, and tests/test_plugin_records.py holds this table to those
#: records; tests_vllm/test_release_rows_nvfp4.py for NVFP4 in every release listed, recorded in
#: tests/golden/plugin/vllm-X.Y.Z-nvfp4.json by `plugin_check.py --format nvfp4` and held to this table
#: the same way; tests_vllm/test_release_0_26.py for MXFP4 and tests_vllm/test_release_0_26_nvfp4.py for
#: NVFP4 in 0.26.0 besides). The plugin loads into these releases only, and only artifacts of these
#: formats. One release may be proven under one row per format (vLLM 0.26.0: vllm-0.26 for MXFP4,
#: vllm-0.25-nvfp4 for NVFP4, the rows `convert --runtime vllm==0.26.0` writes); the artifact's format
#: then decides the row (adapters.serving_row). A row's `releases` (what `convert --runtime
#: vllm==X.Y.Z` may claim) is not enough: a new row proves the bytes, not the plugin's hooks into that
#: release's internals. adapters.py holds one adapter per row here (what differs between their
#: internals).
#:
#: vLLM 0.19.0 and 0.19.1 (row vllm-0.19, GPT-OSS MXFP4) name the quant method `Mxfp4MoEMethod` and its
#: conversion function `convert_to_mxfp4_moe_kernel_format` (0.20.0 renamed them `GptOssMxfp4MoEMethod`,
#: `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`); the plugin bypasses that function as in every
#: other release, by the name the row's adapter gives (adapters.py `_MXFP4_0_19`).
#:
#: NVFP4 in 0.18.0-0.19.1 (rows vllm-0.18, vllm-0.19-nvfp4, NVFP4 only): their methods call the same
#: conversion function as 0.20.0's (adapters.py `_NVFP4_0_19` says what differs); their FLASHINFER_CUTEDSL
#: is the batched kernel, which tests_vllm does not run there (docs/vllm-plugin.md).
#: NVFP4 in 0.15.0-0.17.1 (rows vllm-0.15, vllm-0.15.1, vllm-0.16, vllm-0.17, NVFP4 only): the same
#: conversion function again; their TRTLLM conversion (`prepare_nvfp4_moe_layer_for_fi_or_cutlass`) also
#: sets `layer.g1_scale_c`, `a1_gscale`, `g1_alphas`, `g2_alphas`, which the plugin sets as that
#: conversion's effects (adapters_nvfp4.py `_NVFP4_0_17`, `_NVFP4_0_16` say what differs); CuteDSL is not
#: run there either.
#: The NVFP4 rows of 0.19.0-0.23.0 leave MARLIN unproven: there the plugin serves (and the module runs)
#: their Blackwell backends only (FLASHINFER_TRTLLM in 0.19.x, FLASHINFER_CUTLASS, VLLM_CUTLASS,
#: FLASHINFER_CUTEDSL_BATCHED from 0.20.0).
PLUGIN_PROVEN: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm-0.33": {"mxfp4": ("0.33.0",), "nvfp4": ("0.33.0", "0.32.0")},
    "vllm-0.32": {"mxfp4": ("0.32.0",)},
    "vllm-0.31": {"mxfp4": ("0.31.0",)},
    "vllm-0.30": {"mxfp4": ("0.30.0",)},
    "vllm-0.29": {"mxfp4": ("0.29.0",), "nvfp4": ("0.29.0", "0.30.0", "0.31.0")},
    "vllm-0.27": {"mxfp4": ("0.27.0", "0.27.1", "0.28.0"), "nvfp4": ("0.27.0", "0.27.1", "0.28.0")},
    "vllm-0.26": {"mxfp4": ("0.26.0",)},
    "vllm-0.25-nvfp4": {"nvfp4": ("0.26.0", "0.25.1", "0.25.0")},
    "vllm-0.25": {"mxfp4": ("0.25.0", "0.25.1")},
    "vllm-0.24": {"mxfp4": ("0.24.0",), "nvfp4": ("0.24.0",)},
    "vllm-0.23": {"mxfp4": ("0.23.0",)},
    "vllm-0.22-nvfp4": {"nvfp4": ("0.23.0", "0.22.1", "0.22.0")},
    "vllm-0.22": {"mxfp4": ("0.22.0", "0.22.1")},
    "vllm-0.21-nvfp4": {"nvfp4": ("0.21.0",)},
    "vllm-0.21": {"mxfp4": ("0.21.0",)},
    "vllm-0.20-nvfp4": {"nvfp4": ("0.20.0", "0.20.1", "0.20.2")},
    "vllm-0.20": {"mxfp4": ("0.20.0", "0.20.1", "0.20.2")},
    "vllm-0.19-nvfp4": {"nvfp4": ("0.19.1", "0.19.0")},
    "vllm-0.19": {"mxfp4": ("0.19.0", "0.19.1")},
    "vllm-0.18": {"nvfp4": ("0.18.1", "0.18.0")},
    "vllm-0.17": {"nvfp4": ("0.17.1", "0.17.0")},
    "vllm-0.16": {"nvfp4": ("0.16.0",)},
    "vllm-0.15.1": {"nvfp4": ("0.15.1",)},
    "vllm-0.15": {"nvfp4": ("0.15.0",)},
}

#: The rows of `PLUGIN_PROVEN`, newest first.
PLUGIN_ROWS = tuple(PLUGIN_PROVEN)


def proven_releases(row: str, fmt: str | None = None) -> set[str]:
    """The vLLM releases the plugin is proven in under `row`, for format `fmt` (any when None)."""
    formats = PLUGIN_PROVEN.get(row, {})
    return {release for name, releases in formats.items() if fmt in (None, name) for release in releases}


def served_releases(fmt: str | None = None) -> str:
    """`0.19.0-0.33.0`: the vLLM releases the plugin loads into (artifacts of format `fmt`, any when
    None), oldest first, runs of consecutive releases as ranges."""
    return ", ".join(release_ranges(sorted(set().union(*(proven_releases(row, fmt) for row in PLUGIN_ROWS)))))


def missing_vllm(exc: ImportError) -> ImportError:
    """The error every guarded vLLM import of the plugin raises: what is missing, what to install."""
    return ImportError(
        f"the mxconvert vLLM plugin needs vLLM {served_releases()} ({exc}); install it with: "
        "pip install 'mxconvert[vllm]' (vLLM 0.33.0), or install mxconvert next to one of those releases"
    )
