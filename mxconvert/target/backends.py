"""MoE kernel backends, named exactly as vLLM's oracle enums name them.

Only names and named sets live here; what each backend needs (support predicates, round-up, layout)
is data in `selection/`, `revisions.py` and `layouts/`, and what a user may call a backend (vLLM's
--moe-backend names, the `mxconvert backends` table) is `selection/vocabulary.py`.
"""

from __future__ import annotations

from enum import Enum


class Mxfp4Backend(str, Enum):
    """`Mxfp4MoeBackend` of vLLM 0.33.0 (values are the enum's string values)."""

    FLASHINFER_TRTLLM_MXFP4_BF16 = "FLASHINFER_TRTLLM_MXFP4_BF16"
    FLASHINFER_TRTLLM_MXFP4_MXFP8 = "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    FLASHINFER_CUTLASS_MXFP4_BF16 = "FLASHINFER_CUTLASS_MXFP4_BF16"
    FLASHINFER_CUTLASS_MXFP4_MXFP8 = "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    CUTLASS_MXFP4_MXFP4 = "CUTLASS_MXFP4_MXFP4"
    AITER_MXFP4_BF16 = "AITER_MXFP4_BF16"  # older trees: CK
    AITER_TRITON_MXFP4_BF16 = "AITER_TRITON_MXFP4_BF16"
    AITER_MXFP4_FP8 = "AITER_MXFP4_FP8"
    AITER_MXFP4_MXFP4 = "AITER_MXFP4_MXFP4"
    AITER_TRITON_MXFP4_MXFP4 = "AITER_TRITON_MXFP4_MXFP4"
    TRITON = "TRITON"
    TRITON_UNFUSED = "TRITON_UNFUSED"
    MARLIN = "MARLIN"
    BATCHED_MARLIN = "BATCHED_MARLIN"
    HUMMING = "HUMMING"
    XPU = "XPU"
    CPU = "CPU"
    EMULATION = "EMULATION"

    @classmethod
    def parse(cls, name: str) -> Mxfp4Backend:
        """Accept enum names in any case, and the old name CK."""
        key = name.strip().upper()
        if key == "CK" or key == "AITER":
            return cls.AITER_MXFP4_BF16
        return cls(key)

    @classmethod
    def artifact_name(cls, live: str) -> str:
        """A live vLLM layer's `mxfp4_backend.value` under the name an artifact records: vLLM 0.19.x calls
        AITER CK "CK", 0.20.0-0.21.0 "AITER"; a name this enum lacks (e.g. a release's NONE) is kept as
        given, so the plugin's backend check refuses it by that name."""
        try:
            return cls.parse(live).value
        except ValueError:
            return live


TRTLLM_BACKENDS = frozenset({Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_BF16, Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8})
CUTLASS_BACKENDS = frozenset({Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16, Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8})
TRITON_BACKENDS = frozenset({Mxfp4Backend.TRITON, Mxfp4Backend.TRITON_UNFUSED})
MARLIN_BACKENDS = frozenset({Mxfp4Backend.MARLIN, Mxfp4Backend.BATCHED_MARLIN})

#: Backends whose activations are MXFP8 (vLLM's `kMxfp8Dynamic` activation key).
MXFP8_ACTIVATION_BACKENDS = frozenset(
    {Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8, Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8}
)


class Nvfp4Backend(str, Enum):
    """`NvFp4MoeBackend` of vLLM 0.33.0 (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py; values are
    the enum's values).

    The older revision (≈ vLLM 0.15) has only FLASHINFER_TRTLLM, FLASHINFER_CUTLASS,
    FLASHINFER_CUTEDSL, VLLM_CUTLASS and MARLIN. Its FLASHINFER_CUTEDSL is the masked (batched-format)
    kernel, i.e. what 0.33 calls FLASHINFER_CUTEDSL_BATCHED.

    Note: like `Mxfp4Backend` this is a `str` enum, so `Nvfp4Backend.MARLIN == Mxfp4Backend.MARLIN`
    (both equal "MARLIN"). Never mix the two in one set or dict key space.
    """

    B12X = "B12X"
    FLASHINFER_TRTLLM = "FLASHINFER_TRTLLM"
    FLASHINFER_CUTLASS = "FLASHINFER_CUTLASS"
    FLASHINFER_CUTEDSL = "FLASHINFER_CUTEDSL"
    FLASHINFER_CUTEDSL_BATCHED = "FLASHINFER_CUTEDSL_BATCHED"
    FLASHINFER_B12X = "FLASHINFER_B12X"
    VLLM_CUTLASS = "VLLM_CUTLASS"
    MARLIN = "MARLIN"
    HUMMING = "HUMMING"
    EMULATION = "EMULATION"
    FLASHINFER_MOE_EP_CUTEDSL = "FLASHINFER_MOE_EP_CUTEDSL"

    @classmethod
    def parse(cls, name: str) -> Nvfp4Backend:
        """Accept enum names in any case."""
        return cls(name.strip().upper())


#: vLLM 0.33.0 `FLASHINFER_NVFP4_MOE_BACKENDS`: the backends that quantize activations with
#: one global scale shared by all experts (`is_global_sf_supported_for_nvfp4_backend`). The one
#: statement of this set: selection's `use_global_sf`, the input-scale rows a ModelOpt checkpoint
#: loads, and the NVFP4 layouts' activation-scale reduction all read it (vLLM ~0.15's set is the same
#: minus the backends it does not have).
NVFP4_GLOBAL_SF_BACKENDS = frozenset(
    {
        Nvfp4Backend.FLASHINFER_TRTLLM,
        Nvfp4Backend.FLASHINFER_CUTLASS,
        Nvfp4Backend.FLASHINFER_CUTEDSL,
        Nvfp4Backend.FLASHINFER_CUTEDSL_BATCHED,
        Nvfp4Backend.FLASHINFER_B12X,
    }
)


#: A backend of either format (selection reports and layout targets hold one or the other).
Backend = Mxfp4Backend | Nvfp4Backend


#: The backends `layouts/` lays out, per checkpoint format: what `mxconvert backends` marks as
#: written by `convert` without importing `layouts/` (a quick command imports no layout code,
#: tests/test_engine.py). layouts/registry.py `register` refuses a backend not listed here, and
#: tests/test_laid_out_table.py holds the registry and this table equal.
LAID_OUT: dict[str, frozenset[Backend]] = {
    "mxfp4": frozenset(
        {
            *TRTLLM_BACKENDS,
            *CUTLASS_BACKENDS,
            *TRITON_BACKENDS,
            *MARLIN_BACKENDS,
            Mxfp4Backend.AITER_MXFP4_BF16,
            Mxfp4Backend.AITER_TRITON_MXFP4_BF16,
            Mxfp4Backend.XPU,
            Mxfp4Backend.EMULATION,
        }
    ),
    "nvfp4": frozenset(
        {
            Nvfp4Backend.FLASHINFER_TRTLLM,
            Nvfp4Backend.FLASHINFER_CUTLASS,
            Nvfp4Backend.FLASHINFER_CUTEDSL,
            Nvfp4Backend.FLASHINFER_CUTEDSL_BATCHED,
            Nvfp4Backend.VLLM_CUTLASS,
            Nvfp4Backend.MARLIN,
        }
    ),
}
