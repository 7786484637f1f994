"""The gfx950 CDNA4 scale swizzle follows vLLM's tensor-parallel group size (the attention TP
size), not the MoE's TP slicing: vLLM 0.33.0 decides it by `get_tensor_model_parallel_world_size()`
(quantization/utils/mxfp4_utils.py `should_use_cdna4_mx_scale_swizzle`, <= 2), and flattens TP x DP
into the MoE group (docs/artifact.md). tests_vllm/test_rocm.py loads these artifacts into vLLM."""

from __future__ import annotations

import json

import pytest
from helpers import EXAMPLE, run_cli

from mxconvert.selection import Deployment


@pytest.mark.parametrize(
    "tp, ep, dp, attention",
    [
        (1, 1, 1, 1),
        (2, 1, 1, 2),
        (4, 1, 1, 4),
        (2, 1, 2, 2),
        (4, 1, 2, 4),
        (1, 2, 1, 2),
        (1, 4, 1, 4),
        (1, 4, 2, 2),
        (1, 4, 4, 1),
    ],
)
def test_attention_tp_is_vllms_tp(tp, ep, dp, attention):
    assert Deployment(tp=tp, ep=ep, dp=dp).attention_tp == attention


@pytest.mark.parametrize(
    "args, scale_layout",
    [
        ((), "CDNA4MXScaleLayout"),
        (("--tp", "2"), "CDNA4MXScaleLayout"),
        (("--tp", "4"), "StridedLayout"),
        (("--tp", "2", "--dp", "2"), "CDNA4MXScaleLayout"),  # vLLM TP=2, DP=2
        (("--ep", "2"), "CDNA4MXScaleLayout"),
        (("--ep", "4"), "StridedLayout"),  # vLLM TP=4 with EP
        (("--ep", "4", "--dp", "2"), "CDNA4MXScaleLayout"),  # vLLM TP=2, DP=2 with EP
    ],
)
def test_mi355x_scale_layout_follows_the_attention_tp(tmp_path, args, scale_layout):
    """The plan, the artifact's manifest (which now records `dp_size`) and verify agree."""
    out = tmp_path / "art"
    made = run_cli("convert", EXAMPLE, "--profile", "mi355x", *args, "-o", out)
    assert made.exit_code == 0, made.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert target["layout"]["scale_layout"] == scale_layout
    assert target["dp_size"] == (int(args[args.index("--dp") + 1]) if "--dp" in args else 1)
    checked = run_cli("verify", out, "--json")
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize("command", ["select", "convert"])
@pytest.mark.parametrize("args", [("--ep", "2", "--dp", "4")])
def test_a_dp_that_does_not_divide_the_moe_group_is_refused(tmp_path, command, args):
    """`--ep` names the EP group, TP x DP ranks in vLLM: a `--dp` that does not divide it is a
    deployment vLLM cannot run; refused with exit 2, naming the command to use, nothing written.
    (`--tp` is vLLM's --tensor-parallel-size: any `--dp` goes with it; tests/test_vllm_parallel.py.)"""
    out = tmp_path / "art"
    extra = ("-o", out) if command == "convert" else ()
    result = run_cli(command, EXAMPLE, "--profile", "mi355x", *args, *extra)
    assert result.exit_code == 2, result.output
    assert "must be a multiple of --dp" in result.output and "Traceback" not in result.output
    assert not out.exists()
