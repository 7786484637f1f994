"""What convert writes for the NVFP4 kernels is checked, not only what it reads (issue 20, item 8).

Every global and input scale of a checkpoint is checked finite and positive when read, but the
kernel tensors computed from them (layouts/nvfp4_scales.py: folded global scales, alphas,
TRTLLM's `g1_scale_c = w13_scale_2 * a13 / a2`, Marlin's `w * 2^119`) are products and
reciprocals, and can overflow to inf or underflow to zero or to a subnormal (which the kernels
flush to zero) from scales that are each in range. `DerivedTensor.check_values`
(layouts/derived.py) refuses such a value where it is computed: exit 2, a message that names the
layer, the tensor, the value, the kernel and the source values, and nothing written.

Each case below sets scales of every expert of layer 1 of a tiny checkpoint to values the reader
accepts, chosen so that one derived tensor leaves the range (the values the fixture's other
scales have, ~1e-3, do not matter at these magnitudes).
"""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_nvfp4 import make_nvfp4_checkpoint
from helpers import rewrite_source_tensor, run_cli

FLASHINFER_CUTLASS_015 = ["--env", "VLLM_USE_FLASHINFER_MOE_FP4=1", "--env", "VLLM_FLASHINFER_MOE_BACKEND=throughput"]

#: id -> (checkpoint format, profile, runtime, extra convert args, {(proj, tensor): value} set on
#: every expert of layer 1, substrings the refusal must hold).
CASES = {
    "trtllm-g1_scale_c-overflows": (
        "modelopt",
        "b200",
        "vllm-0.33",
        ["--backend", "flashinfer_trtllm"],
        {
            ("gate_proj", "weight_scale_2"): 1e30,
            ("up_proj", "weight_scale_2"): 1e30,
            ("down_proj", "input_scale"): 1e-20,
        },
        ["layer 1: g1_scale_c[0] = inf for FLASHINFER_TRTLLM", "w13_weight_scale_2 = 1e+30", "w2_input_scale = 1e-20"],
    ),
    "folded-global-scale-overflows": (
        "modelopt",
        "b200",
        "vllm-0.33",
        ["--backend", "flashinfer_cutlass"],
        {
            ("gate_proj", "weight_scale_2"): 1e30,
            ("up_proj", "weight_scale_2"): 1e30,
            ("gate_proj", "input_scale"): 1e10,
            ("up_proj", "input_scale"): 1e10,
        },
        ["layer 1: w13_weight_scale_2[0] = inf for FLASHINFER_CUTLASS", "w13_input_scale = 1e+10"],
    ),
    "alphas-underflow-to-zero": (
        "modelopt",
        "b200",
        "vllm-0.15",
        FLASHINFER_CUTLASS_015,
        {
            ("gate_proj", "weight_scale_2"): 1e-37,
            ("up_proj", "weight_scale_2"): 1e-37,
            ("gate_proj", "input_scale"): 1e-10,
            ("up_proj", "input_scale"): 1e-10,
        },
        ["layer 1: g1_alphas[0] = 0 for FLASHINFER_CUTLASS", "w13_weight_scale_2 = 1e-37", "normal float32"],
    ),
    "alphas-underflow-to-a-subnormal": (
        "modelopt",
        "b200",
        "vllm-0.15",
        FLASHINFER_CUTLASS_015,
        {
            ("gate_proj", "weight_scale_2"): 1e-37,
            ("up_proj", "weight_scale_2"): 1e-37,
            ("gate_proj", "input_scale"): 1e-3,
            ("up_proj", "input_scale"): 1e-3,
        },
        ["layer 1: g1_alphas[0] = 9.99995e-41 for FLASHINFER_CUTLASS", "w13_input_scale = 0.001"],
    ),
    "marlin-global-scale-overflows": (
        "modelopt",
        "h100",
        "vllm-0.33",
        [],
        {("gate_proj", "weight_scale_2"): 1e4, ("up_proj", "weight_scale_2"): 1e4},
        ["layer 1: w13_weight_scale_2[0] = inf for MARLIN", "w13_weight_scale_2 = 10000", "float32"],
    ),
    "plain-marlin-bf16-global-scale-overflows": (
        "modelopt",
        "h100",
        "vllm-0.15",
        [],
        {("gate_proj", "weight_scale_2"): 1e4, ("up_proj", "weight_scale_2"): 1e4},
        ["layer 1: w13_weight_scale_2[0] = inf for MARLIN", "bfloat16"],
    ),
    "compressed-tensors-reciprocals-overflow": (
        "compressed-tensors",
        "b200",
        "vllm-0.33",
        ["--backend", "flashinfer_cutlass"],
        {
            ("gate_proj", "weight_global_scale"): 1e-20,
            ("up_proj", "weight_global_scale"): 1e-20,
            ("gate_proj", "input_global_scale"): 1e-25,
            ("up_proj", "input_global_scale"): 1e-25,
        },
        ["layer 1: w13_weight_scale_2[0] = inf for FLASHINFER_CUTLASS", "w13_weight_scale_2 = 1e+20"],
    ),
}


