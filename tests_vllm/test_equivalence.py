"""Path A (vLLM's own loading and post-processing of the checkpoint) and path B (the plugin,
loading the mxconvert artifact) leave vLLM 0.33.0's MoE blocks in identical state: every parameter,
buffer and attribute of every module (bytes, dtype, shape, stride, tensor attributes), the quant
method with its triton_kernels tensors (layout class and arguments), precision configs, quant config
and modular kernel, and the process-wide triton_kernels opt-flag constraints."""

from __future__ import annotations

import harness as H
import pytest
import torch

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

#: (backend vLLM's oracle picks, profile, extra convert args, capability the worker stands in for)
BACKENDS = {
    "TRITON-hopper": ("TRITON", "h100", (), (9, 0)),
    "TRITON-blackwell": ("TRITON", "b200", ("--backend", "triton"), (10, 0)),
    "TRITON_UNFUSED-hopper": ("TRITON_UNFUSED", "h100", ("--backend", "triton_unfused"), (9, 0)),
    "TRTLLM_BF16": ("FLASHINFER_TRTLLM_MXFP4_BF16", "b200", (), (10, 0)),
    "TRTLLM_MXFP8": ("FLASHINFER_TRTLLM_MXFP4_MXFP8", "b200", ("--backend", "flashinfer_trtllm_afp8"), (10, 0)),
    "CUTLASS_MXFP8": ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "b200", ("--backend", "flashinfer_cutlass_afp8"), (10, 0)),
    "MARLIN": ("MARLIN", "a100", (), (8, 0)),
    "MARLIN-fp8": ("MARLIN", "l40s", ("--marlin-input-dtype", "fp8"), (8, 9)),
}
#: The live worker's environment for a case (vLLM reads VLLM_MARLIN_INPUT_DTYPE at load time).
ENV = {"MARLIN-fp8": {"VLLM_MARLIN_INPUT_DTYPE": "fp8"}}
PARALLEL = {"tp1": (1, 0), "tp2-rank0": (2, 0), "tp2-rank1": (2, 1)}


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("name", BACKENDS)
def test_plugin_leaves_the_state_vllm_leaves(artifacts, name, parallel, monkeypatch):
    backend, profile, args, cap = BACKENDS[name]
    for key, value in ENV.get(name, {}).items():
        monkeypatch.setenv(key, value)
    tp, rank = PARALLEL[parallel]
    art = artifacts.get(profile, "--tp", str(tp), *args)
    target = H.Target(backend, cap, tp, rank)
    H.reset_opt_flags()
    state_a = H.state(H.path_a(target))
    H.reset_opt_flags()
    model_b, installer = H.path_b(target, art)
    state_b = H.state(model_b)
    assert installer.sources and not installer.reconverted
    assert state_a == state_b, H.first_difference(state_a, state_b)
    experts = H.routed_experts(model_b)
    # the converted layer really holds kernel-format data (not the zero-filled checkpoint shape)
    w13 = experts[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()


def test_snapshot_sees_one_byte_and_one_layout_argument(artifacts):
    """The comparison can fail: a flipped byte of a triton storage, or another num_warps, differ."""
    art = artifacts.get("h100", "--tp", "1")
    target = H.Target("TRITON", (9, 0), 1, 0)
    model, _ = H.path_b(target, art)
    before = H.module_snapshot(model)
    method = H.routed_experts(model)[1].quant_method
    scale = method.w13_precision_config.weight_scale
    scale.storage.layout.num_warps = 4
    assert H.module_snapshot(model) != before
    scale.storage.layout.num_warps = 8
    assert H.module_snapshot(model) == before
    data = H.routed_experts(model)[0].w2_weight.storage.data
    data[0, 1, 2] ^= 1
    assert H.module_snapshot(model) != before


@pytest.mark.parametrize("parallel", ["tp1", "tp2-rank1"])
def test_batched_marlin_leaves_the_state_vllm_leaves(artifacts, parallel):
    """BATCHED_MARLIN (`--batched`, e.g. DeepEP low-latency on Ampere): as above, with the batched
    deployment stood in (harness.batched_deployment: vLLM's own BatchedPrepareAndFinalize, the
    BatchedExperts activation format)."""
    tp, rank = PARALLEL[parallel]
    art = artifacts.in_process(H.EXAMPLE, "a100", "--batched") / f"a100-tp{tp}"
    target = H.Target("BATCHED_MARLIN", (8, 0), tp, rank)
    state_a = H.state(H.path_a(target))
    model_b, installer = H.path_b(target, art)
    assert installer.sources and not installer.reconverted
    state_b = H.state(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)
    assert type(H.routed_experts(model_b)[0].quant_method.moe_kernel.fused_experts).__name__ == "BatchedMarlinExperts"
