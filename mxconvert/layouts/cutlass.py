"""CUTLASS grouped GEMMs: FlashInfer's for MXFP4 (FLASHINFER_CUTLASS_MXFP4_BF16 on SM90,
FLASHINFER_CUTLASS_MXFP4_MXFP8 on SM100+) and for NVFP4 (FLASHINFER_CUTLASS), and vLLM's own for
NVFP4 (VLLM_CUTLASS). Formulas and references: docs/layouts.md, "CUTLASS".

MXFP4: C1 (both) gate/up rows de-interleaved and swapped, `[up_0..up_{I-1}, gate_0..gate_{I-1}]`;
the bias stays bf16. C2a (BF16, FlashInfer 0.7): FlashInfer's SM90 mixed-GEMM weight interleave
plus the Hopper fp4 bit packing, and its scale fold. C2b (BF16, older revisions): weights
unchanged, vLLM's `_interleave_mxfp4_cutlass_sm90` scales. C2c (BF16, FlashInfer 0.6.11.post2-
0.6.16.post3): that kernel generation's fp4 weight interleave (a move of 4-bit codes, stored as plain
packed bytes) and C2b's scales. C3 (MXFP8): weights unchanged, the 128x4 block-scale interleave.
The revision row picks C2a, C2b or C2c (`cutlass_sm90_layout`).

NVFP4 (`prepare_nvfp4_moe_layer_for_fi_or_cutlass`): FLASHINFER_CUTLASS reorders [w1; w3] ->
[w3; w1]; both swizzle the block scales 128x4 (`swizzle_blockscale`); gated layers whose 2N is
not a multiple of 128 are refused, as vLLM raises for padding them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import UINT8, DType
from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts.base import Arrange, TensorLayout, chain, pad_dims, round_up
from mxconvert.layouts.codecs import NIBBLES, Codec
from mxconvert.layouts.nvfp4_scales import (
    CT_W4A4_CUTLASS_ACTIVATION_SCALE,
    E4M3_BLOCK_SCALES,
    activation_and_global_scales,
    activation_params,
    ct_w4a4_cutlass_scales,
)
from mxconvert.layouts.primitives import identity, swap_deinterleave, swap_halves, swizzle_128x4, swizzle_128x4_padded
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, nvfp4_layout, register
from mxconvert.layouts.triton import HOPPER_PACK
from mxconvert.target.backends import CUTLASS_BACKENDS, Mxfp4Backend, Nvfp4Backend

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np, torch


def sm90_weight_interleave(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2a weights before PACK: per 16-row group RG, row r < 8, 32-byte partition P, mma = 2mh+ml,
    q < 4, the bytes (W[r,c], W[r+8,c], W[r,c+4], W[r+8,c+4]) with c = 32P + 8mma + q land at
    `Y[16RG + 8ml + r, 32P + 16mh + 4q + (0..3)]`. Needs rows % 16 == 0 and bytes % 32 == 0."""
    e, n, kb = x.shape
    if n % 16 or kb % 32:
        raise ValueError(f"SM90 mixed-GEMM interleave needs rows % 16 == 0 and K % 64 == 0, got {n} x {2 * kb}")
    y = x.reshape(e, n // 16, 2, 8, kb // 32, 2, 2, 2, 4)  # (RG, h, r, P, mh, ml, j, q)
    return y.permute(0, 1, 6, 3, 4, 5, 8, 7, 2).reshape(e, n, kb)  # (RG, ml, r, P, mh, q, j, h)


def sm90_nibble_interleave_0_6(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2c weights as 4-bit codes (FlashInfer 0.6.11.post2-0.6.16.post3
    `interleave_fp4_weights_for_sm90_mixed_gemm_kernel`, moe_gemm_mixed_utils.cu): per 16-row group
    RG, row r < 8, 64-code partition P and lane L = 16 l4 + 8 l3 + 4 l2 + l01 (the kernel's thread),
    the codes (W[r, c], W[r+8, c], W[r, c+1], W[r+8, c+1]) with c = 64P + 32l4 + 16l3 + 8l2 + 2l01
    land at `Y[16RG + 8l3 + r, 64P + 32l4 + 8l01 + 4l2 + (0..3)]` (rows relative to RG). The
    kernel's byte form: `a' = lo(a) | lo(b) << 4`, `b' = hi(a) | hi(b) << 4` for a = W[row][col],
    b = W[row + 8][col] (bytes), written to byte columns 32P + ilane, +1. Needs rows % 16 == 0 and
    K % 64 == 0 (elsewhere the kernel leaves bytes unwritten)."""
    e, n, k = x.shape
    if n % 16 or k % 64:
        raise ValueError(f"SM90 fp4 interleave (FlashInfer 0.6) needs rows % 16 == 0 and K % 64 == 0, got {n} x {k}")
    y = x.reshape(e, n // 16, 2, 8, k // 64, 2, 2, 2, 4, 2)  # (RG, h, r, P, l4, l3, l2, l01, j)
    return y.permute(0, 1, 6, 3, 4, 5, 8, 7, 9, 2).reshape(e, n, k)  # (RG, l3, r, P, l4, l01, l2, j, h)


@dataclass(frozen=True)
class PackNibbles(Codec):
    """4-bit codes `[..., K]` -> u8 `[..., K/2]` (low nibble = even code): the inverse of `NIBBLES`,
    for a layout that moves fp4 values and stores them as plain packed bytes again."""

    def encode(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        # the codes come from `NIBBLES.split`, so each is < 16 (no data-dependent check: this also
        # runs on meta tensors for shapes)
        pairs = x.unflatten(-1, (-1, 2))
        return pairs[..., 0] | (pairs[..., 1] << 4)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        return NIBBLES.split(y, portable)

    def numpy_form(self, dtype: DType) -> bool:
        return True

    def encode_bits(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        return pairs[..., 0] | (pairs[..., 1] << 4)

    def decode_bits(self, y: np.ndarray, arranged_dtype: DType) -> np.ndarray:
        return NIBBLES.split_bits(y)

    def encoded_spec(self, dtype: DType | torch.dtype, shape: tuple[int, ...]) -> tuple[DType, tuple[int, ...]]:
        _, same = super().encoded_spec(dtype, shape)
        return UINT8, (*same[:-1], same[-1] // 2)


PACK_NIBBLES = PackNibbles("pack_nibbles")


def sm90_scale_fold(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2a scales (`interleave_moe_scales_for_sm90_mixed_gemm`, u8, group 32):
    `out[e, r//64, g//4, r%16, 4*((r%64)//16) + g%4] = S[e, r, g]`."""
    e, rows, ks = x.shape
    if rows % 64 or ks % 4:
        raise ValueError(f"SM90 scale interleave needs rows % 64 == 0 and scale groups % 4 == 0, got {rows} x {ks}")
    y = x.reshape(e, rows // 64, 4, 16, ks // 4, 4)
    return y.permute(0, 1, 4, 3, 2, 5).reshape(e, rows // 64, ks // 4, 16, 16)


def sm90_scale_interleave(x: torch.Tensor, fill: int) -> torch.Tensor:
    """C2b (vLLM 0.19-0.20 `_interleave_mxfp4_cutlass_sm90`): `out[e, kq, 4n + t] = S[e, n, 4kq + t]`."""
    e, n, ks = x.shape
    if ks % 4:
        raise ValueError(f"SM90 CUTLASS scale interleave needs scale groups % 4 == 0, got {ks}")
    return x.reshape(e, n, ks // 4, 4).permute(0, 2, 1, 3).reshape(e, ks // 4, 4 * n)


# ---- MXFP4 ----------------------------------------------------------------------------------------
_ROWS13 = "up/gate halves (u0..u_{I-1}, g0..g_{I-1})"
_SWAP = "swap_deinterleave (cat[w3, w1])"


def cutlass_tensors(variant: str) -> tuple[TensorLayout, ...]:
    """variant: "sm90-mixed-gemm" (C2a), "sm90-scale-interleave" (C2b), "sm90-interleave-0.6" (C2c)
    or "mxfp8-128x4" (C3)."""
    natural = {"row_order": "natural"}
    halves = {"row_order": _ROWS13}
    bias13 = TensorLayout("w13_bias", swap_deinterleave, steps=(_SWAP,), info=halves)
    bias2 = TensorLayout("w2_bias", identity, steps=(), info=natural)
    if variant == "sm90-mixed-gemm":
        w_steps = ("sm90_mixed_gemm_weight_interleave", "hopper_fp4_pack")
        s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "sm90 mixed-gemm scale fold"}
        return (
            TensorLayout(
                "w13_weight",
                chain(swap_deinterleave, sm90_weight_interleave),
                HOPPER_PACK,
                steps=(_SWAP, *w_steps),
                info=halves,
            ),
            TensorLayout(
                "w13_weight_scale",
                chain(swap_deinterleave, sm90_scale_fold),
                steps=(_SWAP, "sm90_scale_fold"),
                info=halves | s_info,
            ),
            bias13,
            TensorLayout("w2_weight", sm90_weight_interleave, HOPPER_PACK, steps=w_steps, info=natural),
            TensorLayout("w2_weight_scale", sm90_scale_fold, steps=("sm90_scale_fold",), info=natural | s_info),
            bias2,
        )
    if variant in ("sm90-scale-interleave", "sm90-interleave-0.6"):
        s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "_interleave_mxfp4_cutlass_sm90"}
        scale, scale_steps = sm90_scale_interleave, ("interleave_mxfp4_cutlass_sm90",)
    elif variant == "mxfp8-128x4":
        s_info = {"scale_encoding": "e8m0 (uint8)", "swizzle": "128x4"}
        scale, scale_steps = swizzle_128x4, ("block_scale_interleave_128x4",)
    else:
        raise ValueError(variant)
    if variant == "sm90-interleave-0.6":
        code_steps = ("4-bit codes", "sm90_fp4_weight_interleave (FlashInfer 0.6)", "pack bytes")
        w13 = TensorLayout(
            "w13_weight",
            chain(swap_deinterleave, sm90_nibble_interleave_0_6),
            PACK_NIBBLES,
            split=NIBBLES,
            steps=(_SWAP, *code_steps),
            info=halves,
        )
        w2 = TensorLayout(
            "w2_weight", sm90_nibble_interleave_0_6, PACK_NIBBLES, split=NIBBLES, steps=code_steps, info=natural
        )
    else:
        w13 = TensorLayout("w13_weight", swap_deinterleave, steps=(_SWAP,), info=halves)
        w2 = TensorLayout("w2_weight", identity, steps=(), info=natural)
    return (
        w13,
        TensorLayout(
            "w13_weight_scale", chain(swap_deinterleave, scale), steps=(_SWAP, *scale_steps), info=halves | s_info
        ),
        bias13,
        w2,
        TensorLayout("w2_weight_scale", scale, steps=scale_steps, info=natural | s_info),
        bias2,
    )


# ---- MXFP4 under SGLang 0.5.23: padded after loading -----------------------------------------------
#: SGLang's CUTLASS alignment of the intermediate size (`_padded_intermediate = round_up(I, 128)`).
SGLANG_CUTLASS_I_ALIGN = 128
_PAD_STEP = "pad I to 128 after loading (zeros)"


def sglang_pad_w13_rows(x: torch.Tensor, fill: int) -> torch.Tensor:
    """w13 (weights, scales, bias) in GPT-OSS's interleaved rows: 2I -> 2 round_up(I, 128) rows, the
    new ones at the end. After the moves' `swap_deinterleave` each [up; gate] half ends in its
    round_up(I, 128) - I padding rows, which is SGLang 0.5.23's `_stack_up_gate_w13` (layers/
    quantization/mxfp4.py: de-interleave, then each half copied into a zeroed [2 N_pad] buffer)."""
    e, m, *rest = x.shape
    return pad_dims(x, {1: 2 * round_up(m // 2, SGLANG_CUTLASS_I_ALIGN)}, fill)


def sglang_pad_w2_columns(per_column: int) -> Arrange:
    """w2's last dim (I / `per_column`: packed bytes 2, scale groups 32) padded to round_up(I, 128):
    SGLang 0.5.23's `_pad_w2_3d` (a zeroed [E, K_pad, N_pad / per_column] buffer)."""
    align = SGLANG_CUTLASS_I_ALIGN // per_column

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        return pad_dims(x, {2: round_up(x.shape[2], align)}, fill)

    return arrange


def sglang_cutlass_tensors(variant: str) -> tuple[TensorLayout, ...]:
    """The row's `mxfp4_cutlass_pad == "after-load-128"` (SGLang 0.5.23): `cutlass_tensors(variant)`
    after SGLang's re-padding. SGLang creates the parameters at the checkpoint's I (hidden rounded to
    256 by FusedMoE, scales filled 0x7F: the canonical tensors under the row's rule and fill) and its
    `_process_weights_for_sm{90,120}_cutlass` pads I to 128 with zeros -- weights, scales and biases
    alike -- before the same moves as vLLM's (de-interleave to [up; gate], then FlashInfer's SM90
    interleaves, or the 128x4 scale swizzle on SM120). The hidden size needs no padding: round_up(H, 256)
    is already SGLang's K_pad = round_up(., 128). docs/sglang.md, "FLASHINFER_CUTLASS"."""
    pads: dict[str, Arrange] = {
        "w13_weight": sglang_pad_w13_rows,
        "w13_weight_scale": sglang_pad_w13_rows,
        "w13_bias": sglang_pad_w13_rows,
        "w2_weight": sglang_pad_w2_columns(2),
        "w2_weight_scale": sglang_pad_w2_columns(32),
    }
    return tuple(
        t if t.name not in pads else replace(t, arrange=chain(pads[t.name], t.arrange), steps=(_PAD_STEP, *t.steps))
        for t in cutlass_tensors(variant)
    )


@register("mxfp4", *CUTLASS_BACKENDS)
def mxfp4_cutlass(target: LayoutTarget) -> ExpertLayout:
    revision = target.revision
    variant = (
        "mxfp8-128x4" if target.backend == Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8 else revision.cutlass_sm90_layout
    )
    after_load = revision.mxfp4_cutlass_pad == "after-load-128"
    return ExpertLayout(
        target.backend,
        revision.name,
        "cutlass",
        {t.name: t for t in (sglang_cutlass_tensors(variant) if after_load else cutlass_tensors(variant))},
        {"variant": variant, "flashinfer": revision.flashinfer} | ({"padding": "after-load-128"} if after_load else {}),
    )


# ---- NVFP4 ----------------------------------------------------------------------------------------
def fi_or_cutlass_tensors(backend: Enum, N: int, gated: bool, reorder: bool) -> dict[str, TensorLayout]:
    """`prepare_nvfp4_moe_layer_for_fi_or_cutlass`: optional [w1; w3] -> [w3; w1], then the 128x4
    swizzle of both block scales; weights otherwise unchanged."""
    if gated and (2 * N) % 128:
        raise UnsupportedError(
            f"{backend.value} cannot run 2N = {2 * N} (not a multiple of 128): vLLM raises "
            "NotImplementedError for padding a gated layer"
        )
    first = (swap_halves,) if reorder else ()
    order = {"row_order": "[w3 (up); w1 (gate)]" if reorder else "[w1 (gate); w3 (up)]"}
    natural = {"row_order": "natural"}
    steps = ("reorder w1w3 -> w3w1",) if reorder else ()
    return {
        "w13_weight": TensorLayout("w13_weight", chain(*first) if first else identity, steps=steps, info=order),
        "w13_weight_scale": TensorLayout(
            "w13_weight_scale",
            chain(*first, swizzle_128x4_padded),
            steps=(*steps, "swizzle_blockscale"),
            info=order | E4M3_BLOCK_SCALES,
        ),
        "w2_weight": TensorLayout("w2_weight", identity, info=natural),
        "w2_weight_scale": TensorLayout(
            "w2_weight_scale", swizzle_128x4_padded, steps=("swizzle_blockscale",), info=natural | E4M3_BLOCK_SCALES
        ),
    }


def nvfp4_fi_or_cutlass(target: LayoutTarget, reorder: bool) -> ExpertLayout:
    tensors = fi_or_cutlass_tensors(target.backend, target.intermediate, target.gated, reorder)
    derived = activation_and_global_scales(target.backend, target.revision, target.num_local_experts)
    return nvfp4_layout(target, tensors, derived, activation_params(target.backend, target.revision))


@register("nvfp4", Nvfp4Backend.FLASHINFER_CUTLASS)
def nvfp4_flashinfer_cutlass(target: LayoutTarget) -> ExpertLayout:
    return nvfp4_fi_or_cutlass(target, reorder=True)


@register("nvfp4", Nvfp4Backend.VLLM_CUTLASS)
def nvfp4_vllm_cutlass(target: LayoutTarget) -> ExpertLayout:
    return nvfp4_fi_or_cutlass(target, reorder=False)


def sglang_ct_w4a4_cutlass(layout: ExpertLayout) -> ExpertLayout:
    """SGLang 0.5.23's `CompressedTensorsW4A4Nvfp4MoE` CUTLASS branch (docs/sglang.md, "NVFP4"): the
    FlashInfer CUTLASS layout `layout` (the row's: [up; gate], `swizzle_blockscale`), whose moves are the
    scheme's bytes, with the scheme's own per-expert scalars (`nvfp4_scales.ct_w4a4_cutlass_scales`)
    in place of the folded ones. Its description's `activation_scale` names the variant, which is what
    a manifest's layout is rebuilt by (formats/nvfp4/format.py `layout_from_target`)."""
    if layout.backend is not Nvfp4Backend.FLASHINFER_CUTLASS:
        raise AssertionError(f"the compressed-tensors W4A4 CUTLASS scalars on a {layout.backend.value} layout")
    params = {
        **{k: v for k, v in layout.params.items() if k != "num_local_experts"},
        "global_scales_folded": False,
        "activation_scale": CT_W4A4_CUTLASS_ACTIVATION_SCALE,
        "num_local_experts": layout.params["num_local_experts"],
    }
    derived = {n: replace(d, kernel=layout.backend.value) for n, d in ct_w4a4_cutlass_scales().items()}
    return replace(layout, params=params, derived=derived)
