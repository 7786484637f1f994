"""SGLang 0.5.23's GPT-OSS MXFP4 FlashInfer CUTLASS bytes against mxconvert's layout (docs/sglang.md,
"FLASHINFER_CUTLASS"): FLASHINFER_CUTLASS_MXFP4_BF16 (SM90, `_process_weights_for_sm90_cutlass`) and
FLASHINFER_CUTLASS_MXFP4_MXFP8 (SM120, `_process_weights_for_sm120_cutlass`).

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` run on CPU
(tools/golden/sglang_mxfp4_cutlass.py; SM90: FlashInfer's CUDA-only weight interleave replayed from
its GPU outputs, tests_sglang/data/sm90_interleave/; SM120: the 128x4 scale swizzle by FlashInfer's
pure-torch copy). They show:

* SGLang's bytes are vLLM 0.33's CUTLASS moves (layouts/cutlass.py: de-interleave to [up; gate], then
  FlashInfer's SM90 weight + scale interleaves, or on SM120 the 128x4 scale swizzle) of the canonical
  tensors at the row's sizes (H -> 256 by FusedMoE, I unpadded; 0x7F scale fill), after one step vLLM
  does not take: I padded to 128 with zeros after loading, weights, scales and biases alike (the row
  field `mxfp4_cutlass_pad == "after-load-128"`);
* so `convert --runtime sglang==0.5.23 --profile h100 | rtx-pro-6000` of the example checkpoint writes
  SGLang's bytes, TP 1 and 2, and verify accepts them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, run_cli
from sglang_golden_helpers import (
    GOLDEN,
    convert_example_for_sglang,
    padded_gpt_oss,
    read_golden,
    tensor_bytes,
    verify_accepts,
)
from test_sglang_golden import NAMES, SCALES, _artifact_digests

from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.selection.sglang.mxfp4_0_5_23 import cutlass_layer_refusal
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import REVISIONS
from mxconvert.target.sglang_revisions import get_sglang_revision

ROW = get_sglang_revision("sglang-0.5.23")
#: backend -> (golden tag, profile)
KERNELS = {
    Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16: ("cutlass-sm90", "h100"),
    Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8: ("cutlass-sm120", "rtx-pro-6000"),
}
CASES = [
    (backend, path)
    for backend, (tag, _) in KERNELS.items()
    for path in sorted(GOLDEN.glob(f"{tag}_sglang-0.5.23_e*.safetensors"))
]
PADDED = "cutlass-sm{}_sglang-0.5.23_e2_h160_i160.safetensors"  # I 160 -> 256 after loading, H 160 -> 256


def _case_id(case) -> str:
    return case[1].stem if isinstance(case, tuple) else str(case)


def _sizes(backend, golden: dict[str, torch.Tensor]) -> tuple[int, int]:
    _, rows, half_h = golden["in.w13_weight"].shape
    return ROW.round_up(backend, "cuda", 2 * half_h, rows // 2)


def _canonical(backend, golden: dict[str, torch.Tensor], scale_fill: int = 0x7F) -> dict[str, torch.Tensor]:
    return {NAMES[n]: t for n, t in padded_gpt_oss(golden, *_sizes(backend, golden), scale_fill).items()}


def _layout(backend, row=ROW):
    return build_layout("mxfp4", LayoutTarget(backend, row, get_profile(KERNELS[backend][1])))


def _kernel(backend, canonical: dict[str, torch.Tensor], row=ROW) -> dict[str, torch.Tensor]:
    layout = _layout(backend, row)
    return {name: layout.tensors[name].forward(t) for name, t in canonical.items()}


def _state(t: torch.Tensor) -> tuple:
    """What the kernel reads of a tensor: dtype, shape, bytes."""
    return t.dtype, tuple(t.shape), tensor_bytes(t)


def test_goldens_cover_both_kernels_padded_and_unpadded():
    names = {path.name for _, path in CASES}
    for tag in ("sm90", "sm120"):
        assert f"cutlass-{tag}_sglang-0.5.23_e2_h160_i160.safetensors" in names  # H, I 160 -> 256
        assert f"cutlass-{tag}_sglang-0.5.23_e1_h256_i256.safetensors" in names  # nothing padded


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_canonical_sizes_are_sglangs_allocation(case):
    """The row's rule: H rounded to 256 (FusedMoE.__init__ for flashinfer_mxfp4), I as loaded."""
    backend, path = case
    golden = read_golden(path)
    _, rows, half_h = golden["in.w13_weight"].shape
    hp, ip = _sizes(backend, golden)
    assert (hp, ip) == (-(-2 * half_h // 256) * 256, rows // 2)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sglang_bytes_are_the_rows_cutlass_layout(case):
    backend, path = case
    golden = read_golden(path)
    kernel = _kernel(backend, _canonical(backend, golden))
    for sglang_name, name in NAMES.items():
        want, got = golden[f"out.{sglang_name}"], kernel[name]
        assert got.dtype == want.dtype, name
        assert tuple(got.shape) == tuple(want.shape), name
        assert tensor_bytes(got) == tensor_bytes(want), f"{path.name}: {name} differs from SGLang's bytes"


def test_vllm_moves_without_the_after_load_padding_give_other_shapes():
    """vLLM 0.33's row (no re-padding after loading) lays the same canonical tensors out at I 160:
    every tensor but w2's bias differs from SGLang's (I 256) in shape or bytes (SM120's w2 scales
    hold the same bytes, the 128x4 swizzle padding the 5 groups to 8, but flat): the reason for the
    row field."""
    backend = Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8
    golden = read_golden(GOLDEN / PADDED.format("120"))
    kernel = _kernel(backend, _canonical(backend, golden), REVISIONS["vllm-0.33"])
    for sglang_name, name in NAMES.items():
        same = _state(kernel[name]) == _state(golden[f"out.{sglang_name}"])
        assert same == (name == "w2_bias"), name


def test_vllm_sm90_moves_cannot_lay_out_sglangs_unpadded_intermediate():
    """On SM90 vLLM's C2a moves need I padded first (FlashInfer's weight interleave takes K % 64 == 0):
    at SGLang's loaded I = 160, w2's 80 bytes per row are refused; the after-load step supplies it."""
    backend = Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16
    golden = read_golden(GOLDEN / PADDED.format("90"))
    canonical = _canonical(backend, golden)
    with pytest.raises(
        ValueError, match="SM90 mixed-GEMM interleave needs rows % 16 == 0 and K % 64 == 0, got 256 x 160"
    ):
        _kernel(backend, {"w2_weight": canonical["w2_weight"]}, REVISIONS["vllm-0.33"])


@pytest.mark.parametrize("tag", ["90", "120"])
def test_zero_scale_padding_differs_only_in_the_scales(tag):
    """The hidden padding of the scales (320 -> 512 for the example, 160 -> 256 here) keeps SGLang's
    0x7F, while the intermediate padding after loading is zeros: both fills are in the golden."""
    backend = next(b for b, (t, _) in KERNELS.items() if t == f"cutlass-sm{tag}")
    golden = read_golden(GOLDEN / PADDED.format(tag))
    kernel = _kernel(backend, _canonical(backend, golden, scale_fill=0))
    for sglang_name, name in NAMES.items():
        same = tensor_bytes(kernel[name]) == tensor_bytes(golden[f"out.{sglang_name}"])
        assert same == (sglang_name not in SCALES), name
    scale = golden["out.w2_weight_scale"] if tag == "120" else None
    if scale is not None:  # SM120 keeps [E, H, I/32] (the swizzle of whole tiles): both fills are there
        assert {0x00, 0x7F} <= set(scale.unique().tolist())


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_inverse_gives_the_canonical_tensors_back(case):
    backend, path = case
    golden = read_golden(path)
    canonical = _canonical(backend, golden)
    layout = _layout(backend)
    by_name = {v: k for k, v in NAMES.items()}
    for name, tensor in canonical.items():
        back = layout.tensors[name].inverse(golden[f"out.{by_name[name]}"], tuple(tensor.shape), tensor.dtype)
        assert tensor_bytes(back) == tensor_bytes(tensor), name


def test_the_inverse_refuses_nonzero_after_load_padding():
    """A byte planted in SGLang's zero padding (I 160 -> 256) is not a layout of any canonical tensor."""
    backend = Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8
    golden = read_golden(GOLDEN / PADDED.format("120"))
    canonical = _canonical(backend, golden)
    bad = golden["out.w2_weight"].clone()
    bad[0, 0, -1] = 0x11  # w2's column padding: I/2 = 80 bytes -> 128
    with pytest.raises(Exception, match="(?i)padding"):
        _layout(backend).tensors["w2_weight"].inverse(bad, tuple(canonical["w2_weight"].shape), torch.uint8)


def test_the_row_field_and_its_layout_steps():
    assert ROW.mxfp4_cutlass_pad == "after-load-128"
    assert {row.mxfp4_cutlass_pad for row in REVISIONS.values()} == {"canonical"}
    for backend in KERNELS:
        layout = _layout(backend)
        assert layout.params["padding"] == "after-load-128"
        assert layout.tensors["w13_weight"].steps[0] == "pad I to 128 after loading (zeros)"
        assert layout.tensors["w2_bias"].steps == ()
        assert "padding" not in build_layout("mxfp4", LayoutTarget(backend, REVISIONS["vllm-0.33"])).params


def _digests(tag: str) -> Path:
    return GOLDEN / f"{tag}_sglang-0.5.23_example_digests.json"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", list(KERNELS), ids=lambda b: b.value)
def test_converted_example_is_sglangs_own_bytes(tmp_path, backend, tp):
    """`convert --runtime sglang==0.5.23 --profile h100 | rtx-pro-6000` (SGLang's `flashinfer_mxfp4`
    choice there) of examples/tiny-gpt-oss: every expert tensor of every rank equals what SGLang's
    own loading and CUTLASS post-processing hold (tools/golden/sglang_mxfp4_cutlass.py); verify accepts it."""
    tag, profile = KERNELS[backend]
    if not _digests(tag).exists():
        pytest.fail(f"{_digests(tag)} missing: run tools/golden/sglang_mxfp4_cutlass.py")
    out = tmp_path / "out"
    target = convert_example_for_sglang(out, tp, "--profile", profile, "--backend", "flashinfer_mxfp4")
    assert target["backend"] == backend.value
    golden = json.loads(_digests(tag).read_text())["digests"][f"tp{tp}"]
    assert _artifact_digests(out) == golden
    verify_accepts(out)


# ---- where SGLang cannot load a CUTLASS layer ---------------------------------------------------------
@pytest.mark.parametrize(("tp", "refused"), [(1, False), (2, False), (3, False), (4, True), (8, True)])
def test_gpt_oss_sizes_follow_sglangs_cutlass_loading(tp, refused):
    """GPT-OSS (I = 2880, 90 MXFP4 blocks): the loader's ceil((90) / tp) * 32 rows per rank fit the
    unpadded `2880 // tp` rows only where tp divides 90."""
    reason = cutlass_layer_refusal(2880, tp)
    assert (reason is not None) == refused
    if refused:
        sliced = -(-90 // tp) * 32
        assert f"= {sliced} intermediate rows per rank into the {2880 // tp}-row parameters" in reason
        assert "use a --tp that divides the 90 MXFP4 blocks (here 1, 2, 3, 5, 6)" in reason


@pytest.mark.parametrize("profile", ["h100", "rtx-pro-6000"])
def test_convert_at_a_tp_sglang_cannot_load_exits_2_and_writes_nothing(tmp_path, profile):
    """The example's I = 320 (10 blocks): at TP 4 the loader slices 96 rows into 80-row parameters."""
    out = tmp_path / "out"
    result = run_cli(
        "convert",
        EXAMPLE,
        "--runtime",
        "sglang==0.5.23",
        "--profile",
        profile,
        "--backend",
        "flashinfer_mxfp4",
        "--tp",
        "4",
        "--out",
        out,
    )
    assert result.exit_code == 2, result.output
    assert "cannot load this model's experts for FLASHINFER_CUTLASS at MoE TP 4" in result.output
    assert "= 96 intermediate rows per rank into the 80-row parameters" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()
