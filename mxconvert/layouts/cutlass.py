"""FLASHINFER_CUTLASS_MXFP4_BF16 (SM90) and FLASHINFER_CUTLASS_MXFP4_MXFP8 (SM100+), spec
mxfp4_transforms.md §4.2.

C1 (both): gate/up rows de-interleaved and swapped: `[up_0..up_{I-1}, gate_0..gate_{I-1}]`
("w1=gate, w3=up; result = cat[w3, w1]"); the bias stays bf16.
C2a, BF16 with vLLM 0.33 + FlashInfer 0.7: FlashInfer's SM90 mixed-GEMM weight interleave (a byte
move plus the Hopper fp4 bit packing of §4.3) and scale fold, on w13 and w2.
C2b, BF16 with vLLM 0.19-0.20: weights unchanged, vLLM's `_interleave_mxfp4_cutlass_sm90` scales.
C3, MXFP8: weights unchanged, FlashInfer's 128x4 block-scale interleave per expert.
C2a and C2b are not interchangeable; the revision decides (`cutlass_sm90_layout`).
"""
from __future__ import annotations

import torch

from .base import TensorLayout, chain
from .triton import HOPPER_PACK, identity
from .trtllm import swizzle_128x4


def swap_deinterleave(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C1: rows (dim 1) g0,u0,g1,u1,... -> u0..u_{I-1}, g0..g_{I-1}."""
    e, n, *rest = x.shape
    return x.reshape(e, n // 2, 2, *rest).flip(2).transpose(1, 2).reshape(e, n, *rest)


def sm90_weight_interleave(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2a weights before PACK: per 16-row group RG, row r < 8, 32-byte partition P, mma = 2mh+ml,
    q < 4, the bytes (W[r,c], W[r+8,c], W[r,c+4], W[r+8,c+4]) with c = 32P + 8mma + q land at
    `Y[16RG + 8ml + r, 32P + 16mh + 4q + (0..3)]`. Needs rows % 16 == 0 and bytes % 32 == 0."""
    e, n, kb = x.shape
    if n % 16 or kb % 32:
        raise ValueError(f"SM90 mixed-GEMM interleave needs rows % 16 == 0 and K % 64 == 0, got {n} x {2 * kb}")
    y = x.reshape(e, n // 16, 2, 8, kb // 32, 2, 2, 2, 4)  # (RG, h, r, P, mh, ml, j, q)
    return y.permute(0, 1, 6, 3, 4, 5, 8, 7, 2).reshape(e, n, kb)  # (RG, ml, r, P, mh, q, j, h)


def sm90_scale_fold(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2a scales (`interleave_moe_scales_for_sm90_mixed_gemm`, u8, group 32):
    `out[e, r//64, g//4, r%16, 4*((r%64)//16) + g%4] = S[e, r, g]`."""
    e, rows, ks = x.shape
    if rows % 64 or ks % 4:
        raise ValueError(f"SM90 scale interleave needs rows % 64 == 0 and scale groups % 4 == 0, got {rows} x {ks}")
    y = x.reshape(e, rows // 64, 4, 16, ks // 4, 4)
    return y.permute(0, 1, 4, 3, 2, 5).reshape(e, rows // 64, ks // 4, 16, 16)


def sm90_scale_interleave_old(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2b (vLLM 0.19-0.20 `_interleave_mxfp4_cutlass_sm90`): `out[e, kq, 4n + t] = S[e, n, 4kq + t]`."""
    e, n, ks = x.shape
    if ks % 4:
        raise ValueError(f"SM90 CUTLASS scale interleave needs scale groups % 4 == 0, got {ks}")
    return x.reshape(e, n, ks // 4, 4).permute(0, 2, 1, 3).reshape(e, ks // 4, 4 * n)



_ROWS13 = "up/gate halves (u0..u_{I-1}, g0..g_{I-1})"
_SWAP = "swap_deinterleave (cat[w3, w1])"


def cutlass_tensors(variant: str) -> tuple[TensorLayout, ...]:
    """variant: "sm90-mixed-gemm" (C2a), "sm90-scale-interleave" (C2b) or "mxfp8-128x4" (C3)."""
    natural = {"row_order": "natural"}
    halves = {"row_order": _ROWS13}
    bias13 = TensorLayout("w13_bias", swap_deinterleave, steps=(_SWAP,), info=halves)
    bias2 = TensorLayout("w2_bias", identity, steps=(), info=natural)
    if variant == "sm90-mixed-gemm":
        w_steps = ("sm90_mixed_gemm_weight_interleave", "hopper_fp4_pack")
        s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "sm90 mixed-gemm scale fold"}
        return (
            TensorLayout("w13_weight", chain(swap_deinterleave, sm90_weight_interleave), HOPPER_PACK,
                         steps=(_SWAP, *w_steps), info=halves),
            TensorLayout("w13_weight_scale", chain(swap_deinterleave, sm90_scale_fold),
                         steps=(_SWAP, "sm90_scale_fold"), info=halves | s_info),
            bias13,
            TensorLayout("w2_weight", sm90_weight_interleave, HOPPER_PACK, steps=w_steps, info=natural),
            TensorLayout("w2_weight_scale", sm90_scale_fold, steps=("sm90_scale_fold",), info=natural | s_info),
            bias2,
        )
    if variant == "sm90-scale-interleave":
        s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "_interleave_mxfp4_cutlass_sm90"}
        scale, scale_steps = sm90_scale_interleave_old, ("interleave_mxfp4_cutlass_sm90",)
    elif variant == "mxfp8-128x4":
        s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "128x4"}
        scale, scale_steps = swizzle_128x4, ("block_scale_interleave_128x4",)
    else:
        raise ValueError(variant)
    return (
        TensorLayout("w13_weight", swap_deinterleave, steps=(_SWAP,), info=halves),
        TensorLayout("w13_weight_scale", chain(swap_deinterleave, scale), steps=(_SWAP, *scale_steps),
                     info=halves | s_info),
        bias13,
        TensorLayout("w2_weight", identity, steps=(), info=natural),
        TensorLayout("w2_weight_scale", scale, steps=scale_steps, info=natural | s_info),
        bias2,
    )
