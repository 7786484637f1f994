"""FlashInfer TRT-LLM-gen MoE: MXFP4 (FLASHINFER_TRTLLM_MXFP4_BF16 / _MXFP8, the same bytes) and
NVFP4 (FLASHINFER_TRTLLM). Formulas and references: docs/layouts.md, "TRTLLM".

MXFP4 (vLLM 0.33.0 / 0.19-0.20 `_prepare_weights_for_trtllm` with FlashInfer's permute indices):
T1 biases -> fp32. T2 swap each (gate, up) row pair, so rows run u0, g0, u1, g1, ... (trtllm-gen's
swiglu takes the other order). T3 per expert, FlashInfer's row shuffle for the transposed MMA
output with `epilogue_tile_m = 128`. T4 scales: the 128x4 block-scale interleave per expert.
T5 scales are labelled float8_e4m3fn (the bytes stay E8M0).

NVFP4 (`prepare_static_weights_for_trtllm_fp4_moe`): [w1; w3] -> [w3; w1], each half and K padded
as the revision row says, FlashInfer's gated row interleave, the same 32-row shuffle, 128x4
swizzle of the scales; global and activation scales from `nvfp4_scales`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts.base import TensorLayout, chain, round_up
from mxconvert.layouts.codecs import Relabel, WideningCast
from mxconvert.layouts.nvfp4_scales import (
    CT_W4A4_TRTLLM_ACTIVATION_SCALE,
    E4M3_BLOCK_SCALES,
    activation_and_global_scales,
    activation_params,
    ct_w4a4_trtllm_scales,
)
from mxconvert.layouts.primitives import (
    interleave_halves,
    pad_to,
    swap_pairs,
    swizzle_128x4,
    swizzle_128x4_padded,
    w3w1_padded,
)
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, nvfp4_layout, register
from mxconvert.layouts.row_host import RowMove
from mxconvert.target.backends import TRTLLM_BACKENDS, Nvfp4Backend

if TYPE_CHECKING:
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch


def row_shuffle_32(x: torch.Tensor, fill: int) -> torch.Tensor:
    """T3: `out[n] = in[32*(n//32) + 4*(n%8) + (n%32)//8]` along dim 1 (needs rows % 32 == 0)."""
    e, n, *rest = x.shape
    if n % 32:
        raise ValueError(f"TRTLLM row shuffle needs a multiple of 32 rows, got {n}")
    return x.reshape(e, n // 32, 8, 4, *rest).transpose(2, 3).reshape(e, n, *rest)


# ---- MXFP4 ----------------------------------------------------------------------------------------
_W13 = chain(swap_pairs, row_shuffle_32)
_S13 = chain(swap_pairs, row_shuffle_32, swizzle_128x4)
_S2 = chain(row_shuffle_32, swizzle_128x4)

_ROWS13 = "up/gate interleaved (u0,g0,u1,g1,...), TRTLLM 32-row shuffle"
_ROWS2 = "natural, TRTLLM 32-row shuffle"
_E8M0_AS_E4M3 = Relabel("label float8_e4m3fn (bytes are E8M0)", "float8_e4m3fn")
_F32 = WideningCast("bf16 -> fp32", "float32")

TRTLLM_TENSORS = (
    TensorLayout(
        "w13_weight",
        _W13,
        steps=("swap_gate_up_pairs", "row_shuffle_32"),
        info={"row_order": _ROWS13},
        host=RowMove(_W13),  # whole rows: no gather plan on the host (layouts/row_host.py)
    ),
    TensorLayout(
        "w13_weight_scale",
        _S13,
        _E8M0_AS_E4M3,
        steps=("swap_gate_up_pairs", "row_shuffle_32", "block_scale_interleave_128x4", "view float8_e4m3fn"),
        info={"row_order": _ROWS13, "scale_encoding": "e8m0 bytes labelled float8_e4m3fn", "swizzle": "128x4"},
    ),
    TensorLayout(
        "w13_bias",
        _W13,
        _F32,
        steps=("swap_gate_up_pairs", "row_shuffle_32", "to float32"),
        info={"row_order": _ROWS13},
    ),
    TensorLayout(
        "w2_weight", row_shuffle_32, steps=("row_shuffle_32",), info={"row_order": _ROWS2}, host=RowMove(row_shuffle_32)
    ),
    TensorLayout(
        "w2_weight_scale",
        _S2,
        _E8M0_AS_E4M3,
        steps=("row_shuffle_32", "block_scale_interleave_128x4", "view float8_e4m3fn"),
        info={"row_order": _ROWS2, "scale_encoding": "e8m0 bytes labelled float8_e4m3fn", "swizzle": "128x4"},
    ),
    TensorLayout("w2_bias", row_shuffle_32, _F32, steps=("row_shuffle_32", "to float32"), info={"row_order": _ROWS2}),
)


@register("mxfp4", *TRTLLM_BACKENDS)
def mxfp4_trtllm(target: LayoutTarget) -> ExpertLayout:
    return ExpertLayout(
        target.backend,
        target.revision.name,
        "trtllm",
        {t.name: t for t in TRTLLM_TENSORS},
        {"epilogue_tile_m": 128, "flashinfer": target.revision.flashinfer},
    )


# ---- NVFP4 ----------------------------------------------------------------------------------------
@register("nvfp4", Nvfp4Backend.FLASHINFER_TRTLLM)
def nvfp4_trtllm(target: LayoutTarget) -> ExpertLayout:
    revision, K, N = target.revision, target.hidden, target.intermediate
    pad = revision.nvfp4_fi_padding
    if pad is None and ((2 * N) % 128 or K % 128):
        raise UnsupportedError(
            f"FLASHINFER_TRTLLM in {revision.name} does not pad, and FlashInfer's scale row "
            f"shuffle needs rows % 128 == 0: 2N = {2 * N}, K = {K}"
        )
    kp, np_ = (round_up(K, pad[0]), round_up(N, pad[1])) if pad else (K, N)
    w3w1 = {"row_order": "[w3 (up); w1 (gate)]"}
    natural = {"row_order": "natural"}
    tensors = {
        "w13_weight": TensorLayout(
            "w13_weight",
            chain(w3w1_padded(np_, kp // 2), interleave_halves, row_shuffle_32),
            steps=("reorder w1w3 -> w3w1", f"pad N to {np_}, K to {kp}", "gated row interleave", "row_shuffle_32"),
            info=w3w1,
        ),
        "w13_weight_scale": TensorLayout(
            "w13_weight_scale",
            chain(w3w1_padded(np_, kp // 16), interleave_halves, row_shuffle_32, swizzle_128x4_padded),
            steps=("reorder w1w3 -> w3w1", "pad", "gated row interleave", "row_shuffle_32", "swizzle_128x4"),
            info=w3w1 | E4M3_BLOCK_SCALES,
        ),
        "w2_weight": TensorLayout(
            "w2_weight",
            chain(pad_to(lambda s: {1: kp, 2: np_ // 2}), row_shuffle_32),
            steps=("pad", "row_shuffle_32"),
            info=natural,
        ),
        "w2_weight_scale": TensorLayout(
            "w2_weight_scale",
            chain(pad_to(lambda s: {1: kp, 2: np_ // 16}), row_shuffle_32, swizzle_128x4_padded),
            steps=("pad", "row_shuffle_32", "swizzle_128x4"),
            info=natural | E4M3_BLOCK_SCALES,
        ),
    }
    params = {
        **activation_params(target.backend, revision),
        "hidden_padded": kp,
        "intermediate_padded": np_,
        "epilogue_tile_m": 128,
    }
    return nvfp4_layout(
        target,
        tensors,
        activation_and_global_scales(target.backend, revision, target.num_local_experts, trtllm=True),
        params,
    )


def sglang_ct_w4a4_trtllm(layout: ExpertLayout) -> ExpertLayout:
    """SGLang 0.5.23's `CompressedTensorsW4A4Nvfp4MoE` TRT-LLM branch (`--moe-runner-backend
    flashinfer_trtllm`, docs/sglang.md "NVFP4"): the row's FlashInfer TRT-LLM layout `layout`, whose moves
    (`reorder_w1w3_to_w3w1`, `prepare_static_weights_for_trtllm_fp4_moe`) are the scheme's bytes where
    nothing is padded (formats/nvfp4/format.py refuses an I / tp the row would pad), with the scheme's
    own scalars (`nvfp4_scales.ct_w4a4_trtllm_scales`: one minimum of the stored input scales) in place
    of the folded ones. Its description's `activation_scale` names the variant, which is what a
    manifest's layout is rebuilt by (formats/nvfp4/format.py `layout_from_target`)."""
    if layout.backend is not Nvfp4Backend.FLASHINFER_TRTLLM:
        raise AssertionError(f"the compressed-tensors W4A4 TRT-LLM scalars on a {layout.backend.value} layout")
    num_local = layout.params["num_local_experts"]
    params = {
        **{k: v for k, v in layout.params.items() if k != "num_local_experts"},
        "global_scales_folded": False,
        "activation_scale": CT_W4A4_TRTLLM_ACTIVATION_SCALE,
        "num_local_experts": num_local,
    }
    derived = {n: replace(d, kernel=layout.backend.value) for n, d in ct_w4a4_trtllm_scales(num_local).items()}
    return replace(layout, params=params, derived=derived)
