"""SGLang 0.5.23's NVFP4 (ModelOpt) FlashInfer CuTe DSL bytes (`--moe-runner-backend flashinfer_cutedsl`, the
v2 standard path, a2a none) against mxconvert's.

The goldens are SGLang's own `ModelOptNvFp4FusedMoEMethod.create_weights`, `FusedMoE`'s per-expert loading
(w13 as [up; gate]: `load_up_proj_weight_first`), `process_weights_after_loading`'s CuTe DSL v2 branches
(`interleave_w13_halves(group_size=64)`, `swizzle_blockscale`, `alias_or_bind_derived_param`, FlashInfer's
`convert_sf_to_mma_layout`) and the runner's `resolve_cutedsl_standard_scales`, run on CPU
(tools/golden/sglang_nvfp4.py). They show (docs/sglang.md, "NVFP4"):

* the moved tensors and the MMA views are vLLM 0.33's "interleaved" CuTe DSL layout (layouts/cutedsl.py),
  bit for bit; the MMA view the loader makes (`cutedsl_mma_view`) is the layout's recorded view;
* the scalars are the row's "interleaved-unfolded" derived tensors (layouts/nvfp4_scales.py
  `cutedsl_standard_scales`): raw global scales, w13's input scale one maximum, w2's per expert,
  `g1_alphas` / `g2_alphas`, the reciprocals SGLang's `*_input_scale_quant`; vLLM 0.33's folded scalars
  are not SGLang's;
* so `convert --runtime sglang==0.5.23 --profile b200 --backend flashinfer_cutedsl` of the ModelOpt example
  writes SGLang's own values at TP 1 and 2 (the runner's four scalars included), and verify accepts it;
  what SGLang cannot run or where its values would differ is refused.
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

from mxconvert.layouts import nvfp4_layout
from mxconvert.runtimes.sglang.install_nvfp4 import NVFP4_CUTEDSL_NAMES, cutedsl_mma_view
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.revisions import get_revision
from mxconvert.target.sglang_revisions import get_sglang_revision, unproven_layout_reason

CASES = sorted(GOLDEN.glob("nvfp4-cutedsl_sglang-0.5.23_e*.safetensors"))
EXAMPLE_DIGESTS = GOLDEN / "nvfp4-cutedsl_sglang-0.5.23_example_digests.json"
MODELOPT = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
MODELOPT_DEEPSEEK = ROOT / "examples" / "tiny-nvfp4-modelopt-deepseek"
ROW = get_sglang_revision("sglang-0.5.23", "nvfp4")
B = Nvfp4Backend.FLASHINFER_CUTEDSL
CUTEDSL = ("--backend", "flashinfer_cutedsl")
#: artifact tensor -> the SGLang layer parameters that hold the same values after post-processing
SGLANG_NAMES = {
    "w13_weight": ("w13_weight",),
    "w13_weight_scale": ("w13_blockscale_swizzled",),
    "w2_weight": ("w2_weight",),
    "w2_weight_scale": ("w2_blockscale_swizzled",),
    "w2_weight_scale_2": ("w2_weight_scale_2",),
    "g1_alphas": ("g1_alphas", "g1_alphas_up"),
    "g2_alphas": ("g2_alphas",),
}
#: artifact input scale -> SGLang's reciprocal (per expert, one float32 division)
RECIPROCALS = {"w13_input_scale": "w13_input_scale_quant", "w2_input_scale": "w2_input_scale_quant"}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tensor_bytes(a) == tensor_bytes(b)


def _mma(swizzled: torch.Tensor, weight: torch.Tensor, experts: int) -> torch.Tensor:
    """SGLang's `w*_blockscale_mma` of a swizzled scale for `weight` ([E, m, k/2]), as the loader makes it."""
    return cutedsl_mma_view(swizzled, int(weight.shape[1]), 2 * int(weight.shape[2]), experts)


