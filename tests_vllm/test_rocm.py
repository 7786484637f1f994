"""MXFP4 on ROCm through the plugin. For every ROCm MXFP4 backend mxconvert writes for vLLM 0.33.0 --
AITER_MXFP4_BF16 (CK, gfx950), TRITON with the CDNA4 scale layout (gfx950, TP <= 2) and with
StridedLayout scales (gfx950 at TP 4, gfx942), AITER_TRITON_MXFP4_BF16 (gfx942, and gfx950 with
`--moe-backend aiter_triton_mxfp4_bf16`) -- at TP=1 and TP=2 (rank 0 and rank 1): vLLM's own oracle
picks the artifact's backend on the stand-in device, and path A (vLLM's own loading and
`process_weights_after_loading` of the checkpoint) and path B (the artifact through the plugin) leave
vLLM 0.33.0's MoE blocks in identical state: every parameter, buffer and attribute of every module
(bytes, dtype, shape, stride, tensor attributes such as AITER's `is_shuffled`), the quant method with
its triton_kernels tensors (layout class and arguments), precision configs, quant config and modular
kernel, and the process-wide triton_kernels opt-flag constraints. Stand-ins: harness_rocm.py."""

from __future__ import annotations

import harness as H
import harness_rocm as R
import pytest
import torch

from mxconvert.core.errors import MismatchError

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

#: case -> (backend vLLM's oracle picks, gfx, VLLM_ROCM_USE_AITER, profile, convert args, --moe-backend,
#:          the triton_kernels scale layout class vLLM must leave, or None for non-triton backends)
CASES = {
    "AITER_MXFP4_BF16-gfx950": ("AITER_MXFP4_BF16", "gfx950", True, "mi355x-aiter", (), "auto", None),
    "TRITON-cdna4-gfx950": ("TRITON", "gfx950", False, "mi355x", (), "auto", "CDNA4MXScaleLayout"),
    "TRITON-gfx942": ("TRITON", "gfx942", False, "mi300x", (), "auto", "StridedLayout"),
    "TRITON_UNFUSED-cdna4-gfx950": (
        "TRITON_UNFUSED",
        "gfx950",
        False,
        "mi355x",
        ("--backend", "triton_unfused"),
        "triton_unfused",
        "CDNA4MXScaleLayout",
    ),
    "AITER_TRITON-gfx942": ("AITER_TRITON_MXFP4_BF16", "gfx942", True, "mi300x-aiter", (), "auto", "StridedLayout"),
    "AITER_TRITON-cdna4-gfx950": (
        "AITER_TRITON_MXFP4_BF16",
        "gfx950",
        True,
        "mi355x-aiter",
        ("--backend", "aiter_triton_mxfp4_bf16"),
        "aiter_triton_mxfp4_bf16",
        "CDNA4MXScaleLayout",
    ),
}
PARALLEL = {"tp1": (1, 0), "tp2-rank0": (2, 0), "tp2-rank1": (2, 1)}
TPS = ("1", "2", "4")  # one in-process conversion per case; TP=4 for the CDNA4 switch-off test


def target_for(name: str, tp: int, rank: int) -> R.RocmTarget:
    backend, gfx, aiter, _profile, _args, moe_backend, _scale = CASES[name]
    return R.RocmTarget(backend, gfx, aiter, tp, rank, moe_backend)


def artifact_for(artifacts, name: str, tp: int):
    _backend, _gfx, _aiter, profile, args, _moe_backend, _scale = CASES[name]
    return artifacts.in_process(H.EXAMPLE, profile, *args, tps=TPS) / f"{profile}-tp{tp}"


def scale_layout_class(model) -> str:
    method = H.routed_experts(model)[0].quant_method
    return type(method.w13_precision_config.weight_scale.storage.layout).__name__


