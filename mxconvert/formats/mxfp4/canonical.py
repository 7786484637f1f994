"""Checkpoint → canonical tensors, exactly as vLLM's GPT-OSS loader builds them
(vLLM 0.33.0 vllm/model_executor/models/gpt_oss.py; see docs/architecture.md, Formats).

For one rank: reshape the blocks, slice the rank's part (tensor parallel: rows of the interleaved
gate/up pairs and byte columns of down_proj, with `I_r = ceil((I/32)/tp)*32`; expert parallel: a
range of experts), and pad every dimension at its end to the backend's rounded sizes (zeros; the scales with the
runtime's own fill: 0 for vLLM, 0x7F for SGLang, docs/sglang.md).
Reads go through lazy safetensors slices, one chunk of experts at a time, so memory stays bounded.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mxconvert.core.bits import bits_dtype, to_torch
from mxconvert.core.dtypes import BFLOAT16, UINT8, DType
from mxconvert.core.errors import InputError
from mxconvert.core.parallel import host_buffer
from mxconvert.formats.base import RankPlan, expert_parallel_plans
from mxconvert.formats.mxfp4.checkpoint import Checkpoint, ModelFacts, expert_tensor_name

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Canonical parameter names (vLLM's `GptOssMxfp4MoEMethod.create_weights`).
CANONICAL_NAMES = ("w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias")
#: The canonical block scales (E8M0 bytes): their padding holds the revision's scale fill.
SCALE_NAMES = ("w13_weight_scale", "w2_weight_scale")


def rank_slice_size(intermediate: int, tp: int) -> int:
    """`I_r = ceil((I/32) / tp) * 32`: the per-rank slice of the intermediate size (as gpt_oss.py)."""
    return -(-(intermediate // 32) // tp) * 32


def plan_ranks(facts: ModelFacts, tp: int, ep: int) -> list[RankPlan]:
    """One `RankPlan` per rank. With expert parallelism the MoE is not TP-sliced (vLLM)."""
    if tp < 1 or ep < 1:
        raise InputError("--tp and --ep must be at least 1")
    if tp > 1 and ep > 1:
        raise InputError(
            "with expert parallelism vLLM flattens TP x DP into the EP group and does not TP-slice "
            "the experts: give the EP size alone (--ep N)"
        )
    E, I = facts.num_experts, facts.intermediate_size
    if ep > 1:
        return expert_parallel_plans(E, I, ep)
    plans = []
    if I % tp:
        raise InputError(f"--tp {tp} does not divide intermediate_size {I} (vLLM asserts this)")
    size = rank_slice_size(I, tp)
    for r in range(tp):
        start, end = r * size, min((r + 1) * size, I)
        if end <= start:
            raise InputError(
                f"--tp {tp} is too large for intermediate_size {I}: rank {r} would hold no rows (slices of {size})"
            )
        plans.append(RankPlan(r, tp, r, 1, 0, 0, E, start, end))
    return plans


def canonical_specs(num_experts: int, hp: int, ip: int) -> dict[str, tuple[DType, tuple[int, ...]]]:
    """dtype and shape of each canonical tensor for `num_experts` experts (docs/architecture.md, Formats)."""
    return {
        "w13_weight": (UINT8, (num_experts, 2 * ip, hp // 2)),
        "w13_weight_scale": (UINT8, (num_experts, 2 * ip, hp // 32)),
        "w13_bias": (BFLOAT16, (num_experts, 2 * ip)),
        "w2_weight": (UINT8, (num_experts, hp, ip // 2)),
        "w2_weight_scale": (UINT8, (num_experts, hp, ip // 32)),
        "w2_bias": (BFLOAT16, (num_experts, hp)),
    }


def load_canonical(
    ckpt: Checkpoint,
    layer: int,
    plan: RankPlan,
    hp: int,
    ip: int,
    experts: range | None = None,
    names: tuple[str, ...] = CANONICAL_NAMES,
    scale_fill: int = 0,
) -> dict[str, torch.Tensor]:
    """`load_canonical_bits` as torch tensors (the same memory)."""
    specs = canonical_specs(1, hp, ip)
    bits = load_canonical_bits(ckpt, layer, plan, hp, ip, experts, names, scale_fill)
    return {name: to_torch(array, specs[name][0]) for name, array in bits.items()}


def load_canonical_bits(
    ckpt: Checkpoint,
    layer: int,
    plan: RankPlan,
    hp: int,
    ip: int,
    experts: range | None = None,
    names: tuple[str, ...] = CANONICAL_NAMES,
    scale_fill: int = 0,
) -> dict[str, np.ndarray]:
    """Canonical tensors `names` of `layer` for the rank's experts `experts` (global ids; default
    all of the rank's), as numpy arrays of their bits (mxconvert/bits.py; no torch). Only the
    rank's rows / byte columns / experts are read from disk. Padding is zero, except the scales'
    (`w13_weight_scale`, `w2_weight_scale`), which hold `scale_fill`: the byte the runtime's own
    scale parameters are created with (the revision row's `mxfp4_scale_pad_fill`)."""
    import numpy as np

    facts = ckpt.facts
    H = facts.hidden_size
    if hp < H or ip < plan.i_end - plan.i_start:
        raise AssertionError("padded sizes smaller than the data")  # guarded by the planner
    experts = experts or range(plan.expert_start, plan.expert_end)
    e0, e1 = experts.start, experts.stop
    s, t = plan.i_start, plan.i_end
    n, rows = e1 - e0, 2 * (t - s)
    specs = canonical_specs(n, hp, ip)

    def read(tensor: str, key: tuple) -> np.ndarray:
        return ckpt.slice(expert_tensor_name(facts, layer, tensor)).bits(key)

    def source(name: str) -> np.ndarray | None:
        """The checkpoint's bytes of canonical tensor `name`, shaped as the leading corner of it
        that they fill (None: nothing is read, all padding)."""
        if name == "w13_weight":
            return read("gate_up_proj_blocks", (slice(e0, e1), slice(2 * s, 2 * t))).reshape(n, rows, H // 2)
        if name == "w13_weight_scale":
            return read("gate_up_proj_scales", (slice(e0, e1), slice(2 * s, 2 * t)))
        if name == "w13_bias":
            return read("gate_up_proj_bias", (slice(e0, e1), slice(2 * s, 2 * t)))
        if name == "w2_weight":
            blocks = read("down_proj_blocks", (slice(e0, e1), slice(None), slice(s // 32, t // 32)))
            return blocks.reshape(n, H, (t - s) // 2)
        if name == "w2_weight_scale":
            return read("down_proj_scales", (slice(e0, e1), slice(None), slice(s // 32, t // 32)))
        if name == "w2_bias":
            return None if plan.zero_down_bias else read("down_proj_bias", (slice(e0, e1),))
        raise KeyError(name)

    out: dict[str, np.ndarray] = {}
    for name in names:
        dtype, shape = specs[name]
        dtype_bits = np.dtype(bits_dtype(dtype))
        data = source(name)
        if data is not None and data.shape == shape and data.dtype == dtype_bits:
            out[name] = data  # no padding (e.g. gpt-oss on h100): the read buffer is the tensor
            continue
        dst = host_buffer(math.prod(shape) * dtype_bits.itemsize).view(dtype_bits).reshape(shape)
        fill = scale_fill if name in SCALE_NAMES else 0
        if data is None:
            dst.fill(fill)
        else:
            fill_outside(dst, data.shape, fill)  # a reused buffer (core/parallel.py host_buffer): set here
            dst[tuple(slice(0, d) for d in data.shape)] = data
        out[name] = dst
    return out


def fill_outside(dst: np.ndarray, corner: tuple[int, ...], fill: int) -> None:
    """Set every element of `dst` outside its leading corner `corner` (the padding) to `fill`,
    each once: along each axis, the part past the corner's end, within the corner on the axes
    before it. The corner itself is left for the data."""
    for axis, end in enumerate(corner):
        if end < dst.shape[axis]:
            dst[(*(slice(0, c) for c in corner[:axis]), slice(end, None))] = fill
