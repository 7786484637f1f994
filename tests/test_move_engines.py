"""The host's ways of running a layout's move give the same bytes: the strided copy (a move that is
one strided view, `Strided`), the word gather (moves of aligned 2/4/8-element blocks), the element
gather, the arrange function run by numpy on the data (`Positions`) and the arrange function
itself on torch (the portable path), forward and inverse, for every
tensor of every registered layout (the targets of test_device.py, plus every NVFP4 revision and
shapes that pad). The golden tests pin the bytes themselves; this pins that the choice of engine
never changes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import torch_specs
from test_device import CASES, NVFP4_BACKENDS
from test_layout_roundtrip import _bytes, _random

from mxconvert.core.bits import to_torch
from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.formats.registry import Geometry
from mxconvert.layouts import InverseError, nvfp4_layout
from mxconvert.layouts.engine.plans import gather_plan
from mxconvert.layouts.engine.strided import Strided, _strided_of
from mxconvert.target.revisions import REVISIONS, get_revision


def _nvfp4_padded_cases():
    """Every NVFP4 revision at the shapes of test_nvfp4.py that its backends accept (some pad)."""
    for revision_name in REVISIONS:
        try:
            revision = get_revision(revision_name, "nvfp4")
        except InputError:
            continue  # defines no NVFP4 layouts
        for backend in NVFP4_BACKENDS:
            for K, N in ((128, 96), (320, 64)):
                try:
                    layout = nvfp4_layout(backend, revision, K, N, 3)
                    specs = torch_specs(Geometry("nvfp4", K, N).specs(3))
                    for name, t in layout.tensors.items():
                        t.buffer_spec(specs[name][1], specs[name][0])
                except (UnsupportedError, ValueError):
                    continue  # a shape this backend refuses
                yield f"nvfp4-{revision_name}-{backend.value}-{K}x{N}", layout, specs


ALL_CASES = [*CASES, *_nvfp4_padded_cases()]


def _input(name, dtype, shape, seed):
    if dtype == torch.float8_e4m3fn:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 0x7F, shape, dtype=torch.uint8, generator=g).view(dtype)
    x = _random(shape, dtype, seed)
    return x.clamp(max=249) if name.endswith("scale") and dtype == torch.uint8 else x


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c[0])
def test_every_engine_gives_the_same_bytes_both_ways(case):
    _, layout, specs = case
    for name, t in layout.tensors.items():
        dtype, shape = specs[name]
        x = _input(name, dtype, shape, 13)
        meta = t.split.split(torch.empty(shape, dtype=dtype, device="meta"))
        plan = gather_plan(t, tuple(meta.shape[1:]))
        engines = ["gather", "torch", *(["strided"] if plan.strided is not None else [])]
        want = _bytes(t.forward(x, engine="torch"))
        for engine in ["auto", "arrange", *engines]:  # "arrange": the move run by numpy (Positions)
            got = t.forward(x, engine=engine)
            assert torch.equal(_bytes(got), want), (name, engine)
            assert got.is_contiguous(), (name, engine)
        buffer = t.forward(x)
        for engine in ["auto", *engines]:
            assert torch.equal(_bytes(t.inverse(buffer, shape, dtype, engine=engine)), _bytes(x)), (name, engine)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c[0])
def test_every_engine_refuses_wrong_padding(case):
    _, layout, specs = case
    for name, t in layout.tensors.items():
        dtype, shape = specs[name]
        meta = t.split.split(torch.empty(shape, dtype=dtype, device="meta"))
        plan = gather_plan(t, tuple(meta.shape[1:]))
        if not plan.pad.size:
            continue
        x = _input(name, dtype, shape, 5)
        elements = t.split.split(x)
        arranged = t.arrange(elements, t.pad_value).contiguous()
        flat = arranged.reshape(shape[0], -1).clone()
        flat[-1, int(plan.pad[-1])] = (t.pad_value + 0x41) & 0xFF if flat.dtype == torch.uint8 else 1
        buffer = t.codec.encode(flat.reshape(arranged.shape))
        for engine in ["auto", "gather", *(["strided"] if plan.strided is not None else [])]:
            with pytest.raises(InverseError, match=f"padding is not .*expert {shape[0] - 1}"):
                t.inverse(buffer, shape, dtype, engine=engine)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_eager_does_not_wait_for_a_plan_another_thread_is_building(case):
    """convert on a machine with cores to spare lays out with engine "eager" (layouts/base.py
    `ready_plan`, layouts/device.py `HostCompute.eager`): a chunk whose plan another thread holds
    runs the arrange function itself, and gives the same bytes. The plan's lock is held here by
    the test's thread; the forward runs on another, which would block on the lock if it waited
    (caught by the join's timeout, not a hang)."""
    import threading

    from mxconvert.core.bits import from_torch
    from mxconvert.core.dtypes import dtype_named
    from mxconvert.layouts.device import HostCompute
    from mxconvert.layouts.engine import plans as base

    _, layout, specs = case
    for name, t in layout.tensors.items():
        dtype, shape = specs[name]
        x = _input(name, dtype, shape, 7)
        want = _bytes(t.forward(x, engine="torch"))
        bits = from_torch(x)
        key = (t.arrange, tuple(t.split.split_bits(bits).shape[1:]))
        with base._PLAN_LOCKS_LOCK:
            lock = base._PLAN_LOCKS.setdefault(key, threading.Lock())
        got: list = []
        with lock:  # "another thread is building the plan"
            worker = threading.Thread(
                target=lambda t=t, bits=bits, dtype=dtype, got=got: got.append(
                    HostCompute(eager=True).forward(t, bits, dtype_named(dtype))
                )
            )
            worker.start()
            worker.join(timeout=60)
            assert not worker.is_alive(), f"{name}: forward waited for the plan being built"
        out_bits, out_dtype = got[0]
        assert torch.equal(_bytes(to_torch(out_bits, out_dtype)), want), name


def test_the_fast_engines_are_chosen_at_gpt_oss_size():
    """The engine choice the speed-ups rest on (bench/CHANGELOG.md, "Session 4"): whole-row moves
    and padding take the strided copy, the 128x4 scale swizzle gathers 4-byte words."""
    from mxconvert.formats.mxfp4.canonical import canonical_specs
    from mxconvert.layouts import resolve_layout
    from mxconvert.target.backends import Mxfp4Backend as B
    from mxconvert.target.profiles import get_profile

    revision = REVISIONS["vllm-0.33"]
    layout = resolve_layout(B.FLASHINFER_TRTLLM_MXFP4_BF16, revision, get_profile("b200"))
    hp, ip = revision.round_up(B.FLASHINFER_TRTLLM_MXFP4_BF16, "cuda", 2880, 2880)
    specs = canonical_specs(1, hp, ip)
    weight = gather_plan(layout.tensors["w13_weight"], specs["w13_weight"][1][1:])
    assert weight.engine == "strided" and weight.strided.forward is not None
    nv = nvfp4_layout(NVFP4_BACKENDS[0], get_revision("vllm-0.33", "nvfp4"), 2880, 2880, 1)
    scale_shape = Geometry("nvfp4", 2880, 2880).specs(1)["w13_weight_scale"][1]
    scale = gather_plan(nv.tensors["w13_weight_scale"], scale_shape[1:])
    assert scale.engine == "gather" and scale.unit == 4


def _strided_positions(shape, strides, offset):
    grids = np.meshgrid(*[np.arange(d) for d in shape], indexing="ij")
    return (offset + sum(g * s for g, s in zip(grids, strides))).reshape(-1)


@pytest.mark.parametrize(
    "shape, strides, offset",
    [
        ((6,), (1,), 0),
        ((4, 3), (1, 4), 0),
        ((2, 3, 5), (-15, 5, 1), 15),
        ((3, 2, 4, 2), (16, -1, 2, 8), 1),
        ((1,), (1,), 7),
    ],
)
def test_strided_of_recovers_every_strided_permutation(shape, strides, offset):
    index = _strided_positions(shape, strides, offset)
    found = _strided_of(index)
    assert found is not None
    flat = np.arange(index.max() + 1).reshape(1, -1)
    assert np.array_equal(found.view(flat).reshape(-1), index)


def test_strided_of_refuses_what_is_not_one_strided_view():
    assert _strided_of(np.array([0, 1, 2, 4, 3, 5])) is None
    assert _strided_of(np.array([0, 1, 2, 3, 4, 6])) is None
    assert _strided_of(np.array([], dtype=np.intp)) is None
    assert Strided((3,), (2,), 0).run == 1 and Strided((3,), (1,), 0).run == 3


def test_16_byte_words_copy_nan_patterns_bit_for_bit():
    """AITER's weight shuffle moves 16-byte runs, copied as complex128 words: every byte pattern
    (quiet and signalling NaN payloads included) must come through unchanged both ways."""
    from mxconvert.formats.mxfp4.canonical import canonical_specs
    from mxconvert.layouts import resolve_layout
    from mxconvert.target.backends import Mxfp4Backend as B
    from mxconvert.target.profiles import get_profile

    revision = REVISIONS["vllm-0.33"]
    t = resolve_layout(B.AITER_MXFP4_BF16, revision, get_profile("mi355x-aiter")).tensors["w2_weight"]
    dtype, shape = canonical_specs(2, 256, 256)["w2_weight"]
    plan = gather_plan(t, shape[1:])
    assert plan.engine == "strided"
    flat = np.zeros((2, plan.inverse.size), dtype=np.uint8)
    assert plan.strided.inverse.word_view(flat).dtype == np.complex128
    words = np.array([0x7FF0000000000001, 0x7FF8DEADBEEF0001, 0xFFF0000000000001, 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    x = torch.from_numpy(np.resize(words, 2 * plan.inverse.size // 8).view(np.uint8).reshape(shape))
    buffer = t.forward(x)
    assert torch.equal(_bytes(buffer), _bytes(t.forward(x, engine="gather")))
    assert torch.equal(_bytes(t.inverse(buffer, shape, dtype)), _bytes(x))


def test_a_strided_description_is_checked_against_its_index():
    """convert's forward and verify's inverse both copy through the strided description, so it is
    checked against the plan's index at every shape a plan is built for (an error would round-trip)."""
    from mxconvert.layouts.engine.strided import _check_describes

    _check_describes(Strided((2, 3), (3, 1), 0), np.arange(6))
    _check_describes(Strided((3, 2), (1, 3), 0), np.array([0, 3, 1, 4, 2, 5]))
    with pytest.raises(AssertionError, match="does not reproduce"):
        _check_describes(Strided((2, 3), (3, 1), 0), np.array([0, 1, 2, 4, 3, 5]))


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c[0])
def test_padding_filled_and_read_the_same_with_and_without_its_strided_description(case):
    """`GatherPlan.pad_strided` (the padding as one strided view, used by every engine to fill
    and check the padding) names exactly the plan's padding positions, and filling / reading
    through it gives what the padding index gives (the per-expert fancy-index fallback)."""
    from dataclasses import replace

    from mxconvert.layouts.engine.moves import _fill_pad, _pad_values

    _, layout, specs = case
    for name, t in layout.tensors.items():
        dtype, shape = specs[name]
        meta = t.split.split(torch.empty(shape, dtype=dtype, device="meta"))
        plan = gather_plan(t, tuple(meta.shape[1:]))
        if plan.pad_strided is None:
            continue
        positions = np.arange(plan.forward.size)[None]
        assert np.array_equal(plan.pad_strided.view(positions).reshape(-1), plan.pad), name
        plain = replace(plan, strided=None, pad_strided=None)
        x = np.random.default_rng(3).integers(0, 256, (3, plan.forward.size), dtype=np.uint8)
        a, b = x.copy(), x.copy()
        _fill_pad(a, plan, 0x7F)
        _fill_pad(b, plain, 0x7F)
        assert np.array_equal(a, b), name
        assert np.array_equal(_pad_values(x, plan).reshape(3, -1), _pad_values(x, plain)), name


def test_padded_scale_swizzles_fill_their_padding_strided_at_gpt_oss_size():
    """What the scale speed-up of session 5 rests on: the NVFP4 128x4 scale swizzle that pads K
    (TRTLLM, hidden padded to 3072) gathers words but fills its padding through a strided view."""
    revision = get_revision("vllm-0.33", "nvfp4")
    nv = nvfp4_layout(NVFP4_BACKENDS[0], revision, 2880, 2880, 1)
    shape = Geometry("nvfp4", 2880, 2880).specs(1)["w13_weight_scale"][1]
    plan = gather_plan(nv.tensors["w13_weight_scale"], shape[1:])
    assert plan.engine == "gather" and plan.pad.size and plan.pad_strided is not None
