"""Backend selection: the upstream decision table, every modifier, env override and explicit name.

Expected values are written from upstream, not from mxconvert's code: vLLM 0.33.0
vllm/model_executor/layers/fused_moe/oracle/mxfp4.py (`select_mxfp4_moe_backend`), the same file of
vLLM 0.19.0-0.20.0 (`select_gpt_oss_mxfp4_moe_backend`) and the triton_kernels v3.6.0 that vLLM 0.20.0
vendors (TRITON needs 9.0 <= cap < 11.0 in 0.19/0.20). docs/selection.md states what each decides.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.selection import (
    MOE_BACKEND_NAMES,
    MOE_BACKEND_NAMES_BY_STYLE,
    Considered,
    Deployment,
    Selection,
    moe_backend_names,
    select_backend,
)
from mxconvert.target.backends import Mxfp4Backend as B
from mxconvert.target.profiles import BUILTIN_PROFILES, DeviceProfile, get_profile
from mxconvert.target.revisions import get_revision

V033 = get_revision("vllm-0.33")
V020 = get_revision("vllm-0.20")


def sel(profile: str | DeviceProfile, revision=V033, moe_backend: str = "auto", **deployment) -> Selection:
    p = get_profile(profile) if isinstance(profile, str) else profile
    return select_backend(p, revision, Deployment(**deployment), moe_backend)


def refused(profile: str | DeviceProfile, revision=V033, moe_backend: str = "auto", **deployment) -> str:
    with pytest.raises(UnsupportedError) as info:
        sel(profile, revision, moe_backend, **deployment)
    return str(info.value)


def check_considered(s: Selection) -> None:
    """The why-not report: exactly one chosen line, last, naming the selection."""
    assert s.considered, "the report is never empty"
    assert [c.chosen for c in s.considered].count(True) == 1
    last = s.considered[-1]
    assert last.chosen and last.backend == s.backend and last.kernel_class == s.kernel_class
    assert all(c.reason for c in s.considered)


# --------------------------------------------------------------------------------------------------
# Decision table, every built-in profile, both revisions
# --------------------------------------------------------------------------------------------------

MONO_TRITON = (B.TRITON, "OAITritonMxfp4ExpertsMonolithic")
MONO_TRTLLM = (B.FLASHINFER_TRTLLM_MXFP4_BF16, "TrtLlmMxfp4ExpertsMonolithic")
MARLIN = (B.MARLIN, "MarlinExperts")

# vLLM 0.33.0 oracle/mxfp4.py auto choice (no override, no LoRA, TP-only, no humming, default env;
# docs/selection.md "MXFP4, vLLM 0.33.0").
DECISION_033 = {
    "a100": (MARLIN, "SM80/86/87/89 row: MARLIN, TRITON needs >= 9.0"),
    "a10g": (MARLIN, "SM80/86/87/89 row"),
    "l40s": (MARLIN, "SM80/86/87/89 row"),
    "h100": (MONO_TRITON, "SM90 row: TRITON -> OAITritonMxfp4ExpertsMonolithic"),
    "h200": (MONO_TRITON, "SM90 row"),
    "b200": (MONO_TRTLLM, "SM100/SM103 row: FLASHINFER_TRTLLM_MXFP4_BF16 -> TrtLlmMxfp4ExpertsMonolithic"),
    "gb200": (MONO_TRTLLM, "SM100/SM103 row"),
    "b300": (MONO_TRTLLM, "SM100/SM103 row (SM103 is family 10.x)"),
    "thor": (MONO_TRITON, "SM110 row: TRITON; TRTLLM needs family 100, FI-CUTLASS excludes SM110"),
    "rtx-pro-6000": (MARLIN, "SM120/SM121 row: MARLIN, TRITON demoted after BATCHED_MARLIN"),
    "rtx-5090": (MARLIN, "SM120/SM121 row"),
    "gb10": (MARLIN, "SM120/SM121 row (SM121)"),
    "mi300x": (MONO_TRITON, "gfx942 row: TRITON without VLLM_ROCM_USE_AITER"),
    "mi300x-aiter": (
        (B.AITER_TRITON_MXFP4_BF16, "AiterW4A16ExpertsMonolithic"),
        "gfx942 row: AITER_TRITON_MXFP4_BF16 with VLLM_ROCM_USE_AITER=1",
    ),
    "mi355x": (MONO_TRITON, "gfx950 row: TRITON without VLLM_ROCM_USE_AITER"),
    "mi355x-aiter": (
        (B.AITER_MXFP4_BF16, "AiterMxfp4Experts"),
        "gfx950 row: AITER_MXFP4_BF16 (CK) with VLLM_ROCM_USE_AITER=1",
    ),
    "intel-xpu": ((B.XPU, "XPUExpertsMxFp4"), "XPU row"),
    "cpu": ((B.CPU, "CPUExpertsMxfp4"), "CPU row"),
}

# vLLM 0.19-0.20 oracle/mxfp4.py `_get_priority_backends`: [TRTLLM_BF16, AITER(CK), TRITON, CUTLASS_BF16,
# TRITON_UNFUSED, MARLIN, BATCHED_MARLIN, XPU, EMULATION]; TRITON only for 9.0 <= cap < 11.0 (its
# triton_kernels_supported).
DECISION_020 = {
    "a100": (MARLIN, "no TRITON below 9.0"),
    "a10g": (MARLIN, "no TRITON below 9.0"),
    "l40s": (MARLIN, "no TRITON below 9.0"),
    "h100": (MONO_TRITON, "TRITON (9.0 in [9.0, 11.0))"),
    "h200": (MONO_TRITON, "TRITON"),
    "b200": (MONO_TRTLLM, "TRTLLM_BF16 first in the list"),
    "gb200": (MONO_TRTLLM, "TRTLLM_BF16"),
    "b300": (MONO_TRTLLM, "TRTLLM_BF16 (family 10.x)"),
    "thor": (MARLIN, "TRITON needs cap < 11.0; FI-CUTLASS BF16 needs 9.0"),
    "rtx-pro-6000": (MARLIN, "TRITON needs cap < 11.0"),
    "rtx-5090": (MARLIN, "TRITON needs cap < 11.0"),
    "gb10": (MARLIN, "TRITON needs cap < 11.0"),
    "mi300x": (MONO_TRITON, "ROCm 9.4 is in [9.0, 11.0)"),
    "mi300x-aiter": (MONO_TRITON, "no AITER_TRITON_MXFP4_BF16 in 0.20; CK needs gfx950"),
    "mi355x": (MONO_TRITON, "ROCm 9.5 is in [9.0, 11.0)"),
    "mi355x-aiter": ((B.AITER_MXFP4_BF16, "AiterExperts"), "AITER (old CK) before TRITON"),
    "intel-xpu": ((B.XPU, "XPUExpertsMXFp4"), "XPU"),
    "cpu": (None, "no CPU backend: the 0.20 oracle returns NONE"),
}


def test_decision_tables_cover_every_builtin_profile():
    names = {p.name for p in BUILTIN_PROFILES}
    assert set(DECISION_033) == names
    assert set(DECISION_020) == names


@pytest.mark.parametrize(
    "profile,expected",
    [pytest.param(k, v[0], id=f"0.33-{k}: {v[1]}") for k, v in DECISION_033.items()],
)
def test_decision_table_033(profile, expected):
    s = sel(profile, V033)
    assert (s.backend, s.kernel_class) == expected
    assert s.activation == "bf16"
    assert s.requested == "auto" and s.revision == "vllm-0.33" and s.profile == profile
    check_considered(s)


@pytest.mark.parametrize(
    "profile,expected",
    [pytest.param(k, v[0], id=f"0.20-{k}: {v[1]}") for k, v in DECISION_020.items()],
)
def test_decision_table_020(profile, expected):
    if expected is None:
        msg = refused(profile, V020)
        assert "returns NONE" in msg and profile in msg
        return
    s = sel(profile, V020)
    assert (s.backend, s.kernel_class) == expected
    assert s.activation == "bf16" and s.revision == "vllm-0.20"
    check_considered(s)


def test_considered_lists_passed_over_backends_in_priority_order_033():
    s = sel("h100")
    # TRTLLM first (both classes, with the device reason), TRTLLM_MXFP8 filtered by activation,
    # the AITER ones refused for the platform, then TRITON monolithic chosen.
    assert [(c.backend, c.kernel_class) for c in s.considered[:2]] == [
        (B.FLASHINFER_TRTLLM_MXFP4_BF16, "TrtLlmMxfp4ExpertsMonolithic"),
        (B.FLASHINFER_TRTLLM_MXFP4_BF16, "TrtLlmMxfp4ExpertsModular"),
    ]
    assert s.considered[0].reason == "kernel requires CUDA capability family 10.x, profile h100 is 9.0"
    mxfp8 = next(c for c in s.considered if c.backend == B.FLASHINFER_TRTLLM_MXFP4_MXFP8)
    assert mxfp8.kernel_class is None and "mxfp8" in mxfp8.reason and "bf16 requested" in mxfp8.reason
    ck = next(c for c in s.considered if c.backend == B.AITER_MXFP4_BF16)
    assert ck.reason == "kernel requires ROCm, profile h100 is 9.0"
    assert B.FLASHINFER_CUTLASS_MXFP4_BF16 not in {c.backend for c in s.considered}


# --------------------------------------------------------------------------------------------------
# 0.33 modifiers
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deployment", [dict(dp=2), dict(all2all="deepep_high_throughput"), dict(eplb=True)], ids=["dp2", "all2all", "eplb"]
)
def test_parallel_modifiers_drop_monolithic_classes(deployment):
    # vLLM 0.33.0 oracle/mxfp4.py: with dp > 1, all2all or EPLB the monolithic classes drop out:
    # SM100 -> TrtLlmMxfp4ExpertsModular, SM90 -> OAITritonExperts.
    h = sel("h100", **deployment)
    assert (h.backend, h.kernel_class) == (B.TRITON, "OAITritonExperts")
    mono = h.considered[-2]
    assert mono.kernel_class == "OAITritonMxfp4ExpertsMonolithic" and mono.reason.startswith("monolithic kernel")
    b = sel("b200", **deployment)
    assert (b.backend, b.kernel_class) == (B.FLASHINFER_TRTLLM_MXFP4_BF16, "TrtLlmMxfp4ExpertsModular")


def test_dp_reason_text():
    s = sel("h100", dp=2)
    assert "monolithic kernel does not support dp > 1 (dp=2)" in [c.reason for c in s.considered]


def test_mi300x_aiter_with_dp_falls_back_to_modular_triton():
    # AiterW4A16ExpertsMonolithic is monolithic, so dp > 1 leaves OAITritonExperts.
    s = sel("mi300x-aiter", dp=2)
    assert (s.backend, s.kernel_class) == (B.TRITON, "OAITritonExperts")


@pytest.mark.parametrize("profile", ["a100", "h100", "b200", "rtx-pro-6000"])
def test_batched_format_selects_batched_marlin(profile):
    # vLLM 0.33.0 oracle/mxfp4.py: with the batched activation format only BATCHED_MARLIN (or batched
    # Humming) qualifies.
    s = sel(profile, batched=True)
    assert (s.backend, s.kernel_class) == (B.BATCHED_MARLIN, "BatchedMarlinExperts")
    marlin = next(c for c in s.considered if c.backend == B.MARLIN)
    assert marlin.reason == ("kernel supports only the standard activation format, deployment uses the batched format")


def test_batched_with_humming_on_sm90_takes_batched_humming():
    h100 = replace(get_profile("h100"), has_humming=True)
    s = sel(h100, batched=True)
    assert (s.backend, s.kernel_class) == (B.HUMMING, "BatchedHummingGroupedExperts")


def test_lora_auto_033_takes_a_lora_capable_class():
    # vLLM 0.33.0 oracle/mxfp4.py: LoRA forces LoRA-capable classes; TRITON_UNFUSED is not in the auto list, so Marlin.
    for profile in ("h100", "b200", "a100", "rtx-pro-6000"):
        s = sel(profile, lora=True)
        assert (s.backend, s.kernel_class) == MARLIN, profile
    s = sel("h100", lora=True)
    triton = [c for c in s.considered if c.backend == B.TRITON]
    assert [c.reason for c in triton] == ["kernel class does not support LoRA"] * 2


def test_lora_explicit_033():
    s = sel("h100", moe_backend="triton_unfused", lora=True)
    assert (s.backend, s.kernel_class) == (B.TRITON_UNFUSED, "UnfusedOAITritonExperts")
    s = sel("b200", moe_backend="flashinfer_trtllm", lora=True)
    assert (s.backend, s.kernel_class) == (B.FLASHINFER_TRTLLM_MXFP4_BF16, "TrtLlmMxfp4LoRAExperts")
    # Without LoRA the explicit TRTLLM still prefers the monolithic class.
    s = sel("b200", moe_backend="flashinfer_trtllm")
    assert s.kernel_class == "TrtLlmMxfp4ExpertsMonolithic"
    msg = refused("h100", moe_backend="triton", lora=True)
    assert "kernel class does not support LoRA" in msg


def test_lora_on_rocm_033_falls_back_to_emulation():
    # tests/golden/selection/vllm-0.33.0-mxfp4.json, entry mi300x / lora / auto: vLLM 0.33.0's own
    # oracle picks EMULATION (OCP_MXQuantizationEmulationTritonExperts takes LoRA); the ROCm kernels
    # that do not take LoRA are still passed over for it.
    s = sel("mi300x", lora=True)
    assert (s.backend, s.kernel_class) == (B.EMULATION, "OCP_MXQuantizationEmulationTritonExperts")
    assert any(c.backend == B.TRITON and "kernel class does not support LoRA" in c.reason for c in s.considered)


def test_mxfp8_activation_override():
    s = sel("b200", activation="mxfp8")
    assert (s.backend, s.kernel_class) == (B.FLASHINFER_TRTLLM_MXFP4_MXFP8, "TrtLlmMxfp4ExpertsMonolithic")
    assert s.activation == "mxfp8"
    # vllm-0.33.0-mxfp4.json, b200 / mxfp8 / auto: the mxfp8 request goes straight to the MXFP8
    # backends (the bf16 TRTLLM entry is not listed first any more), and TRTLLM MXFP8 wins.
    assert s.considered[0].backend == B.FLASHINFER_TRTLLM_MXFP4_MXFP8
    assert s.considered[0].chosen
    # SM12x: TRTLLM needs family 10.x; FI-CUTLASS takes mxfp8 on cap >= 10.0.
    s = sel("rtx-pro-6000", activation="mxfp8")
    assert (s.backend, s.activation) == (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "mxfp8")
    # SM90 runs no MXFP8-activation kernel: vllm-0.33.0-mxfp4.json, h100 / mxfp8 / auto, falls back to
    # EMULATION (with the mxfp8 activation) instead of refusing; the kernels say why they were passed over.
    s = sel("h100", activation="mxfp8")
    assert (s.backend, s.kernel_class, s.activation) == (
        B.EMULATION,
        "OCP_MXQuantizationEmulationTritonExperts",
        "mxfp8",
    )
    reasons = " ".join(c.reason for c in s.considered)
    assert "MXFP4 weights with mxfp8 activations need CUDA capability >= 10.0, profile h100 is 9.0" in reasons


def test_sm12x_demotes_triton_behind_marlin():
    # vLLM 0.33.0 oracle/mxfp4.py priority modifier: on SM12x TRITON moves to just after BATCHED_MARLIN,
    # so MARLIN wins before TRITON is tried; on SM110 (not SM12x) TRITON keeps its place and wins.
    for profile in ("rtx-pro-6000", "rtx-5090", "gb10"):
        s = sel(profile)
        assert B.TRITON not in {c.backend for c in s.considered}, profile
    assert sel("thor").backend == B.TRITON
    # Explicitly requested, TRITON runs on SM12x in 0.33 (9.0 <= cap < 13.0).
    s = sel("rtx-pro-6000", moe_backend="triton")
    assert (s.backend, s.kernel_class) == MONO_TRITON


def test_sm12x_demotion_order_visible_when_marlin_is_unusable():
    # With Marlin unusable (FI-NVL two-sided all2all) the report shows TRITON tried after BATCHED_MARLIN.
    s = sel("rtx-pro-6000", all2all="flashinfer_all2allv", dp=2)
    order = [c.backend for c in s.considered]
    assert order.index(B.BATCHED_MARLIN) < order.index(B.TRITON)
    assert (s.backend, s.kernel_class) == (B.TRITON, "OAITritonExperts")


def test_humming_promotion_only_on_sm90():
    # vLLM 0.33.0 oracle/mxfp4.py priority modifier: prioritize_humming moves HUMMING directly before
    # MARLIN only on SM90.
    bare_h100 = replace(get_profile("h100"), has_triton_kernels=False, has_flashinfer_cutlass=False)
    assert sel(bare_h100).backend == B.MARLIN
    s = sel(replace(bare_h100, has_humming=True))
    assert (s.backend, s.kernel_class) == (B.HUMMING, "HummingIndexedExperts")
    # Elsewhere HUMMING stays after BATCHED_MARLIN, so MARLIN wins.
    assert sel(replace(get_profile("a100"), has_humming=True)).backend == B.MARLIN
    # On SM90 with triton_kernels, TRITON still comes first.
    assert sel(replace(get_profile("h100"), has_humming=True)).backend == B.TRITON


def test_sm90_fallbacks():
    # vLLM 0.33.0 oracle/mxfp4.py, SM90: falls back to CUTLASS_BF16 (FI), then MARLIN.
    no_triton = replace(get_profile("h100"), has_triton_kernels=False)
    s = sel(no_triton)
    assert (s.backend, s.kernel_class) == (B.FLASHINFER_CUTLASS_MXFP4_BF16, "FlashInferExperts")
    assert s.considered[-2].reason == "triton_kernels not installed on profile h100"
    assert sel(replace(no_triton, has_flashinfer_cutlass=False)).backend == B.MARLIN


def test_sm100_without_flashinfer_takes_triton():
    # vLLM 0.33.0 oracle/mxfp4.py, SM100: without flashinfer, TRITON (Blackwell layouts).
    s = sel(replace(get_profile("b200"), has_flashinfer=False))
    assert (s.backend, s.kernel_class) == MONO_TRITON
    assert s.considered[0].reason == "flashinfer not installed on profile b200"


def test_aiter_switches():
    # CK needs AITER fused MoE (VLLM_ROCM_USE_AITER and VLLM_ROCM_USE_AITER_MOE); AITER Triton only AITER.
    s = sel(replace(get_profile("mi355x-aiter"), rocm_use_aiter_moe=False))
    assert s.backend == B.AITER_TRITON_MXFP4_BF16
    assert "VLLM_ROCM_USE_AITER_MOE" in s.considered[-2].reason
    ck = next(c for c in sel("mi300x-aiter").considered if c.backend == B.AITER_MXFP4_BF16)
    assert ck.reason == "AITER CK MXFP4 kernel requires gfx950 (not gfx1250), profile mi300x-aiter is ROCm gfx942"


def test_global_capability_gate():
    # Mxfp4Config.get_min_capability() = 80 (vLLM 0.33.0 quantization/mxfp4.py), before any backend.
    turing = DeviceProfile("t4", "NVIDIA T4", "cuda", (7, 5), has_triton_kernels=False)
    for revision in (V033, V020):
        msg = refused(turing, revision)
        assert "needs CUDA capability >= 8.0" in msg and "profile t4 is 7.5" in msg


def test_xpu_forced_and_refused():
    msg = refused("intel-xpu", batched=True)
    assert msg.startswith("XPU is forced on the XPU platform but cannot run on profile intel-xpu")
    assert "XPUExpertsMxFp4" in msg and "batched format" in msg
    msg = refused("intel-xpu", V020, batched=True)
    assert "XPUExpertsMXFp4" in msg


def test_cpu_033_refused_when_batched():
    msg = refused("cpu", batched=True)
    assert "CPUExpertsMxfp4" in msg and "no MXFP4 MoE backend supports profile cpu" in msg


# --------------------------------------------------------------------------------------------------
# 0.20 env overrides and LoRA branch (vLLM 0.20.0 oracle/mxfp4.py `select_gpt_oss_mxfp4_moe_backend`)
# --------------------------------------------------------------------------------------------------

BF16 = "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"
MXFP8 = "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"
MXFP8_CUTLASS = "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS"
USE_MARLIN = "VLLM_MXFP4_USE_MARLIN"


def test_env_bf16_on_forces_fi_bf16_per_device():
    s = sel("h100", V020, env={BF16: "1"})
    assert (s.backend, s.kernel_class) == (B.FLASHINFER_CUTLASS_MXFP4_BF16, "FlashInferExperts")
    assert s.considered == (
        Considered(B.FLASHINFER_CUTLASS_MXFP4_BF16, "FlashInferExperts", True, f"forced by {BF16}=1"),
    )
    s = sel("b300", V020, env={BF16: "1"})
    assert (s.backend, s.kernel_class) == MONO_TRTLLM
    msg = refused("a100", V020, env={BF16: "1"})
    assert "only SM90 (CUTLASS) and SM100+ (TRTLLM) are supported" in msg and "a100 is 8.0" in msg
    msg = refused(replace(get_profile("h100"), has_flashinfer_cutlass=False), V020, env={BF16: "1"})
    assert "forces FLASHINFER_CUTLASS_MXFP4_BF16" in msg
    assert "flashinfer CUTLASS fused MoE not installed on profile h100" in msg


def test_env_bf16_off_removes_both_fi_bf16_backends():
    s = sel("b200", V020, env={BF16: "0"})
    assert (s.backend, s.kernel_class) == MONO_TRITON
    assert s.considered[0] == Considered(B.FLASHINFER_TRTLLM_MXFP4_BF16, None, False, f"removed by {BF16}=0")
    no_triton = replace(get_profile("h100"), has_triton_kernels=False)
    assert sel(no_triton, V020).backend == B.FLASHINFER_CUTLASS_MXFP4_BF16
    s = sel(no_triton, V020, env={BF16: "0"})
    assert s.backend == B.MARLIN
    cutlass = next(c for c in s.considered if c.backend == B.FLASHINFER_CUTLASS_MXFP4_BF16)
    assert cutlass.reason == f"removed by {BF16}=0"


def test_env_mxfp8_overrides():
    s = sel("b200", V020, env={MXFP8: "1"})
    assert (s.backend, s.activation) == (B.FLASHINFER_TRTLLM_MXFP4_MXFP8, "mxfp8")
    assert "family 10.x" in refused("h100", V020, env={MXFP8: "1"})
    s = sel("b200", V020, env={MXFP8_CUTLASS: "1"})
    assert (s.backend, s.kernel_class, s.activation) == (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "FlashInferExperts", "mxfp8")
    msg = refused("h100", V020, env={MXFP8_CUTLASS: "1"})
    assert "MXFP4 weights with mxfp8 activations need CUDA capability >= 10.0, profile h100 is 9.0" in msg
    # =0 means "not requested": plain priority order.
    assert sel("b200", V020, env={MXFP8: "0", MXFP8_CUTLASS: "0"}).backend == B.FLASHINFER_TRTLLM_MXFP4_BF16


def test_env_override_order_bf16_first():
    # The oracle reads VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 before the MXFP8 switches.
    s = sel("b200", V020, env={MXFP8: "1", BF16: "1"})
    assert s.backend == B.FLASHINFER_TRTLLM_MXFP4_BF16
    s = sel("b200", V020, env={MXFP8: "1", BF16: "0"})
    assert s.backend == B.FLASHINFER_TRTLLM_MXFP4_MXFP8


def test_env_use_marlin():
    s = sel("h100", V020, env={USE_MARLIN: "1"})
    assert (s.backend, s.kernel_class) == MARLIN
    # The env path does not switch to BATCHED_MARLIN (only --moe-backend marlin does).
    msg = refused("h100", V020, env={USE_MARLIN: "1"}, batched=True)
    assert "forces MARLIN" in msg and "standard activation format" in msg
    assert sel("h100", V020, moe_backend="marlin", batched=True).backend == B.BATCHED_MARLIN
    assert sel("h100", V020, env={USE_MARLIN: "0"}).backend == B.TRITON


def test_env_lora_branch_020():
    # vLLM 0.20.0 oracle/mxfp4.py: `envs.VLLM_MXFP4_USE_MARLIN is False and triton_kernels_supported` -> TRITON_UNFUSED,
    # else MARLIN. Unset gives None (maybe_convert_bool), so the default is MARLIN.
    s = sel("h100", V020, lora=True)
    assert (s.backend, s.kernel_class) == MARLIN
    assert "not set to 0" in s.considered[0].reason
    s = sel("h100", V020, lora=True, env={USE_MARLIN: "0"})
    assert (s.backend, s.kernel_class) == (B.TRITON_UNFUSED, "UnfusedOAITritonExperts")
    assert sel("b200", V020, lora=True, env={USE_MARLIN: "0"}).backend == B.TRITON_UNFUSED
    s = sel("thor", V020, lora=True, env={USE_MARLIN: "0"})
    assert s.backend == B.MARLIN and "9.0 <= cap < 11.0" in s.considered[0].reason
    s = sel(replace(get_profile("h100"), has_triton_kernels=False), V020, lora=True, env={USE_MARLIN: "0"})
    assert s.backend == B.MARLIN and "triton_kernels not installed" in s.considered[0].reason
    # The branch runs before --moe-backend is read.
    s = sel("h100", V020, moe_backend="triton", lora=True)
    assert s.backend == B.MARLIN and "ignored" in s.considered[-1].reason
    assert "only supported on CUDA" in refused("mi300x", V020, lora=True)


@pytest.mark.parametrize(
    "env,needle",
    [
        ({BF16: "true"}, "vLLM parses it with int()"),
        ({"VLLM_USE_FLASHINFER_MOE_MXFP4_BF61": "1"}, "unknown env override"),
    ],
)
def test_bad_env_020(env, needle):
    with pytest.raises(InputError, match=needle):
        sel("h100", V020, env=env)


def test_env_vars_do_not_exist_in_033():
    with pytest.raises(InputError, match="do not exist in vLLM 0.33.0"):
        sel("h100", V033, env={BF16: "1"})


def test_activation_override_does_not_exist_in_020():
    with pytest.raises(InputError, match="activation override does not exist"):
        sel("b200", V020, activation="mxfp8")


# --------------------------------------------------------------------------------------------------
# Explicit --moe-backend names
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profile,name,revision,expected",
    [
        ("h100", "flashinfer_cutlass", V033, (B.FLASHINFER_CUTLASS_MXFP4_BF16, "FlashInferExperts")),
        ("b200", "flashinfer_cutlass_afp8", V033, (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "FlashInferExperts")),
        ("b200", "flashinfer_trtllm_afp8", V033, (B.FLASHINFER_TRTLLM_MXFP4_MXFP8, "TrtLlmMxfp4ExpertsMonolithic")),
        ("b200", "triton", V033, MONO_TRITON),
        ("h100", "triton_unfused", V033, (B.TRITON_UNFUSED, "UnfusedOAITritonExperts")),
        ("h100", "marlin", V033, MARLIN),
        ("mi355x-aiter", "aiter", V033, (B.AITER_MXFP4_BF16, "AiterMxfp4Experts")),
        ("mi300x-aiter", "aiter", V033, (B.AITER_TRITON_MXFP4_BF16, "AiterW4A16ExpertsMonolithic")),
        ("mi355x-aiter", "aiter_triton_mxfp4_bf16", V033, (B.AITER_TRITON_MXFP4_BF16, "AiterW4A16ExpertsMonolithic")),
        ("h100", "emulation", V033, (B.EMULATION, "OCP_MXQuantizationEmulationTritonExperts")),
        ("intel-xpu", "emulation", V033, (B.EMULATION, "OCP_MXQuantizationEmulationTritonExperts")),
        ("intel-xpu", "xpu", V033, (B.XPU, "XPUExpertsMxFp4")),
        ("cpu", "cpu", V033, (B.CPU, "CPUExpertsMxfp4")),
        ("h100", "flashinfer_cutlass", V020, (B.FLASHINFER_CUTLASS_MXFP4_BF16, "FlashInferExperts")),
        ("b200", "flashinfer_cutlass_afp8", V020, (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "FlashInferExperts")),
        ("b200", "triton", V020, MONO_TRITON),
        ("mi355x-aiter", "aiter", V020, (B.AITER_MXFP4_BF16, "AiterExperts")),
        ("a100", "emulation", V020, (B.EMULATION, "OCP_MXQuantizationEmulationTritonExperts")),
    ],
)
def test_explicit_backend_accepted(profile, name, revision, expected):
    s = sel(profile, revision, name)
    assert (s.backend, s.kernel_class) == expected
    assert s.requested == name
    assert s.considered[-1].reason == f"--moe-backend {name}: all predicates pass"
    check_considered(s)


def test_explicit_name_is_normalised():
    assert sel("h100", moe_backend=" FlashInfer-Cutlass ").requested == "flashinfer_cutlass"


def test_explicit_flashinfer_cutlass_follows_the_activation_filter():
    # vLLM 0.33.0 oracle/mxfp4.py `map_mxfp4_backend`: flashinfer_cutlass -> [CUTLASS_BF16, CUTLASS_MXFP8],
    # then filtered by activation.
    msg = refused("b200", moe_backend="flashinfer_cutlass")
    assert msg.startswith("--moe-backend 'flashinfer_cutlass'")
    assert "profile b200" in msg and "FLASHINFER_CUTLASS_MXFP4_BF16 [FlashInferExperts]" in msg
    assert "MXFP4 weights with bf16 activations need CUDA capability 9.0 (SM90 only), profile b200 is 10.0" in msg
    assert "FLASHINFER_CUTLASS_MXFP4_MXFP8: not tried" in msg
    s = sel("b200", moe_backend="flashinfer_cutlass", activation="mxfp8")
    assert (s.backend, s.activation) == (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "mxfp8")
    s = sel("b200", moe_backend="flashinfer_trtllm", activation="mxfp8")
    assert s.backend == B.FLASHINFER_TRTLLM_MXFP4_MXFP8


@pytest.mark.parametrize(
    "profile,name,revision,needles",
    [
        (
            "h100",
            "flashinfer_trtllm",
            V033,
            ["FLASHINFER_TRTLLM_MXFP4_BF16", "kernel requires CUDA capability family 10.x, profile h100 is 9.0"],
        ),
        ("a100", "triton", V033, ["TRITON", "kernel requires CUDA capability 9.0 <= cap < 13.0, profile a100 is 8.0"]),
        (
            replace(get_profile("h100"), has_triton_kernels=False),
            "triton",
            V033,
            ["triton_kernels not installed on profile h100"],
        ),
        (
            "rtx-pro-6000",
            "triton",
            V020,
            ["kernel requires capability 9.0 <= cap < 11.0 (vLLM 0.19-0.20), profile rtx-pro-6000 is 12.0"],
        ),
        ("thor", "flashinfer_cutlass_afp8", V033, ["(SM110 excluded), profile thor is 11.0"]),
        ("mi300x", "marlin", V033, ["MARLIN", "kernel requires CUDA, profile mi300x is ROCm gfx942"]),
        ("mi300x", "aiter", V033, ["AITER_MXFP4_BF16", "AITER_TRITON_MXFP4_BF16", "needs VLLM_ROCM_USE_AITER=1"]),
        ("h100", "xpu", V033, ["XPU", "kernel requires the XPU platform, profile h100 is 9.0"]),
        ("cpu", "emulation", V033, ["emulation requires CUDA, ROCm or XPU, profile cpu is CPU"]),
        ("h100", "humming", V033, ["HUMMING", "humming not installed on profile h100"]),
        ("b200", "flashinfer_cutlass", V020, ["FLASHINFER_CUTLASS_MXFP4_BF16", "profile b200 is 10.0"]),
    ],
)
def test_explicit_backend_refused(profile, name, revision, needles):
    msg = refused(profile, revision, name)
    p = profile if isinstance(profile, str) else profile.name
    assert f"--moe-backend {name!r}" in msg and f"profile {p}" in msg and revision.name in msg
    for needle in needles:
        assert needle in msg


def test_explicit_marlin_becomes_batched_marlin():
    s = sel("h100", moe_backend="marlin", batched=True)
    assert (s.backend, s.kernel_class) == (B.BATCHED_MARLIN, "BatchedMarlinExperts")


def test_explicit_triton_with_dp_uses_modular_class():
    s = sel("h100", moe_backend="triton", dp=4)
    assert s.kernel_class == "OAITritonExperts"
    s = sel("b200", V020, moe_backend="flashinfer_trtllm", dp=2)
    assert s.kernel_class == "TrtLlmMxfp4ExpertsModular"


def test_fi_nvl_two_sided_all2all_excludes_marlin():
    msg = refused("a100", moe_backend="marlin", dp=2, all2all="flashinfer_all2allv")
    assert "FlashInfer NVLink two-sided all2all" in msg


def test_explicit_emulation_runs_an_mxfp8_request():
    # vllm-0.33.0-mxfp4.json, h100 / mxfp8 / emulation: EMULATION runs with the requested activation
    # key (vLLM 0.33.0 builds its class for the requested mxfp8 key rather than filtering it out).
    s = sel("h100", moe_backend="emulation", activation="mxfp8")
    assert (s.backend, s.kernel_class, s.activation) == (
        B.EMULATION,
        "OCP_MXQuantizationEmulationTritonExperts",
        "mxfp8",
    )


# --------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------

REQUIRED_NAMES = [
    "flashinfer_trtllm",
    "flashinfer_trtllm_afp8",
    "flashinfer_cutlass",
    "flashinfer_cutlass_afp8",
    "triton",
    "triton_unfused",
    "marlin",
    "aiter",
    "xpu",
    "emulation",
]


def test_moe_backend_names_tables():
    assert set(REQUIRED_NAMES) <= set(MOE_BACKEND_NAMES)
    assert MOE_BACKEND_NAMES["flashinfer_cutlass"] == (
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.FLASHINFER_CUTLASS_MXFP4_MXFP8,
    )
    assert MOE_BACKEND_NAMES["aiter"][0] == B.AITER_MXFP4_BF16 and len(MOE_BACKEND_NAMES["aiter"]) == 5
    names_020 = MOE_BACKEND_NAMES_BY_STYLE["env-0.20"]
    # vLLM 0.20.0 oracle/mxfp4.py map_mxfp4_backend: one backend per name; the wheel accepts
    # triton_unfused (tests/golden/selection/vllm-0.20.0-mxfp4.json, "moe_backend_names").
    assert set(names_020) == set(REQUIRED_NAMES)
    assert names_020["triton_unfused"] == (B.TRITON_UNFUSED,)
    assert all(len(v) == 1 for v in names_020.values())
    assert moe_backend_names(V020)[0] == "auto" and "triton_unfused" in moe_backend_names(V020)
    assert "humming" in moe_backend_names(V033)


# vllm-0.20.0-mxfp4.json "moe_backend_names": 0.20.0 knows no humming or ck, and does know
# triton_unfused (so both rows list it among the valid names).
@pytest.mark.parametrize("revision,name", [(V033, "bogus"), (V020, "bogus"), (V020, "humming"), (V020, "ck")])
def test_unknown_names(revision, name):
    with pytest.raises(InputError) as info:
        sel("h100", revision, name)
    msg = str(info.value)
    assert f"unknown --moe-backend {name!r} for {revision.name}" in msg
    assert "valid names: auto, flashinfer_trtllm," in msg
    assert "triton_unfused" in msg.split("valid names:")[1]
    assert ("humming" in msg.split("valid names:")[1]) == (revision is V033)


def test_vllm_0_20_accepts_triton_unfused():
    # vllm-0.20.0-mxfp4.json: `triton_unfused` is one of 0.20.0's names (an explicit request of it).
    assert sel("h100", V020, "triton_unfused").backend == B.TRITON_UNFUSED


def test_vllm_names_without_a_layout_are_refused():
    with pytest.raises(UnsupportedError, match="deep_gemm"):
        sel("b200", moe_backend="deep_gemm")


# --------------------------------------------------------------------------------------------------
# Deployment validation, Marlin input dtype, JSON
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(dp=0), "dp must be an integer >= 1"),
        (dict(tp=1.5), "tp must be an integer >= 1"),
        (dict(activation="fp8"), "unsupported MoE activation"),
        (dict(marlin_input_dtype="fp16"), "VLLM_MARLIN_INPUT_DTYPE"),
        (dict(env={BF16: 1}), "env entries must be strings"),
        (dict(all2all=""), "all2all must be a backend name"),
    ],
)
def test_deployment_validation(kwargs, needle):
    with pytest.raises(InputError, match=needle):
        Deployment(**kwargs)


def test_deployment_normalisation_and_equality():
    assert Deployment(activation="BF16").activation is None
    assert Deployment(activation="MXFP8") == Deployment(activation="mxfp8")
    assert Deployment(env={BF16: "1"}) == Deployment(env={BF16: "1"})
    assert hash(Deployment(dp=2)) == hash(Deployment(dp=2))


def test_hidden_size_validation():
    with pytest.raises(InputError, match="hidden_size"):
        select_backend(get_profile("h100"), V033, Deployment(), "auto", hidden_size=0)
    assert select_backend(get_profile("h100"), V033, hidden_size=2880).backend == B.TRITON


def test_marlin_input_dtype():
    # vLLM 0.33.0 marlin_utils_fp4.py get_marlin_input_dtype: fp8 only on SM89 or the SM12x family;
    # int8 refused for MXFP4.
    assert sel("l40s", marlin_input_dtype="fp8").marlin_input_dtype == "fp8"
    assert sel("rtx-5090", marlin_input_dtype="fp8").marlin_input_dtype == "fp8"
    assert sel("l40s").marlin_input_dtype is None
    msg = refused("a100", marlin_input_dtype="fp8")
    assert "only allowed on SM89 or the SM12x family, profile a100 is 8.0" in msg
    assert "int8 is refused for MXFP4" in refused("a100", marlin_input_dtype="int8")
    # Not a Marlin backend: the variable has no effect.
    assert sel("h100", marlin_input_dtype="int8").marlin_input_dtype is None


def test_to_json_round_trip():
    for s in (
        sel("h100", dp=2),
        sel("b200", activation="mxfp8"),
        sel("h100", V020, lora=True),
        sel("l40s", marlin_input_dtype="fp8"),
    ):
        data = s.to_json()
        text = json.dumps(data, sort_keys=True)
        back = json.loads(text)
        assert back == data
        assert Selection.from_json(back) == s
        assert data["backend"] == s.backend.value and data["kernel_class"] == s.kernel_class
        assert data["considered"][-1]["chosen"] is True
        assert set(data) == {
            "backend",
            "kernel_class",
            "requested",
            "revision",
            "profile",
            "activation",
            "marlin_input_dtype",
            "considered",
        }


def test_errors_carry_exit_code_and_report():
    with pytest.raises(UnsupportedError) as info:
        sel("b200", moe_backend="flashinfer_cutlass")
    assert info.value.exit_code == 2
    assert [c.backend for c in info.value.considered] == [
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.FLASHINFER_CUTLASS_MXFP4_MXFP8,
    ]
