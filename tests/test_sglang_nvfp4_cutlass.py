"""SGLang 0.5.23's NVFP4 (ModelOpt) FlashInfer CUTLASS bytes (`--moe-runner-backend flashinfer_cutlass` on
Blackwell) against mxconvert's.

The goldens are SGLang's own `ModelOptNvFp4FusedMoEMethod.create_weights`, `FusedMoE`'s per-expert
loading (w13 as [up; gate]: `load_up_proj_weight_first`) and `process_weights_after_loading`'s CUTLASS
branch (`swizzle_blockscale`, `alias_or_bind_derived_param`, the scalars `apply` hands
`cutlass_fused_moe`), run on CPU (tools/golden/sglang_nvfp4.py). They show (docs/sglang.md, "NVFP4"):

* the four moved tensors are vLLM's FlashInfer CUTLASS NVFP4 layout (layouts/cutlass.py: [w3; w1],
  128x4 swizzle with the scale columns padded to 4 and the rows to 128), bit for bit;
* the kernel scalars are the folded derived tensors: `w13_weight_scale_2` (folded) is SGLang's
  `g1_alphas`, `w2_weight_scale_2` its `g2_alphas`, and the reduced input scales' reciprocals its
  `w13_input_scale_quant` / `w2_input_scale_quant`;
* so `convert --runtime sglang==0.5.23 --profile b200 --backend flashinfer_cutlass` of the ModelOpt
  example writes SGLang's own values at TP 1 and 2, and verify accepts it; what SGLang cannot run or
  where its values would differ is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import ROOT, rewrite_source_tensor, run_cli
from sglang_golden_helpers import GOLDEN, artifact_tensors, digest, read_golden, tensor_bytes
from test_sglang_nvfp4_golden import _canonical, _kernel

from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.sglang_revisions import get_sglang_revision, unproven_layout_reason

CASES = sorted(GOLDEN.glob("nvfp4-cutlass_sglang-0.5.23_e*.safetensors"))
EXAMPLE_DIGESTS = GOLDEN / "nvfp4-cutlass_sglang-0.5.23_example_digests.json"
MODELOPT = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
MODELOPT_DEEPSEEK = ROOT / "examples" / "tiny-nvfp4-modelopt-deepseek"
ROW = get_sglang_revision("sglang-0.5.23", "nvfp4")
B = Nvfp4Backend.FLASHINFER_CUTLASS
CUTLASS = ("--backend", "flashinfer_cutlass")
#: artifact tensor -> the SGLang layer parameters that hold its values after post-processing
SGLANG_NAMES = {
    "w13_weight": ("w13_weight",),
    "w13_weight_scale": ("w13_blockscale_swizzled",),
    "w2_weight": ("w2_weight",),
    "w2_weight_scale": ("w2_blockscale_swizzled",),
    "w13_weight_scale_2": ("g1_alphas", "g1_alphas_up"),
    "w2_weight_scale_2": ("g2_alphas",),
}
#: artifact input scale (one maximum repeated per expert) -> SGLang's reciprocal scalar
RECIPROCALS = {"w13_input_scale": "w13_input_scale_quant", "w2_input_scale": "w2_input_scale_quant"}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tensor_bytes(a) == tensor_bytes(b)


def test_goldens_cover_an_unpadded_and_a_padded_scale_case():
    names = {p.name for p in CASES}
    assert names == {
        "nvfp4-cutlass_sglang-0.5.23_e2_h256_i128.safetensors",
        "nvfp4-cutlass_sglang-0.5.23_e1_h160_i64.safetensors",  # H 160: scale columns 10 -> 12, w2 rows -> 256
    }
    golden = read_golden(GOLDEN / "nvfp4-cutlass_sglang-0.5.23_e1_h160_i64.safetensors")
    assert tuple(golden["out.w13_blockscale_swizzled"].shape) == (1, 128, 12)
    assert tuple(golden["out.w2_blockscale_swizzled"].shape) == (1, 256, 4)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_rows_cutlass_layout(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden), ROW, B)
    assert set(kernel) == set(SGLANG_NAMES) | set(RECIPROCALS)
    for name, sglang_names in SGLANG_NAMES.items():
        for sglang_name in sglang_names:
            assert _same(kernel[name], golden[f"out.{sglang_name}"]), f"{path.name}: {name} vs SGLang's {sglang_name}"
    for name, sglang_name in RECIPROCALS.items():
        assert _same((1 / kernel[name][0]).reshape(()), golden[f"out.{sglang_name}"]), sglang_name


def test_gate_first_bytes_are_not_sglangs():
    """vLLM's VLLM_CUTLASS keeps [w1; w3]: SGLang's CUTLASS loads up first, so that order would differ."""
    golden = read_golden(CASES[0])
    plain = _kernel(_canonical(golden), ROW, Nvfp4Backend.VLLM_CUTLASS)
    assert not _same(plain["w13_weight"], golden["out.w13_weight"])
    assert not _same(plain["w13_weight_scale"], golden["out.w13_blockscale_swizzled"])


def test_the_row_writes_cutlass():
    assert unproven_layout_reason(ROW, "nvfp4", B.value) is None  # CuTe DSL: tests/test_sglang_nvfp4_cutedsl.py


def _artifact_values(out: Path) -> dict:
    """{rankN: {layerL: {SGLang parameter: digest}}} of the artifact's expert tensors, named as SGLang's."""
    values: dict = {}
    for rank, layer_key, name, tensor in artifact_tensors(out):
        layer = values.setdefault(rank, {}).setdefault(layer_key, {})
        if name in SGLANG_NAMES:
            layer.update({sglang_name: digest(tensor) for sglang_name in SGLANG_NAMES[name]})
        else:
            layer[RECIPROCALS[name]] = digest((1 / tensor[0]).reshape(()))
    return values


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_values(tmp_path, tp):
    """`convert ... --profile b200 --backend flashinfer_cutlass` of the ModelOpt Qwen3 example: every kernel
    tensor of every rank and layer equals what SGLang's own loading and post-processing hold; verify
    accepts it."""
    out = tmp_path / "out"
    done = run_cli(
        "convert", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTLASS, "--tp", tp, "--out", out
    )
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["backend"], target["runtime_revision"]) == ("FLASHINFER_CUTLASS", "sglang-0.5.23")
    golden = json.loads(EXAMPLE_DIGESTS.read_text())["digests"][f"tp{tp}"]
    assert len(golden) == tp and all(golden.values())
    assert _artifact_values(out) == golden
    verified = run_cli("verify", out, "--source", MODELOPT)
    assert verified.exit_code == 0, verified.output


def test_a_gated_intermediate_sglang_would_pad_is_refused(tmp_path):
    """The DeepSeek example's I 96 (2I 192, not a multiple of 128): SGLang's CUTLASS preparation asserts
    ("The intermediate size required padding") and vLLM's raises; convert refuses, writing nothing."""
    out = tmp_path / "out"
    done = run_cli(
        "convert", MODELOPT_DEEPSEEK, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTLASS, "--out", out
    )
    assert done.exit_code == 2 and "not a multiple of 128" in done.output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("scalar", ["weight_scale_2", "input_scale"])
def test_differing_gate_and_up_scalars_are_refused(tmp_path, scalar):
    """SGLang keeps the last-loaded of w1's / w3's input scales per expert (mxconvert the larger) and
    computes `g1_alphas_up` from w3's global scale (mxconvert holds w1's): refused, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(MODELOPT, src)
    rewrite_source_tensor(src, f"model.layers.1.mlp.experts.2.up_proj.{scalar}", lambda t: t * 1.5)
    out = tmp_path / "out"
    done = run_cli("convert", src, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTLASS, "--out", out)
    assert done.exit_code == 2 and f"layer 1 expert 2: gate_proj.{scalar}" in done.output
    assert not out.exists()


def test_hopper_cannot_run_it(tmp_path):
    """ModelOptNvFp4FusedMoEMethod.__init__ raises off Blackwell unless Marlin runs."""
    done = run_cli("select", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "h100", *CUTLASS)
    assert done.exit_code == 2 and "does not support NVFP4" in done.output
