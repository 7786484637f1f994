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
    cuda_family,
    cutlass_device,
    emulation_device,
    has,
    not_fi_nvl_two_sided,
    platform,
    require_cuda,
    require_rocm,
    schemes,
    where,
)
from mxconvert.selection.report import Selection
from mxconvert.selection.vllm.mxfp4_0_33 import CK_DEVICE, ck_scheme
from mxconvert.target.backends import Backend, Mxfp4Backend

B = Mxfp4Backend

#: FusedMoEParallelConfig.use_fi_nvl_two_sided_kernels / use_fi_nvl_one_sided_kernels of 0.26.0.
_FI_NVL = frozenset({"flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided"})


def _not_fi_nvl(ctx: Context) -> Reason:
    # MarlinExpertsBase / AiterExperts / TritonExperts._supports_parallel_config (0.26.0): neither
    # FlashInfer NVLink two-sided nor one-sided all2all (0.27.0 lets Marlin run the one-sided one).
    d = ctx.deployment
    if d.all2all in _FI_NVL:
        return f"kernel does not support FlashInfer NVLink all2all kernels (all2all={d.all2all})"
    return None


def _monolithic_parallel(ctx: Context) -> Reason:
    # Monolithic classes: no all2all kernels, no EPLB, dp <= 1.
    d = ctx.deployment
    if d.dp > 1:
        return f"monolithic kernel does not support dp > 1 (dp={d.dp})"
    if d.uses_all2all:
        return f"monolithic kernel does not support all2all kernels (all2all={d.all2all})"
    if d.eplb:
        return "monolithic kernel does not support EPLB"
    return None


def _on_gfx9(p) -> bool:
    # vllm.platforms.rocm.on_gfx9(): gfx90a / gfx942 / gfx950.
    return p.platform == "rocm" and p.gfx in ("gfx90a", "gfx942", "gfx950")


def _on_gfx1x(p) -> bool:
    # vllm.platforms.rocm.on_gfx1x(): gfx11xx and gfx12xx.
    return p.platform == "rocm" and p.gfx is not None and p.gfx.startswith(("gfx11", "gfx12"))


def _triton_device_026(ctx: Context) -> Reason:
    # gpt_oss_triton_kernels_moe.py `_triton_kernel_moe_supports_current_device` (0.26.0): CUDA
    # 9.0 <= cap < 11.0 (SM12x excluded), ROCm on_gfx9() or on_gfx1x().
    p = ctx.profile
    if p.platform == "cuda":
        if (9, 0) <= p.cap < (11, 0):
            return None
        return f"kernel requires CUDA capability 9.0 <= cap < 11.0, {where(p)}"
    if p.platform == "rocm":
        if _on_gfx9(p) or _on_gfx1x(p):
            return None
        return f"kernel requires a ROCm gfx90a/gfx942/gfx950 or gfx11/gfx12 GPU, {where(p)}"
    return f"kernel requires CUDA or ROCm, {where(p)}"


def _cutlass_scheme(ctx: Context) -> Reason:
    # FlashInferExperts._supports_quant_scheme (0.26.0): (mxfp4, None) only on cap == 9.0;
    # (mxfp4, mxfp8) on cap >= 10.0.
    p = ctx.profile
    if ctx.activation == "bf16":
        if p.cap == (9, 0) and p.platform == "cuda":
            return None
        return f"MXFP4 weights with bf16 activations need CUDA capability 9.0 (SM90 only), {where(p)}"
    if ctx.activation == "mxfp8":
        if p.cap >= (10, 0):
            return None
        return f"MXFP4 weights with mxfp8 activations need CUDA capability >= 10.0, {where(p)}"
    return f"kernel does not support MXFP4 weights with {ctx.activation} activations"


def _aiter_enabled(ctx: Context) -> Reason:
    # rocm_aiter_ops.is_enabled(): VLLM_ROCM_USE_AITER=1 (on a ROCm platform).
    p = ctx.profile
    return None if p.rocm_use_aiter else f"ROCm AITER not enabled on profile {p.name} (needs VLLM_ROCM_USE_AITER=1)"


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


