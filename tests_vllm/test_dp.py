"""Data parallelism without expert parallelism through the plugin (vLLM 0.33.0).

`--data-parallel-size DP` without `--enable-expert-parallel`: vLLM 0.33.0 fused_moe/config.py
`FusedMoEParallelConfig.make` flattens DP x TP into the MoE layers' TP group (TP size TP x DP, TP rank
dp_rank x TP + tp_rank; GPT-OSS's `_load_weights_mxfp4` slices the intermediate size the same way)
and keeps `dp_size` = DP, at which every monolithic kernel class refuses the parallel config
(`_supports_parallel_config`: `dp_size <= 1`). The expert layout of a DP rank is therefore not the
TP layout of the engine: it is the TP slice of the flattened group, made by the backend and kernel
class vLLM picks at DP > 1, i.e. `mxconvert convert MODEL --tp TP --dp DP` (mxconvert's --tp and --dp
are vLLM's --tensor-parallel-size and --data-parallel-size; selection/deployment.py derives the MoE's
sizes from them).

The worker here is a ROCm gfx942 with AITER on, where vLLM's own oracle (harness_rocm.py: not stood
in) picks AITER_TRITON_MXFP4_BF16 (a monolithic class) at DP=1 and TRITON (`OAITritonExperts`) at
DP=2: a TP=1, DP=2 worker (DP rank 1) refuses the artifact made for a DP=1 engine, names the command
with `--dp`, and the artifact that command makes loads, leaving the state vLLM's own load leaves.
"""

from __future__ import annotations

import json

import harness as H
import harness_rocm as R
import pytest

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.checks import LiveLayer, LiveRuntime, convert_command

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

#: TP=1, DP=2, this worker DP rank 1 (MoE TP rank 1 of 2); gfx942, VLLM_ROCM_USE_AITER=1
LIVE = R.RocmTarget("TRITON", "gfx942", True, tp=1, rank=0, dp=2, dp_rank=1)


