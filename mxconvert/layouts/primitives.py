"""Moves shared by several backends: identity, row orders of w13, the 128x4 block-scale swizzle,
padding. Each is a pure move (`Arrange`, see base.py) on an `[E, rows, ...]` tensor, so its exact
inverse comes for free. The formulas are in docs/layouts.md, "Shared moves".

Canonical w13 rows differ per format: GPT-OSS MXFP4 interleaves them (g0, u0, g1, u1, ...);
NVFP4 stacks two halves ([w1 = gate; w3 = up]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mxconvert.layouts.base import Arrange, chain, pad_dims, round_up

if TYPE_CHECKING:
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch


def identity(x: torch.Tensor, fill: int) -> torch.Tensor:
    """No move: the kernel reads the canonical bytes."""
    return x


# ---- row orders (dim 1) ---------------------------------------------------------------------------
def swap_pairs(x: torch.Tensor, fill: int) -> torch.Tensor:
    """Rows 2i and 2i+1 trade places: g0,u0,g1,u1,... -> u0,g0,u1,g1,..."""
    e, n, *rest = x.shape
    return x.reshape(e, n // 2, 2, *rest).flip(2).reshape(e, n, *rest)


def deinterleave(x: torch.Tensor, fill: int) -> torch.Tensor:
    """g0,u0,g1,u1,... -> g0..g_{I-1}, u0..u_{I-1} (the inverse of `interleave_halves`)."""
    e, n, *rest = x.shape
    return x.reshape(e, n // 2, 2, *rest).transpose(1, 2).reshape(e, n, *rest)


def swap_deinterleave(x: torch.Tensor, fill: int) -> torch.Tensor:
    """g0,u0,g1,u1,... -> u0..u_{I-1}, g0..g_{I-1} ("cat[w3, w1]")."""
    e, n, *rest = x.shape
    return x.reshape(e, n // 2, 2, *rest).flip(2).transpose(1, 2).reshape(e, n, *rest)


def swap_halves(x: torch.Tensor, fill: int) -> torch.Tensor:
    """[a; b] -> [b; a] (vLLM `reorder_w1w3_to_w3w1`: [w1; w3] -> [w3; w1])."""
    e, m, *rest = x.shape
    return x.reshape(e, 2, m // 2, *rest).flip(1).reshape(e, m, *rest)


def interleave_halves(x: torch.Tensor, fill: int) -> torch.Tensor:
    """[a; b] -> a0, b0, a1, b1, ... (FlashInfer's gated-activation row reorder)."""
    e, m, *rest = x.shape
    return x.reshape(e, 2, m // 2, *rest).transpose(1, 2).reshape(e, m, *rest)


# ---- the 128x4 block-scale swizzle ----------------------------------------------------------------
def swizzle_128x4_blocks(x: torch.Tensor, fill: int, k_align: int = 4) -> torch.Tensor:
    """Scale bytes `S [E, M, K]`, M padded to 128 and K to `k_align` with `fill`, as
    `[E, Mp/128, Kp/4, 32, 4, 4]`: element `(mb, kb, r, q, c)` = `S[128mb + 32q + r, 4kb + c]`.
    Flattened per expert this is FlashInfer's `block_scale_interleave` offset
    `((m//128)*(Kp/4) + k//4)*512 + (m%32)*16 + ((m%128)//32)*4 + k%4`."""
    e, m, k = x.shape
    mp, kp = round_up(m, 128), round_up(k, k_align)
    padded = pad_dims(x, {1: mp, 2: kp}, fill)
    return padded.reshape(e, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5)


def swizzle_128x4(x: torch.Tensor, fill: int) -> torch.Tensor:
    """FlashInfer `block_scale_interleave` per expert. The result keeps `[E, M, K]` when nothing
    was padded, as vLLM's reshape requires; otherwise it is the flat `[E, Mp*Kp]` buffer."""
    e, m, k = x.shape
    out = swizzle_128x4_blocks(x, fill)
    mp, kp = out.shape[1] * 128, out.shape[2] * 4
    return out.reshape(e, m, k) if (mp, kp) == (m, k) else out.reshape(e, mp * kp)


def swizzle_128x4_padded(x: torch.Tensor, fill: int) -> torch.Tensor:
    """vLLM `swizzle_blockscale`: the 128x4 swizzle, keeping the padded 3-D shape `[E, Mp, Kp]`."""
    e = x.shape[0]
    out = swizzle_128x4_blocks(x, fill)
    return out.reshape(e, out.shape[1] * 128, out.shape[2] * 4)


# ---- padding --------------------------------------------------------------------------------------
def pad_halves(n_to: int) -> Arrange:
    """Pad each of the two halves of w13 (dim 1) to `n_to` rows, at its end."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        e, m, *rest = x.shape
        return pad_dims(x.reshape(e, 2, m // 2, *rest), {2: n_to}, fill).reshape(e, 2 * n_to, *rest)

    return arrange


def w3w1_padded(n_to: int, cols: int) -> Arrange:
    """NVFP4 w13 (weights or scales) for FlashInfer's kernels: [w1; w3] -> [w3; w1], each half
    padded to `n_to` rows, the columns to `cols`."""
    return chain(swap_halves, pad_halves(n_to), pad_to(lambda s: {2: cols}))


def pad_to(sizes_of: Callable[[tuple[int, ...]], dict[int, int]]) -> Arrange:
    """Pad dims at their end to the sizes `sizes_of(shape)` gives ({dim: size})."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        return pad_dims(x, sizes_of(tuple(x.shape)), fill)

    return arrange
