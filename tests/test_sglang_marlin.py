"""SGLang 0.5.23's GPT-OSS MXFP4 MARLIN bytes against mxconvert's layout (docs/sglang.md, "MARLIN").

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` (marlin
branch: `deinterleave_moe_mxfp4_w13_for_marlin`, `prepare_moe_mxfp4_layer_for_marlin`) run on CPU
(tools/golden/sglang_mxfp4_marlin.py; `gptq_marlin_repack` stood in by vLLM's test reference, checked
there against a transcription of SGLang's own CUDA kernel). They show:

* SGLang's bytes are vLLM's MXFP4 Marlin layout (layouts/marlin.py) of the canonical tensors padded to
  the row's sizes (I -> 128, H -> 256) with the row's 0x7F scale fill, after one move vLLM does not
  make: w13's gate/up rows de-interleaved into [gate; up] halves (weights, scales and bias alike),
  the row field `mxfp4_marlin_w13_rows == "halves"`;
* so `convert --runtime sglang==0.5.23 --profile h100 --backend marlin` writes SGLang's bytes: the
  example checkpoint's artifact equals SGLang's own loading + post-processing of it, TP 1 and 2.
"""

from __future__ import annotations

import json

import pytest
import torch
from sglang_golden_helpers import GOLDEN, convert_example_for_sglang, read_golden, tensor_bytes, verify_accepts
from test_sglang_golden import NAMES, SCALES, _artifact_digests, _canonical

from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import REVISIONS, get_revision
from mxconvert.target.sglang_revisions import get_sglang_revision

CASES = sorted(GOLDEN.glob("marlin_sglang-0.5.23_*.safetensors"))
EXAMPLE_DIGESTS = GOLDEN / "marlin_sglang-0.5.23_example_digests.json"
BACKEND = Mxfp4Backend.MARLIN
ROW = get_sglang_revision("sglang-0.5.23")
W13 = ("w13_weight", "w13_weight_scale", "w13_weight_bias")


def _padded_sizes(golden: dict[str, torch.Tensor]) -> tuple[int, int]:
    _, rows, half_h = golden["in.w13_weight"].shape
    return ROW.round_up(BACKEND, "cuda", 2 * half_h, rows // 2)


def _layout(row):
    return build_layout("mxfp4", LayoutTarget(BACKEND, row, get_profile("h100")))


def _kernel(row, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layout = _layout(row)
    return {name: layout.tensors[name].forward(t) for name, t in canonical.items()}


def test_goldens_cover_a_padded_and_an_unpadded_case():
    names = {p.name for p in CASES}
    assert "marlin_sglang-0.5.23_e2_h192_i160.safetensors" in names  # H 192 -> 256, I 160 -> 256
    assert "marlin_sglang-0.5.23_e1_h256_i256.safetensors" in names  # nothing padded


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_pads_to_the_rows_marlin_round_up(path):
    golden = read_golden(path)
    assert _padded_sizes(golden) == (
        int(golden["params.hidden_padded"]),
        int(golden["params.intermediate_padded"]),
    )


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_rows_marlin_layout_of_a_0x7f_padded_canonical(path):
    golden = read_golden(path)
    kernel = _kernel(ROW, _canonical(golden, *_padded_sizes(golden), scale_fill=0x7F))
    for sglang_name, name in NAMES.items():
        want, got = golden[f"out.{sglang_name}"], kernel[name]
        assert got.dtype == want.dtype, name
        assert tuple(got.shape) == tuple(want.shape), name
        assert tensor_bytes(got) == tensor_bytes(want), f"{path.name}: {name} differs from SGLang's bytes"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_vllms_marlin_layout_differs_exactly_in_the_w13_row_order(path):
    """vLLM 0.33's MARLIN (gate/up interleaved) gives SGLang's w2 bytes and not its w13 bytes:
    the reason for the row field."""
    golden = read_golden(path)
    kernel = _kernel(get_revision("vllm-0.33"), _canonical(golden, *_padded_sizes(golden), scale_fill=0x7F))
    for sglang_name, name in NAMES.items():
        same = tensor_bytes(kernel[name]) == tensor_bytes(golden[f"out.{sglang_name}"])
        assert same == (sglang_name not in W13), name


def test_zero_scale_padding_differs_only_in_the_scales():
    golden = read_golden(GOLDEN / "marlin_sglang-0.5.23_e2_h192_i160.safetensors")
    kernel = _kernel(ROW, _canonical(golden, *_padded_sizes(golden), scale_fill=0))
    for sglang_name, name in NAMES.items():
        same = tensor_bytes(kernel[name]) == tensor_bytes(golden[f"out.{sglang_name}"])
        assert same == (sglang_name not in SCALES), name


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_the_inverse_gives_the_canonical_tensors_back(path):
    golden = read_golden(path)
    canonical = _canonical(golden, *_padded_sizes(golden), scale_fill=0x7F)
    layout = _layout(ROW)
    for name, tensor in canonical.items():
        back = layout.tensors[name].inverse(
            golden[f"out.{ {v: k for k, v in NAMES.items()}[name] }"], tuple(tensor.shape), tensor.dtype
        )
        assert tensor_bytes(back) == tensor_bytes(tensor), name


def test_the_row_field_and_its_layout_steps():
    assert ROW.mxfp4_marlin_w13_rows == "halves"
    assert {row.mxfp4_marlin_w13_rows for row in REVISIONS.values()} == {"interleaved"}
    assert BACKEND.value not in dict(ROW.unproven_layouts)
    tensors = _layout(ROW).tensors
    assert tensors["w13_weight"].steps[0] == "deinterleave"
    assert tensors["w13_bias"].steps == ("deinterleave", "marlin_permute_bias")
    assert tensors["w2_weight"].steps[0] != "deinterleave"
    assert "deinterleave" not in _layout(get_revision("vllm-0.33")).tensors["w13_weight"].steps


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_marlintensor_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile h100 --backend marlin` of examples/tiny-gpt-oss:
    every expert tensor of every rank equals what SGLang 0.5.23's own loading and Marlin
    post-processing hold (tools/golden/sglang_mxfp4_marlin.py), padding included; verify accepts it."""
    out = tmp_path / "out"
    target = convert_example_for_sglang(out, tp, "--profile", "h100", "--backend", "marlin")
    assert target["backend"] == BACKEND.value
    golden = json.loads(EXAMPLE_DIGESTS.read_text())["digests"][f"tp{tp}"]
    assert _artifact_digests(out) == golden
    verify_accepts(out)


def test_sglangs_bf16_detour_of_the_scales_keeps_every_byte():
    """SGLang's `_normalize_scale_tensor` turns the e8m0 scales into bf16 values (2**e) and
    `mxfp4_marlin_process_scales` back to e8m0: for all 256 bytes, 0x00 (2**-127, a bf16 subnormal)
    and 0xFF (NaN) included, the detour gives the byte back (torch on CPU), so mxconvert's byte moves
    stand for it."""
    raw = torch.arange(256, dtype=torch.uint8)
    back = raw.view(torch.float8_e8m0fnu).to(torch.bfloat16).to(torch.float8_e8m0fnu).view(torch.uint8)
    assert torch.equal(back, raw)
