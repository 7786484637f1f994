"""The NVFP4 number format: E2M1 codes, two per byte (low nibble = even element), one E4M3 scale
per 16 values, and a per-tensor float32 global scale. Used to dequantize for checks."""

from __future__ import annotations

import torch

from mxconvert.formats.fp4 import FP4_VALUES


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`packed u8 [..., N, K/2]` and block scales `float8_e4m3fn [..., N, K/16]` -> float32
    `[..., N, K]`, before the global scale (the same factor on both sides of a comparison)."""
    table = FP4_VALUES.to(packed.device)
    lo = table[(packed & 0xF).long()]
    hi = table[(packed >> 4).long()]
    values = torch.stack((lo, hi), dim=-1).flatten(-2)
    factor = scales.to(torch.float32)
    return (values.unflatten(-1, (-1, 16)) * factor.unsqueeze(-1)).flatten(-2)
