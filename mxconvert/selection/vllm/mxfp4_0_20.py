"""The MXFP4 (GPT-OSS) oracle of vLLM 0.19-0.20, as data for the engine.

Mirrors vllm/model_executor/layers/fused_moe/oracle/mxfp4.py of vLLM 0.19.0-0.20.0
(``_get_priority_backends``, ``map_mxfp4_backend``, ``select_gpt_oss_mxfp4_moe_backend`` with its
VLLM_USE_FLASHINFER_MOE_MXFP4_* / VLLM_MXFP4_USE_MARLIN overrides and its LoRA branch). The kernel
classes are vLLM 0.33.0's with the differences listed at `KERNEL_CLASSES`.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.selection.engine import (
    Context,
    EnvOverride,
    KernelClass,
    Reason,
    Run,
    SelectionStyle,
    always,
    apply_env_overrides,
    first_passing,
    parse_env,
    resolve_name,
)
from mxconvert.selection.mxfp4_common import activation_of, choose, force_xpu, global_gate, try_requested
from mxconvert.selection.predicates import has, platform, require_cuda, schemes, where
from mxconvert.selection.report import Selection
from mxconvert.selection.vllm import mxfp4_0_26 as vllm_0_26
from mxconvert.selection.vllm.mxfp4_0_33 import (
    CK_DEVICE,
    TRTLLM_MODULAR,
    TRTLLM_MONO,
    ck_scheme,
    not_fi_nvl,
    triton_classes,
)
from mxconvert.selection.vllm.mxfp4_0_33 import KERNEL_CLASSES as KERNEL_CLASSES_0_33
from mxconvert.target.backends import Backend, Mxfp4Backend

B = Mxfp4Backend


def _triton_device_020(ctx: Context) -> Reason:
    # 0.19/0.20: every OAI Triton class accepts only (9,0) <= capability < (11,0) (triton_kernels
    # 3.6.0 as vendored in vLLM 0.20.0; the same test as the selector's triton_kernels_supported).
    # ROCm gfx942/gfx950 report the pseudo-capabilities 9.4 / 9.5, so they pass; SM110 and SM12x do not.
    p = ctx.profile
    if p.platform in ("cuda", "rocm") and p.capability is not None and (9, 0) <= p.cap < (11, 0):
        return None
    return f"kernel requires capability 9.0 <= cap < 11.0 (vLLM 0.19-0.20), {where(p)}"


_TRITON_DEVICE_020 = (_triton_device_020, has("has_triton_kernels", "triton_kernels"))


def _cutlass_device_020(ctx: Context) -> Reason:
    # FlashInferExperts._supports_current_device (0.20.0 fused_moe/flashinfer_cutlass_moe.py):
    # cap == 9.0 or family 10.x, 11.x or 12.x (SM110 included, unlike 0.33.0).
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] in (10, 11, 12)):
        return None
    return f"kernel requires CUDA capability 9.0 or family 10.x, 11.x or 12.x, {where(p)}"


def _cutlass_scheme_020(ctx: Context) -> Reason:
    # FlashInferExperts._supports_quant_scheme (0.20.0): (mxfp4, None) only on cap == 9.0;
    # (mxfp4, mxfp8) on cap >= 10.0.
    p = ctx.profile
    if ctx.activation == "bf16":
        if p.platform == "cuda" and p.cap == (9, 0):
            return None
        return f"MXFP4 weights with bf16 activations need CUDA capability 9.0 (SM90 only), {where(p)}"
    if ctx.activation == "mxfp8":
        if p.cap >= (10, 0):
            return None
        return f"MXFP4 weights with mxfp8 activations need CUDA capability >= 10.0, {where(p)}"
    return f"kernel does not support MXFP4 weights with {ctx.activation} activations"


_CUTLASS_020 = KernelClass(
    "FlashInferExperts",
    False,
    (require_cuda, _cutlass_device_020, has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
    _cutlass_scheme_020,
)

#: vLLM 0.20.0 kernel classes: 0.33.0's predicates except where the 0.20.0 wheel differs (its
#: record, tests/golden/selection/vllm-0.20.0-mxfp4.json, holds them):
#:  * TRITON / TRITON_UNFUSED accept only 9.0 <= capability < 11.0 (triton_kernels 3.6);
#:  * TRTLLM has no LoRA class (LoRA takes the separate branch of select_gpt_oss_mxfp4_moe_backend);
#:  * FlashInferExperts runs on SM110 too (`_cutlass_device_020`);
#:  * MarlinExperts, BatchedMarlinExperts and AiterExperts refuse both FlashInfer NVLink all2all
#:    kinds (`_supports_parallel_config`), not only the two-sided one;
#:  * the class names of 0.20.0 (AiterExperts, XPUExpertsMXFp4).
KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    **KERNEL_CLASSES_0_33,
    B.FLASHINFER_TRTLLM_MXFP4_BF16: (TRTLLM_MONO, TRTLLM_MODULAR),
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: (TRTLLM_MONO, TRTLLM_MODULAR),
    B.FLASHINFER_CUTLASS_MXFP4_BF16: (_CUTLASS_020,),
    B.FLASHINFER_CUTLASS_MXFP4_MXFP8: (_CUTLASS_020,),
    B.AITER_MXFP4_BF16: (KernelClass("AiterExperts", False, CK_DEVICE, ck_scheme, not_fi_nvl),),
    **triton_classes(_TRITON_DEVICE_020),
    B.MARLIN: (replace(KERNEL_CLASSES_0_33[B.MARLIN][0], parallel=not_fi_nvl),),
    B.BATCHED_MARLIN: (replace(KERNEL_CLASSES_0_33[B.BATCHED_MARLIN][0], parallel=not_fi_nvl),),
    B.XPU: (KernelClass("XPUExpertsMXFp4", False, (platform("xpu"),), schemes("bf16", "mxfp4")),),
}

#: --moe-backend names of vLLM 0.20.0 (oracle/mxfp4.py `map_mxfp4_backend`: one backend each, no
#: humming, cpu or aiter_* names; deep_gemm is refused below).
MOE_BACKEND_NAMES_0_20: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16,),
    "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16,),
    "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
    "triton": (B.TRITON,),
    "triton_unfused": (B.TRITON_UNFUSED,),
    "marlin": (B.MARLIN,),
    "aiter": (B.AITER_MXFP4_BF16,),
    "xpu": (B.XPU,),
    "emulation": (B.EMULATION,),
}

_ENV_0_20 = (
    EnvOverride(
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
        # current_platform.is_device_capability(90) / is_device_capability_family(100).
        force=(
            (lambda p: p.cap == (9, 0) and p.capability is not None, B.FLASHINFER_CUTLASS_MXFP4_BF16),
            (lambda p: p.is_cuda_family(10), B.FLASHINFER_TRTLLM_MXFP4_BF16),
        ),
        remove_when_false=(B.FLASHINFER_TRTLLM_MXFP4_BF16, B.FLASHINFER_CUTLASS_MXFP4_BF16),
        no_match=(
            "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 is set but the device capability is not "
            "supported; only SM90 (CUTLASS) and SM100+ (TRTLLM) are supported"
        ),
    ),
    EnvOverride("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8", force=((always, B.FLASHINFER_TRTLLM_MXFP4_MXFP8),)),
    EnvOverride("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS", force=((always, B.FLASHINFER_CUTLASS_MXFP4_MXFP8),)),
    # Not turned into BATCHED_MARLIN for the batched format (only the --moe-backend path does that).
    EnvOverride("VLLM_MXFP4_USE_MARLIN", force=((always, B.MARLIN),)),
)

STYLE = SelectionStyle(
    name="env-0.20",
    runtime="vLLM 0.19-0.20",
    # vLLM 0.20.0 oracle/mxfp4.py `_get_priority_backends` (AITER is the old CK, i.e. AITER_MXFP4_BF16).
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16,
        B.AITER_MXFP4_BF16,
        B.TRITON,
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.TRITON_UNFUSED,
        B.MARLIN,
        B.BATCHED_MARLIN,
        B.XPU,
        B.EMULATION,
    ),
    moves=(),
    names=MappingProxyType(MOE_BACKEND_NAMES_0_20),
    unsupported_names=MappingProxyType({"deep_gemm": "DEEPGEMM_MXFP4 is not a GPT-OSS backend mxconvert lays out"}),
    classes=MappingProxyType(KERNEL_CLASSES),
    env_overrides=_ENV_0_20,
    activation_override=False,
    activation_of=activation_of,
    choose=choose,
)


def select(run: Run) -> Selection:
    d = run.deployment
    env = parse_env(run)
    if d.activation is not None:
        raise InputError(
            f"the MoE activation override does not exist in {run.style.runtime}; use "
            "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (TRTLLM) or VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1, "
            "or --moe-backend flashinfer_trtllm_afp8 / flashinfer_cutlass_afp8"
        )
    global_gate(run)
    p = run.profile

    if d.lora:
        # vLLM 0.20.0 oracle/mxfp4.py: the LoRA branch runs first and ignores --moe-backend; it returns a class without
        # checking its predicates. `envs.VLLM_MXFP4_USE_MARLIN is False` is true only when the
        # variable is set to 0 (maybe_convert_bool gives None when unset).
        if p.platform != "cuda":
            raise UnsupportedError(f"Mxfp4 LoRA is only supported on CUDA in {run.style.runtime}; {where(p)}")
        ignored = "" if run.requested == "auto" else f"; --moe-backend {run.requested} is ignored by this branch"
        triton_ok = p.has_triton_kernels and (9, 0) <= p.cap < (11, 0)
        marlin_off = env.get("VLLM_MXFP4_USE_MARLIN") is False
        if marlin_off and triton_ok:
            return run.choose(
                B.TRITON_UNFUSED,
                "UnfusedOAITritonExperts",
                "bf16",
                f"LoRA branch: VLLM_MXFP4_USE_MARLIN=0 and triton_kernels with 9.0 <= cap < 11.0{ignored}",
            )
        if not marlin_off:
            why = "VLLM_MXFP4_USE_MARLIN is not set to 0 (vLLM tests `is False`)"
        elif not p.has_triton_kernels:
            why = f"triton_kernels not installed on profile {p.name}"
        else:
            why = f"TRITON_UNFUSED needs 9.0 <= cap < 11.0, {where(p)}"
        run.note(B.TRITON_UNFUSED, "UnfusedOAITritonExperts", f"LoRA branch: {why}")
        return run.choose(B.MARLIN, "MarlinExperts", "bf16", f"LoRA branch: Marlin fallback{ignored}")

    if run.requested != "auto":
        (backend,) = resolve_name(run, run.requested)
        if d.batched and backend == B.MARLIN:
            backend = B.BATCHED_MARLIN
        chosen = try_requested(run, backend)
        if chosen is not None:
            return chosen
        raise run.refuse(f"--moe-backend {run.requested!r} ({backend.value}) cannot run on {run.where()}")

    forced, removed = apply_env_overrides(run)
    if forced is not None:
        return forced
    chosen = first_passing(run, run.style.priority, removed)
    if chosen is not None:
        return chosen
    if p.platform == "xpu":
        return force_xpu(run)
    if p.platform in ("cuda", "rocm"):
        raise run.refuse(f"no MXFP4 MoE backend supports {run.where()} with this deployment")
    # The 0.19-0.20 oracle returns Mxfp4MoeBackend.NONE here (no MXFP4 MoE kernel at all).
    raise run.refuse(f"{run.style.runtime} has no MXFP4 MoE backend for {run.where()} (the oracle returns NONE)")


#: vLLM 0.19.0-0.19.1 (tests/golden/selection/vllm-0.19.0-mxfp4.json): 0.20.0's selection, except
#: that `map_mxfp4_backend` names the CK backend `ck` (not `aiter`) and has no deep_gemm,
#: triton_unfused or emulation, `_get_priority_backends` ends at XPU (no EMULATION), and the OAI
#: Triton classes do not ask for triton_kernels.
MOE_BACKEND_NAMES_0_19: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16,),
    "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16,),
    "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
    "triton": (B.TRITON,),
    "marlin": (B.MARLIN,),
    "ck": (B.AITER_MXFP4_BF16,),
    "xpu": (B.XPU,),
}

STYLE_0_19 = replace(
    STYLE,
    name="env-0.19",
    runtime="vLLM 0.19",
    # 0.19's OAI Triton classes check only the capability window (gpt_oss_triton_kernels_moe.py
    # `_supports_current_device`), not has_triton_kernels().
    classes=MappingProxyType({**KERNEL_CLASSES, **triton_classes((_triton_device_020,))}),
    priority=tuple(b for b in STYLE.priority if b != B.EMULATION),
    names=MappingProxyType(MOE_BACKEND_NAMES_0_19),
    unsupported_names=MappingProxyType({}),
)


#: vLLM 0.23.0 (tests/golden/selection/vllm-0.23.0-mxfp4.json): 0.24.0's oracle (mxfp4_0_26.py
#: `STYLE_0_24`) that still reads 0.20's env overrides (after an explicit name, before the list)
#: and forces only XPU and CPU after the list (no ROCm TRITON_UNFUSED fallback).
STYLE_0_23 = replace(
    vllm_0_26.STYLE_0_24,
    name="oracle-0.23",
    runtime="vLLM 0.23.0",
    env_overrides=_ENV_0_20,
    env_removed=MappingProxyType({}),
    forced_after_list=("xpu", "cpu"),
)

#: vLLM 0.22.0-0.22.1: 0.23.0's, with the XPU class named XPUExpertsMXFp4.
STYLE_0_22 = replace(
    STYLE_0_23,
    name="oracle-0.22",
    runtime="vLLM 0.22.0-0.22.1",
    classes=MappingProxyType(
        {
            **STYLE_0_23.classes,
            B.XPU: (replace(STYLE_0_23.classes[B.XPU][0], name="XPUExpertsMXFp4"),),
        }
    ),
)

#: vLLM 0.21.0 (tests/golden/selection/vllm-0.21.0-mxfp4.json): 0.22.0's flow with 0.21.0's data:
#: one backend per name (no cpu or aiter_mxfp4_mxfp4), no activation override, the auto list
#: TRTLLM_BF16, AITER_MXFP4_BF16, AITER_MXFP4_FP8, TRITON, CUTLASS_BF16, MARLIN, BATCHED_MARLIN,
#: XPU, EMULATION, and only XPU forced after it.
STYLE_0_21 = replace(
    STYLE_0_22,
    name="oracle-0.21",
    runtime="vLLM 0.21.0",
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16,
        B.AITER_MXFP4_BF16,
        B.AITER_MXFP4_FP8,
        B.TRITON,
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.MARLIN,
        B.BATCHED_MARLIN,
        B.XPU,
        B.EMULATION,
    ),
    names=MappingProxyType(
        {
            "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16,),
            "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
            "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16,),
            "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
            "triton": (B.TRITON,),
            "triton_unfused": (B.TRITON_UNFUSED,),
            "humming": (B.HUMMING,),
            "marlin": (B.MARLIN,),
            "aiter": (B.AITER_MXFP4_BF16,),
            "aiter_mxfp4_fp8": (B.AITER_MXFP4_FP8,),
            "xpu": (B.XPU,),
            "emulation": (B.EMULATION,),
        }
    ),
    activation_override=False,
    forced_after_list=("xpu",),
)
