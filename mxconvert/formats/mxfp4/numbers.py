"""The MXFP4 number format (OCP Microscaling Formats v1.0): E2M1 codes, two per byte (low nibble =
even element), one E8M0 power-of-two scale per 32 values. Used to dequantize for checks."""

from __future__ import annotations

import torch

from mxconvert.formats.fp4 import FP4_VALUES


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`packed u8 [..., N, K/2]` and `scales u8 [..., N, K/32]` -> float32 `[..., N, K]`.

    E8M0 byte `s` is `2**(s - 127)`; 0xFF is NaN.
    """
    table = FP4_VALUES.to(packed.device)
    lo = table[(packed & 0xF).long()]
    hi = table[(packed >> 4).long()]
    values = torch.stack((lo, hi), dim=-1).flatten(-2)
    exp = scales.to(torch.float32) - 127.0
    factor = torch.where(scales == 0xFF, torch.full_like(exp, float("nan")), torch.exp2(exp))
    return (values.unflatten(-1, (-1, 32)) * factor.unsqueeze(-1)).flatten(-2)