def run_convert(args: list[str], out) -> dict:
    """`mxconvert convert ARGS -o OUT` in this process; the manifest it wrote."""
    from typer.testing import CliRunner

    from mxconvert.cli.main import app

    done = CliRunner().invoke(app, [*args, "-o", str(out)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads((out / "mxconvert.json").read_text())


def test_dp_worker_refusal_names_the_command_that_makes_its_artifact(artifacts, tmp_path, opened):
    # the artifact of the same engine without DP: AITER Triton, TP 1
    art = artifacts.in_process(H.EXAMPLE, "mi300x-aiter", tps=("1", "2", "4")) / "mi300x-aiter-tp1"
    opened.clear()
    with pytest.raises(MismatchError) as refused:
        R.path_b(LIVE, art)
    message = str(refused.value)
    where = "this layer model.layers.0.mlp.experts"
    assert f"field 'backend': artifact has 'AITER_TRITON_MXFP4_BF16', {where} has 'TRITON'" in message
    assert f"field 'tp_size': artifact has 1, {where} has 2" in message
    assert f"field 'rank': artifact has [0], {where} has 1" in message
    assert opened == []
    line = next(x for x in message.splitlines() if "make a matching artifact:" in x)
    command = line.split("make a matching artifact:", 1)[1].split()
    assert command[:2] == ["mxconvert", "convert"] and command[-2:] == ["-o", "OUT"]
    assert " --tp 1 --dp 2 -o OUT" in line  # vLLM's own sizes: TP 1, DP 2

    manifest = run_convert(command[1:-2], tmp_path / "matching")
    _, model_b, installer = paths_agree(LIVE, tmp_path / "matching")
    assert installer.sources and not installer.reconverted
    layer = H.routed_experts(model_b)[0]
    parallel = layer.moe_config.moe_parallel_config
    assert (parallel.use_ep, parallel.tp_size, parallel.tp_rank, parallel.dp_size) == (False, 2, 1, 2)
    live_class = type(layer.quant_method.moe_kernel.fused_experts).__name__
    target = manifest["target"]
    assert (target["backend"], target["tp_size"], target["ep_size"]) == ("TRITON", 2, 1)
    # the artifact names the kernel class this worker runs ...
    assert target["kernel_class"] == live_class == "OAITritonExperts"
    # ... which the same command without --dp would not: at DP=1 vLLM runs the monolithic class
    without_dp = command[1:-2]
    del without_dp[without_dp.index("--dp") : without_dp.index("--dp") + 2]
    assert run_convert(without_dp, tmp_path / "no-dp")["target"]["kernel_class"] == "OAITritonMxfp4ExpertsMonolithic"


@pytest.mark.parametrize("dp_rank, tp_rank", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_tp2_dp2_artifact_loads_as_vllm_loads_the_checkpoint(tmp_path, dp_rank, tp_rank):
    """`vllm serve -tp 2 -dp 2` (no EP) takes `mxconvert convert MODEL --tp 2 --dp 2`: the MoE layer's
    TP group is the 4 flattened ranks (TP rank dp_rank x 2 + tp_rank), and every worker's path B
    (the artifact) leaves the state of path A (vLLM's own load of the checkpoint)."""
    live = R.RocmTarget("TRITON", "gfx942", True, tp=2, rank=tp_rank, dp=2, dp_rank=dp_rank)
    manifest = run_convert(
        ["convert", str(H.EXAMPLE), "--profile", "mi300x-aiter", "--tp", "2", "--dp", "2"], tmp_path / "a"
    )
    target = manifest["target"]
    assert (target["tp_size"], target["ep_size"], target["dp_size"]) == (4, 1, 2)
    assert (target["serve"]["tensor_parallel_size"], target["serve"]["data_parallel_size"]) == (2, 2)
    assert [entry["plan"]["tp_rank"] for entry in manifest["ranks"]] == [0, 1, 2, 3]
    _, model_b, installer = paths_agree(live, tmp_path / "a")
    assert installer.sources and not installer.reconverted
    layer = H.routed_experts(model_b)[0]
    parallel = layer.moe_config.moe_parallel_config
    assert (parallel.use_ep, parallel.tp_size, parallel.tp_rank, parallel.dp_size) == (
        False,
        4,
        dp_rank * 2 + tp_rank,
        2,
    )


def test_tp2_dp2_worker_refuses_the_artifact_of_the_old_meaning(tmp_path, opened):
    """Before --tp took vLLM's meaning, `--tp 2 --dp 2` planned vLLM TP 1 x DP 2 (MoE TP size 2); such
    an artifact (made today with `--tp 1 --dp 2`) is refused by a TP=2 x DP=2 worker, whose refusal
    names `--tp 2 --dp 2`."""
    live = R.RocmTarget("TRITON", "gfx942", True, tp=2, rank=1, dp=2, dp_rank=1)
    run_convert(["convert", str(H.EXAMPLE), "--profile", "mi300x-aiter", "--tp", "1", "--dp", "2"], tmp_path / "old")
    opened.clear()
    with pytest.raises(MismatchError) as refused:
        R.path_b(live, tmp_path / "old")
    message = str(refused.value)
    assert "field 'tp_size': artifact has 2, this layer model.layers.0.mlp.experts has 4" in message
    assert " --tp 2 --dp 2 -o OUT" in message
    assert opened == []


def paths_agree(target: R.RocmTarget, artifact):
    """Path A (vLLM's own load of the checkpoint on this DP rank) and path B (the artifact) agree."""
    H.reset_opt_flags()
    model_a = R.path_a(target)
    state_a = H.state(model_a)
    H.reset_opt_flags()
    model_b, installer = R.path_b(target, artifact)
    state_b = H.state(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)
    return model_a, model_b, installer


@pytest.mark.parametrize(
    "ep,tp,dp,expected",
    [
        (1, 4, 2, "--tp 2 --dp 2 -o OUT"),  # TP=2 x DP=2 without EP: MoE TP size 4, vLLM's TP 2
        (4, 1, 2, "--ep 4 --dp 2 -o OUT"),  # TP=2 x DP=2 with EP
        (1, 2, 1, "--tp 2 -o OUT"),
        (2, 1, 1, "--ep 2 -o OUT"),
    ],
)
def test_convert_command_carries_the_moe_sizes_and_dp(ep, tp, dp, expected):
    live = LiveRuntime("0.33.0", "cuda", [10, 0], None, "3.5.1")
    layer = LiveLayer("p", "FLASHINFER_TRTLLM_MXFP4_BF16", 0, 0, tp, ep, 0, 32, dp_size=dp)
    command = convert_command({"source": {"identity": {"kind": "hub", "repo_id": "openai/gpt-oss-20b"}}}, live, layer)
    assert command == (
        "mxconvert convert openai/gpt-oss-20b --profile b200 --runtime vllm-0.33 "
        f"--backend flashinfer_trtllm {expected}"
    )


def test_convert_command_pins_the_hub_commit_the_artifact_was_made_from():
    """A hub source is named with the commit the manifest records: the repo's head may have moved."""
    live = LiveRuntime("0.33.0", "cuda", [9, 0], None, "3.5.1")
    layer = LiveLayer("p", "TRITON", 0, 0, 2, 1, 0, 32)
    commit = "0123456789abcdef0123456789abcdef01234567"
    manifest = {"source": {"identity": {"kind": "hub", "repo_id": "openai/gpt-oss-20b", "revision": commit}}}
    assert convert_command(manifest, live, layer) == (
        f"mxconvert convert openai/gpt-oss-20b --revision {commit} --profile h100 --runtime vllm-0.33 "
        "--backend triton --tp 2 -o OUT"
    )
