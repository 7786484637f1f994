"""XPU and EMULATION: the kernels read the canonical tensors unchanged (spec §4.7)."""
from __future__ import annotations

from .base import TensorLayout


def _identity(x, fill):
    return x


IDENTITY_TENSORS = tuple(
    TensorLayout(name, _identity, steps=(),
                 info={"row_order": "gate/up interleaved (g0,u0,g1,u1,...)" if name.startswith("w13") else "natural"})
    for name in ("w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias")
)