_MONO_ROUTING = frozenset({"Renormalize", "RenormalizeNaive"})

# experts/trtllm_mxfp4_moe.py: CUDA family 10.x and has_flashinfer().
_TRTLLM_DEVICE = (require_cuda, cuda_family(10), has("has_flashinfer", "flashinfer"))
_TRTLLM = (
    KernelClass(
        "TrtLlmMxfp4ExpertsMonolithic",
        True,
        _TRTLLM_DEVICE,
        schemes("bf16", "mxfp8"),
        _monolithic_parallel,
        routing=_MONO_ROUTING,
    ),
    KernelClass("TrtLlmMxfp4ExpertsModular", False, _TRTLLM_DEVICE, schemes("bf16", "mxfp8")),
)

_CUTLASS = KernelClass(
    "FlashInferExperts",
    False,
    (require_cuda, cutlass_device, has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
    _cutlass_scheme,
)

_TRITON_DEVICE = (_triton_device_026, has("has_triton_kernels", "triton_kernels"))

_AITER_CK = KernelClass("AiterExperts", False, CK_DEVICE, ck_scheme, _not_fi_nvl)

#: vLLM 0.26.0 `backend_to_kernel_cls`, in its order (monolithic first).
KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    B.FLASHINFER_TRTLLM_MXFP4_BF16: _TRTLLM,
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: _TRTLLM,
    B.FLASHINFER_CUTLASS_MXFP4_BF16: (_CUTLASS,),
    B.FLASHINFER_CUTLASS_MXFP4_MXFP8: (_CUTLASS,),
    B.TRITON: (
        KernelClass(
            "OAITritonMxfp4ExpertsMonolithic",
            True,
            _TRITON_DEVICE,
            schemes("bf16"),
            _monolithic_parallel,
            routing=_MONO_ROUTING,
        ),
        KernelClass("OAITritonExperts", False, _TRITON_DEVICE, schemes("bf16")),
    ),
    B.TRITON_UNFUSED: (KernelClass("UnfusedOAITritonExperts", False, _TRITON_DEVICE, schemes("bf16"), lora=True),),
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
    B.MARLIN: (KernelClass("MarlinExperts", False, MARLIN_DEVICE, any_scheme, _not_fi_nvl, lora=True),),
    B.BATCHED_MARLIN: (
        KernelClass(
            "BatchedMarlinExperts", False, MARLIN_DEVICE, any_scheme, _not_fi_nvl, formats=frozenset({"batched"})
        ),
    ),
    B.AITER_MXFP4_BF16: (_AITER_CK,),
    B.AITER_MXFP4_FP8: (
        KernelClass(
            "AiterW4A8ExpertsMonolithic",
            True,
            (require_rocm, _aiter_enabled, _gfx950),
            schemes("fp8"),
            _monolithic_parallel,
            routing=_MONO_ROUTING,
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
    # OCP_MXQuantizationEmulationTritonExperts(TritonExperts): CUDA-alike or XPU, any scheme, LoRA.
    B.EMULATION: (
        KernelClass(
            "OCP_MXQuantizationEmulationTritonExperts",
            False,
            (emulation_device,),
            any_scheme,
            _not_fi_nvl,
            lora=True,
        ),
    ),
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


def _filter_by_activation(backends, requested: str | None) -> list[Backend]:
    """vLLM 0.26.0 ``_filter_by_activation``: with a request, the backends of that activation and
    EMULATION; without one, the BF16 backends, or the whole list when it has none."""
    if requested is not None:
        return [b for b in backends if BACKEND_ACTIVATION[b] == requested or b == B.EMULATION]
    bf16 = [b for b in backends if BACKEND_ACTIVATION[b] == "bf16"]
    return bf16 if bf16 else list(backends)


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
        kept = _filter_by_activation(candidates, requested)
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
    kept = _filter_by_activation(order, requested)
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
