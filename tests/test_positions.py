"""Plans without torch (issue 11, target 1): the gather plan of every registered layout's move,
built on numpy `Positions` (layouts/positions.py), equals the plan the same move gives when run
on a torch `arange` (the way plans were built before; the reference builder is below), refusals
included; the Hopper fp4 pack tables built with numpy equal those the torch codec gives over all
65536 values; and building plans and tables leaves torch unimported."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import ROOT
from test_layout_shapes import _move_key, _outcome, _targets

from mxconvert.layouts.base import pad_dims
from mxconvert.layouts.engine.plans import _gather_plan
from mxconvert.layouts.engine.positions import Positions
from mxconvert.layouts.engine.shapes import ShapeOnly
from mxconvert.layouts.triton import HOPPER_PACK, _pack_tables


def _torch_plan(arrange, expert_shape: tuple[int, ...]) -> tuple:
    """The reference: the move run on a torch `arange` of one expert (fill -1), and the forward,
    inverse and padding indices and arranged shape read from the result."""
    n = math.prod(expert_shape)
    dtype = torch.int32 if n < 2**31 else torch.int64
    arranged = arrange(torch.arange(n, dtype=dtype).reshape(1, *expert_shape), -1)
    index = arranged.reshape(-1).numpy().astype(np.intp)
    is_pad = index < 0
    inverse = np.full(n, -1, dtype=np.intp)
    inverse[index[~is_pad]] = np.nonzero(~is_pad)[0]
    return np.where(is_pad, n, index), inverse, np.nonzero(is_pad)[0], tuple(arranged.shape[1:])


def _positions_plan(arrange, expert_shape: tuple[int, ...]) -> tuple:
    plan = _gather_plan.__wrapped__(arrange, expert_shape)  # built now, not read from the cache
    return plan.forward, plan.inverse, plan.pad, plan.arranged_shape


def _same_plan(a: tuple, b: tuple) -> bool:
    if a[0] != "ok" or b[0] != "ok":
        return a == b
    (f1, i1, p1, s1), (f2, i2, p2, s2) = a[1], b[1]
    return s1 == s2 and all(np.array_equal(x, y) for x, y in ((f1, f2), (i1, i2), (p1, p2)))


def test_positions_plan_equals_torch_plan_for_every_registered_layout():
    seen: set = set()
    compared = refused = 0
    for label, layout, specs in _targets():
        for name, tensor in layout.tensors.items():
            dtype, shape = specs[name]
            element_shape = tensor.split.split_shape(tuple(shape))[1:]
            key = (_move_key(tensor.arrange), element_shape)
            if key in seen:
                continue
            seen.add(key)
            ours = _outcome(_positions_plan, tensor.arrange, element_shape)
            reference = _outcome(_torch_plan, tensor.arrange, element_shape)
            assert _same_plan(ours, reference), f"{label} {name}: Positions {ours[0]} != torch {reference[0]}"
            compared += 1
            refused += ours[0] != "ok"
    print(f"compared {compared} distinct (move, shape) plans, {refused} refused by both")
    assert compared > 50, compared


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.reshape(3, -1),
        lambda t: t.reshape(-1),
        lambda t: t.view(12, 5),
        lambda t: t.permute(2, 0, 1),
        lambda t: t.permute((1, 2, 0)),
        lambda t: t.transpose(0, -1),
        lambda t: t.mT,
        lambda t: t.flip(1),
        lambda t: t.flip((0, 2)),
        lambda t: t.flip(-1),
        lambda t: t.flatten(1),
        lambda t: t.flatten(-2),
        lambda t: t.flatten(),
        lambda t: t.unflatten(-1, (2, -1)),
        lambda t: t.contiguous(),
        lambda t: t.clone(),
        lambda t: t.mT.reshape(6, 10).flip(0).transpose(0, 1).contiguous().reshape(2, 3, 10),
        lambda t: pad_dims(t.permute(0, 2, 1), {1: 12, 2: 7}, -1).reshape(6, -1),
        lambda t: t.reshape(5, -1),
        lambda t: t.reshape(7, 7),
        lambda t: t.permute(0, 1),
        lambda t: t.permute(0, 0, 1),
        lambda t: t.flip(3),
        lambda t: t.unflatten(1, (3, -1)),
    ],
)
def test_positions_ops_give_torchs_elements_and_refusals(op):
    """Each op (and a chain of them) gives the elements torch gives, in torch's order; an op
    torch refuses is refused with torch's exception type and `ShapeOnly`'s message (the shape
    arithmetic is ShapeOnly's; its messages are torch's but for unflatten's)."""
    real = torch.arange(6 * 4 * 10, dtype=torch.int32).reshape(6, 4, 10)
    ours = _outcome(lambda: op(Positions(real.numpy().copy())))
    reference = _outcome(lambda: op(real))
    assert ours[0] == reference[0], (ours, reference)
    if ours[0] != "ok":
        assert ours == _outcome(lambda: op(ShapeOnly(real.shape)))
        return
    assert ours[1].shape == tuple(reference[1].shape)
    assert np.array_equal(ours[1].flat(), reference[1].reshape(-1).numpy())


def test_a_move_torch_refuses_is_refused_the_same_way_when_planned():
    def move(x, fill):
        e, n, k = x.shape
        return x.reshape(e, n // 3, 3, k).permute(0, 2, 1, 3)

    ours = _outcome(_positions_plan, move, (8, 4))
    assert ours == _outcome(_torch_plan, move, (8, 4)) and ours[0] == "RuntimeError"
    assert _same_plan(_outcome(_positions_plan, move, (9, 4)), _outcome(_torch_plan, move, (9, 4)))


def test_numpy_pack_tables_equal_the_torch_codec_over_every_16_bit_value():
    v = torch.arange(65536, dtype=torch.int32)
    lo, hi = (v & 0xFF).to(torch.uint8), (v >> 8).to(torch.uint8)
    zero = torch.zeros_like(lo)
    first = torch.stack((lo, hi, zero, zero), -1).reshape(1, -1)
    second = torch.stack((zero, zero, lo, hi), -1).reshape(1, -1)
    reference = (
        HOPPER_PACK._encode_torch(first),
        HOPPER_PACK._encode_torch(second),
        HOPPER_PACK._decode_torch(first),
        HOPPER_PACK._decode_torch(second),
    )
    tables = _pack_tables()
    for table, ref in zip(tables, reference):
        assert table.dtype == np.uint32 and table.shape == (65536,)
        assert np.array_equal(table, ref.numpy().view(np.uint32).reshape(-1))
    t01, t23, u_lo, u_hi = tables
    words = t01[np.arange(65536)] | t23[np.arange(65536)[::-1]]  # a bijection: no collisions in a sample
    assert np.unique(words).size == 65536
    assert np.array_equal(
        u_lo[words & 0xFFFF] | u_hi[words >> 16],
        np.arange(65536, dtype=np.uint32) | (np.arange(65536, dtype=np.uint32)[::-1] << 16),
    )


def test_plans_and_pack_tables_are_built_without_importing_torch():
    """What convert's host path does before its first chunk (`prepare_all` of a layer's layouts,
    the Hopper tables) imports numpy, never torch."""
    code = """
import sys
from mxconvert.pipeline.plan import make_plan
from mxconvert.formats.registry import open_model
from mxconvert.layouts.engine.plans import gather_plan, prepare_all
from mxconvert.layouts.triton import _pack_tables
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision
from mxconvert.selection import Deployment
planned = 0
for profile in ("h100", "b200", "mi355x"):
    plan = make_plan(open_model("examples/tiny-gpt-oss"), get_profile(profile), get_revision(None), Deployment(tp=1))
    specs = plan.geometry.specs(plan.ranks[0].num_experts)
    prepare_all(plan.layout.tensors, specs, jobs=2)
    for name, tensor in plan.layout.tensors.items():
        gather_plan(tensor, tensor.split.split_shape(tuple(specs[name][1]))[1:])
        planned += 1
_pack_tables()
assert "numpy" in sys.modules
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print(planned)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) >= 9


def _duplicate_first(x, fill):
    a = x.array.copy()
    a[..., 1] = a[..., 0]  # n positions in range, one twice and one missing
    return Positions(a)


@pytest.mark.parametrize(
    "move",
    [
        _duplicate_first,
        lambda x, fill: pad_dims(_duplicate_first(x, fill), {2: 7}, fill),  # the same, with padding
        lambda x, fill: Positions(x.array[..., 1:]),  # an element dropped
        lambda x, fill: pad_dims(Positions(x.array[..., 1:]), {2: 5}, fill),  # dropped, padded back to size
        lambda x, fill: Positions(x.array + 1),  # a position out of range
    ],
    ids=["duplicate", "duplicate-padded", "dropped", "dropped-padded", "out-of-range"],
)
def test_a_move_that_is_not_a_permutation_plus_padding_is_refused(move):
    with pytest.raises(AssertionError, match="not a permutation"):
        _gather_plan.__wrapped__(move, (3, 5))