def _sglang_values(kernel: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What SGLang's layer holds, made from the artifact's tensors as the loader makes it (install_nvfp4.py),
    plus the four scalars `resolve_cutedsl_standard_scales` (flashinfer_cutedsl.py) hands the runner:
    `used_input_scale` = min(1 / a13) (numel > 1) or the value, `w1_alpha` = gate's global / it,
    `fc2_input_scale` = min(1 / a2[e]), `w2_alpha` = w2's global / it."""
    experts = int(kernel["w13_weight"].shape[0])
    out = {sglang: kernel[name] for name, sglang_names in SGLANG_NAMES.items() for sglang in sglang_names}
    out |= {sglang: (1 / kernel[name]).float() for name, sglang in RECIPROCALS.items()}
    out["w13_weight_scale_2"] = kernel["w13_weight_scale_2"].reshape(-1, 1).expand(-1, 2).contiguous()
    out["w13_blockscale_mma"] = _mma(kernel["w13_weight_scale"], kernel["w13_weight"], experts).contiguous()
    out["w2_blockscale_mma"] = _mma(kernel["w2_weight_scale"], kernel["w2_weight"], experts).contiguous()
    used = out["w13_input_scale_quant"].min().reshape(1)
    fc2 = out["w2_input_scale_quant"].min().reshape(1)
    out["cutedsl.used_input_scale"] = used
    out["cutedsl.w1_alpha"] = kernel["w13_weight_scale_2"] / torch.clamp(used.reshape(()), min=1e-12)
    out["cutedsl.fc2_input_scale"] = fc2
    out["cutedsl.w2_alpha"] = kernel["w2_weight_scale_2"] / torch.clamp(fc2.reshape(()), min=1e-12)
    return out


def test_goldens_cover_an_unpadded_and_a_padded_scale_case():
    names = {p.name for p in CASES}
    assert names == {
        "nvfp4-cutedsl_sglang-0.5.23_e2_h256_i128.safetensors",
        "nvfp4-cutedsl_sglang-0.5.23_e1_h160_i64.safetensors",  # H 160: scale columns 10 -> 12, w2 rows -> 256
    }
    golden = read_golden(GOLDEN / "nvfp4-cutedsl_sglang-0.5.23_e1_h160_i64.safetensors")
    assert tuple(golden["out.w13_blockscale_swizzled"].shape) == (1, 128, 12)
    assert tuple(golden["out.w13_blockscale_mma"].shape) == (32, 4, 1, 4, 3, 1)
    two = read_golden(GOLDEN / "nvfp4-cutedsl_sglang-0.5.23_e2_h256_i128.safetensors")
    assert not torch.equal(two["out.w2_input_scale_quant"][0], two["out.w2_input_scale_quant"][1])  # per expert


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_rows_cutedsl_layout(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden), ROW, B)
    assert set(kernel) == set(NVFP4_CUTEDSL_NAMES)
    want = {k.removeprefix("out."): t for k, t in golden.items() if k.startswith("out.")}
    got = _sglang_values(kernel)
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert _same(got[name], tensor), f"{path.name}: {name}"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_the_loaders_mma_view_is_the_layouts_recorded_view(path):
    """The layout records the kernel's view of the swizzled scales (`_MMA_VIEW`); the loader's
    `cutedsl_mma_view` (FlashInfer's `convert_sf_to_mma_layout`) is that view, over the same storage."""
    golden = read_golden(path)
    canonical = _canonical(golden)
    e, k, half_n = canonical["w2_weight"].shape
    layout = nvfp4_layout(B, ROW, k, 2 * half_n, e)
    kernel = _kernel(canonical, ROW, B)
    for name, weight in (("w13_weight_scale", "w13_weight"), ("w2_weight_scale", "w2_weight")):
        recorded = layout.tensors[name].kernel_view(kernel[name])
        loader = _mma(kernel[name], kernel[weight], e)
        assert (tuple(recorded.shape), recorded.stride()) == (tuple(loader.shape), loader.stride())
        assert loader.data_ptr() == kernel[name].data_ptr()
        assert torch.equal(recorded.contiguous().view(torch.uint8), loader.contiguous())


def test_vllms_folded_cutedsl_scalars_are_not_sglangs():
    """vLLM 0.33's FLASHINFER_CUTEDSL ("interleaved", folded global scales, w2's input scale one maximum):
    the same bytes, other scalars, so the row's `nvfp4_cutedsl_prepare` says "interleaved-unfolded"."""
    golden = read_golden(CASES[-1])  # e2: per-expert w2 input scales differ
    vllm = _kernel(_canonical(golden), get_revision("vllm-0.33", "nvfp4"), B)
    mine = _kernel(_canonical(golden), ROW, B)
    for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
        assert _same(vllm[name], mine[name]), name
    assert ROW.nvfp4_cutedsl_prepare == "interleaved-unfolded"
    assert not _same(vllm["w13_weight_scale_2"], mine["w13_weight_scale_2"])  # folded: g1_alphas
    assert not _same(vllm["w2_input_scale"], golden["out.w2_input_scale_quant"].reciprocal())


