"""FlashInfer CuteDSL NVFP4 MoE: FLASHINFER_CUTEDSL and FLASHINFER_CUTEDSL_BATCHED.
Formulas and references: docs/layouts.md, "CuteDSL".

FLASHINFER_CUTEDSL with its own preparation (vLLM 0.33.0
`prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`): [w1; w3] -> [w3; w1], each half and K padded as
the revision row says, then `interleave_linear_and_gate` (64 up rows, 64 gate rows, ...) on the
weights and the unswizzled scales, then the 128x4 swizzle; the kernel views the scales in its MMA
layout (`nvfp4_swizzled_scale_to_cutedsl_mma_view`, a view, no data moves).

A row whose `nvfp4_cutedsl_prepare` is "interleaved-unfolded" (SGLang 0.5.23's CuTe DSL v2 standard
path, docs/sglang.md "NVFP4") has the same bytes: SGLang loads w13 as [up; gate] and runs
`interleave_w13_halves(group_size=64)`, `swizzle_blockscale` and `convert_sf_to_mma_layout` (the same
view); only its scalars differ (`nvfp4_scales.cutedsl_standard_scales`).

FLASHINFER_CUTEDSL_BATCHED, and FLASHINFER_CUTEDSL of revisions whose row says "fi-or-cutlass"
(the masked kernel of older vLLM): `prepare_nvfp4_moe_layer_for_fi_or_cutlass` without the
reorder, i.e. VLLM_CUTLASS's bytes with FlashInfer's global activation scale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mxconvert.layouts.base import TensorLayout, chain, permuted_view, round_up
from mxconvert.layouts.cutlass import nvfp4_fi_or_cutlass
from mxconvert.layouts.nvfp4_scales import (
    E4M3_BLOCK_SCALES,
    activation_and_global_scales,
    activation_params,
    cutedsl_standard_scales,
)
from mxconvert.layouts.primitives import pad_to, swizzle_128x4_padded, w3w1_padded
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, nvfp4_layout, register
from mxconvert.target.backends import Nvfp4Backend

if TYPE_CHECKING:
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch


def interleave_linear_and_gate(x: torch.Tensor, fill: int) -> torch.Tensor:
    """Each 128-row block holds 64 rows of the first half, then 64 of the second."""
    e, m, *rest = x.shape
    if m % 128:
        raise ValueError(f"CuteDSL gate/linear interleave needs rows % 128 == 0, got {m}")
    return x.reshape(e, 2, m // 128, 64, *rest).transpose(1, 2).reshape(e, m, *rest)


#: `nvfp4_swizzled_scale_to_cutedsl_mma_view` of a swizzled `[E, Mp, Kp]` scale buffer.
_MMA_VIEW = permuted_view(lambda s: (s[0], s[1] // 128, s[2] // 4, 32, 4, 4), (3, 4, 1, 5, 2, 0))


def _interleaved(target: LayoutTarget) -> ExpertLayout:
    revision, K, N = target.revision, target.hidden, target.intermediate
    pad = revision.nvfp4_fi_padding or (1, 1)
    kp, np_ = round_up(K, pad[0]), round_up(N, pad[1])
    mix = {"row_order": "[w3; w1], 64-row blocks of up then gate"}
    natural = {"row_order": "natural"}
    tensors = {
        "w13_weight": TensorLayout(
            "w13_weight",
            chain(w3w1_padded(np_, kp // 2), interleave_linear_and_gate),
            steps=("reorder w13 -> w31", "pad", "interleave_linear_and_gate(64)"),
            info=mix,
        ),
        "w13_weight_scale": TensorLayout(
            "w13_weight_scale",
            chain(w3w1_padded(np_, kp // 16), interleave_linear_and_gate, swizzle_128x4_padded),
            view=_MMA_VIEW,
            steps=("reorder", "pad", "interleave_linear_and_gate(64)", "swizzle_blockscale", "view: cute mma layout"),
            info=mix | E4M3_BLOCK_SCALES,
        ),
        "w2_weight": TensorLayout("w2_weight", pad_to(lambda s: {1: kp, 2: np_ // 2}), steps=("pad",), info=natural),
        "w2_weight_scale": TensorLayout(
            "w2_weight_scale",
            chain(pad_to(lambda s: {1: kp, 2: np_ // 16}), swizzle_128x4_padded),
            view=_MMA_VIEW,
            steps=("pad", "swizzle_blockscale", "view: cute mma layout"),
            info=natural | E4M3_BLOCK_SCALES,
        ),
    }
    params = {**activation_params(target.backend, revision), "hidden_padded": kp, "intermediate_padded": np_}
    derived = activation_and_global_scales(target.backend, revision, target.num_local_experts)
    if revision.nvfp4_cutedsl_prepare == "interleaved-unfolded":
        # SGLang 0.5.23's CuTe DSL v2 path: the same bytes, its own scalars (nvfp4_scales.cutedsl_standard_scales)
        params |= {"global_scales_folded": False, "activation_scale": "w13 global max, w2 per expert"}
        derived = cutedsl_standard_scales(target.num_local_experts)
    return nvfp4_layout(target, tensors, derived, params)


@register("nvfp4", Nvfp4Backend.FLASHINFER_CUTEDSL)
def nvfp4_cutedsl(target: LayoutTarget) -> ExpertLayout:
    if target.revision.nvfp4_cutedsl_prepare == "fi-or-cutlass":
        return nvfp4_fi_or_cutlass(target, reorder=False)
    return _interleaved(target)


@register("nvfp4", Nvfp4Backend.FLASHINFER_CUTEDSL_BATCHED)
def nvfp4_cutedsl_batched(target: LayoutTarget) -> ExpertLayout:
    return nvfp4_fi_or_cutlass(target, reorder=False)
