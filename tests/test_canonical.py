"""Checkpoint → canonical tensors: TP/EP slicing and tail padding, as vLLM 0.33.0
vllm/model_executor/models/gpt_oss.py loads them.

The expected tensors are built here the way vLLM's loader does it, literally from gpt_oss.py's slicing
(`.view` of the blocks, the rank's slice, `param[:, :d1, :d2].copy_(w)` into zeros), and compared
with mxconvert's chunked, lazily-read implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures_ckpt import load_example_module, make_checkpoint

from mxconvert.core.errors import InputError
from mxconvert.core.parallel import host_buffer, reused_buffers
from mxconvert.formats.mxfp4.canonical import (
    canonical_specs,
    fill_outside,
    load_canonical,
    plan_ranks,
    rank_slice_size,
)
from mxconvert.formats.mxfp4.checkpoint import open_checkpoint


@pytest.mark.parametrize("tp, expected", [(1, 2880), (2, 1440), (4, 736), (8, 384)])
def test_rank_slice_size_matches_the_spec_examples(tp, expected):
    assert rank_slice_size(2880, tp) == expected


def test_tp4_of_2880_leaves_the_last_rank_short():
    from mxconvert.formats.mxfp4.checkpoint import ModelFacts

    facts = ModelFacts("gpt_oss", "mxfp4", 1, 4, 4, 2880, 2880, 7.0, "hf")
    plans = plan_ranks(facts, 4, 1)
    assert [(p.i_start, p.i_end) for p in plans] == [(0, 736), (736, 1472), (1472, 2208), (2208, 2880)]
    plans8 = plan_ranks(facts, 8, 1)
    assert plans8[-1].i_end - plans8[-1].i_start == 192


def _vllm_reference(ckpt, layer, tp, tp_rank, ep, ep_rank, hp, ip):
    """vLLM 0.33.0 gpt_oss.py's slicing and padding, written out literally."""
    f = ckpt.facts
    E, I = f.num_experts, f.intermediate_size

    def name(t):
        return f"model.layers.{layer}.mlp.experts.{t}"

    gu_b = ckpt.tensor(name("gate_up_proj_blocks")).view(E, 2 * I, -1)
    gu_s = ckpt.tensor(name("gate_up_proj_scales"))
    gu_bias = ckpt.tensor(name("gate_up_proj_bias"))
    dn_b = ckpt.tensor(name("down_proj_blocks")).view(E, -1, I // 2)
    dn_s = ckpt.tensor(name("down_proj_scales"))
    dn_bias = ckpt.tensor(name("down_proj_bias")).clone()
    if ep > 1:
        e0, e1 = ep_rank * E // ep, (ep_rank + 1) * E // ep
        w = [gu_b[e0:e1], gu_s[e0:e1], gu_bias[e0:e1], dn_b[e0:e1], dn_s[e0:e1], dn_bias[e0:e1]]
    else:
        size = -(-(I // 32) // tp) * 32
        s, t = tp_rank * size, min((tp_rank + 1) * size, I)
        if tp_rank != 0:
            dn_bias.zero_()
        w = [
            gu_b[:, 2 * s : 2 * t, :],
            gu_s[:, 2 * s : 2 * t, :],
            gu_bias[:, 2 * s : 2 * t],
            dn_b[..., s // 2 : t // 2],
            dn_s[..., s // 32 : t // 32],
            dn_bias,
        ]
    n = w[0].shape[0]
    params = {
        "w13_weight": torch.zeros(n, 2 * ip, hp // 2, dtype=torch.uint8),
        "w13_weight_scale": torch.zeros(n, 2 * ip, hp // 32, dtype=torch.uint8),
        "w13_bias": torch.zeros(n, 2 * ip, dtype=torch.bfloat16),
        "w2_weight": torch.zeros(n, hp, ip // 2, dtype=torch.uint8),
        "w2_weight_scale": torch.zeros(n, hp, ip // 32, dtype=torch.uint8),
        "w2_bias": torch.zeros(n, hp, dtype=torch.bfloat16),
    }
    for param, src in zip(params.values(), w):
        if src.dim() == 3:
            param[:, : src.shape[1], : src.shape[2]].copy_(src)
        else:
            param[:, : src.shape[1]].copy_(src)
    return params


@pytest.mark.parametrize(
    "tp, ep, hp, ip", [(1, 1, 512, 384), (2, 1, 512, 256), (4, 1, 320, 128), (1, 2, 512, 512), (1, 4, 320, 320)]
)
def test_canonical_tensors_match_the_vllm_loader(tmp_path, tp, ep, hp, ip):
    ckpt = open_checkpoint(str(make_checkpoint(tmp_path, num_experts=4, hidden_size=320, intermediate_size=320)))
    for plan in plan_ranks(ckpt.facts, tp, ep):
        for layer in range(ckpt.facts.num_layers):
            expected = _vllm_reference(ckpt, layer, plan.tp_size, plan.tp_rank, plan.ep_size, plan.ep_rank, hp, ip)
            whole = load_canonical(ckpt, layer, plan, hp, ip)
            # the same, assembled one expert at a time (how convert streams)
            chunks = [
                load_canonical(ckpt, layer, plan, hp, ip, range(e, e + 1))
                for e in range(plan.expert_start, plan.expert_end)
            ]
            for key, value in expected.items():
                assert torch.equal(whole[key], value), (plan, layer, key)
                assert torch.equal(torch.cat([c[key] for c in chunks]), value), (plan, layer, key)


def test_canonical_dequantizes_to_the_source_weights_of_the_rank(tmp_path):
    """Across TP ranks the canonical tensors hold exactly the source values (padding decodes to 0)."""
    mod = load_example_module()
    ckpt = open_checkpoint(str(make_checkpoint(tmp_path)))
    f = ckpt.facts
    full = mod.dequantize_mxfp4(
        ckpt.tensor("model.layers.0.mlp.experts.down_proj_blocks"),
        ckpt.tensor("model.layers.0.mlp.experts.down_proj_scales"),
    )
    pieces = []
    for plan in plan_ranks(f, 2, 1):
        c = load_canonical(ckpt, 0, plan, 512, 256)
        deq = mod.dequantize_mxfp4(c["w2_weight"].view(4, 512, -1, 16), c["w2_weight_scale"])
        width = plan.i_end - plan.i_start
        assert torch.count_nonzero(deq[:, 320:, :]) == 0 and torch.count_nonzero(deq[:, :, width:]) == 0
        pieces.append(deq[:, :320, :width])
    assert torch.equal(torch.cat(pieces, dim=2), full)


@pytest.mark.parametrize(
    "tp, ep, message",
    [
        (3, 1, "does not divide intermediate_size"),
        (1, 3, "does not divide the 4 experts"),
        (2, 2, "give the EP size alone"),
        (16, 1, "too large"),
    ],
)
def test_impossible_parallel_setups_are_refused(tp, ep, message):
    from mxconvert.formats.mxfp4.checkpoint import ModelFacts

    facts = ModelFacts("gpt_oss", "mxfp4", 1, 4, 4, 320, 320, 7.0, "hf")
    with pytest.raises(InputError, match=message):
        plan_ranks(facts, tp, ep)


@pytest.mark.parametrize(
    "shape, corner",
    [((3, 5, 7), (3, 2, 4)), ((3, 5, 7), (1, 5, 7)), ((2, 4), (2, 1)), ((4, 6, 8), (4, 6, 8)), ((2, 3, 4), (2, 3, 0))],
)
def test_fill_outside_sets_the_padding_and_nothing_else(shape, corner):
    dst = np.full(shape, 0xAB, dtype=np.uint8)
    fill_outside(dst, corner, 7)
    expected = np.full(shape, 7, dtype=np.uint8)
    expected[tuple(slice(0, c) for c in corner)] = 0xAB
    assert np.array_equal(dst, expected)


@pytest.mark.parametrize("hp, ip", [(512, 384), (320, 320)])
def test_reused_dirty_buffers_leave_no_stale_bytes_in_the_padding(tmp_path, hp, ip):
    """Inside a conversion the canonical tensors come from a pool of reused buffers: padding must be
    set every time (scales to the row's fill byte, the rest to zero), not left from a chunk before."""
    ckpt = open_checkpoint(str(make_checkpoint(tmp_path, num_experts=4, hidden_size=320, intermediate_size=320)))
    (plan,) = plan_ranks(ckpt.facts, 1, 1)
    expected = _vllm_reference(ckpt, 0, 1, 0, 1, 0, hp, ip)
    for name in ("w13_weight_scale", "w2_weight_scale"):  # scale padding holds the fill byte
        pad = expected[name].clone().fill_(0x7F)
        corner = expected[name][:, : 2 * 320 if name == "w13_weight_scale" else 320, : 320 // 32]
        pad[:, : corner.shape[1], : corner.shape[2]] = corner
        expected[name] = pad
    with reused_buffers(64 << 20):
        for _, shape in canonical_specs(4, hp, ip).values():
            for _ in range(2):
                dirty = [host_buffer(int(np.prod(shape)) * 2) for _ in range(3)] + [host_buffer(int(np.prod(shape)))]
                for buffer in dirty:
                    buffer.fill(0xAB)
                del dirty
        got = load_canonical(ckpt, 0, plan, hp, ip, scale_fill=0x7F)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
