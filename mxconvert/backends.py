"""MoE kernel backends, named exactly as vLLM's oracle enums name them.

Only names live here; what each backend needs (support predicates, round-up, layout) is data in
`selection.py`, `revisions.py` and `layouts/`.
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
    def parse(cls, name: str) -> "Mxfp4Backend":
        """Accept enum names in any case, and the old name CK."""
        key = name.strip().upper()
        if key == "CK" or key == "AITER":
            return cls.AITER_MXFP4_BF16
        return cls(key)


TRTLLM_BACKENDS = frozenset(
    {Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_BF16, Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8}
)
CUTLASS_BACKENDS = frozenset(
    {Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16, Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8}
)
TRITON_BACKENDS = frozenset({Mxfp4Backend.TRITON, Mxfp4Backend.TRITON_UNFUSED})
MARLIN_BACKENDS = frozenset({Mxfp4Backend.MARLIN, Mxfp4Backend.BATCHED_MARLIN})

#: Backends whose activations are MXFP8 (vLLM's `kMxfp8Dynamic` activation key).
MXFP8_ACTIVATION_BACKENDS = frozenset(
    {Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8, Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8}
)
