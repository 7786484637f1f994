"""AITER_MXFP4_BF16 (older name CK; ROCm gfx950), MXFP4 only. Formulas and references:
docs/layouts.md, "AITER".

K1 biases fp32.  K2 gate/up de-interleave of w13 weights and scales: rows g0..g_{I-1}, u0..u_{I-1}.
K3 AITER `shuffle_weight_a16w4` (16x16 layout, KPack 16, KLane 4; the gate_up variant keeps the two
halves of each 16-row block next to each other).  K4 `shuffle_scale_a16w4` (scale groups padded to
a multiple of 8 with 0x7F = 1.0).  K5 the w13 bias de-interleaved like the rows.  Weights are held
as `float4_e2m1fn_x2` (same bytes; stored as uint8, relabelled on load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mxconvert.layouts.base import TensorLayout, chain, pad_dims, reshaped_view, round_up
from mxconvert.layouts.codecs import WideningCast
from mxconvert.layouts.primitives import deinterleave, identity
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, register
from mxconvert.target.backends import Mxfp4Backend

if TYPE_CHECKING:
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch


def shuffle_weight(gate_up: bool):
    """K3: byte `(row = half*Nh + 16*n0 + nl, col = 64*k0 + 16*kl + kp)` goes to per-expert offset
    `((((n0*2 + half)*K0 + k0)*4 + kl)*16 + nl)*16 + kp` (gate_up) or without `half` (w2)."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        e, n, kb = x.shape
        if kb % 64 or n % (32 if gate_up else 16):
            raise ValueError(
                f"AITER weight shuffle needs K % 128 == 0 and rows % {32 if gate_up else 16} == 0, got {n} x {2 * kb}"
            )
        if gate_up:
            y = x.reshape(e, 2, n // 32, 16, kb // 64, 4, 16)  # (half, n0, nl, k0, kl, kp)
            return y.permute(0, 2, 1, 4, 5, 3, 6).reshape(e, n, kb)
        y = x.reshape(e, n // 16, 16, kb // 64, 4, 16)  # (n0, nl, k0, kl, kp)
        return y.permute(0, 1, 3, 4, 2, 5).reshape(e, n, kb)

    return arrange


def shuffle_scale(gate_up: bool):
    """K4: pad scale groups to 8 (with the fill, 0x7F for data), then for row `np*(n/2) + 16*n1 + nl`
    (gate_up; w2: `32*n1 + 16*np + nl`) and group `8*k1 + 4*kp + kl` the per-expert offset is
    `(((((n1*K1 + k1)*4 + kl)*16 + nl)*2 + kp)*2 + np)`."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        e, n, ks = x.shape
        if n % 32:
            raise ValueError(f"AITER scale shuffle needs rows % 32 == 0, got {n}")
        kp = round_up(ks, 8)
        y = pad_dims(x, {2: kp}, fill)
        if gate_up:
            y = y.reshape(e, 2, n // 32, 16, kp // 8, 2, 4)  # (np, n1, nl, k1, kp, kl)
            return y.permute(0, 2, 4, 6, 3, 5, 1).reshape(e, n, kp)
        y = y.reshape(e, n // 32, 2, 16, kp // 8, 2, 4)  # (n1, np, nl, k1, kp, kl)
        return y.permute(0, 1, 4, 6, 3, 5, 2).reshape(e, n, kp)

    return arrange


def _rows_view(shape: tuple[int, ...]) -> tuple[int, ...]:
    e, n, kp = shape
    return (e * n, kp)


def aiter_tensors() -> tuple[TensorLayout, ...]:
    halves = {"row_order": "gate/up halves (g0..g_{I-1}, u0..u_{I-1})"}
    natural = {"row_order": "natural"}
    fp4 = {"kernel_dtype": "float4_e2m1fn_x2", "is_shuffled": True}
    s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "aiter a16w4 scale shuffle", "scale_pad_value": 0x7F}
    f32 = WideningCast("bf16 -> fp32", "float32")
    return (
        TensorLayout(
            "w13_weight",
            chain(deinterleave, shuffle_weight(True)),
            steps=("deinterleave", "shuffle_weight_a16w4(gate_up=True)"),
            info=halves | fp4,
        ),
        TensorLayout(
            "w13_weight_scale",
            chain(deinterleave, shuffle_scale(True)),
            view=reshaped_view(_rows_view),
            pad_value=0x7F,
            steps=("deinterleave", "shuffle_scale_a16w4(gate_up=True)"),
            info=halves | s_info,
        ),
        TensorLayout("w13_bias", deinterleave, f32, steps=("deinterleave", "to float32"), info=halves),
        TensorLayout(
            "w2_weight", shuffle_weight(False), steps=("shuffle_weight_a16w4(gate_up=False)",), info=natural | fp4
        ),
        TensorLayout(
            "w2_weight_scale",
            shuffle_scale(False),
            view=reshaped_view(_rows_view),
            pad_value=0x7F,
            steps=("shuffle_scale_a16w4(gate_up=False)",),
            info=natural | s_info,
        ),
        TensorLayout("w2_bias", identity, f32, steps=("to float32",), info=natural),
    )


@register("mxfp4", Mxfp4Backend.AITER_MXFP4_BF16)
def mxfp4_aiter(target: LayoutTarget) -> ExpertLayout:
    return ExpertLayout(
        target.backend,
        target.revision.name,
        "aiter",
        {t.name: t for t in aiter_tensors()},
        {"layout": "a16w4 (16, 16)"},
    )
