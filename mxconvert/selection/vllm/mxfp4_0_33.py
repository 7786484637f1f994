"""The MXFP4 (GPT-OSS) oracle of vLLM 0.33.0, as data for the engine.

Mirrors vllm/model_executor/layers/fused_moe/oracle/mxfp4.py of vLLM 0.33.0
(``_get_priority_backends_for_gpt_oss``, ``map_mxfp4_backend``, ``_filter_by_activation``,
``select_gpt_oss_mxfp4_moe_backend``) and the ``is_supported_config`` predicates of the expert
classes it names (vllm/model_executor/layers/fused_moe/experts/: trtllm_mxfp4_moe.py,
flashinfer_cutlass_moe.py, gpt_oss_triton_kernels_moe.py, aiter_mxfp4_w4a16_moe.py,
aiter_mxfp4_w4a8_moe.py, aiter_mxfp4_w4a4_moe.py, fused_humming_moe.py, trtllm_lora_moe.py).
Read, not copied: the order of the tables below follows the upstream file, so the two diff well.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from mxconvert.core.errors import InputError
from mxconvert.selection.engine import (
    Check,
    Context,
    KernelClass,
    PriorityMove,
    Reason,
    Run,
    SelectionStyle,
    first_passing,
    moved_priority,
    resolve_name,
)
from mxconvert.selection.mxfp4_common import (
    BACKEND_ACTIVATION,
    choose,
    force_platform,
    global_gate,
)
from mxconvert.selection.predicates import (
    HUMMING_DEVICE,
    MARLIN_DEVICE,
    any_scheme,
    cuda_family,
    cutlass_device,
    emulation_device,
    gfx_in,
    has,
    not_fi_nvl_two_sided,
    platform,
    require_cuda,
    require_rocm,
    schemes,
    where,
)
from mxconvert.selection.report import Selection
from mxconvert.target.backends import Backend, Mxfp4Backend
from mxconvert.target.profiles import DeviceProfile

B = Mxfp4Backend


def _on_gfx9(p: DeviceProfile) -> bool:
    # vllm.platforms.rocm.on_gfx9(): gfx90a / gfx942 / gfx950.
    return p.platform == "rocm" and p.gfx in ("gfx90a", "gfx942", "gfx950")


def _on_gfx1x(p: DeviceProfile) -> bool:
    # on_gfx1x(): gfx11xx (RDNA3/3.5) and gfx12xx (RDNA4, gfx1250) — gpt_oss_triton_kernels_moe.py.
    return p.platform == "rocm" and p.gfx is not None and p.gfx.startswith(("gfx11", "gfx12"))


def triton_device(below: tuple[int, int]) -> tuple[Check, ...]:
    """The OAI Triton classes' device checks (gpt_oss_triton_kernels_moe.py): first
    `_triton_kernel_moe_supports_current_device`, CUDA 9.0 <= cap < `below` or ROCm on_gfx9() /
    on_gfx1x(), then `has_triton_kernels()`. `below` is the one thing the releases change: 13.0 in
    0.32.0-0.33.0, 11.0 in 0.24.0-0.31.0 (SM110 and SM12x excluded; mxfp4_0_26.py)."""
    top = f"{below[0]}.{below[1]}"

    def supports_current_device(ctx: Context) -> Reason:
        p = ctx.profile
        if p.platform == "cuda":
            if (9, 0) <= p.cap < below:
                return None
            return f"kernel requires CUDA capability 9.0 <= cap < {top}, {where(p)}"
        if p.platform == "rocm":
            if _on_gfx9(p) or _on_gfx1x(p):
                return None
            return f"kernel requires a ROCm gfx90a/gfx942/gfx950 or gfx11/gfx12 GPU, {where(p)}"
        return f"kernel requires CUDA or ROCm, {where(p)}"

    return (supports_current_device, has("has_triton_kernels", "triton_kernels"))


def _aiter_fused_moe_enabled(ctx: Context) -> Reason:
    # rocm_aiter_ops.is_fused_moe_enabled(): VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE (default on).
    p = ctx.profile
    if p.rocm_use_aiter and p.rocm_use_aiter_moe:
        return None
    return (
        f"ROCm AITER fused MoE not enabled on profile {p.name} "
        "(needs VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE=1)"
    )


def aiter_enabled(ctx: Context) -> Reason:
    # rocm_aiter_ops.is_enabled(): VLLM_ROCM_USE_AITER=1.
    p = ctx.profile
    return None if p.rocm_use_aiter else f"ROCm AITER not enabled on profile {p.name} (needs VLLM_ROCM_USE_AITER=1)"


def _cutlass_scheme(ctx: Context) -> Reason:
    # FlashInferExperts._supports_quant_scheme: (mxfp4, None) only on cap == 9.0; (mxfp4, mxfp8)
    # only on cap >= 10.0.
    p = ctx.profile
    if ctx.activation == "bf16":
        if p.cap == (9, 0):
            return None
        return f"MXFP4 weights with bf16 activations need CUDA capability 9.0 (SM90 only), {where(p)}"
    if ctx.activation == "mxfp8":
        if p.cap >= (10, 0):
            return None
        return f"MXFP4 weights with mxfp8 activations need CUDA capability >= 10.0, {where(p)}"
    return f"kernel does not support MXFP4 weights with {ctx.activation} activations"


def ck_scheme(ctx: Context) -> Reason:
    # AiterMxfp4Experts: (mxfp4, None) and (mxfp4, mxfp4), and the scheme check requires
    # on_gfx950() and not on_gfx1250().
    p = ctx.profile
    if ctx.activation not in ("bf16", "mxfp4"):
        return f"kernel does not support MXFP4 weights with {ctx.activation} activations"
    if p.gfx == "gfx950":
        return None
    return f"AITER CK MXFP4 kernel requires gfx950 (not gfx1250), {where(p)}"


# Parallel-config predicates.


def monolithic_parallel(ctx: Context) -> Reason:
    # Monolithic classes: no all2all kernels, no EPLB, dp <= 1.
    d = ctx.deployment
    if d.dp > 1:
        return f"monolithic kernel does not support dp > 1 (dp={d.dp})"
    if d.uses_all2all:
        return f"monolithic kernel does not support all2all kernels (all2all={d.all2all})"
    if d.eplb:
        return "monolithic kernel does not support EPLB"
    return None


def no_ep_monolithic_parallel(ctx: Context) -> Reason:
    # AiterW4A8ExpertsMonolithic._supports_parallel_config (experts/aiter_mxfp4_w4a8_moe.py): no EP,
    # no EPLB, dp <= 1.
    d = ctx.deployment
    if d.ep > 1:
        return f"kernel does not support expert parallelism (ep={d.ep})"
    return monolithic_parallel(ctx)


_FI_NVL = frozenset({"flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided"})


def not_fi_nvl(ctx: Context) -> Reason:
    # AiterExperts._supports_parallel_config (experts/rocm_aiter_moe.py): neither FlashInfer NVLink
    # two-sided nor one-sided all2all.
    d = ctx.deployment
    if d.all2all in _FI_NVL:
        return f"kernel does not support FlashInfer NVLink all2all kernels (all2all={d.all2all})"
    return None


def _trtllm_lora_parallel(ctx: Context) -> Reason:
    # _TrtLlmLoRAExpertsBase: (no all2all, or allgather_reducescatter) and no EPLB
    # (experts/trtllm_lora_moe.py).
    d = ctx.deployment
    if d.uses_all2all and d.all2all != "allgather_reducescatter":
        return f"kernel does not support all2all kernels other than allgather_reducescatter (all2all={d.all2all})"
    if d.eplb:
        return "kernel does not support EPLB"
    return None


MONO_ROUTING = frozenset({"Renormalize", "RenormalizeNaive"})

# TRTLLM (experts/trtllm_mxfp4_moe.py): CUDA family 10.x and has_flashinfer().
_TRTLLM_DEVICE = (require_cuda, cuda_family(10), has("has_flashinfer", "flashinfer"))
TRTLLM_MONO = KernelClass(
    "TrtLlmMxfp4ExpertsMonolithic",
    True,
    _TRTLLM_DEVICE,
    schemes("bf16", "mxfp8"),
    monolithic_parallel,
    routing=frozenset({"DeepSeekV3", "Renormalize", "RenormalizeNaive"}),
)
TRTLLM_MODULAR = KernelClass("TrtLlmMxfp4ExpertsModular", False, _TRTLLM_DEVICE, schemes("bf16", "mxfp8"))
# LoRA-capable TRTLLM class, reachable only with moe_backend=flashinfer_trtllm;
# BF16 only, per experts/trtllm_lora_moe.py.
_TRTLLM_LORA = KernelClass(
    "TrtLlmMxfp4LoRAExperts",
    False,
    _TRTLLM_DEVICE,
    schemes("bf16"),
    _trtllm_lora_parallel,
    lora=True,
    explicit_only=True,
)

# FlashInferExperts (experts/flashinfer_cutlass_moe.py): its device and quant-scheme checks read the
# same in 0.24.0-0.28.0 (mxfp4_0_26.py).
CUTLASS = KernelClass(
    "FlashInferExperts",
    False,
    (require_cuda, cutlass_device, has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
    _cutlass_scheme,
)


def triton_classes(device: tuple[Check, ...]) -> dict[Backend, tuple[KernelClass, ...]]:
    return {
        B.TRITON: (
            KernelClass(
                "OAITritonMxfp4ExpertsMonolithic",
                True,
                device,
                schemes("bf16"),
                monolithic_parallel,
                routing=MONO_ROUTING,
            ),
            KernelClass("OAITritonExperts", False, device, schemes("bf16")),
        ),
        B.TRITON_UNFUSED: (KernelClass("UnfusedOAITritonExperts", False, device, schemes("bf16"), lora=True),),
    }


_MARLIN = KernelClass("MarlinExperts", False, MARLIN_DEVICE, any_scheme, not_fi_nvl_two_sided, lora=True)
_BATCHED_MARLIN = KernelClass(
    "BatchedMarlinExperts", False, MARLIN_DEVICE, any_scheme, not_fi_nvl_two_sided, formats=frozenset({"batched"})
)

CK_DEVICE = (require_rocm, _aiter_fused_moe_enabled)


# OCP_MXQuantizationEmulationTritonExperts(TritonExperts): amd-quark (assumed installed), then
# TritonExperts' predicates: CUDA-alike or XPU, LoRA, neither FlashInfer NVLink all2all kind (the
# same in 0.24.0-0.28.0: mxfp4_0_26.py).
EMULATION = KernelClass(
    "OCP_MXQuantizationEmulationTritonExperts", False, (emulation_device,), any_scheme, not_fi_nvl, lora=True
)

#: vLLM 0.33.0 kernel classes per backend, in the order vLLM tries them (monolithic first).
KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    B.FLASHINFER_TRTLLM_MXFP4_BF16: (TRTLLM_MONO, TRTLLM_MODULAR, _TRTLLM_LORA),
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: (TRTLLM_MONO, TRTLLM_MODULAR, _TRTLLM_LORA),
    B.FLASHINFER_CUTLASS_MXFP4_BF16: (CUTLASS,),
    B.FLASHINFER_CUTLASS_MXFP4_MXFP8: (CUTLASS,),
    # No kernel class for it is known to mxconvert, and it has no converter branch.
    # It is only reachable with an "mxfp4" activation override, which Deployment refuses.
    B.CUTLASS_MXFP4_MXFP4: (),
    B.AITER_MXFP4_BF16: (KernelClass("AiterMxfp4Experts", False, CK_DEVICE, ck_scheme, not_fi_nvl),),
    B.AITER_TRITON_MXFP4_BF16: (
        KernelClass(
            "AiterW4A16ExpertsMonolithic",
            True,
            (require_rocm, aiter_enabled, gfx_in("gfx942", "gfx950", "gfx1250")),
            schemes("bf16"),
            monolithic_parallel,
            routing=MONO_ROUTING,
        ),
    ),
    # The next three: their predicates come from the public
    # vLLM experts/aiter_mxfp4_w4a8_moe.py / aiter_mxfp4_w4a4_moe.py (possibly newer than 0.33.0).
    # They are reachable only through their explicit --moe-backend names.
    B.AITER_MXFP4_FP8: (
        KernelClass(
            "AiterW4A8ExpertsMonolithic",
            True,
            (require_rocm, aiter_enabled, gfx_in("gfx950", "gfx1250")),
            schemes("fp8"),
            no_ep_monolithic_parallel,
            routing=MONO_ROUTING,
        ),
    ),
    B.AITER_MXFP4_MXFP4: (KernelClass("AiterMxfp4Experts", False, CK_DEVICE, ck_scheme, not_fi_nvl),),
    B.AITER_TRITON_MXFP4_MXFP4: (
        KernelClass(
            "AiterW4A4ExpertsMonolithic",
            True,
            (require_rocm, aiter_enabled, gfx_in("gfx1250")),
            schemes("mxfp4"),
            monolithic_parallel,
            routing=MONO_ROUTING,
        ),
    ),
    **triton_classes(triton_device((13, 0))),
    B.MARLIN: (_MARLIN,),
    B.BATCHED_MARLIN: (_BATCHED_MARLIN,),
    # Class names from experts/fused_humming_moe.py; the order of the two standard-format classes
    # (which share every predicate) was not read, so the first listed one is reported.
    B.HUMMING: (
        KernelClass("HummingIndexedExperts", False, HUMMING_DEVICE, any_scheme),
        KernelClass("HummingGroupedExperts", False, HUMMING_DEVICE, any_scheme),
        KernelClass("BatchedHummingGroupedExperts", False, HUMMING_DEVICE, any_scheme, formats=frozenset({"batched"})),
    ),
    B.XPU: (KernelClass("XPUExpertsMxFp4", False, (platform("xpu"),), schemes("bf16", "mxfp4")),),
    # CPUExpertsMxfp4 also checks the CPU ISA; profiles do not describe it, so it is assumed present.
    B.CPU: (KernelClass("CPUExpertsMxfp4", False, (platform("cpu"),), any_scheme),),
    B.EMULATION: (EMULATION,),
}

#: --moe-backend names of vLLM 0.33.0.
MOE_BACKEND_NAMES: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16, B.FLASHINFER_TRTLLM_MXFP4_MXFP8),
    "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16, B.FLASHINFER_CUTLASS_MXFP4_MXFP8),
    "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
    "triton": (B.TRITON,),
    "triton_unfused": (B.TRITON_UNFUSED,),
    "marlin": (B.MARLIN,),
    "humming": (B.HUMMING,),
    "aiter": (
        B.AITER_MXFP4_BF16,
        B.AITER_TRITON_MXFP4_BF16,
        B.AITER_MXFP4_FP8,
        B.AITER_MXFP4_MXFP4,
        B.AITER_TRITON_MXFP4_MXFP4,
    ),
    "aiter_triton_mxfp4_bf16": (B.AITER_TRITON_MXFP4_BF16,),
    "aiter_mxfp4_fp8": (B.AITER_MXFP4_FP8,),
    "aiter_triton_mxfp4_mxfp4": (B.AITER_TRITON_MXFP4_MXFP4,),
    "aiter_mxfp4_mxfp4": (B.AITER_MXFP4_MXFP4,),
    "xpu": (B.XPU,),
    "cpu": (B.CPU,),
    "emulation": (B.EMULATION,),
}


def filter_by_activation(backends: Sequence[Backend], requested: str | None, bf16_fallback: bool) -> list[Backend]:
    """vLLM 0.33.0 ``_filter_by_activation``: the candidates that stay, in order.

    A requested activation keeps the backends whose activation key matches it and EMULATION, then
    (`bf16_fallback`, from 0.32.0) the BF16 backends as a higher-precision fallback. Without one,
    the BF16 backends (activation key None, EMULATION included) are kept, or the whole list when it
    has none (so an explicit `_afp8` name still lands). Without the fallback it is also 0.24.0-0.31.0's
    (mxfp4_0_26.py, mxfp4_0_32.py).
    """
    bf16 = [b for b in backends if BACKEND_ACTIVATION[b] == "bf16"]
    if requested is not None:
        matching = [b for b in backends if BACKEND_ACTIVATION[b] == requested or b == B.EMULATION]
        return matching + [b for b in bf16 if b not in matching] if bf16_fallback else matching
    return bf16 if bf16 else list(backends)


def _activation_of(run: Run, backend: Backend) -> str:
    # select_mxfp4_moe_backend (0.33.0): EMULATION takes the requested activation key, every other
    # backend its own (`_backend_activation_key`).
    requested = run.deployment.activation
    return requested if backend == B.EMULATION and requested else BACKEND_ACTIVATION[backend]


STYLE = SelectionStyle(
    name="oracle-0.33",
    runtime="vLLM 0.33.0",
    # _get_priority_backends_for_gpt_oss; TRITON_UNFUSED is commented out there.
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16,
        B.FLASHINFER_TRTLLM_MXFP4_MXFP8,
        B.AITER_MXFP4_BF16,
        B.AITER_TRITON_MXFP4_BF16,
        B.AITER_MXFP4_FP8,
        B.AITER_MXFP4_MXFP4,
        B.TRITON,
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.FLASHINFER_CUTLASS_MXFP4_MXFP8,
        B.CUTLASS_MXFP4_MXFP4,
        B.MARLIN,
        B.BATCHED_MARLIN,
        B.HUMMING,
        B.XPU,
        B.CPU,
        B.EMULATION,
    ),
    moves=(
        PriorityMove(
            B.TRITON,
            lambda p: p.is_cuda_family(12),
            "SM12x family: TRITON demoted after BATCHED_MARLIN",
            after=B.BATCHED_MARLIN,
        ),
        PriorityMove(
            B.HUMMING,
            lambda p: p.platform == "cuda" and p.cap == (9, 0),
            "SM90: prioritize_humming puts HUMMING before MARLIN",
            before=B.MARLIN,
        ),
    ),
    names=MappingProxyType(MOE_BACKEND_NAMES),
    unsupported_names=MappingProxyType(
        {
            "b12x": "B12X_* backends are not routed through the GPT-OSS MXFP4 weight converter",
            "deep_gemm": "DEEPGEMM_MXFP4 is not a GPT-OSS backend mxconvert lays out",
            "flashinfer_moe_ep_cutedsl": "FLASHINFER_MOE_EP_CUTEDSL is not a GPT-OSS backend mxconvert lays out",
            "flashinfer_moe_ep_mega_deep_gemm": (
                "FLASHINFER_MOE_EP_MEGA_DEEP_GEMM is not a GPT-OSS backend mxconvert lays out"
            ),
        }
    ),
    classes=MappingProxyType(KERNEL_CLASSES),
    env_overrides=(),
    activation_override=True,
    activation_bf16_fallback=True,
    forced_after_list=("xpu",),
    activation_of=_activation_of,
    choose=choose,
)


def select(run: Run) -> Selection:
    d = run.deployment
    if d.env:
        raise InputError(
            f"env overrides {', '.join(sorted(d.env))} do not exist in {run.style.runtime} "
            "(VLLM_USE_FLASHINFER_MOE_MXFP4_* and VLLM_MXFP4_USE_MARLIN were removed); use "
            "--moe-backend and the MoE activation override instead"
        )
    global_gate(run)
    requested = d.activation  # _resolve_activation_key(None): only the user override sets it
    want = requested or "bf16"

    if run.requested != "auto":
        candidates = resolve_name(run, run.requested)
        kept = filter_by_activation(candidates, requested, run.style.activation_bf16_fallback)
        # With a request the kept ones go first (matching, then BF16); the others are only noted.
        walk = list(candidates) if requested is None else [*kept, *(b for b in candidates if b not in kept)]
        for backend in walk:
            if backend not in kept:
                run.note(backend, None, f"not tried: runs {BACKEND_ACTIVATION[backend]} activations, {want} requested")
                continue
            if d.batched and backend == B.MARLIN:
                backend = B.BATCHED_MARLIN
            act = _activation_of(run, backend)
            hit = run.try_backend(backend, act, explicit=True)
            if hit:
                return run.choose(backend, hit[0], act, f"--moe-backend {run.requested}: all predicates pass")
        raise run.refuse(
            f"--moe-backend {run.requested!r} ({', '.join(b.value for b in candidates)}) cannot run on {run.where()}"
        )

    order = moved_priority(run)
    kept = filter_by_activation(order, requested, run.style.activation_bf16_fallback)
    skipped = {
        b: f"not tried: runs {BACKEND_ACTIVATION[b]} activations, {want} requested" for b in order if b not in kept
    }
    chosen = first_passing(run, order if requested is None else [*kept, *skipped], skipped)
    if chosen is not None:
        return chosen
    forced = {"xpu": B.XPU, "cpu": B.CPU}
    if run.profile.platform in run.style.forced_after_list:
        return force_platform(run, forced[run.profile.platform])
    raise run.refuse(f"no MXFP4 MoE backend supports {run.where()} with this deployment")
