"""The `Format` protocol: every format answers every hook, and verify's dequantized sample covers
NVFP4 as it covers MXFP4."""

from __future__ import annotations

import inspect
import json

import torch
from fixtures_nvfp4 import EXAMPLE_DIRS, dequantize_nvfp4
from helpers import run_cli

from mxconvert.formats.registry import FORMATS, Format, format_of, open_model

QWEN_MO = EXAMPLE_DIRS["tiny-nvfp4-modelopt-qwen3"]


def test_every_format_implements_every_hook_of_the_protocol():
    hooks = {name for name, value in vars(Format).items() if inspect.isfunction(value) and not name.startswith("_")}
    assert {
        "select",
        "geometry",
        "canonical_specs",
        "layout_for",
        "layout_from_target",
        "plan_ranks",
        "load",
        "load_bits",
        "dequantize",
    } <= hooks
    for fmt in FORMATS.values():
        for hook in hooks:
            ours = inspect.signature(getattr(type(fmt), hook))
            declared = inspect.signature(getattr(Format, hook))
            assert list(ours.parameters) == list(declared.parameters), (fmt.name, hook)


def test_nvfp4_dequantize_matches_the_example_generators_reference():
    ckpt = open_model(str(QWEN_MO))
    fmt = format_of(ckpt)
    assert fmt.name == "nvfp4"
    prefix = "model.layers.0.mlp.experts.0.gate_proj"
    packed, scales = ckpt.tensor(f"{prefix}.weight"), ckpt.tensor(f"{prefix}.weight_scale")
    # The hook stops before the global scale (the same factor on both sides of verify's comparison).
    assert torch.equal(fmt.dequantize(packed, scales), dequantize_nvfp4(packed, scales, 1.0))


def test_verify_samples_dequantized_nvfp4_experts(tmp_path):
    # TRTLLM moves its block scales (the sample restores them); MARLIN rescales them (no inverse:
    # the bit-exact check of the derived tensors covers them, the sample skips them).
    for profile, sampled in (("b200", True), ("a100", False)):
        out = tmp_path / profile
        assert run_cli("convert", QWEN_MO, "--profile", profile, "-o", out).exit_code == 0
        result = run_cli("verify", out, "--json")
        report = json.loads(result.stdout)
        assert result.exit_code == 0 and report["ok"], report
        if sampled:
            assert report["max_dequant_diff"] and set(report["max_dequant_diff"].values()) == {0.0}
        else:
            assert report["max_dequant_diff"] == {}
