"""NVFP4 through the plugin. For every NVFP4 backend mxconvert writes for vLLM 0.33.0, for the
ModelOpt and the compressed-tensors example (Qwen3-MoE, 4 experts, 2 MoE layers), at TP=1 and TP=2
(rank 1): path A (vLLM's own loading of the checkpoint and its own `process_weights_after_loading`)
and path B (the artifact through the plugin) leave vLLM 0.33.0's MoE blocks in identical state:
every parameter, buffer and attribute of every module (names, dtypes, shapes, strides, bytes, tensor
attributes), the quant method with its quant config (g1/g2 alphas, activation scales, block scales,
CuteDSL's MMA view), its modular kernel (prepare/finalize and expert objects), and `moe_config`
(padded sizes). Stand-ins: harness.py and harness_nvfp4.py docstrings.

One difference is allowed and asserted: compressed-tensors' four checkpoint global-scale parameters
(`w13_weight_global_scale`, `w2_weight_global_scale`, `w13_input_global_scale`,
`w2_input_global_scale`), which vLLM 0.33.0 leaves on the layer after its conversion and never reads
again. The artifact does not hold them (they are folded into the kernel scales); the plugin keeps
them with vLLM's names, dtypes, shapes and strides, zero-filled.

Refusals: another backend, capability, TP size, rank, a tampered manifest, and on_mismatch=reconvert
(NVFP4 scales have no exact inverse) are refused naming the field, before any weight file is opened.
"""
from __future__ import annotations

import json
import shutil

import harness as H
import harness_nvfp4 as N
import pytest
import torch

from mxconvert.errors import MismatchError
from mxconvert.vllm_plugin.install_nvfp4 import unfold

#: backend vLLM's oracle picks -> (profile, extra convert args, capability the worker stands in for)
BACKENDS = {
    "FLASHINFER_TRTLLM": ("b200", (), (10, 0)),
    "FLASHINFER_CUTLASS": ("b200", ("--backend", "flashinfer_cutlass"), (10, 0)),
    "VLLM_CUTLASS": ("b200", ("--backend", "cutlass"), (10, 0)),
    "FLASHINFER_CUTEDSL": ("b200", ("--backend", "flashinfer_cutedsl"), (10, 0)),
    "FLASHINFER_CUTEDSL_BATCHED": ("b200", ("--backend", "flashinfer_cutedsl", "--batched"), (10, 0)),
    "MARLIN": ("h100", (), (9, 0)),
}
PARALLEL = {"tp1": (1, 0), "tp2-rank1": (2, 1)}


def artifact(artifacts, checkpoint: str, backend: str, tp: int):
    profile, args, _ = BACKENDS[backend]
    return artifacts.nvfp4(checkpoint, profile, *args) / f"{profile}-tp{tp}"


@pytest.fixture
def pre_processed_calls(monkeypatch):
    """How often the plugin entered vLLM's `weights_already_processed()`."""
    import vllm.model_executor.utils as utils

    calls = []
    original = utils.weights_already_processed

    def counting():
        calls.append(1)
        return original()

    monkeypatch.setattr(utils, "weights_already_processed", counting)
    return calls


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("checkpoint", ["modelopt", "ct"])
def test_plugin_leaves_the_state_vllm_leaves(artifacts, checkpoint, backend, parallel, pre_processed_calls):
    tp, rank = PARALLEL[parallel]
    target = N.Target(checkpoint, backend, BACKENDS[backend][2], tp, rank)
    model_a = N.path_a(target)
    model_b, installer = N.path_b(target, artifact(artifacts, checkpoint, backend, tp))
    assert len(installer.sources) == N.NUM_LAYERS and not installer.reconverted
    # vLLM's pre-processed path where it has one (ModelOpt + TRTLLM), else the bypassed conversion
    uses_pre_processed = checkpoint == "modelopt" and backend == "FLASHINFER_TRTLLM"
    assert len(pre_processed_calls) == (N.NUM_LAYERS if uses_pre_processed else 0)
    for layer_a, layer_b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        assert layer_b.w13_weight.detach().view(torch.uint8).any()  # kernel data, not a released placeholder
        for name in N.CT_LEFTOVER_SCALES if checkpoint == "ct" else ():
            left_a, left_b = getattr(layer_a, name), getattr(layer_b, name)
            assert (left_a.dtype, left_a.shape, left_a.stride()) == (left_b.dtype, left_b.shape, left_b.stride())
            assert bool((left_a != 0).all()) and not left_b.any()
            left_a.data.zero_()  # the one allowed difference (module docstring)
    state_a, state_b = H.module_snapshot(model_a), H.module_snapshot(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)


