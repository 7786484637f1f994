"""SGLang 0.5.23's GPT-OSS MXFP4 TRITON (`triton_kernel`) bytes on SM90 against mxconvert's layouts,
and why the row still refuses TRITON (docs/sglang.md, "triton_kernels").

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` (its
triton_kernels branch, `_swizzle_mxfp4`, `_pad_hopper_mxfp4_scale`) run on CPU with the triton_kernels
of `tokenspeed-triton-kernels 1.0.0.post20260510`, the one package-index copy with the API SGLang
calls (tools/golden/sglang_mxfp4_triton.py, stand-ins named there). They show:

* the weights are mxconvert's triton_kernels 3.6.0 Hopper value layout (pad N, Kb to 64; the
  permutation; the fp4 bit packing) of the canonical tensors SGLang pads (I -> 64), bit for bit;
* the scales are vLLM 0.33's SM90 scale-group padding (to a multiple of 4 groups, which is
  `round_up(K, 128) / 32`) then the Hopper scale layout (rows padded to 256, num_warps 8), but with
  two padding values in one tensor: SGLang's groups 0x7F (`_UE8M0_ONE`), the layout's rows 0. A
  mxconvert `TensorLayout` has one `pad_value`, so neither fill gives SGLang's bytes;
* the biases are float32.

The row keeps refusing TRITON: besides the two fills, triton's v3.8 tree (what SGLang's torch pin
brings) pads the Hopper value's packed dimension to 256 (triton PR #10428), which this snapshot
predates and no reference run covers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from sglang_golden_helpers import GOLDEN, padded_gpt_oss

from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts import resolve_layout
from mxconvert.layouts.triton import TritonChoice, hopper_scale, pad_scale_groups_to_4, triton_tensors
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.sglang_revisions import get_sglang_revision

PADDED = GOLDEN / "triton-sm90_sglang-0.5.23_e2_h320_i160.safetensors"
UNPADDED = GOLDEN / "triton-sm90_sglang-0.5.23_e1_h256_i256.safetensors"
CASES = (PADDED, UNPADDED)
SCALES = ("w13_weight_scale", "w2_weight_scale")
FILL = 0x7F


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["kernel_tensors"])


def _canonical(golden: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint tensors padded as SGLang's create_weights pads them with triton_kernels
    installed (I -> 64, H unchanged; scales filled with 0x7F, the rest with 0)."""
    _, rows, half_h = golden["in.w13_weight"].shape
    hp, ip = 2 * half_h, -(-(rows // 2) // 64) * 64
    assert (hp, ip) == (int(golden["params.hidden_padded"]), int(golden["params.intermediate_padded"]))
    return padded_gpt_oss(golden, hp, ip, FILL)


def _layouts(generation: str) -> dict:
    """mxconvert's TRITON tensor layouts for an SM90 target of `generation`, scale groups padded to 4."""
    choice = TritonChoice("HopperMXValueLayout", "HopperMXScaleLayout", True, 8, generation, 0)
    return {t.name: t for t in triton_tensors(choice)}


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def test_the_goldens_are_hopper_layouts_of_the_triton_kernels_3_8_api():
    for path in CASES:
        _, info = _read(path)
        for w in ("w13", "w2"):
            assert info[f"{w}_weight"]["layout"] == "HopperMXValueLayout"
            assert info[f"{w}_weight"]["layout_fields"] == {"mma_version": 3, "mx_axis": -2}
            assert info[f"{w}_weight_scale"]["layout"] == "HopperMXScaleLayout"
            assert info[f"{w}_weight_scale"]["layout_fields"] == {"mx_axis": -2, "num_warps": 8}
            assert info[f"{w}_b_microblock_size"] == 32  # the 3.8 field SGLang's _mx_block_kwargs probes


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_weights_are_triton_kernels_3_6_0_hopper_value_bytes(path):
    golden, _ = _read(path)
    canonical = _canonical(golden)
    layouts = _layouts("3.6.0")
    for w in ("w13_weight", "w2_weight"):
        assert _equal(layouts[w].forward(canonical[w]), golden[f"out.{w}"]), w


def test_the_3_5_1_value_padding_differs_where_the_sizes_need_padding():
    golden, _ = _read(PADDED)
    canonical = _canonical(golden)
    assert not _equal(_layouts("3.5.1")["w13_weight"].forward(canonical["w13_weight"]), golden["out.w13_weight"])


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_scales_are_groups_padded_with_0x7f_then_the_hopper_scale_layout_padding_rows_with_0(path):
    golden, _ = _read(path)
    canonical = _canonical(golden)
    for s in SCALES:
        want = golden[f"out.{s}"]
        got = hopper_scale(8)(pad_scale_groups_to_4(canonical[s], FILL), 0)
        assert _equal(got, want), s


def test_one_pad_value_cannot_give_sglangs_scales():
    """The padded case holds both fills: a mxconvert layout with pad_value 0 differs exactly where
    SGLang wrote 0x7F, with pad_value 0x7F exactly where the Hopper layout wrote 0."""
    golden, _ = _read(PADDED)
    canonical = _canonical(golden)
    layouts = _layouts("3.6.0")
    for s in SCALES:
        want = golden[f"out.{s}"]
        zero = layouts[s].forward(canonical[s])
        ones = replace(layouts[s], pad_value=FILL).forward(canonical[s])
        assert zero.shape == ones.shape == want.shape
        assert bool((zero != want).any()) and bool((ones != want).any()), s
        assert bool(((want[zero != want] == FILL) & (zero[zero != want] == 0)).all()), s
        assert bool(((want[ones != want] == 0) & (ones[ones != want] == FILL)).all()), s


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_biases_are_float32(path):
    golden, _ = _read(path)
    canonical = _canonical(golden)
    layouts = _layouts("3.6.0")
    for sglang_name, name in (("w13_weight_bias", "w13_bias"), ("w2_weight_bias", "w2_bias")):
        assert _equal(layouts[name].forward(canonical[sglang_name]), golden[f"out.{sglang_name}"])


def test_the_row_still_refuses_triton_and_says_why():
    row = get_sglang_revision("sglang-0.5.23")
    with pytest.raises(UnsupportedError) as refused:
        resolve_layout(Mxfp4Backend.TRITON, row, get_profile("h100"))
    text = str(refused.value)
    assert "TRITON under sglang-0.5.23: its bytes are not proven yet" in text
    assert "triton PR #10428" in text and "two padding values" in text