def test_the_row_writes_cutedsl():
    assert unproven_layout_reason(ROW, "nvfp4", B.value) is None


def _artifact_values(out: Path) -> dict:
    """{rankN: {layerL: {SGLang parameter: digest}}} of the artifact's tensors, made SGLang's values."""
    layers: dict = {}
    for rank, layer_key, name, tensor in artifact_tensors(out):
        layers.setdefault(rank, {}).setdefault(layer_key, {})[name] = tensor
    return {
        rank: {key: {n: digest(t) for n, t in _sglang_values(kernel).items()} for key, kernel in by_layer.items()}
        for rank, by_layer in layers.items()
    }


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_values(tmp_path, tp):
    """`convert ... --profile b200 --backend flashinfer_cutedsl` of the ModelOpt Qwen3 example: every tensor
    of every rank and layer, and the runner's scalars, equal what SGLang's own loading, post-processing
    and `resolve_cutedsl_standard_scales` hold; verify accepts it."""
    out = tmp_path / "out"
    done = run_cli(
        "convert", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTEDSL, "--tp", tp, "--out", out
    )
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["backend"], target["runtime_revision"]) == ("FLASHINFER_CUTEDSL", "sglang-0.5.23")
    golden = json.loads(EXAMPLE_DIGESTS.read_text())["digests"][f"tp{tp}"]
    assert len(golden) == tp and all(golden.values())
    assert _artifact_values(out) == golden
    verified = run_cli("verify", out, "--source", MODELOPT)
    assert verified.exit_code == 0, verified.output


def test_an_intermediate_shard_sglang_cannot_interleave_is_refused(tmp_path):
    """The DeepSeek example's I 96: `interleave_w13_halves` raises on a half that is not a multiple of 64
    (mxconvert's layout would pad it to 128); select and convert refuse, writing nothing."""
    out = tmp_path / "out"
    done = run_cli(
        "convert", MODELOPT_DEEPSEEK, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTEDSL, "--out", out
    )
    assert done.exit_code == 2 and "interleave_w13_halves" in done.output
    assert not out.exists() or not any(out.iterdir())
    done = run_cli("select", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTEDSL, "--tp", "4")
    assert done.exit_code == 2 and "128 / 4 = 32" in done.output


@pytest.mark.parametrize("scalar", ["weight_scale_2", "input_scale"])
def test_differing_gate_and_up_scalars_are_refused(tmp_path, scalar):
    """SGLang keeps the last-loaded of w1's / w3's input scales per expert (mxconvert the larger) and w13's
    raw [gate, up] global scales (mxconvert holds gate's): refused, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(MODELOPT, src)
    rewrite_source_tensor(src, f"model.layers.1.mlp.experts.2.up_proj.{scalar}", lambda t: t * 1.5)
    out = tmp_path / "out"
    done = run_cli("convert", src, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTEDSL, "--out", out)
    assert done.exit_code == 2 and f"layer 1 expert 2: gate_proj.{scalar}" in done.output
    assert not out.exists()


def test_hopper_and_the_w4a16_mode_are_refused():
    """ModelOptNvFp4FusedMoEMethod.__init__ raises off Blackwell unless Marlin runs; the CuTe DSL W4A16
    mode (input scales of one) is not mirrored."""
    done = run_cli("select", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "h100", *CUTEDSL)
    assert done.exit_code == 2 and "does not support NVFP4" in done.output
    for value in ("1", "y", "maybe"):  # EnvBool: true, true, raises
        env = ("--env", f"SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16={value}")
        done = run_cli("select", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTEDSL, *env)
        assert done.exit_code == 2 and "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16" in done.output, value
    env = ("--env", "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16=0")
    done = run_cli("select", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "b200", *CUTEDSL, *env)
    assert done.exit_code == 0, done.output