def test_snapshot_sees_a_scale_bit_and_a_padded_size(artifacts):
    """The comparison can fail: one bit of a folded global scale, or moe_config's unpadded hidden size."""
    target = N.Target("modelopt", "FLASHINFER_TRTLLM", (10, 0), 1, 0)
    model, _ = N.path_b(target, artifact(artifacts, "modelopt", "FLASHINFER_TRTLLM", 1))
    before = H.module_snapshot(model)
    layer = N.routed_experts(model)[1]
    layer.w13_weight_scale_2.data.view(torch.int32)[0] ^= 1
    assert H.module_snapshot(model) != before
    layer.w13_weight_scale_2.data.view(torch.int32)[0] ^= 1
    assert H.module_snapshot(model) == before
    saved = layer.moe_config.hidden_dim_unpadded
    layer.moe_config.hidden_dim_unpadded = None
    assert H.module_snapshot(model) != before
    layer.moe_config.hidden_dim_unpadded = saved
    assert H.module_snapshot(model) == before


def test_unfold_finds_the_exact_preimage_of_the_fold():
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(4096, generator=gen) * 1e-3 + 1e-6
    a = torch.rand(4096, generator=gen) * 10 + 1e-3
    folded = w * a
    x = unfold(folded, a, "t")
    assert torch.equal((x * a).view(torch.int32), folded.view(torch.int32))
    with pytest.raises(MismatchError, match="finite and positive"):
        unfold(folded, torch.zeros_like(a), "t")


def refused(target, art, **kwargs) -> str:
    with pytest.raises(MismatchError) as err:
        N.path_b(target, art, **kwargs)
    return str(err.value)


def test_other_backend_is_refused_before_any_read_and_not_reconverted(artifacts, opened):
    art = artifact(artifacts, "modelopt", "FLASHINFER_TRTLLM", 1)
    opened.clear()  # the in-process conversion above read the checkpoint
    target = N.Target("modelopt", "FLASHINFER_TRTLLM", (10, 0), 1, 0)
    for mode in ("fail", "reconvert"):
        message = refused(target, art, live_backend="FLASHINFER_CUTLASS", on_mismatch=mode)
        assert ("field 'backend': artifact has 'FLASHINFER_TRTLLM', this layer model.layers.0.mlp.experts has "
                "'FLASHINFER_CUTLASS'") in message
        assert "--profile b200" in message and "--backend flashinfer_cutlass --tp 1" in message
        assert "on_mismatch=reconvert does not apply to NVFP4 artifacts" in message
    assert opened == []


def test_other_capability_is_refused(artifacts, opened):
    art = artifact(artifacts, "ct", "MARLIN", 1)
    opened.clear()
    message = refused(N.Target("ct", "MARLIN", (8, 0), 1, 0), art)
    assert "field 'capability': artifact has [9, 0], this worker has [8, 0]" in message
    assert "--profile a100" in message
    assert opened == []


def test_other_tp_size_is_refused(artifacts, opened):
    art = artifact(artifacts, "modelopt", "VLLM_CUTLASS", 1)
    opened.clear()
    message = refused(N.Target("modelopt", "VLLM_CUTLASS", (10, 0), 2, 0), art)
    assert "field 'tp_size': artifact has 1" in message and "--backend cutlass --tp 2" in message
    # the TP slice also shows in the checkpoint shapes vLLM allocated
    assert "field 'checkpoint shape of w13_weight': artifact has [4, 256, 128]" in message
    assert opened == []


def test_other_rank_is_refused(artifacts, opened):
    art = artifacts.nvfp4("ct", "b200", "--rank", "0", "--backend", "flashinfer_cutedsl", tps=("2",))
    opened.clear()
    message = refused(N.Target("ct", "FLASHINFER_CUTEDSL", (10, 0), 2, 1), art)
    assert "field 'rank': artifact has [0]" in message and "has 1" in message
    assert opened == []


def test_tampered_manifest_is_refused(artifacts, opened, tmp_path):
    art = tmp_path / "tampered"
    shutil.copytree(artifact(artifacts, "modelopt", "FLASHINFER_TRTLLM", 1), art)
    manifest = json.loads((art / "mxconvert.json").read_text())
    manifest["target"]["layout"]["global_scales_folded"] = False
    (art / "mxconvert.json").write_text(json.dumps(manifest))
    opened.clear()
    message = refused(N.Target("modelopt", "FLASHINFER_TRTLLM", (10, 0), 1, 0), art)
    assert "field 'fingerprint'" in message and "edited" in message
    assert opened == []
