"""NVFP4 backend selection: the upstream auto choices, every modifier, env overrides, explicit names.

Expected values are written from upstream, not from mxconvert's code: vLLM 0.33.0
vllm/model_executor/layers/fused_moe/oracle/nvfp4.py (`select_nvfp4_moe_backend` and the
`is_supported_config` predicates of the expert classes it names), their weight preparation (shape
refusals) and the same oracle file as of vLLM 0.15.0 (with its env overrides); docs/selection.md states
what each decides. Built-in profiles have no `humming` package installed (has_humming=False), so the
SM90 auto choice is MARLIN; the HUMMING branch is tested with a profile that has it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.selection import (
    NVFP4_MOE_BACKEND_NAMES,
    Deployment,
    Selection,
    is_global_sf_supported_for_nvfp4_backend,
    nvfp4_moe_backend_names,
    nvfp4_shape_refusal,
    select_backend,
    select_nvfp4_backend,
)
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.backends import Nvfp4Backend as N
from mxconvert.target.profiles import BUILTIN_PROFILES, DeviceProfile, get_profile
from mxconvert.target.revisions import REVISIONS, get_revision

V033 = get_revision("vllm-0.33", fmt="nvfp4")
V015 = get_revision("vllm-0.15", fmt="nvfp4")


def prof(profile: str | DeviceProfile, **changes) -> DeviceProfile:
    p = get_profile(profile) if isinstance(profile, str) else profile
    return replace(p, **changes) if changes else p


def sel(
    profile: str | DeviceProfile, revision=V033, moe_backend: str = "auto", *, model=None, **deployment
) -> Selection:
    return select_nvfp4_backend(prof(profile), revision, Deployment(**deployment), moe_backend, **(model or {}))


def refused(profile, revision=V033, moe_backend: str = "auto", *, model=None, **deployment) -> str:
    with pytest.raises(UnsupportedError) as info:
        sel(profile, revision, moe_backend, model=model, **deployment)
    return str(info.value)


def check_considered(s: Selection) -> None:
    assert s.considered, "the report is never empty"
    assert [c.chosen for c in s.considered].count(True) == 1
    last = s.considered[-1]
    assert last.chosen and last.backend == s.backend and last.kernel_class == s.kernel_class
    assert all(c.reason for c in s.considered)
    assert all(isinstance(c.backend, N) for c in s.considered)
    assert isinstance(s.backend, N) and s.format == "nvfp4"


# --------------------------------------------------------------------------------------------------
# Auto choices, every built-in profile, both revisions
# --------------------------------------------------------------------------------------------------

TRTLLM_MONO = (N.FLASHINFER_TRTLLM, "TrtLlmNvFp4ExpertsMonolithic")
TRTLLM_MOD = (N.FLASHINFER_TRTLLM, "TrtLlmNvFp4ExpertsModular")
FI_CUTLASS = (N.FLASHINFER_CUTLASS, "FlashInferExperts")
VLLM_CUTLASS = (N.VLLM_CUTLASS, "CutlassExpertsFp4")
MARLIN = (N.MARLIN, "MarlinExperts")
EMULATION = (N.EMULATION, "Nvfp4QuantizationEmulationTritonExperts")

# vLLM 0.33.0 oracle/nvfp4.py auto choice (W4A4, SiLU, FlashInfer installed, no EPLB, Standard format). ROCm / XPU / CPU
# follow from the class predicates (only EMULATION is "CUDA-alike or XPU"; nothing runs on CPU).
AUTO_033 = {
    "a100": (MARLIN, "SM75-SM89 row"),
    "a10g": (MARLIN, "SM75-SM89 row"),
    "l40s": (MARLIN, "SM75-SM89 row"),
    "h100": (MARLIN, "SM90 row without humming"),
    "h200": (MARLIN, "SM90 row without humming"),
    "b200": (TRTLLM_MONO, "SM100 row: TRTLLM Monolithic"),
    "gb200": (TRTLLM_MONO, "SM100 row"),
    "b300": (TRTLLM_MONO, "SM103 row"),
    "thor": (VLLM_CUTLASS, "SM110 row"),
    "rtx-pro-6000": (FI_CUTLASS, "SM120 row"),
    "rtx-5090": (FI_CUTLASS, "SM120 row"),
    "gb10": (FI_CUTLASS, "SM121 row"),
    "mi300x": (EMULATION, "vLLM 0.33.0 oracle/nvfp4.py: EMULATION is CUDA-alike"),
    "mi300x-aiter": (EMULATION, "vLLM 0.33.0 oracle/nvfp4.py: no AITER NVFP4 backend"),
    "mi355x": (EMULATION, "vLLM 0.33.0 oracle/nvfp4.py: EMULATION is CUDA-alike"),
    "mi355x-aiter": (EMULATION, "vLLM 0.33.0 oracle/nvfp4.py: no AITER NVFP4 backend"),
    "intel-xpu": (EMULATION, "vLLM 0.33.0 oracle/nvfp4.py: EMULATION runs on XPU"),
    "cpu": (None, "no backend: NotImplementedError"),
}

# vLLM 0.15.0 oracle/nvfp4.py AVAILABLE_BACKENDS: [TRTLLM, CUTEDSL (batched-format masked kernel), FI CUTLASS,
# MARLIN]; FI CUTLASS runs NVFP4 only on family 10.x in that tree; MARLIN is CUDA only; VLLM_CUTLASS is commented out.
AUTO_015 = {
    "a100": (MARLIN, ""),
    "a10g": (MARLIN, ""),
    "l40s": (MARLIN, ""),
    "h100": (MARLIN, "FI CUTLASS NVFP4 needs family 10.x"),
    "h200": (MARLIN, ""),
    "b200": ((N.FLASHINFER_TRTLLM, "is_supported_config_trtllm"), "TRTLLM first, k_cls None"),
    "gb200": ((N.FLASHINFER_TRTLLM, "is_supported_config_trtllm"), ""),
    "b300": ((N.FLASHINFER_TRTLLM, "is_supported_config_trtllm"), "family 10.x"),
    # tests/golden/selection/vllm-0.15.0-nvfp4.json, tp1 / auto: the 0.15.0 wheel lists VLLM_CUTLASS
    # (capability >= 10.0) before MARLIN, so SM11x/SM12x take it (FI CUTLASS is 9.0 / family 10.x only).
    "thor": ((N.VLLM_CUTLASS, "CutlassExpertsFp4"), "0.15.0 record: VLLM_CUTLASS"),
    "rtx-pro-6000": ((N.VLLM_CUTLASS, "CutlassExpertsFp4"), "0.15.0 record: VLLM_CUTLASS"),
    "rtx-5090": ((N.VLLM_CUTLASS, "CutlassExpertsFp4"), "0.15.0 record: VLLM_CUTLASS"),
    "gb10": ((N.VLLM_CUTLASS, "CutlassExpertsFp4"), "0.15.0 record: VLLM_CUTLASS"),
    "mi300x": (None, "no EMULATION in this revision; MARLIN is CUDA only"),
    "mi300x-aiter": (None, ""),
    "mi355x": (None, ""),
    "mi355x-aiter": (None, ""),
    "intel-xpu": (None, ""),
    "cpu": (None, ""),
}


def test_auto_tables_cover_every_builtin_profile():
    names = {p.name for p in BUILTIN_PROFILES}
    assert set(AUTO_033) == names and set(AUTO_015) == names


@pytest.mark.parametrize("revision,table", [(V033, AUTO_033), (V015, AUTO_015)], ids=["0.33", "0.15"])
def test_auto_choice_every_profile(revision, table):
    for name, (expected, why) in table.items():
        if expected is None:
            msg = refused(name, revision)
            assert "no NVFP4 MoE backend supports" in msg and "NotImplementedError" in msg, name
            continue
        s = sel(name, revision)
        assert (s.backend, s.kernel_class) == expected, f"{name}: {why}"
        check_considered(s)
        assert s.revision == revision.name and s.profile == name and s.requested == "auto"
        assert s.activation == ("bf16" if s.backend == N.MARLIN else "nvfp4")
        assert s.use_a16 is False and s.activation_fn == "silu"
        assert s.marlin_input_dtype is None


def test_why_not_report_033_h100():
    s = sel("h100")
    lines = [(c.backend, c.kernel_class, c.reason) for c in s.considered]
    assert lines[0] == (
        N.FLASHINFER_TRTLLM,
        "TrtLlmNvFp4ExpertsMonolithic",
        "kernel requires CUDA capability family 10.x, profile h100 is 9.0",
    )
    assert (
        N.FLASHINFER_CUTLASS,
        "FlashInferExperts",
        "NVFP4 weights with nvfp4 activations need CUDA capability >= 10.0, profile h100 is 9.0",
    ) in lines
    # prioritize_humming (capability 90): HUMMING is tried before MARLIN.
    order = [c.backend for c in s.considered]
    assert order.index(N.HUMMING) < order.index(N.MARLIN)
    assert (N.HUMMING, "HummingGroupedExperts", "humming not installed on profile h100") in lines
    assert s.considered[-1].reason == "first backend in priority order whose predicates all pass"


def test_humming_on_sm90_only_before_marlin():
    # SM90 auto choice: HUMMING when importable (capability 90 moves it before MARLIN).
    s = sel(prof("h100", has_humming=True))
    assert (s.backend, s.kernel_class) == (N.HUMMING, "HummingGroupedExperts")
    # Elsewhere HUMMING stays after MARLIN.
    assert sel(prof("a100", has_humming=True)).backend == N.MARLIN
    # W4A16 on SM90: HUMMING (prioritize_humming).
    assert sel(prof("h200", has_humming=True), model={"w4a16": True}).backend == N.HUMMING


def test_sm12x_without_flashinfer_uses_vllm_cutlass():
    # SM120/121 auto choice: VLLM_CUTLASS without FlashInfer.
    s = sel(prof("rtx-5090", has_flashinfer=False, has_flashinfer_cutlass=False))
    assert (s.backend, s.kernel_class) == VLLM_CUTLASS
    assert "flashinfer CUTLASS fused MoE not installed" in s.considered[-2].reason


def test_trtllm_needs_its_flashinfer_ops():
    # Class predicates: TRTLLM needs the FI trtllm ops; CUTEDSL needs cute_dsl; then FI CUTLASS on SM100.
    p = prof("b200", extra={"has_flashinfer_trtllm": False, "has_flashinfer_cutedsl": False})
    s = sel(p)
    assert (s.backend, s.kernel_class) == FI_CUTLASS
    assert "flashinfer TRT-LLM fused MoE (trtllm_fp4_block_scale_moe) not installed" in s.considered[0].reason
    p = prof("b200", extra={"has_flashinfer_trtllm": False})
    assert (sel(p).backend, sel(p).kernel_class) == (N.FLASHINFER_CUTEDSL, "FlashInferCuteDSLExperts")


def test_cuda_below_7_5_is_refused_before_selection():
    old = DeviceProfile("v100", "test", "cuda", (7, 0))
    assert "NVFP4 needs CUDA capability >= 7.5" in refused(old)
    assert "NVFP4 needs CUDA capability >= 7.5" in refused(old, V015)


def test_revision_without_nvfp4_is_refused():
    with pytest.raises(InputError) as info:
        sel("b200", get_revision("vllm-0.20"))
    able = ", ".join(sorted(r.name for r in REVISIONS.values() if "nvfp4" in r.formats))
    assert str(info.value) == f"runtime revision vllm-0.20 defines no NVFP4 layouts; revisions that do: {able}"
    assert "vllm-0.15" in able and "vllm-0.33" in able


# --------------------------------------------------------------------------------------------------
# Modifiers (0.33)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deployment,reason",
    [
        ({"eplb": True}, "monolithic kernel does not support EPLB"),
        ({"dp": 2, "ep": 2}, "monolithic kernel does not support all2all kernels (dp=2 with ep=2)"),
        (
            {"all2all": "deepep_high_throughput", "dp": 2, "ep": 2},
            "monolithic kernel does not support all2all kernels (all2all=deepep_high_throughput)",
        ),
    ],
)
def test_sm100_modular_rows(deployment, reason):
    # DP+EP all2all (Standard format), EPLB -> TRTLLM Modular (the monolithic class refuses them).
    s = sel("b200", **deployment)
    assert (s.backend, s.kernel_class) == TRTLLM_MOD
    assert s.considered[0].reason == reason
    check_considered(s)


def test_routing_method():
    # An unsupported routing method -> Modular; supported ones stay Monolithic.
    s = sel("b200", model={"routing_method": "TopK"})
    assert (s.backend, s.kernel_class) == TRTLLM_MOD
    assert s.considered[0].reason == "kernel does not support TopK routing"
    for ok in ("DeepSeekV3", "renormalize", "Llama4", "MiniMax2"):
        assert sel("gb200", model={"routing_method": ok}).kernel_class == "TrtLlmNvFp4ExpertsMonolithic"
    with pytest.raises(InputError, match="unknown routing method 'softmax'"):
        sel("b200", model={"routing_method": "softmax"})


def test_batched_format_cutedsl_batched():
    # SM100 with deepep_low_latency / nixl_ep (Batched) -> FLASHINFER_CUTEDSL_BATCHED.
    s = sel("b200", batched=True, all2all="deepep_low_latency", dp=2, ep=2)
    assert (s.backend, s.kernel_class) == (N.FLASHINFER_CUTEDSL_BATCHED, "FlashInferCuteDSLBatchedExperts")
    assert "batched format" in s.considered[0].reason or "all2all" in s.considered[0].reason
    # "SiLU only; else HUMMING batched if installed; else none".
    msg = refused("b200", batched=True, model={"activation_fn": "gelu_tanh"})
    assert (
        "FLASHINFER_CUTEDSL_BATCHED [FlashInferCuteDSLBatchedExperts]: kernel does not support gelu_tanh activation"
        in msg
    )
    s = sel(prof("b200", has_humming=True), batched=True, model={"activation_fn": "gelu_tanh"})
    assert (s.backend, s.kernel_class) == (N.HUMMING, "BatchedHummingGroupedExperts")
    # Non-gated layers: the batched CuteDSL kernel has no no-act-and-mul support.
    msg = refused("b200", batched=True, model={"activation_fn": "relu2_no_mul"})
    assert "kernel does not support no act_and_mul MLP layer" in msg
    # Explicit flashinfer_cutedsl turns into its batched variant.
    s = sel("b200", V033, "flashinfer_cutedsl", batched=True)
    assert s.backend == N.FLASHINFER_CUTEDSL_BATCHED


def test_swiglu_limit_only_clamp_backends():
    # swiglu_limit: CUTEDSL_BATCHED (and FLASHINFER_B12X) are not clamp backends and leave the list.
    s = sel(prof("b200", has_humming=True), batched=True, model={"swiglu_limit": 7.0})
    assert (s.backend, s.kernel_class) == (N.HUMMING, "BatchedHummingGroupedExperts")
    dropped = [c for c in s.considered if c.backend == N.FLASHINFER_CUTEDSL_BATCHED]
    assert dropped == [dropped[0]] and dropped[0].kernel_class is None
    assert dropped[0].reason == "dropped: does not apply the SwiGLU clamp (swiglu_limit=7.0)"
    msg = refused("b200", batched=True, model={"swiglu_limit": 7.0})
    assert "FLASHINFER_CUTEDSL_BATCHED: dropped: does not apply the SwiGLU clamp" in msg
    # Standard format: clamp-capable TRTLLM still wins (SwiGLU-OAI packed halves).
    s = sel("b200", model={"swiglu_limit": 7.0, "activation_fn": "swigluoai_uninterleave"})
    assert s.kernel_class == "TrtLlmNvFp4ExpertsMonolithic"
    # Interleaved SWIGLUOAI (gpt-oss rows): TRTLLM does not take it, CuteDSL does (their activation sets).
    s = sel("b200", model={"swiglu_limit": 7.0, "activation_fn": "swigluoai"})
    assert (s.backend, s.kernel_class) == (N.FLASHINFER_CUTEDSL, "FlashInferCuteDSLExperts")
    assert s.considered[0].reason == "kernel does not support swigluoai activation"
    # Explicit non-clamp backend: ValueError in vLLM.
    msg = refused("rtx-5090", moe_backend="flashinfer_b12x", model={"swiglu_limit": 7.0})
    assert "swiglu_limit=7.0" in msg and "does not apply the SwiGLU clamp" in msg
    assert "flashinfer_trtllm" in msg and "marlin" in msg and "flashinfer_b12x, " not in msg
    msg = refused("b200", moe_backend="flashinfer_cutedsl", batched=True, model={"swiglu_limit": 7.0})
    assert "(FLASHINFER_CUTEDSL_BATCHED) does not apply the SwiGLU clamp" in msg


def test_w4a16_checkpoints():
    # W4A16 -> MARLIN everywhere (HUMMING on SM90, tested above); no input scales.
    for name in ("a100", "h100", "b200", "b300", "thor", "rtx-5090", "gb10"):
        s = sel(name, model={"w4a16": True})
        assert (s.backend, s.kernel_class) == MARLIN, name
        assert s.use_a16 is True and s.activation == "bf16" and s.use_global_sf is False
    s = sel("b200", model={"w4a16": True})
    assert s.considered[0].reason == ("kernel does not support NVFP4 weights with bf16 activations (supports nvfp4)")
    # EMULATION needs (S, Dyn): nothing on ROCm.
    assert (
        "EMULATION [Nvfp4QuantizationEmulationTritonExperts]: kernel does not support NVFP4 weights with bf16"
        in refused("mi355x", model={"w4a16": True})
    )
    # B12X / FLASHINFER_B12X take W4A16 when requested explicitly on SM12x (by name only).
    s = sel("rtx-5090", moe_backend="flashinfer_b12x", model={"w4a16": True})
    assert (s.backend, s.use_a16, s.activation) == (N.FLASHINFER_B12X, True, "bf16")
    assert "supports nvfp4" in refused("b200", moe_backend="flashinfer_trtllm", model={"w4a16": True})
    # 0.15 too: only MARLIN ignores the missing activation scales.
    assert sel("b200", V015, model={"w4a16": True}).backend == N.MARLIN


def test_ep_with_global_scales():
    for backend in N:
        expected = backend in {
            N.FLASHINFER_TRTLLM,
            N.FLASHINFER_CUTLASS,
            N.FLASHINFER_CUTEDSL,
            N.FLASHINFER_CUTEDSL_BATCHED,
            N.FLASHINFER_B12X,
        }
        assert is_global_sf_supported_for_nvfp4_backend(backend) is expected, backend
        assert is_global_sf_supported_for_nvfp4_backend(backend.value.lower()) is expected
    with pytest.raises(InputError):
        is_global_sf_supported_for_nvfp4_backend(Mxfp4Backend.MARLIN)
    with pytest.raises(InputError):
        is_global_sf_supported_for_nvfp4_backend("TRITON")
    # EP without DP: TRTLLM Monolithic, activation scales reduced over all global experts.
    s = sel("b200", ep=4)
    assert (s.backend, s.kernel_class) == TRTLLM_MONO and s.use_global_sf is True
    assert "input scales of all global experts are reduced to one scalar" in s.considered[-1].reason
    s = sel("thor", ep=2)
    assert s.backend == N.VLLM_CUTLASS and s.use_global_sf is False
    assert "global experts" not in s.considered[-1].reason
    assert sel("b200").use_global_sf is True and "global experts" not in sel("b200").considered[-1].reason
    # ≈0.15: the same set (vLLM 0.15.0 FLASHINFER_NVFP4_MOE_BACKENDS).
    assert sel("b200", V015, ep=2).use_global_sf is True


def test_parallel_predicates():
    # VLLM_CUTLASS refuses DeepEP high-throughput and the FlashInfer NVLink all2alls (CutlassExpertsFp4
    # parallel-config predicate).
    s = sel("thor", all2all="deepep_high_throughput", dp=2, ep=2)
    assert s.backend == N.MARLIN
    assert "kernel does not support the deepep_high_throughput all2all backend" in [
        c.reason for c in s.considered if c.backend == N.VLLM_CUTLASS
    ]
    # MARLIN refuses FlashInfer NVLink two-sided too; EMULATION any FlashInfer NVLink all2all.
    msg = refused("thor", all2all="flashinfer_nvlink_two_sided", dp=2, ep=2)
    assert "MARLIN [MarlinExperts]: kernel does not support FlashInfer NVLink two-sided all2all" in msg
    s = sel("thor", all2all="flashinfer_nvlink_one_sided", dp=2, ep=2)
    assert s.backend == N.MARLIN


def test_lora_and_batch_invariance():
    # LoRA: only MarlinExperts supports it (supports_lora).
    s = sel("b200", lora=True)
    assert s.backend == N.MARLIN
    assert s.considered[0].reason == "kernel class does not support LoRA"
    # VLLM_BATCH_INVARIANT=1: VLLM_CUTLASS and HUMMING only (_supports_batch_invariance).
    s = sel("b200", env={"VLLM_BATCH_INVARIANT": "1"})
    assert (s.backend, s.kernel_class) == VLLM_CUTLASS
    assert s.considered[0].reason == "kernel does not support batch invariance (VLLM_BATCH_INVARIANT=1)"
    assert "kernel does not support batch invariance" in refused("h100", env={"VLLM_BATCH_INVARIANT": "1"})
    assert sel("b200", env={"VLLM_BATCH_INVARIANT": "0"}).backend == N.FLASHINFER_TRTLLM


def test_activation_functions():
    # Non-gated relu2: TRTLLM and FI CUTLASS take it (their activation sets).
    assert sel("b200", model={"activation_fn": "relu2_no_mul"}).kernel_class == "TrtLlmNvFp4ExpertsMonolithic"
    assert sel("rtx-5090", model={"activation_fn": "relu2_no_mul"}).backend == N.FLASHINFER_CUTLASS
    # SWIGLUSTEP is only in the apply set: VLLM_CUTLASS on SM100.
    s = sel("b200", model={"activation_fn": "SwiGLUStep"})
    assert s.backend == N.VLLM_CUTLASS and s.activation_fn == "swiglustep"
    # SITU on TRTLLM only when FlashInfer exposes it.
    assert sel("b200", model={"activation_fn": "situ"}).backend == N.FLASHINFER_CUTEDSL
    p = prof("b200", extra={"flashinfer_situ": True})
    assert sel(p, model={"activation_fn": "situ"}).backend == N.FLASHINFER_TRTLLM
    with pytest.raises(InputError, match="unknown MoE activation 'swish'"):
        sel("b200", model={"activation_fn": "swish"})
    # 0.15: TRTLLM silu only; the FlashInfer kernels pass swigluoai over and VLLM_CUTLASS, listed
    # before MARLIN in the 0.15.0 wheel (vllm-0.15.0-nvfp4.json, b200 / env-VLLM_USE_FLASHINFER_MOE_FP4=0
    # -> VLLM_CUTLASS), takes it; gated only.
    s = sel("b200", V015, model={"activation_fn": "swigluoai"})
    assert s.backend == N.VLLM_CUTLASS
    assert all("does not support swigluoai" in c.reason for c in s.considered[:3])
    # gelu: not in the FlashInfer kernels' sets; 0.15.0 cutlass_moe.py CutlassExpertsFp4._supports_activation
    # takes silu, gelu and swigluoai, so VLLM_CUTLASS runs it.
    s = sel("b200", V015, model={"activation_fn": "gelu"})
    assert s.backend == N.VLLM_CUTLASS
    assert [c.reason for c in s.considered[:3]] == ["kernel does not support gelu activation"] * 3


def test_marlin_input_dtype_refused():
    # prepare_nvfp4_moe_layer_for_marlin: NVFP4 Marlin accepts only 16-bit activations.
    msg = refused("l40s", marlin_input_dtype="fp8")
    assert "VLLM_MARLIN_INPUT_DTYPE=fp8 is refused for NVFP4 Marlin" in msg
    assert "is refused for NVFP4 Marlin" in refused("a100", V015, marlin_input_dtype="int8")
    # Not Marlin: no effect.
    assert sel("b200", marlin_input_dtype="fp8").marlin_input_dtype is None


# --------------------------------------------------------------------------------------------------
# Shape refusals (weight preparation; docs/selection.md "Shape refusals", docs/layouts.md)
# --------------------------------------------------------------------------------------------------


def test_shape_refusal_helper():
    f = nvfp4_shape_refusal
    # N = 96 (768 at TP 8): 2N = 192 is not a multiple of 128.
    for b in (N.FLASHINFER_CUTLASS, N.VLLM_CUTLASS, N.FLASHINFER_CUTEDSL_BATCHED, N.FLASHINFER_B12X):
        assert "2N = 192" in f(b, V033, 2048, 96), b
        assert f(b, V033, 2048, 128) is None
        assert f(b, V033, 2048, 96, gated=False) is None  # non-gated layers are padded
    for b in (N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTEDSL, N.MARLIN, N.B12X, N.HUMMING, N.EMULATION):
        assert f(b, V033, 2048, 96) is None, b  # 0.33 pads these itself
    assert "hidden size % 64 == 0, got 96" in f(N.MARLIN, V033, 96, 128)
    assert f(N.MARLIN, V033, 192, 128) is None
    # ≈0.15 pads nothing.
    for b in (N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTLASS, N.FLASHINFER_CUTEDSL):
        assert "pads nothing" in f(b, V015, 2048, 96), b
    assert f(N.MARLIN, V015, 2048, 96) is None
    assert "not a multiple of the NVFP4 block size 16" in f(N.MARLIN, V033, 2056, 128)
    assert "not a multiple of 16" in f(N.FLASHINFER_TRTLLM, V033, 2048, 100)


def test_shape_refusals_in_selection():
    # SM120 picks FLASHINFER_CUTLASS, whose preparation raises for N = 96: refused, not re-chosen.
    msg = refused("rtx-5090", model={"intermediate_size": 768}, tp=8)
    assert "selects FLASHINFER_CUTLASS (FlashInferExperts)" in msg and "2N = 192" in msg
    # With EP the MoE is not TP-sharded: N = 768.
    assert sel("rtx-5090", model={"intermediate_size": 768}, tp=8, ep=8).backend == N.FLASHINFER_CUTLASS
    # TRTLLM pads N to 64 in 0.33 but not in ≈0.15 (`nvfp4_fi_padding`).
    assert sel("b200", model={"intermediate_size": 768, "hidden_size": 2048}, tp=8).backend == N.FLASHINFER_TRTLLM
    assert "pads nothing" in refused("b200", V015, model={"intermediate_size": 768}, tp=8)
    assert "hidden size % 64" in refused("a100", model={"hidden_size": 2080})
    with pytest.raises(InputError, match="tp 5 does not divide intermediate_size 768"):
        sel("b200", model={"intermediate_size": 768}, tp=5)
    with pytest.raises(InputError, match="hidden_size must be a positive integer"):
        sel("b200", model={"hidden_size": 0})


# --------------------------------------------------------------------------------------------------
# Explicit --moe-backend names (0.33)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profile,name,expected",
    [
        ("b200", "flashinfer_trtllm", TRTLLM_MONO),
        ("b200", "FlashInfer-TRTLLM", TRTLLM_MONO),
        ("b200", "flashinfer_cutlass", FI_CUTLASS),
        ("b200", "flashinfer_cutedsl", (N.FLASHINFER_CUTEDSL, "FlashInferCuteDSLExperts")),
        ("b200", "cutlass", VLLM_CUTLASS),
        ("thor", "cutlass", VLLM_CUTLASS),
        ("b200", "marlin", MARLIN),
        ("a100", "emulation", EMULATION),
        ("mi300x", "emulation", EMULATION),
        ("rtx-5090", "flashinfer_b12x", (N.FLASHINFER_B12X, "FlashInferB12xExperts")),
    ],
)
def test_explicit_names_accepted(profile, name, expected):
    s = sel(profile, moe_backend=name)
    assert (s.backend, s.kernel_class) == expected
    assert s.requested == name.lower().replace("-", "_")
    assert s.considered[-1].reason.startswith("--moe-backend ")
    check_considered(s)


@pytest.mark.parametrize(
    "profile,name,reason",
    [
        (
            "h100",
            "flashinfer_trtllm",
            "FLASHINFER_TRTLLM [TrtLlmNvFp4ExpertsModular]: "
            "kernel requires CUDA capability family 10.x, profile h100 is 9.0",
        ),
        (
            "h100",
            "flashinfer_cutlass",
            "NVFP4 weights with nvfp4 activations need CUDA capability >= 10.0, profile h100 is 9.0",
        ),
        (
            "thor",
            "flashinfer_cutlass",
            "kernel requires CUDA capability 9.0, family 10.x or family 12.x (SM110 excluded), profile thor is 11.0",
        ),
        ("h100", "cutlass", "kernel requires CUDA capability family 10.x, 11.x or 12.x, profile h100 is 9.0"),
        ("rtx-5090", "flashinfer_cutedsl", "kernel requires CUDA capability family 10.x, profile rtx-5090 is 12.0"),
        ("mi300x", "marlin", "kernel requires CUDA, profile mi300x is ROCm gfx942"),
        ("h100", "humming", "humming not installed on profile h100"),
        ("cpu", "emulation", "emulation requires CUDA, ROCm or XPU, profile cpu is CPU"),
        ("rtx-5090", "b12x", "the b12x package not installed on profile rtx-5090"),
        ("b200", "b12x", "kernel requires CUDA capability family 12.x, profile b200 is 10.0"),
        ("b200", "flashinfer_b12x", "kernel requires CUDA capability family 12.x, profile b200 is 10.0"),
    ],
)
def test_explicit_names_refused_with_reason(profile, name, reason):
    msg = refused(profile, moe_backend=name)
    assert f"--moe-backend {name!r}" in msg and "cannot run on" in msg
    assert reason in msg


def test_b12x_explicit():
    p = prof("rtx-5090", extra={"has_b12x": True})
    s = sel(p, moe_backend="b12x")
    assert (s.backend, s.kernel_class, s.activation, s.use_a16) == (N.B12X, "B12xExperts", "nvfp4", False)
    assert s.use_global_sf is False
    # VLLM_B12X_MOE_FP4_FORCE_A16=1: activation_key None (``_use_a16``).
    s = sel(p, moe_backend="b12x", env={"VLLM_B12X_MOE_FP4_FORCE_A16": "1"})
    assert (s.activation, s.use_a16) == ("bf16", True)
    assert "kernel does not support expert parallelism (ep=2)" in refused(p, moe_backend="b12x", ep=2)
    assert "kernel does not support expert parallelism (ep=2)" in refused("gb10", moe_backend="flashinfer_b12x", ep=2)
    # Never auto-selected.
    assert sel(p).backend == N.FLASHINFER_CUTLASS


def test_unknown_and_unsupported_names():
    with pytest.raises(InputError) as info:
        sel("b200", moe_backend="triton")
    msg = str(info.value)
    assert "unknown --moe-backend 'triton'" in msg
    assert (
        "valid names: auto, b12x, cutlass, flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl, "
        "flashinfer_b12x, marlin, humming, emulation"
    ) in msg
    with pytest.raises(UnsupportedError, match="megakernel transforms the checkpoint tensors itself"):
        sel("b200", moe_backend="flashinfer_moe_ep_cutedsl")
    assert nvfp4_moe_backend_names(V033) == ("auto", *NVFP4_MOE_BACKEND_NAMES)
    assert nvfp4_moe_backend_names(V015) == ("auto",)


def test_033_refuses_legacy_env_and_activation_override():
    for var in ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_TEST_FORCE_FP8_MARLIN"):
        with pytest.raises(InputError, match=f"{var}: removed in v0.33.0"):
            sel("b200", env={var: "1"})
    with pytest.raises(InputError, match="unknown env override"):
        sel("b200", env={"VLLM_SOMETHING": "1"})
    with pytest.raises(InputError, match="is an MXFP4 setting"):
        sel("b200", activation="mxfp8")


# --------------------------------------------------------------------------------------------------
# ≈vLLM 0.15 env overrides (vLLM 0.15.0 oracle/nvfp4.py select_nvfp4_moe_backend)
# --------------------------------------------------------------------------------------------------

FP4 = "VLLM_USE_FLASHINFER_MOE_FP4"
FI_BACKEND = "VLLM_FLASHINFER_MOE_BACKEND"
FORCE_MARLIN = "VLLM_TEST_FORCE_FP8_MARLIN"


def test_015_fp4_off_removes_flashinfer():
    # vllm-0.15.0-nvfp4.json, b200 / env-VLLM_USE_FLASHINFER_MOE_FP4=0 / auto -> VLLM_CUTLASS.
    s = sel("b200", V015, env={FP4: "0"})
    assert s.backend == N.VLLM_CUTLASS
    assert [(c.backend, c.reason) for c in s.considered[:3]] == [
        (N.FLASHINFER_TRTLLM, f"removed by {FP4}=0"),
        (N.FLASHINFER_CUTEDSL, f"removed by {FP4}=0"),
        (N.FLASHINFER_CUTLASS, f"removed by {FP4}=0"),
    ]
    # The backend choice is ignored when the FlashInfer switch is off.
    assert sel("b200", V015, env={FP4: "0", FI_BACKEND: "latency"}).backend == N.VLLM_CUTLASS


@pytest.mark.parametrize(
    "value,expected",
    [
        ("throughput", (N.FLASHINFER_CUTLASS, "FlashInferExperts")),
        ("latency", (N.FLASHINFER_TRTLLM, "is_supported_config_trtllm")),
        ("LATENCY", (N.FLASHINFER_TRTLLM, "is_supported_config_trtllm")),
    ],
)
def test_015_fp4_on_with_backend(value, expected):
    s = sel("b200", V015, env={FP4: "1", FI_BACKEND: value})
    assert (s.backend, s.kernel_class) == expected
    assert s.considered == (s.considered[-1],)
    assert s.considered[-1].reason == f"forced by {FP4}=1 and {FI_BACKEND}={value.lower()}"


def test_015_fp4_on_backend_refused():
    # masked_gemm -> CUTEDSL, the batched-format kernel: ValueError in the Standard format.
    msg = refused("b200", V015, env={FP4: "1", FI_BACKEND: "masked_gemm"})
    assert "forces FLASHINFER_CUTEDSL, which cannot run on profile b200" in msg
    assert "kernel supports only the batched activation format" in msg
    s = sel("b200", V015, env={FP4: "1", FI_BACKEND: "masked_gemm"}, batched=True)
    assert (s.backend, s.kernel_class) == (N.FLASHINFER_CUTEDSL, "FlashInferCuteDSLExperts")
    # vllm-0.15.0-nvfp4.json, h100 / env-...=1,VLLM_FLASHINFER_MOE_BACKEND=latency: latency means
    # FLASHINFER_CUTLASS on h100 in 0.15.0 ("NvFp4 MoE backend 'FLASHINFER_CUTLASS' does not support ...").
    msg = refused("h100", V015, env={FP4: "1", FI_BACKEND: "latency"})
    assert "forces FLASHINFER_CUTLASS, which cannot run on profile h100" in msg
    assert "need CUDA capability family 10.x, profile h100 is 9.0" in msg
    # ≈0.15 FI CUTLASS: dp must be 1 or equal ep.
    msg = refused("b200", V015, env={FP4: "1", FI_BACKEND: "throughput"}, dp=2, ep=4)
    assert "kernel supports only dp == 1 or dp == ep (dp=2, ep=4)" in msg


def test_015_fp4_on_alone_tries_trtllm_first_and_checks_it():
    # vllm-0.15.0-nvfp4.json, b200 / env-VLLM_USE_FLASHINFER_MOE_FP4=1 / auto -> FLASHINFER_TRTLLM: the
    # 0.15.0 wheel tries the FlashInfer backends in order, TRTLLM first, each checked.
    s = sel("b200", V015, env={FP4: "1"})
    assert (s.backend, s.kernel_class) == (N.FLASHINFER_TRTLLM, "is_supported_config_trtllm")
    assert "the first FlashInfer NVFP4 backend whose predicates pass" in s.considered[-1].reason
    # h100: none passes (the record: "NotImplementedError: Found VLLM_USE_FLASHINFER_MOE_FP4=1, but no
    # FlashInfer NVFP4 MoE backend supports the configuration"); mxconvert refuses, naming each.
    msg = refused("h100", V015, env={FP4: "1"})
    assert "no FlashInfer NVFP4 MoE backend supports profile h100" in msg
    assert "NVFP4 weights with nvfp4 activations need CUDA capability family 10.x" in msg


def test_015_force_marlin():
    s = sel("b200", V015, env={FORCE_MARLIN: "1"})
    assert (s.backend, s.kernel_class) == MARLIN
    assert s.considered[-1].reason == f"forced by {FORCE_MARLIN}=1"
    assert sel("b200", V015, env={FORCE_MARLIN: "0"}).backend == N.FLASHINFER_TRTLLM
    # The FlashInfer block comes first in the page.
    assert sel("b200", V015, env={FP4: "1", FI_BACKEND: "latency", FORCE_MARLIN: "1"}).backend == N.FLASHINFER_TRTLLM
    assert sel("b200", V015, env={FP4: "0", FORCE_MARLIN: "1"}).backend == N.MARLIN
    assert "forces MARLIN, which cannot run on profile mi300x" in refused("mi300x", V015, env={FORCE_MARLIN: "1"})
    # The backend choice alone does nothing (the page reads it only under FP4=1).
    assert sel("b200", V015, env={FI_BACKEND: "throughput"}).backend == N.FLASHINFER_TRTLLM


def test_015_batched_and_refusals():
    s = sel("b200", V015, batched=True)
    assert (s.backend, s.kernel_class) == (N.FLASHINFER_CUTEDSL, "FlashInferCuteDSLExperts")
    assert (
        "kernel does not support TopK routing"
        in sel("b200", V015, model={"routing_method": "TopK"}).considered[0].reason
    )
    with pytest.raises(InputError, match="reads no --moe-backend; valid names: auto"):
        sel("b200", V015, moe_backend="flashinfer_trtllm")
    with pytest.raises(InputError, match=f"{FI_BACKEND}='fast': vLLM accepts only throughput, latency, masked_gemm"):
        sel("b200", V015, env={FP4: "1", FI_BACKEND: "fast"})
    with pytest.raises(InputError, match="parses it with int"):
        sel("b200", V015, env={FP4: "yes"})
    with pytest.raises(InputError, match="unknown env override.*VLLM_BATCH_INVARIANT"):
        sel("b200", V015, env={"VLLM_BATCH_INVARIANT": "1"})
    assert "swiglu_limit with NVFP4 is not modelled" in refused("b200", V015, model={"swiglu_limit": 7.0})
    # vllm-0.15.0-nvfp4.json, b200 / lora / auto -> FLASHINFER_TRTLLM: 0.15.0 does not refuse LoRA here.
    assert sel("b200", V015, lora=True).backend == N.FLASHINFER_TRTLLM


# --------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------


def test_to_json_round_trip():
    samples = (
        sel("b200", ep=4),
        sel("h100"),
        sel("b200", V015, env={FP4: "1"}),
        sel(prof("rtx-5090", extra={"has_b12x": True}), moe_backend="b12x", env={"VLLM_B12X_MOE_FP4_FORCE_A16": "1"}),
        sel("b200", model={"activation_fn": "relu2_no_mul", "w4a16": True}),
    )
    for s in samples:
        data = s.to_json()
        back = json.loads(json.dumps(data, sort_keys=True))
        assert back == data
        again = Selection.from_json(back)
        assert again == s
        assert type(again.backend) is N and all(type(c.backend) is N for c in again.considered)
        assert data["format"] == "nvfp4" and data["backend"] == s.backend.value
        assert set(data) == {
            "backend",
            "kernel_class",
            "requested",
            "revision",
            "profile",
            "activation",
            "marlin_input_dtype",
            "considered",
            "format",
            "use_global_sf",
            "use_a16",
            "activation_fn",
        }
    # MXFP4 selections keep their JSON (no "format" key) and still read back as MXFP4.
    m = select_backend(get_profile("h100"), get_revision("vllm-0.33"), Deployment())
    data = m.to_json()
    assert "format" not in data
    back = Selection.from_json(json.loads(json.dumps(data)))
    assert back == m and type(back.backend) is Mxfp4Backend and back.format == "mxfp4"
    with pytest.raises(InputError, match="unknown selection format 'fp8'"):
        Selection.from_json({**data, "format": "fp8"})
