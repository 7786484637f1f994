"""The `SGLANG_*` variables a mirrored SGLang release reads while it picks and prepares MoE weights.

`convert` and `select` read them from the environment as they read vLLM's `VLLM_*` variables for a
vLLM row (selection/environment.py): a CI job that exports them for `sglang serve` gets the same
selection from mxconvert, and the plan reports each with where it came from. A device profile that
turns AITER on (`mi300x-aiter`, `mi355x-aiter`: `rocm_use_aiter`) is `SGLANG_USE_AITER=1` on an
SGLang row unless the variable is given (docs/sglang.md, "Environment").
"""

from __future__ import annotations

#: selection name (an SGLang row's `selection`) -> variable -> what reads it in that release
SGLANG_ENV_READ: dict[str, dict[str, str]] = {
    "sglang-0.5.23": {
        "SGLANG_USE_AITER": "layers/quantization/mxfp4.py `_use_aiter` (ROCm: the AITER MXFP4 path)",
        "SGLANG_AITER_K3_OPT": "mxfp4.py `_aiter_k3_opt` (AITER path: I padded to 128)",
        "SGLANG_USE_AITER_MOE_GU_ITLV": "environ.py, mxfp4.py's AITER shuffles",
        "SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION": "modelopt_quant.py (NVFP4 per-token activation scales)",
        "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16": "modelopt_quant.py, flashinfer_cutedsl.py (CuTe DSL W4A16)",
    },
}

#: The variable a profile's `rocm_use_aiter` stands for on an SGLang row.
AITER_SWITCH = "SGLANG_USE_AITER"
