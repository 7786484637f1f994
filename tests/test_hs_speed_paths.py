"""The host's fused paths (issue 24, convert and verify faster on the CPU) give the bytes of the
general paths: the Hopper value layout fused with its PACK (layouts/hopper_host.py) against the
gather plan and against the portable torch path, forward and inverse, on edge shapes (no
padding, padded columns, padded rows, one expert, odd expert counts), and its padding check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mxconvert.core.dtypes import DType
from mxconvert.layouts.engine import plans
from mxconvert.layouts.errors import PaddingError
from mxconvert.layouts.triton import TritonChoice, triton_tensors

U8 = DType("uint8")
GENERATIONS = ("3.5.1", "3.6.0")  # pads (N, Kb) to (16, 32) and to (64, 64)
SHAPES = [
    (1, 16, 32),  # no padding in either generation's smallest unit
    (3, 64, 64),  # no padding at all
    (2, 5760 // 8, 1440 // 8),  # gpt-oss's proportions, padded columns for 3.6.0
    (5, 40, 50),  # padded rows and columns
    (1, 17, 3),  # one row and columns past a unit
    (7, 2880 // 16, 1440 // 16),  # an odd expert count
]


def _value(generation: str):
    choice = TritonChoice("HopperMXValueLayout", "HopperMXScaleLayout", False, 8, generation, 0)
    layout = triton_tensors(choice)[0]
    assert layout.name == "w13_weight" and layout.host is not None
    return layout


def _bytes(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_hopper_value_forward_equals_the_gather_and_the_torch_path(generation, shape):
    layout = _value(generation)
    x = _bytes(shape)
    fused, fused_dtype = layout.forward_bits(x, U8, "auto")
    gathered, gathered_dtype = layout.forward_bits(x, U8, "gather")
    portable = layout.forward(torch.from_numpy(x.copy()), "torch").numpy()
    assert fused_dtype == gathered_dtype
    assert fused.shape == gathered.shape == portable.shape
    assert np.array_equal(fused, gathered)
    assert np.array_equal(fused, portable)
    assert layout.buffer_spec(shape, U8)[1] == fused.shape


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_hopper_value_inverse_equals_the_gather_inverse(generation, shape):
    layout = _value(generation)
    x = _bytes(shape, seed=1)
    buffer, _ = layout.forward_bits(x, U8, "gather")
    fused = layout.inverse_bits(buffer, shape, U8, "auto")
    gathered = layout.inverse_bits(buffer, shape, U8, "gather")
    assert fused.shape == gathered.shape == shape
    assert np.array_equal(fused, x)
    assert np.array_equal(gathered, x)


def test_fused_hopper_value_eager_engine_runs_the_fused_path():
    layout = _value("3.5.1")
    x = _bytes((2, 32, 64), seed=2)
    assert np.array_equal(layout.forward_bits(x, U8, "eager")[0], layout.forward_bits(x, U8, "gather")[0])


@pytest.mark.parametrize(("shape", "where"), [((4, 64, 50), "columns"), ((3, 24, 64), "rows")])
def test_fused_hopper_value_inverse_refuses_wrong_padding_naming_the_first_expert(shape, where):
    layout = _value("3.6.0")
    x = _bytes(shape, seed=3)
    buffer, _ = layout.forward_bits(x, U8, "gather")
    e, n, kb = shape
    np_, kbp = layout.host.padded(n, kb)
    assert (np_ != n) if where == "rows" else (kbp != kb)
    # unpack, plant a non-zero padding byte in expert 2 (and 3), pack again with the torch codec
    arranged = layout.codec.decode(torch.from_numpy(buffer.copy()), torch.uint8).numpy().copy()
    per_expert = arranged.reshape(e, -1)
    pad_positions = plans.gather_plan(layout, shape[1:]).pad  # the general path's padding
    assert pad_positions.size
    for expert in range(2, e):
        per_expert[expert, pad_positions[-1]] = 0x11
    planted = layout.codec.encode(torch.from_numpy(arranged), True).numpy()
    for engine in ("auto", "gather"):
        with pytest.raises(PaddingError, match=r"w13_weight: padding is not zero \(first in expert 2\)"):
            layout.inverse_bits(planted, shape, U8, engine)


def test_a_fused_layout_needs_no_plan_and_prepare_all_builds_none():
    layout = _value("3.5.1")
    assert not layout.needs_plan
    before = plans._gather_plan.cache_info().currsize
    plans.prepare_all({"w13_weight": layout}, {"w13_weight": (U8, (4, 48, 96))}, jobs=1)
    assert plans._gather_plan.cache_info().currsize == before
    others = triton_tensors(TritonChoice("HopperMXValueLayout", "HopperMXScaleLayout", False, 8, "3.5.1", 0))
    assert [t.name for t in others if t.needs_plan] == [
        "w13_weight_scale",
        "w13_bias",
        "w2_weight_scale",
        "w2_bias",
    ]


# ---- whole-row moves without a plan (layouts/row_host.py) ----------------------------------------
def _row_moves():
    from mxconvert.layouts.trtllm import TRTLLM_TENSORS

    strided = triton_tensors(TritonChoice("StridedLayout", "StridedLayout", False, 8, "3.5.1", 0))[0]
    trtllm = [t for t in TRTLLM_TENSORS if t.name in ("w13_weight", "w2_weight")]
    return [*trtllm, strided]


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("shape", [(1, 32, 16), (3, 64, 1), (5, 96, 7), (2, 5888 // 8, 1536 // 8)])
def test_row_moves_equal_the_plan_forward_and_inverse(index, shape):
    layout = _row_moves()[index]
    assert layout.host is not None and not layout.needs_plan
    x = _bytes(shape, seed=4)
    fused, fused_dtype = layout.forward_bits(x, U8, "auto")
    strided = plans.gather_plan(layout, shape[1:]).strided is not None  # not for rows of a few bytes
    for engine in ("gather", "strided") if strided else ("gather",):
        general, general_dtype = layout.forward_bits(x, U8, engine)
        assert fused_dtype == general_dtype and np.array_equal(fused, general)
    assert np.array_equal(fused, layout.forward(torch.from_numpy(x.copy()), "torch").numpy())
    assert np.array_equal(layout.inverse_bits(fused, shape, U8, "auto"), x)
    assert np.array_equal(layout.inverse_bits(fused, shape, U8, "gather"), x)


def test_row_moves_move_rows_and_refuse_a_move_that_pads():
    from mxconvert.layouts.primitives import identity, swap_pairs
    from mxconvert.layouts.row_host import RowMove

    x = np.arange(4 * 3, dtype=np.uint8).reshape(1, 4, 3)
    assert np.array_equal(RowMove(swap_pairs).forward(x, 0)[0, :, 0], [3, 0, 9, 6])
    assert RowMove(identity).forward(x, 0) is x

    def pad_rows(t, fill):
        from mxconvert.layouts.base import pad_dims

        return pad_dims(t, {1: t.shape[1] + 1}, fill)

    with pytest.raises(AssertionError, match="permutation of the rows"):
        RowMove(pad_rows).forward(x, 0)
