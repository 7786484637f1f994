"""The MXFP4 (GPT-OSS) oracle of vLLM 0.26.0, as data for the engine.

Mirrors vllm/model_executor/layers/fused_moe/oracle/mxfp4.py of vLLM 0.26.0
(``_get_priority_backends_for_gpt_oss``, ``map_mxfp4_backend``, ``_filter_by_activation``,
``select_mxfp4_moe_backend`` with its XPU / CPU / ROCm fallbacks) and the ``is_supported_config``
predicates of the expert classes its ``backend_to_kernel_cls`` names (vllm/model_executor/layers/
fused_moe/experts/ of 0.26.0: trtllm_mxfp4_moe.py, flashinfer_cutlass_moe.py,
gpt_oss_triton_kernels_moe.py, rocm_aiter_moe.py, aiter_mxfp4_w4a8_moe.py, marlin_moe.py,
fused_humming_moe.py, xpu_moe.py, cpu_moe.py, ocp_mx_emulation_moe.py over triton_moe.py).
The order of the tables follows the upstream file. What differs from vLLM 0.33.0 (mxfp4_0_33.py),
beyond the fields of the `vllm-0.26` revision row: no AITER_TRITON_* or CUTLASS_MXFP4_MXFP4
backends and no HUMMING or CPU in the auto list; no SM12x TRITON demotion and no HUMMING promotion;
the TRITON device window stops before 11.0; TRTLLM has no LoRA class; an activation request keeps
EMULATION in the list (and EMULATION then runs with the requested activation); the fallbacks
after the list force XPU, CPU, or on ROCm TRITON_UNFUSED; Marlin, CK AITER and the emulation
classes refuse both FlashInfer NVLink all2all kinds; CPUExpertsMxfp4 is monolithic.
The selection records tests/golden/selection/vllm-0.25.0-mxfp4.json .. vllm-0.26.0-mxfp4.json (made
by running each release's own oracle, tools/vllm_releases/record_selection.py) hold this module to
0.25.x-0.26.0; `STYLE_0_27` is the one difference of 0.27.0-0.28.0.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from mxconvert.core.errors import InputError
from mxconvert.selection.engine import (
    Context,
    KernelClass,
    Reason,
    Run,
    SelectionStyle,
    apply_env_overrides,
    first_passing,
    parse_env,
    resolve_name,
)
from mxconvert.selection.mxfp4_common import BACKEND_ACTIVATION, choose, global_gate
from mxconvert.selection.predicates import (
    HUMMING_DEVICE,
    MARLIN_DEVICE,
    any_scheme,
    not_fi_nvl_two_sided,
    platform,
    require_rocm,
    schemes,
    where,
)
from mxconvert.selection.report import Selection
from mxconvert.selection.vllm.mxfp4_0_33 import (
    CK_DEVICE,
    CUTLASS,
    EMULATION,
    MONO_ROUTING,
    TRTLLM_MODULAR,
    TRTLLM_MONO,
    aiter_enabled,
    ck_scheme,
    filter_by_activation,
    monolithic_parallel,
    not_fi_nvl,
    triton_classes,
    triton_device,
)
from mxconvert.target.backends import Backend, Mxfp4Backend

B = Mxfp4Backend

# What this module takes from mxfp4_0_33.py reads the same in 0.26.0: the classes `CUTLASS`
# (FlashInferExperts), `EMULATION` and the TRTLLM pair (routing aside), the predicates
# `monolithic_parallel`, `aiter_enabled` and `not_fi_nvl` (which 0.26.0's MarlinExpertsBase,
# AiterExperts and TritonExperts all apply; 0.27.0 lets Marlin run the one-sided kind),
# `triton_device` (with its own bound) and `filter_by_activation` (with no BF16 fallback).


def _gfx950(ctx: Context) -> Reason:
    # AiterW4A8ExpertsMonolithic._supports_current_device (0.26.0): on_gfx950() only.
    p = ctx.profile
    return None if p.gfx == "gfx950" else f"kernel requires gfx950, {where(p)}"


def _humming_indexed_only(ctx: Context) -> Reason:
    # HummingExpertsBase.is_supported_config (0.26.0): after the base predicates, the class's gemm
    # type must be `get_humming_moe_gemm_type()`, "indexed" unless VLLM_HUMMING_MOE_GEMM_TYPE says
    # otherwise (mxconvert does not model that variable). Listed with the device checks: every check
    # must pass, so where it sits only changes the reason reported.
    return None


def _humming_grouped(ctx: Context) -> Reason:
    return "preferred gemm type indexed != supported gemm type grouped_contiguous"


# experts/trtllm_mxfp4_moe.py: 0.33.0's classes, except that the monolithic one takes no DeepSeekV3
# routing yet; no LoRA class.
_TRTLLM = (replace(TRTLLM_MONO, routing=MONO_ROUTING), TRTLLM_MODULAR)

_AITER_CK = KernelClass("AiterExperts", False, CK_DEVICE, ck_scheme, not_fi_nvl)

#: vLLM 0.26.0 `backend_to_kernel_cls`, in its order (monolithic first).
KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    B.FLASHINFER_TRTLLM_MXFP4_BF16: _TRTLLM,
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: _TRTLLM,
    B.FLASHINFER_CUTLASS_MXFP4_BF16: (CUTLASS,),
    B.FLASHINFER_CUTLASS_MXFP4_MXFP8: (CUTLASS,),
    # gpt_oss_triton_kernels_moe.py (0.26.0): CUDA 9.0 <= cap < 11.0 (SM12x excluded), ROCm gfx9 / gfx1x.
    **triton_classes(triton_device((11, 0))),
    B.HUMMING: (
        KernelClass(
            "BatchedHummingGroupedExperts",
            False,
            (*HUMMING_DEVICE, _humming_grouped),
            any_scheme,
            formats=frozenset({"batched"}),
        ),
        KernelClass("HummingGroupedExperts", False, (*HUMMING_DEVICE, _humming_grouped), any_scheme),
        KernelClass("HummingIndexedExperts", False, (*HUMMING_DEVICE, _humming_indexed_only), any_scheme),
    ),
    B.MARLIN: (KernelClass("MarlinExperts", False, MARLIN_DEVICE, any_scheme, not_fi_nvl, lora=True),),
    B.BATCHED_MARLIN: (
        KernelClass(
            "BatchedMarlinExperts", False, MARLIN_DEVICE, any_scheme, not_fi_nvl, formats=frozenset({"batched"})
        ),
    ),
    B.AITER_MXFP4_BF16: (_AITER_CK,),
    B.AITER_MXFP4_FP8: (
        KernelClass(
            "AiterW4A8ExpertsMonolithic",
            True,
            (require_rocm, aiter_enabled, _gfx950),
            schemes("fp8"),
            monolithic_parallel,
            routing=MONO_ROUTING,
        ),
    ),
    B.AITER_MXFP4_MXFP4: (_AITER_CK,),
    B.XPU: (KernelClass("XPUExpertsMxFp4", False, (platform("xpu"),), schemes("bf16")),),
    B.CPU: (
        KernelClass(
            "CPUExpertsMxfp4",
            True,
            (platform("cpu"),),
            schemes("bf16"),
            routing=frozenset({"Default", "Renormalize", "RenormalizeNaive"}),
        ),
    ),
    B.EMULATION: (EMULATION,),
}

#: --moe-backend names of vLLM 0.26.0 (`map_mxfp4_backend`; deep_gemm below).
MOE_BACKEND_NAMES: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16, B.FLASHINFER_TRTLLM_MXFP4_MXFP8),
    "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16, B.FLASHINFER_CUTLASS_MXFP4_MXFP8),
    "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
    "triton": (B.TRITON,),
    "triton_unfused": (B.TRITON_UNFUSED,),
    "humming": (B.HUMMING,),
    "marlin": (B.MARLIN,),
    "aiter": (B.AITER_MXFP4_BF16, B.AITER_MXFP4_FP8, B.AITER_MXFP4_MXFP4),
    "aiter_mxfp4_fp8": (B.AITER_MXFP4_FP8,),
    "aiter_mxfp4_mxfp4": (B.AITER_MXFP4_MXFP4,),
    "xpu": (B.XPU,),
    "cpu": (B.CPU,),
    "emulation": (B.EMULATION,),
}


def _activation_of(run: Run, backend: Backend) -> str:
    # select_mxfp4_moe_backend (0.26.0): the requested activation key when there is one, else the
    # backend's own (`_backend_activation_key`).
    return run.deployment.activation or BACKEND_ACTIVATION[backend]


STYLE = SelectionStyle(
    name="oracle-0.26",
    runtime="vLLM 0.26.0",
    # _get_priority_backends_for_gpt_oss (TRITON_UNFUSED is commented out there).
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16,
        B.FLASHINFER_TRTLLM_MXFP4_MXFP8,
        B.AITER_MXFP4_BF16,
        B.AITER_MXFP4_FP8,
        B.AITER_MXFP4_MXFP4,
        B.TRITON,
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.FLASHINFER_CUTLASS_MXFP4_MXFP8,
        B.MARLIN,
        B.BATCHED_MARLIN,
        B.XPU,
        B.EMULATION,
    ),
    moves=(),
    names=MappingProxyType(MOE_BACKEND_NAMES),
    unsupported_names=MappingProxyType(
        {"deep_gemm": "DEEPGEMM_MXFP4 is not a GPT-OSS backend mxconvert lays out"},
    ),
    classes=MappingProxyType(KERNEL_CLASSES),
    env_overrides=(),
    activation_override=True,
    forced_after_list=("xpu", "cpu", "rocm"),
    activation_of=_activation_of,
    choose=choose,
    env_removed=MappingProxyType(
        {
            "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "removed in vLLM 0.24; use --moe-backend",
            "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "removed in vLLM 0.24; use --moe-backend flashinfer_trtllm_afp8",
            "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": (
                "removed in vLLM 0.24; use --moe-backend flashinfer_cutlass_afp8"
            ),
            "VLLM_MXFP4_USE_MARLIN": "removed in vLLM 0.24; use --moe-backend marlin",
        }
    ),
)


def select(run: Run) -> Selection:
    parse_env(run)  # 0.24.0-0.28.0 read no variable: every one is refused with what replaces it
    global_gate(run)
    d = run.deployment
    if d.activation is not None and not run.style.activation_override:
        raise InputError(f"the MoE activation override does not exist in {run.style.runtime}")
    requested = d.activation
    want = requested or "bf16"

    if run.requested != "auto":
        candidates = list(resolve_name(run, run.requested))
        if d.batched:
            candidates = [B.BATCHED_MARLIN if b == B.MARLIN else b for b in candidates]
        kept = filter_by_activation(candidates, requested, run.style.activation_bf16_fallback)
        for backend in candidates:
            if backend not in kept:
                run.note(backend, None, f"not tried: runs {BACKEND_ACTIVATION[backend]} activations, {want} requested")
        for backend in kept:
            act = _activation_of(run, backend)
            hit = run.try_backend(backend, act, explicit=True)
            if hit:
                return run.choose(backend, hit[0], act, f"--moe-backend {run.requested}: all predicates pass")
        raise run.refuse(
            f"--moe-backend {run.requested!r} ({', '.join(b.value for b in candidates)}) cannot run on {run.where()}"
        )

    # 0.21.0-0.23.0 read the VLLM_USE_FLASHINFER_MOE_MXFP4_* / VLLM_MXFP4_USE_MARLIN overrides here,
    # after an explicit name (their styles in mxfp4_0_20.py); 0.24.0 on has none.
    forced, removed = apply_env_overrides(run)
    if forced is not None:
        return forced
    order = list(run.style.priority)
    kept = filter_by_activation(order, requested, run.style.activation_bf16_fallback)
    skipped = {
        b: f"not tried: runs {BACKEND_ACTIVATION[b]} activations, {want} requested" for b in order if b not in kept
    } | dict(removed)
    chosen = first_passing(run, order, skipped)
    if chosen is not None:
        return chosen
    p = run.profile
    # The fallbacks after the list: `_return_or_raise` with activation key None (0.24.0 on: XPU,
    # CPU and, on ROCm, TRITON_UNFUSED; 0.22.0-0.23.0: XPU and CPU).
    if p.platform in run.style.forced_after_list:
        backend = {"xpu": B.XPU, "cpu": B.CPU, "rocm": B.TRITON_UNFUSED}[p.platform]
        hit = run.try_backend(backend, "bf16", explicit=True)
        if hit:
            return run.choose(backend, hit[0], "bf16", f"forced on the {p.platform.upper()} platform")
        raise run.refuse(
            f"{backend.value} is forced on the {p.platform.upper()} platform but cannot run on {run.where()}"
        )
    raise run.refuse(f"no MXFP4 MoE backend supports {run.where()} with this deployment")


#: vLLM 0.27.0-0.28.0 (their selection records, tests/golden/selection/vllm-0.27.0-mxfp4.json and
#: vllm-0.28.0-mxfp4.json): 0.26.0's oracle, except that MarlinExpertsBase._supports_parallel_config
#: refuses only the FlashInfer NVLink two-sided all2all (the one-sided kind runs on Marlin).
KERNEL_CLASSES_0_27: dict[Backend, tuple[KernelClass, ...]] = {
    **KERNEL_CLASSES,
    B.MARLIN: (replace(KERNEL_CLASSES[B.MARLIN][0], parallel=not_fi_nvl_two_sided),),
    B.BATCHED_MARLIN: (replace(KERNEL_CLASSES[B.BATCHED_MARLIN][0], parallel=not_fi_nvl_two_sided),),
}

STYLE_0_27 = replace(
    STYLE, name="oracle-0.27", runtime="vLLM 0.27.0-0.28.0", classes=MappingProxyType(KERNEL_CLASSES_0_27)
)

#: vLLM 0.24.0 (tests/golden/selection/vllm-0.24.0-mxfp4.json): 0.26.0's oracle, except that
#: `_get_priority_backends_for_gpt_oss` ends at XPU (no EMULATION in the auto list).
STYLE_0_24 = replace(
    STYLE, name="oracle-0.24", runtime="vLLM 0.24.0", priority=tuple(b for b in STYLE.priority if b != B.EMULATION)
)
