"""FLASHINFER_TRTLLM_MXFP4_BF16 / _MXFP8 (spec mxfp4_transforms.md §4.1). Both read the same bytes.

T1 biases → fp32.  T2 swap each (gate, up) row pair, so rows run u0, g0, u1, g1, ... (trtllm-gen's
swiglu takes the other order).  T3 per expert, FlashInfer's row shuffle for the transposed MMA
output with `epilogue_tile_m = 128`: source row `32b + j` goes to `32b + 8*(j%4) + j//4`.
T4 scales: the 128x4 block-scale interleave per expert.  T5 scales are labelled float8_e4m3fn
(the bytes stay E8M0).
"""
from __future__ import annotations

import torch

from .base import Relabel, TensorLayout, WideningCast, chain, pad_dims, round_up


def swap_gate_up_pairs(x: torch.Tensor, fill: int) -> torch.Tensor:
    """T2: rows (dim 1) 2i and 2i+1 trade places."""
    e, n, *rest = x.shape
    return x.reshape(e, n // 2, 2, *rest).flip(2).reshape(e, n, *rest)


def row_shuffle_32(x: torch.Tensor, fill: int) -> torch.Tensor:
    """T3: `out[n] = in[32*(n//32) + 4*(n%8) + (n%32)//8]` along dim 1 (needs rows % 32 == 0)."""
    e, n, *rest = x.shape
    if n % 32:
        raise ValueError(f"TRTLLM row shuffle needs a multiple of 32 rows, got {n}")
    return x.reshape(e, n // 32, 8, 4, *rest).transpose(2, 3).reshape(e, n, *rest)


def swizzle_128x4(x: torch.Tensor, fill: int) -> torch.Tensor:
    """T4: FlashInfer `block_scale_interleave` per expert, on `[E, M, K]` scale bytes.

    `out[((m//128)*(Kp/4) + k//4)*512 + (m%32)*16 + ((m%128)//32)*4 + k%4] = S[m, k]` with M padded
    to 128 and K to 4 (zeros). The result keeps `[E, M, K]` when no padding was needed, as vLLM's
    reshape requires; otherwise it is the flat `[E, Mp*Kp]` buffer.
    """
    e, m, k = x.shape
    mp, kp = round_up(m, 128), round_up(k, 4)
    padded = pad_dims(x, {1: mp, 2: kp}, fill)
    out = padded.reshape(e, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return out.reshape(e, m, k) if (mp, kp) == (m, k) else out.reshape(e, mp * kp)



_W13 = chain(swap_gate_up_pairs, row_shuffle_32)
_S13 = chain(swap_gate_up_pairs, row_shuffle_32, swizzle_128x4)
_S2 = chain(row_shuffle_32, swizzle_128x4)

_ROWS13 = "up/gate interleaved (u0,g0,u1,g1,...), TRTLLM 32-row shuffle"
_ROWS2 = "natural, TRTLLM 32-row shuffle"
_E4M3 = Relabel("label float8_e4m3fn (bytes are E8M0)", torch.float8_e4m3fn)
_F32 = WideningCast("bf16 -> fp32", torch.float32)

TRTLLM_TENSORS = (
    TensorLayout("w13_weight", _W13, steps=("swap_gate_up_pairs", "row_shuffle_32"),
                 info={"row_order": _ROWS13}),
    TensorLayout("w13_weight_scale", _S13, _E4M3,
                 steps=("swap_gate_up_pairs", "row_shuffle_32", "block_scale_interleave_128x4",
                        "view float8_e4m3fn"),
                 info={"row_order": _ROWS13, "scale_encoding": "e8m0 bytes labelled float8_e4m3fn",
                       "swizzle": "128x4"}),
    TensorLayout("w13_bias", _W13, _F32, steps=("swap_gate_up_pairs", "row_shuffle_32", "to float32"),
                 info={"row_order": _ROWS13}),
    TensorLayout("w2_weight", row_shuffle_32, steps=("row_shuffle_32",), info={"row_order": _ROWS2}),
    TensorLayout("w2_weight_scale", _S2, _E4M3,
                 steps=("row_shuffle_32", "block_scale_interleave_128x4", "view float8_e4m3fn"),
                 info={"row_order": _ROWS2, "scale_encoding": "e8m0 bytes labelled float8_e4m3fn",
                       "swizzle": "128x4"}),
    TensorLayout("w2_bias", row_shuffle_32, _F32, steps=("row_shuffle_32", "to float32"),
                 info={"row_order": _ROWS2}),
)