def paths_agree(target: R.RocmTarget, artifact, on_mismatch: str = "fail"):
    """Path A and path B on `target` (opt-flag constraints reset before each), asserted to leave
    identical state; returns (model A, model B, the plugin's installer)."""
    H.reset_opt_flags()
    model_a = R.path_a(target)
    state_a = H.state(model_a)
    H.reset_opt_flags()
    model_b, installer = R.path_b(target, artifact, on_mismatch=on_mismatch)
    state_b = H.state(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)
    return model_a, model_b, installer


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("name", CASES)
def test_plugin_leaves_the_state_vllm_leaves_on_rocm(artifacts, name, parallel):
    tp, rank = PARALLEL[parallel]
    target = target_for(name, tp, rank)
    art = artifact_for(artifacts, name, tp)
    model_a, model_b, installer = paths_agree(target, art)
    assert installer.sources and not installer.reconverted
    experts = H.routed_experts(model_b)
    w13 = experts[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()  # kernel data, not the zero-filled shape
    expected_scale = CASES[name][-1]
    if expected_scale is None:  # AITER CK: shuffled float4 parameters, flagged for the kernel
        assert w13.dtype == torch.float4_e2m1fn_x2 and w13.is_shuffled and experts[0].w2_weight.is_shuffled
    else:
        assert scale_layout_class(model_a) == expected_scale


def test_cdna4_scale_layout_switches_off_above_tp2(artifacts):
    """vLLM 0.33.0 swizzles gfx950 scales to CDNA4 only at TP <= 2: at TP=4 both paths hold
    StridedLayout scales, and still agree."""
    target = target_for("TRITON-cdna4-gfx950", 4, 3)
    art = artifact_for(artifacts, "TRITON-cdna4-gfx950", 4)
    model_a, _, _ = paths_agree(target, art)
    assert scale_layout_class(model_a) == "StridedLayout"


def test_snapshot_sees_a_flipped_aiter_byte_and_flag(artifacts):
    """The comparison can fail on these layers: one byte of a shuffled AITER scale, or the
    `is_shuffled` flag the CK kernel reads, make the snapshots differ."""
    target = target_for("AITER_MXFP4_BF16-gfx950", 1, 0)
    model, _ = R.path_b(target, artifact_for(artifacts, "AITER_MXFP4_BF16-gfx950", 1))
    before = H.module_snapshot(model)
    layer = H.routed_experts(model)[1]
    layer.w2_weight.is_shuffled = False
    assert H.module_snapshot(model) != before
    layer.w2_weight.is_shuffled = True
    assert H.module_snapshot(model) == before
    layer.w13_weight_scale.data.view(-1)[5] ^= 1
    assert H.module_snapshot(model) != before


def test_snapshot_sees_the_cdna4_layout_class(artifacts):
    """A CDNA4 scale storage relabelled StridedLayout (same bytes) differs."""
    from triton_kernels.tensor_details.layout import StridedLayout

    target = target_for("TRITON-cdna4-gfx950", 1, 0)
    model, _ = R.path_b(target, artifact_for(artifacts, "TRITON-cdna4-gfx950", 1))
    before = H.module_snapshot(model)
    storage = H.routed_experts(model)[0].quant_method.w2_precision_config.weight_scale.storage
    storage.layout = StridedLayout(storage.data.shape)
    assert H.module_snapshot(model) != before


@pytest.mark.parametrize("other", ["TRITON-cdna4-gfx950", "TRITON-gfx942"])
def test_artifact_for_another_rocm_device_is_refused(artifacts, other, opened):
    """An AITER CK artifact (gfx950, AITER on) on a gfx950 worker whose oracle picks TRITON (AITER
    off), or on a gfx942 worker, is refused naming the field, before any weight file is opened; with
    on_mismatch=reconvert it loads through vLLM's own conversion for the live backend and leaves
    exactly the state of path A."""
    art = artifact_for(artifacts, "AITER_MXFP4_BF16-gfx950", 1)
    live = target_for(other, 1, 0)
    with pytest.raises(MismatchError) as refused:
        R.path_b(live, art)
    field = "backend" if other == "TRITON-cdna4-gfx950" else "gfx"
    assert f"field '{field}': artifact has " in str(refused.value)
    assert not opened
    _, _, installer = paths_agree(live, art, on_mismatch="reconvert")
    assert installer.reconverted and not installer.sources


@pytest.mark.parametrize(
    "live_case,artifact_case",
    [("AITER_MXFP4_BF16-gfx950", "TRITON-cdna4-gfx950"), ("AITER_TRITON-gfx942", "TRITON-gfx942")],
)
def test_refusal_names_a_command_that_makes_a_matching_artifact(artifacts, tmp_path, live_case, artifact_case):
    """A TRITON artifact on a worker whose oracle picks an AITER backend is refused; the `mxconvert
    convert` command the refusal names (an `-aiter` profile: AITER runs only with VLLM_ROCM_USE_AITER=1)
    makes an artifact that worker loads, leaving path A's state."""
    from typer.testing import CliRunner

    from mxconvert.cli.main import app

    live = target_for(live_case, 1, 0)
    with pytest.raises(MismatchError) as refused:
        R.path_b(live, artifact_for(artifacts, artifact_case, 1))
    line = next(x for x in str(refused.value).splitlines() if "make a matching artifact:" in x)
    command = line.split("make a matching artifact:", 1)[1].split()
    assert command[:2] == ["mxconvert", "convert"] and command[-2:] == ["-o", "OUT"]
    assert command[command.index("--profile") + 1] == CASES[live_case][3]
    out = tmp_path / "matching"
    done = CliRunner().invoke(app, [*command[1:-1], str(out)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    _, _, installer = paths_agree(live, out)
    assert installer.sources and not installer.reconverted


# ---- expert parallelism under AITER ---------------------------------------------------------------
AITER_CK_EP = {
    rank: R.RocmTarget("AITER_MXFP4_BF16", "gfx950", True, tp=2, rank=rank, expert_parallel=True) for rank in (0, 1)
}


def aiter_ep_artifact(artifacts):
    return artifacts.in_process(H.EXAMPLE, "mi355x-aiter", "--ep", "2", tps=())


@pytest.mark.parametrize("rank", (0, 1))
def test_aiter_ep_experts_are_read_from_the_map_not_the_kernel_mask(artifacts, rank):
    """AITER CK (`AiterMxfp4Experts.consumes_expert_mask`) at EP=2: once vLLM built the kernel, the
    layer's `expert_map` property answers with the 0/1 expert mask (sentinel slot included), not the
    global -> local map; the plugin's experts check reads vLLM's ExpertMapManager, so it names the
    rank's experts before and after the kernel is built, and path A = path B (mask and map buffers
    included)."""
    from mxconvert.runtimes.vllm.loader import held_experts

    _, model_b, installer = paths_agree(AITER_CK_EP[rank], aiter_ep_artifact(artifacts))
    assert installer.sources and not installer.reconverted
    for layer in H.routed_experts(model_b):
        parallel = layer.moe_config.moe_parallel_config
        assert (parallel.use_ep, parallel.ep_size, parallel.ep_rank, parallel.tp_size) == (True, 2, rank, 1)
        assert layer.quant_method.moe_kernel.fused_experts.consumes_expert_mask
        mask = torch.zeros(layer.global_num_experts + 1, dtype=torch.int32)
        mask[2 * rank : 2 * rank + 2] = 1
        assert torch.equal(layer.expert_map, mask)  # what the property hands the AITER kernel now
        assert held_experts(layer) == (2 * rank, 2 * rank + 1)


def test_aiter_ep_other_placement_is_refused(artifacts, monkeypatch, opened):
    """Round-robin placement (forced) under AITER: the map puts experts 0 and 2 in rank 0's slots;
    refused, naming them (vLLM builds the mask from the same map)."""
    import vllm.model_executor.layers.fused_moe.expert_map_manager as emm

    monkeypatch.setattr(emm, "determine_expert_placement_strategy", lambda **_: "round_robin")
    art = aiter_ep_artifact(artifacts)
    opened.clear()
    with pytest.raises(MismatchError) as refused:
        R.path_b(AITER_CK_EP[0], art)
    assert "field 'experts': artifact has '0..1', this layer model.layers.0.mlp.experts has '[0, 2]'" in str(
        refused.value
    )
    assert opened == []


def test_cdna4_scale_swizzle_follows_the_attention_tp_size(artifacts, opened, tmp_path):
    """vLLM 0.33.0 swizzles gfx950 scales to CDNA4 by `should_use_cdna4_mx_scale_swizzle()`: at an
    attention TP size <= 2, whatever the MoE's sizes, and AITER's Triton kernels take the same answer
    as their scale argument. mxconvert decides by the same size (`Deployment.attention_tp`): at TP=2
    with EP (EP=2) the `--ep 2` artifact has CDNA4 scales, at TP=4 with EP (EP=4) the `--ep 4`
    artifact keeps StridedLayout scales, each loading to vLLM's own state. An artifact whose scale
    layout is not the worker's (what `--ep 4` made before mxconvert read the attention TP size;
    here its manifest is edited and resealed) is refused before any weight file is opened, naming
    the field; with on_mismatch=reconvert it loads to vLLM's own state."""
    import json
    import shutil

    from mxconvert.artifact.manifest import seal

    agreeing = R.RocmTarget("TRITON", "gfx950", False, tp=2, rank=1, expert_parallel=True)
    model_a, _, installer = paths_agree(agreeing, artifacts.in_process(H.EXAMPLE, "mi355x", "--ep", "2", tps=()))
    assert installer.sources and scale_layout_class(model_a) == "CDNA4MXScaleLayout"

    live = R.RocmTarget("TRITON", "gfx950", False, tp=4, rank=3, expert_parallel=True)
    art = artifacts.in_process(H.EXAMPLE, "mi355x", "--ep", "4", tps=())
    model_a, _, installer = paths_agree(live, art)
    assert installer.sources and scale_layout_class(model_a) == "StridedLayout"

    stale = tmp_path / "stale"
    shutil.copytree(art, stale)
    manifest = json.loads((stale / "mxconvert.json").read_text())
    assert manifest["target"]["layout"]["scale_layout"] == "StridedLayout"
    manifest["target"]["layout"]["scale_layout"] = "CDNA4MXScaleLayout"
    manifest.pop("fingerprint")
    (stale / "mxconvert.json").write_text(json.dumps(seal(manifest)))
    opened.clear()
    with pytest.raises(MismatchError) as refused:
        R.path_b(live, stale)
    message = str(refused.value)
    assert "field 'CDNA4 scale swizzle': artifact has True, this layer model.layers.0.mlp.experts has False" in message
    assert "--ep 4" in message and "on_mismatch=reconvert cannot bridge" not in message
    assert opened == []
    model_a, _, installer = paths_agree(live, stale, on_mismatch="reconvert")
    assert installer.reconverted and not installer.sources
    assert scale_layout_class(model_a) == "StridedLayout"
