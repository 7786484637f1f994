"""NVFP4 through the plugin. For every NVFP4 backend mxconvert writes for vLLM 0.33.0, for the ModelOpt and
the compressed-tensors example (Qwen3-MoE, 4 experts, 2 MoE layers), at TP=1 and TP=2 (rank 1; rank 0
for every backend of the ModelOpt example and Marlin of the compressed-tensors one): path A (vLLM's own
loading of the checkpoint and its own `process_weights_after_loading`) and path B (the artifact through
the plugin) leave vLLM 0.33.0's MoE blocks in identical state: every parameter, buffer and attribute of
every module (names, dtypes, shapes, strides, bytes, tensor attributes), the quant method with its quant
config (g1/g2 alphas, activation scales, block scales, CuteDSL's MMA view), its modular kernel
(prepare/finalize and expert objects), and `moe_config` (padded sizes). Stand-ins: harness.py and
harness_nvfp4.py docstrings.

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

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.install_nvfp4 import unfold

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

BACKENDS = N.BACKENDS
#: TP=2 rank 0 for every backend of one format (ModelOpt) and one of the other: the matrix stays small
PARALLEL_CASES = [("modelopt", b, p) for b in BACKENDS for p in N.PARALLEL] + [
    ("ct", b, p) for b in BACKENDS for p in N.PARALLEL if p != "tp2-rank0" or b == "MARLIN"
]


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


@pytest.mark.parametrize("checkpoint, backend, parallel", PARALLEL_CASES)
def test_plugin_leaves_the_state_vllm_leaves(artifacts, checkpoint, backend, parallel, pre_processed_calls):
    target = N.target(checkpoint, backend, parallel)
    model_a = N.path_a(target)
    model_b, installer = N.path_b(target, artifact(artifacts, checkpoint, backend, target.tp))
    N.assert_same_state(target, model_a, model_b, installer, pre_processed_calls)


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
        assert (
            "field 'backend': artifact has 'FLASHINFER_TRTLLM', this layer model.layers.0.mlp.experts has "
            "'FLASHINFER_CUTLASS'"
        ) in message
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
