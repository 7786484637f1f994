"""Every layout step has an exact inverse: inverse(forward(x)) == x bit for bit, on random inputs
of many legal shapes (docs/architecture.md, "Layouts": every move has an exact inverse). Golden tests
against the reference libraries are in test_golden_mxfp4.py; these tests cover shapes the goldens do not."""

from __future__ import annotations

import pytest
import torch
from helpers import torch_specs
from hypothesis import given, settings
from hypothesis import strategies as st

from mxconvert.core.dtypes import dtype_named
from mxconvert.formats.mxfp4.canonical import canonical_specs
from mxconvert.layouts import InverseError, resolve_layout
from mxconvert.layouts.triton import HOPPER_PACK
from mxconvert.target.backends import Mxfp4Backend as B
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import REVISIONS

TARGETS = [
    (B.FLASHINFER_TRTLLM_MXFP4_BF16, "b200", "vllm-0.33"),
    (B.FLASHINFER_TRTLLM_MXFP4_MXFP8, "b300", "vllm-0.20"),
    (B.TRITON, "h100", "vllm-0.33"),
    (B.TRITON, "h100", "vllm-0.20"),
    (B.TRITON, "b200", "vllm-0.33"),
    (B.TRITON, "b200", "vllm-0.20"),
    (B.TRITON, "mi355x", "vllm-0.33"),
    (B.TRITON, "mi355x", "vllm-0.20"),
    (B.TRITON, "mi300x", "vllm-0.33"),
    (B.XPU, "intel-xpu", "vllm-0.33"),
    (B.FLASHINFER_CUTLASS_MXFP4_BF16, "h100", "vllm-0.33"),
    (B.FLASHINFER_CUTLASS_MXFP4_BF16, "h100", "vllm-0.20"),
    (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "b200", "vllm-0.33"),
    (B.MARLIN, "a100", "vllm-0.33"),
    (B.BATCHED_MARLIN, "l40s", "vllm-0.20"),
    (B.AITER_MXFP4_BF16, "mi355x-aiter", "vllm-0.33"),
    (B.AITER_TRITON_MXFP4_BF16, "mi300x-aiter", "vllm-0.33"),
    (B.EMULATION, "h100", "vllm-0.33"),
]


def _random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    return torch.randn(shape, generator=g).to(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@settings(max_examples=60, deadline=None)
@given(
    target=st.sampled_from(TARGETS),
    experts=st.integers(1, 3),
    hidden_blocks=st.integers(1, 12),
    inter_blocks=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    marlin=st.sampled_from([None, "fp8"]),
)
def test_inverse_of_forward_is_identity(target, experts, hidden_blocks, inter_blocks, seed, marlin):
    backend, profile_name, revision_name = target
    profile, revision = get_profile(profile_name), REVISIONS[revision_name]
    layout = resolve_layout(backend, revision, profile, marlin_input_dtype=marlin)
    hp, ip = revision.round_up(backend, profile.platform, 32 * hidden_blocks, 32 * inter_blocks)
    for name, (dtype, shape) in torch_specs(canonical_specs(experts, hp, ip)).items():
        x = _random(shape, dtype, seed)
        if marlin == "fp8" and name.endswith("scale"):
            x = x.clamp(max=249)  # vLLM asserts this for fp8-activation Marlin scales
        tensor_layout = layout.tensors[name]
        buffer = tensor_layout.forward(x)
        assert buffer.is_contiguous()
        assert (dtype_named(buffer.dtype), tuple(buffer.shape)) == tensor_layout.buffer_spec(shape, dtype)
        back = tensor_layout.inverse(buffer, shape, dtype)
        assert torch.equal(_bytes(back), _bytes(x)), name


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0].value}-{t[1]}-{t[2]}")
def test_wrong_padding_is_rejected_by_the_inverse(target):
    """Plant a wrong byte into the first padding position of each padded tensor (found through the
    layout's gather index): the inverse must refuse it."""
    from mxconvert.layouts.engine.plans import expert_index

    backend, profile_name, revision_name = target
    profile, revision = get_profile(profile_name), REVISIONS[revision_name]
    layout = resolve_layout(backend, revision, profile)
    hp, ip = revision.round_up(backend, profile.platform, 96, 96)
    checked = 0
    for name, (dtype, shape) in torch_specs(canonical_specs(2, hp, ip)).items():
        t = layout.tensors[name]
        x = _random(shape, dtype, 1)
        elements = t.split.split(x)
        index = expert_index(t, tuple(elements.shape[1:]))
        if not bool((index < 0).any()):
            continue  # this layout adds no padding to this tensor
        pad_pos = int(torch.nonzero(index < 0)[0])
        arranged = t.arrange(elements, t.pad_value).contiguous().reshape(2, -1).clone()
        arranged[1, pad_pos] = (t.pad_value + 0x41) & 0xFF if arranged.dtype == torch.uint8 else 1
        buffer = t.codec.encode(arranged.reshape(t.arrange(elements, t.pad_value).shape))
        with pytest.raises(InverseError, match="padding is not"):
            t.inverse(buffer, shape, dtype)
        checked += 1
    if backend == B.TRITON and profile_name == "h100":
        assert checked > 0  # Hopper layouts always pad these shapes


def test_hopper_pack_is_a_bijection_on_all_32_bit_patterns_of_each_lane():
    # Every byte pair (b0,b1) combined with every (b2,b3) pattern class: decode(encode(x)) == x.
    values = torch.arange(65536, dtype=torch.int32)
    x = torch.stack([values & 0xFF, values >> 8, (values * 7) & 0xFF, (values * 13 >> 8) & 0xFF], -1)
    x = x.to(torch.uint8).reshape(1, -1)
    y = HOPPER_PACK.encode(x)
    assert torch.equal(HOPPER_PACK.decode(y, torch.uint8), x)
    assert len(torch.unique(y.view(torch.int32))) == 65536
    assert int(HOPPER_PACK.encode(torch.zeros(1, 8, dtype=torch.uint8)).sum()) == 0


def test_widening_cast_inverse_refuses_values_bf16_cannot_hold():
    layout = resolve_layout(B.TRITON, REVISIONS["vllm-0.33"], get_profile("h100"))
    bias = layout.tensors["w13_bias"]
    x = _random((1, 128), torch.bfloat16, 3)
    y = bias.forward(x)
    assert y.dtype == torch.float32
    y[0, 5] = 1.0 + 2**-20  # not representable in bf16
    with pytest.raises(InverseError):
        bias.inverse(y, (1, 128), torch.bfloat16)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0].value}-{t[1]}-{t[2]}")
def test_gather_engine_and_arrange_engine_give_the_same_bytes(target):
    """The CPU fast path (one cached gather) and the literal reshape/permute path (used on CUDA)
    must agree bit for bit."""
    backend, profile_name, revision_name = target
    profile, revision = get_profile(profile_name), REVISIONS[revision_name]
    for marlin in [None, "fp8"] if backend in (B.MARLIN, B.BATCHED_MARLIN) else [None]:
        layout = resolve_layout(backend, revision, profile, marlin_input_dtype=marlin)
        hp, ip = revision.round_up(backend, profile.platform, 160, 96)
        for name, (dtype, shape) in torch_specs(canonical_specs(2, hp, ip)).items():
            x = _random(shape, dtype, 7)
            if name.endswith("scale"):
                x = x.clamp(max=249)
            t = layout.tensors[name]
            assert torch.equal(_bytes(t.forward(x, engine="gather")), _bytes(t.forward(x, engine="torch"))), name
