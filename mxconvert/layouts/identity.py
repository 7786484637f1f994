"""XPU and EMULATION (MXFP4): the kernels read the canonical tensors unchanged."""

from __future__ import annotations

from mxconvert.layouts.base import TensorLayout
from mxconvert.layouts.primitives import identity
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, register
from mxconvert.target.backends import Mxfp4Backend

IDENTITY_TENSORS = tuple(
    TensorLayout(
        name,
        identity,
        steps=(),
        info={"row_order": "gate/up interleaved (g0,u0,g1,u1,...)" if name.startswith("w13") else "natural"},
    )
    for name in ("w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias")
)


@register("mxfp4", Mxfp4Backend.XPU, Mxfp4Backend.EMULATION)
def mxfp4_identity(target: LayoutTarget) -> ExpertLayout:
    return ExpertLayout(target.backend, target.revision.name, "identity", {t.name: t for t in IDENTITY_TENSORS})