def _set_layer_scales(ckpt, layer: int, values: dict[tuple[str, str], float]) -> None:
    """Set `proj.tensor` of every expert of `layer` to the value (dtype and shape kept)."""
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    prefix = f"model.layers.{layer}.mlp.experts."
    for (proj, tensor), value in values.items():
        keys = [k for k in weight_map if k.startswith(prefix) and k.endswith(f".{proj}.{tensor}")]
        assert keys, f"no {proj}.{tensor} in layer {layer}"
        for key in keys:
            rewrite_source_tensor(ckpt, key, lambda t, value=value: torch.full_like(t, value))


@pytest.mark.parametrize("case", list(CASES))
def test_a_derived_scale_out_of_the_kernels_range_is_refused_and_nothing_is_written(tmp_path, case):
    fmt, profile, runtime, args, values, expected = CASES[case]
    ckpt = make_nvfp4_checkpoint(tmp_path, fmt=fmt)
    _set_layer_scales(ckpt, 1, values)
    out = tmp_path / "out"
    result = run_cli("convert", ckpt, "--profile", profile, "--runtime", runtime, *args, "-o", out)
    assert result.exit_code == 2, result.stderr + result.stdout
    message = " ".join(result.stderr.split())  # rich wraps long lines
    assert "Traceback" not in result.stderr
    assert f"{ckpt}: layer 1: " in message
    for text in expected:
        assert text in message, (text, message)
    assert "the checkpoint's scales are out of the range the kernel can use" in message
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.name]  # no staging folder left either


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_targets_convert_a_checkpoint_whose_scales_are_in_range(tmp_path, case):
    """Positive control: the targets above convert the unmodified checkpoint (exit 0), so each
    refusal above is the value check's, not the target's."""
    fmt, profile, runtime, args, _, _ = CASES[case]
    ckpt = make_nvfp4_checkpoint(tmp_path, fmt=fmt)
    out = tmp_path / "out"
    result = run_cli("convert", ckpt, "--profile", profile, "--runtime", runtime, *args, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert (out / "mxconvert.json").is_file()


def test_verify_recomputing_from_such_a_source_refuses_too(tmp_path):
    """verify recomputes every derived tensor from the source (`compute.derive`, the same check):
    an artifact converted before its source's scales left the range is not passed as matching."""
    fmt, profile, runtime, args, values, expected = CASES["trtllm-g1_scale_c-overflows"]
    ckpt = make_nvfp4_checkpoint(tmp_path, fmt=fmt)
    out = tmp_path / "out"
    assert run_cli("convert", ckpt, "--profile", profile, "--runtime", runtime, *args, "-o", out).exit_code == 0
    _set_layer_scales(ckpt, 1, values)
    result = run_cli("verify", out)
    assert result.exit_code == 2, result.stderr + result.stdout
    message = " ".join(result.stderr.split())
    assert f"{ckpt}: layer 1: " in message and expected[0] in message, message
