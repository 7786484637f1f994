"""What every module of the SGLang loader needs of its surroundings: the load format's name, the
SGLang releases the loader is proven in, and the error a missing SGLang raises.

Kept apart from the package `__init__` for the reason runtimes/vllm/dependency.py gives: the loader's
modules import this concrete module, never the package (no import cycle, tests/test_architecture.py).
"""

from __future__ import annotations

#: `python -m mxconvert.runtimes.sglang --model-path ARTIFACT --load-format mxconvert ...`
LOAD_FORMAT = "mxconvert"

#: Runtime revision row -> format -> the SGLang releases the loader is proven in under that row: those
#: where tests_sglang runs SGLang's own loading and post-processing next to the loader's install and
#: finds the layer state equal (path A = path B, tests_sglang/test_equivalence.py). A row's `releases`
#: (what `convert --runtime sglang==X.Y.Z` may claim) proves the bytes, not the loader's hooks.
LOADER_PROVEN: dict[str, dict[str, tuple[str, ...]]] = {
    "sglang-0.5.23": {"mxfp4": ("0.5.23",), "nvfp4": ("0.5.23",)},
}

#: The mxconvert backends whose SGLang post-processing the loader replaces (install.py), by the
#: `Mxfp4MoEMethod` path SGLang 0.5.23 runs for them (layers/quantization/mxfp4.py: TRT-LLM, marlin,
#: `_process_weights_for_sm{90,120}_cutlass`); and NVFP4's
#: FLASHINFER_TRTLLM and FLASHINFER_CUTLASS (`ModelOptNvFp4FusedMoEMethod`, install_nvfp4.py).
INSTALLABLE_BACKENDS = (
    "FLASHINFER_TRTLLM_MXFP4_MXFP8",
    "MARLIN",
    "FLASHINFER_CUTLASS_MXFP4_BF16",
    "FLASHINFER_CUTLASS_MXFP4_MXFP8",
    "FLASHINFER_TRTLLM",
    "FLASHINFER_CUTLASS",
    # NVFP4 FLASHINFER_CUTEDSL (the CuTe DSL v2 standard path; install_nvfp4.py `install_nvfp4_cutedsl`)
    "FLASHINFER_CUTEDSL",
    # MXFP4 AITER_MXFP4_BF16 (ROCm, SGLANG_USE_AITER=1: the `_use_aiter` branch; install.py `install_aiter`)
    "AITER_MXFP4_BF16",
)


def missing_sglang(exc: ImportError) -> ImportError:
    """The error every guarded SGLang import of the loader raises: what is missing, what to install."""
    releases = sorted({r for row in LOADER_PROVEN.values() for rs in row.values() for r in rs})
    return ImportError(
        f"the mxconvert SGLang loader needs SGLang {', '.join(releases)} ({exc}); install it next to "
        "mxconvert: pip install 'mxconvert[sglang]' (or pip install 'sglang==0.5.23')"
    )
