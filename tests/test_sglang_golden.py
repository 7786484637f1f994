"""SGLang 0.5.23's GPT-OSS MXFP4 FlashInfer TRT-LLM (SM100) bytes against mxconvert's layout.

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` run on
CPU (tools/golden/sglang_mxfp4_trtllm.py, stand-ins named there). They show (docs/sglang.md):

* the moves are exactly the reused FlashInfer TRT-LLM layout (layouts/trtllm.py, vLLM 0.33's), with
  the sizes SGLang pads to (the `sglang-0.5.23` row's round-up: I -> 128, H -> 256), bit for bit;
* the one difference is the padding of the scales: SGLang's is 0x7F where vLLM's is 0, which the
  row's `mxfp4_scale_pad_fill` carries into the canonical tensors (formats/mxfp4/canonical.py);
* so `convert --runtime sglang==0.5.23 --profile b200` writes SGLang's bytes: the example
  checkpoint's artifact equals SGLang's own loading + post-processing of it, TP 1 and 2
  (tools/golden/sglang_mxfp4_example.py), bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, run_cli
from sglang_golden_helpers import (
    GOLDEN,
    artifact_tensors,
    convert_example_for_sglang,
    digest,
    padded_gpt_oss,
    read_golden,
    tensor_bytes,
    verify_accepts,
)

from mxconvert.layouts import resolve_layout
from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import REVISIONS, get_revision
from mxconvert.target.sglang_revisions import get_sglang_revision

CASES = sorted(GOLDEN.glob("trtllm-sm100_sglang-0.5.23_*.safetensors"))
EXAMPLE_DIGESTS = GOLDEN / "trtllm-sm100_sglang-0.5.23_example_digests.json"
BACKEND = Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8
#: checkpoint name (SGLang's parameter) -> mxconvert's canonical / kernel tensor name
NAMES = {
    "w13_weight": "w13_weight",
    "w13_weight_scale": "w13_weight_scale",
    "w13_weight_bias": "w13_bias",
    "w2_weight": "w2_weight",
    "w2_weight_scale": "w2_weight_scale",
    "w2_weight_bias": "w2_bias",
}
SCALES = ("w13_weight_scale", "w2_weight_scale")


def _canonical(golden: dict[str, torch.Tensor], hp: int, ip: int, scale_fill: int) -> dict[str, torch.Tensor]:
    """The rank's checkpoint tensors padded at their ends to (Hp, Ip), scales with `scale_fill`, by
    mxconvert's names."""
    return {NAMES[name]: t for name, t in padded_gpt_oss(golden, hp, ip, scale_fill).items()}


def _padded_sizes(golden: dict[str, torch.Tensor]) -> tuple[int, int]:
    _, rows, half_h = golden["in.w13_weight"].shape
    return get_sglang_revision("sglang-0.5.23").round_up(BACKEND, "cuda", 2 * half_h, rows // 2)


def _kernel(canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layout = resolve_layout(BACKEND, get_revision("vllm-0.33"), get_profile("b200"))
    return {name: layout.tensors[name].forward(t) for name, t in canonical.items()}


def test_goldens_cover_a_padded_and_an_unpadded_case():
    names = {p.name for p in CASES}
    assert "trtllm-sm100_sglang-0.5.23_e2_h160_i160.safetensors" in names
    assert "trtllm-sm100_sglang-0.5.23_e1_h256_i256.safetensors" in names


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_pads_to_the_rows_round_up(path):
    golden = read_golden(path)
    hp, ip = _padded_sizes(golden)
    assert (hp, ip) == (int(golden["params.hidden_padded"]), int(golden["params.intermediate_padded"]))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_trtllm_layout_of_a_0x7f_padded_canonical(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden, *_padded_sizes(golden), scale_fill=0x7F))
    for sglang_name, name in NAMES.items():
        want = golden[f"out.{sglang_name}"]
        got = kernel[name]
        assert got.dtype == want.dtype, name
        assert tuple(got.shape) == tuple(want.shape), name
        assert tensor_bytes(got) == tensor_bytes(want), f"{path.name}: {name} differs from SGLang's bytes"


def test_zero_padded_canonical_differs_only_in_the_scales():
    """With vLLM's canonical padding (zeros) the weights and biases still match SGLang's and the
    scales do not: the reason the SGLang row carries its own fill."""
    golden = read_golden(GOLDEN / "trtllm-sm100_sglang-0.5.23_e2_h160_i160.safetensors")
    kernel = _kernel(_canonical(golden, *_padded_sizes(golden), scale_fill=0))
    for sglang_name, name in NAMES.items():
        same = tensor_bytes(kernel[name]) == tensor_bytes(golden[f"out.{sglang_name}"])
        assert same == (sglang_name not in SCALES), name


def test_unpadded_shape_needs_no_fill():
    golden = read_golden(GOLDEN / "trtllm-sm100_sglang-0.5.23_e1_h256_i256.safetensors")
    kernel = _kernel(_canonical(golden, *_padded_sizes(golden), scale_fill=0))
    for sglang_name, name in NAMES.items():
        assert tensor_bytes(kernel[name]) == tensor_bytes(golden[f"out.{sglang_name}"]), name


def test_the_sglang_row_fills_scale_padding_with_0x7f_and_vllm_rows_with_zero():
    assert get_sglang_revision("sglang-0.5.23").mxfp4_scale_pad_fill == 0x7F
    assert {row.mxfp4_scale_pad_fill for row in REVISIONS.values()} == {0}


def test_the_sglang_row_lays_out_the_backend():
    target = LayoutTarget(BACKEND, get_sglang_revision("sglang-0.5.23"), get_profile("b200"))
    assert build_layout("mxfp4", target).kind == "trtllm"


def _artifact_digests(out: Path) -> dict:
    """{rankN: {layerL: {SGLang parameter name: dtype, shape, sha256}}} of an artifact's expert tensors."""
    sglang_names = {v: k for k, v in NAMES.items()}
    digests: dict = {}
    for rank, layer, name, tensor in artifact_tensors(out):
        digests.setdefault(rank, {}).setdefault(layer, {})[sglang_names[name]] = digest(tensor)
    return digests


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_owntensor_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile b200` of examples/tiny-gpt-oss: every expert
    tensor of every rank equals what SGLang 0.5.23's own loading and post-processing hold
    (tools/golden/sglang_mxfp4_example.py), padding included; and verify accepts the artifact."""
    out = tmp_path / "out"
    target = convert_example_for_sglang(out, tp, "--profile", "b200")
    assert target["backend"] == BACKEND.value
    golden = json.loads(EXAMPLE_DIGESTS.read_text())["digests"][f"tp{tp}"]
    assert _artifact_digests(out) == golden
    verify_accepts(out)


def test_vllm_manifests_record_no_scale_fill(tmp_path):
    """The fill is written to the target only where it is not 0, so vLLM artifacts are unchanged."""
    out = tmp_path / "out"
    assert run_cli("convert", EXAMPLE, "--profile", "b200", "--out", out).exit_code == 0
    assert "scale_pad_fill" not in json.loads((out / "mxconvert.json").read_text())["target"]
