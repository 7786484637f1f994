"""E2M1, the 4-bit float both FP4 formats store (two codes per byte, low nibble = even element):
MXFP4 (OCP Microscaling Formats v1.0) and NVFP4 differ only in their block scales."""

from __future__ import annotations

import torch

#: E2M1 code -> value; bit 3 is the sign.
FP4_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32
)
