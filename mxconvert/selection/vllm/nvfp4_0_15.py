"""The NVFP4 oracle of vLLM 0.15.0, as data for the engine.

Mirrors vllm/model_executor/layers/fused_moe/oracle/nvfp4.py of the vLLM 0.15.0 wheel
(``select_nvfp4_moe_backend`` with VLLM_USE_FLASHINFER_MOE_FP4, VLLM_FLASHINFER_MOE_BACKEND and
VLLM_TEST_FORCE_FP8_MARLIN), with the class predicates of the same release:
quantization/utils/flashinfer_fp4_moe.py (``is_supported_config_trtllm``),
fused_moe/flashinfer_cutlass_moe.py, fused_moe/flashinfer_cutedsl_moe.py, fused_moe/cutlass_moe.py
(``CutlassExpertsFp4``) and fused_moe/fused_marlin_moe.py. The selection record
tests/golden/selection/vllm-0.15.0-nvfp4.json (0.15.0's own oracle, run on CPU) holds it to the
release. Until that record this module mirrored a tree from before the release, which differed in
three places: VLLM_CUTLASS was commented out of the auto list, ``FLASHINFER_NVFP4_MOE_BACKENDS``
was ordered CUTLASS, TRTLLM, CUTEDSL and its VLLM_USE_FLASHINFER_MOE_FP4=1 loop returned the first
one unchecked, and MarlinExperts needed capability 8.0 (silu / swigluoai only); LoRA was refused
as not modelled (0.15.0's oracle does not look at it).
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
    force,
    parse_env,
    resolve_name,
)
from mxconvert.selection.nvfp4_common import ShapeRule, activation_of, choose, common_gate, needs_2n_multiple_of_128
from mxconvert.selection.predicates import (
    activations,
    any_scheme,
    cuda_family,
    cuda_min,
    has,
    has_extra,
    require_cuda,
    schemes,
    where,
)
from mxconvert.selection.report import Selection
from mxconvert.selection.vllm import nvfp4_0_29 as _v029
from mxconvert.selection.vllm.nvfp4_0_29 import marlin_no_fi_nvl
from mxconvert.selection.vllm.nvfp4_0_33 import KERNEL_CLASSES as _V033_CLASSES
from mxconvert.target.backends import Backend, Nvfp4Backend

N = Nvfp4Backend


def _fi_cutlass_device_015(ctx: Context) -> Reason:
    # ≈0.15 FlashInferExperts._supports_current_device: cap == 9.0 or family 10.x, and the
    # flashinfer CUTLASS fused MoE (fused_moe/flashinfer_cutlass_moe.py @ 01f004eb). No SM12x yet.
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] == 10):
        return None
    return f"kernel requires CUDA capability 9.0 or family 10.x, {where(p)}"


def _nvfp4_fi_cutlass_scheme_015(ctx: Context) -> Reason:
    # ≈0.15: (kNvfp4Static, kNvfp4Dynamic) only on family 10.x (same file).
    if ctx.activation != "nvfp4":
        return f"kernel does not support NVFP4 weights with {ctx.activation} activations (supports nvfp4)"
    p = ctx.profile
    if p.is_cuda_family(10):
        return None
    return f"NVFP4 weights with nvfp4 activations need CUDA capability family 10.x, {where(p)}"


def _fi_cutlass_parallel_015(ctx: Context) -> Reason:
    # ≈0.15: dp_size == 1 or dp_size == ep_size (its own prepare/finalize; same file).
    d = ctx.deployment
    if d.dp == 1 or d.dp == d.ep:
        return None
    return f"kernel supports only dp == 1 or dp == ep (dp={d.dp}, ep={d.ep})"


def _vllm_cutlass_parallel_015(ctx: Context) -> Reason:
    # CutlassExpertsFp4._supports_parallel_config (0.15.0 fused_moe/cutlass_moe.py): no expert map,
    # so ep_size == 1.
    d = ctx.deployment
    return None if d.ep == 1 else f"kernel does not support expert parallelism (ep={d.ep})"


#: vLLM 0.15.0 NVFP4 kernel classes (oracle/nvfp4.py ``backend_to_kernel_cls`` plus the class files
#: cited above). FLASHINFER_TRTLLM has no expert class there (``k_cls = None``; the layer calls
#: FlashInfer itself): its row is ``is_supported_config_trtllm`` (quantization/utils/
#: flashinfer_fp4_moe.py), which is also what the report names as its "kernel class". No class
#: checks LoRA in 0.15.0 (``is_supported_config`` has no LoRA step yet), so every row takes it.
KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    N.FLASHINFER_TRTLLM: (
        # No flashinfer availability check in this era's _supports_current_device.
        KernelClass(
            "is_supported_config_trtllm",
            True,
            (require_cuda, cuda_family(10)),
            schemes("nvfp4"),
            routing=frozenset({"DeepSeekV3", "Renormalize", "RenormalizeNaive", "Llama4"}),
            no_act_and_mul=False,
            activation=activations("silu"),
            lora=True,
        ),
    ),
    # The masked-GEMM CuteDSL kernel: batched activation format only (flashinfer_cutedsl_moe.py @ 04f87a28).
    N.FLASHINFER_CUTEDSL: (
        KernelClass(
            "FlashInferCuteDSLExperts",
            False,
            (require_cuda, cuda_family(10)),
            schemes("nvfp4"),
            formats=frozenset({"batched"}),
            no_act_and_mul=False,
            activation=activations("silu"),
            lora=True,
        ),
    ),
    N.FLASHINFER_CUTLASS: (
        KernelClass(
            "FlashInferExperts",
            False,
            (require_cuda, _fi_cutlass_device_015, has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
            _nvfp4_fi_cutlass_scheme_015,
            _fi_cutlass_parallel_015,
            activation=activations("silu", "relu2_no_mul"),
            lora=True,
        ),
    ),
    # cutlass_moe.py CutlassExpertsFp4: capability >= 10.0, gated only, W4A4 NVFP4, ep_size == 1.
    N.VLLM_CUTLASS: (
        KernelClass(
            "CutlassExpertsFp4",
            False,
            (require_cuda, cuda_min((10, 0))),
            schemes("nvfp4"),
            _vllm_cutlass_parallel_015,
            no_act_and_mul=False,
            activation=activations("silu", "gelu", "swigluoai"),
            lora=True,
        ),
    ),
    # fused_marlin_moe.py MarlinExperts: CUDA >= 7.5, gated only, any activation key.
    N.MARLIN: (
        KernelClass(
            "MarlinExperts",
            False,
            (require_cuda, cuda_min((7, 5))),
            any_scheme,
            no_act_and_mul=False,
            activation=activations("silu", "gelu", "swigluoai", "silu_no_mul", "gelu_no_mul", "relu2_no_mul"),
            lora=True,
        ),
    ),
}


#: vLLM ~0.15).
FLASHINFER_MOE_BACKEND_ENV_0_15: dict[str, Nvfp4Backend] = {
    "throughput": N.FLASHINFER_CUTLASS,
    "latency": N.FLASHINFER_TRTLLM,
    "masked_gemm": N.FLASHINFER_CUTEDSL,
}

#: vLLM 0.15.0 oracle/nvfp4.py ``FLASHINFER_NVFP4_MOE_BACKENDS``, in its order.
_FI_NVFP4_BACKENDS_0_15 = (N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTLASS, N.FLASHINFER_CUTEDSL)


def _fi_fp4_on_015(run: Run) -> Selection:
    """vLLM 0.15.0 oracle/nvfp4.py, ``VLLM_USE_FLASHINFER_MOE_FP4=1``."""
    fi = run.env.get("VLLM_FLASHINFER_MOE_BACKEND")
    if isinstance(fi, str):  # a choice of `env_choices`, parsed as a string
        backend = FLASHINFER_MOE_BACKEND_ENV_0_15[fi]
        if backend == N.FLASHINFER_TRTLLM and not run.profile.is_cuda_family(10):
            # get_flashinfer_moe_backend (quantization/utils/flashinfer_utils.py): "latency" off
            # the SM100 family is FlashInfer CUTLASS.
            backend = N.FLASHINFER_CUTLASS
        return force(
            run,
            backend,
            f"forced by VLLM_USE_FLASHINFER_MOE_FP4=1 and VLLM_FLASHINFER_MOE_BACKEND={fi}",
            f"VLLM_USE_FLASHINFER_MOE_FP4=1 with VLLM_FLASHINFER_MOE_BACKEND={fi} forces "
            f"{backend.value}, which cannot run on {run.where()}",
        )
    # "If the user is not explicit about the backend, try each": the first of
    # FLASHINFER_NVFP4_MOE_BACKENDS whose predicates pass, else NotImplementedError.
    since = len(run.considered)
    for backend in _FI_NVFP4_BACKENDS_0_15:
        act = run.activation_for(backend)
        hit = run.try_backend(backend, act, explicit=True)
        if hit:
            return run.choose(
                backend,
                hit[0],
                act,
                "VLLM_USE_FLASHINFER_MOE_FP4=1 without VLLM_FLASHINFER_MOE_BACKEND: the first FlashInfer "
                "NVFP4 backend whose predicates pass",
            )
    raise run.refuse(
        f"VLLM_USE_FLASHINFER_MOE_FP4=1, but no FlashInfer NVFP4 MoE backend supports {run.where()} "
        "(vLLM raises NotImplementedError)",
        since,
    )


STYLE = SelectionStyle(
    name="env-0.15",
    runtime="vLLM 0.15.0 (NVFP4 oracle)",
    # vLLM 0.15.0 oracle/nvfp4.py AVAILABLE_BACKENDS.
    priority=(N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTEDSL, N.FLASHINFER_CUTLASS, N.VLLM_CUTLASS, N.MARLIN),
    moves=(),
    names=MappingProxyType({}),
    unsupported_names=MappingProxyType({}),
    classes=MappingProxyType(KERNEL_CLASSES),
    env_overrides=(
        EnvOverride("VLLM_USE_FLASHINFER_MOE_FP4", remove_when_false=_FI_NVFP4_BACKENDS_0_15, when_true=_fi_fp4_on_015),
        EnvOverride("VLLM_TEST_FORCE_FP8_MARLIN", force=((always, N.MARLIN),)),
    ),
    activation_override=False,
    fmt="nvfp4",
    activation_of=activation_of,
    choose=choose,
    env_choices=MappingProxyType({"VLLM_FLASHINFER_MOE_BACKEND": tuple(FLASHINFER_MOE_BACKEND_ENV_0_15)}),
)


def select(run: Run) -> Selection:
    """vLLM 0.15.0 oracle/nvfp4.py ``select_nvfp4_moe_backend`` (0.17.0 adds the explicit name,
    tried before the env overrides)."""
    if run.requested != "auto" and not run.style.names:
        raise InputError(
            f"--moe-backend {run.requested!r}: the NVFP4 oracle of {run.revision.name} reads no "
            "--moe-backend; valid names: auto. Use its env overrides instead: "
            "VLLM_USE_FLASHINFER_MOE_FP4=1 with VLLM_FLASHINFER_MOE_BACKEND=throughput (FLASHINFER_CUTLASS), "
            "latency (FLASHINFER_TRTLLM) or masked_gemm (FLASHINFER_CUTEDSL); "
            "VLLM_USE_FLASHINFER_MOE_FP4=0 (no FlashInfer); VLLM_TEST_FORCE_FP8_MARLIN=1 (MARLIN)"
        )
    parse_env(run)
    common_gate(run)
    if run.model.swiglu_limit is not None:
        raise UnsupportedError(
            f"swiglu_limit with NVFP4 is not modelled for {run.revision.name}: its oracle has no SwiGLU "
            "clamp filter, and whether its kernels apply the limit was not checked"
        )
    if run.requested != "auto":
        (backend,) = resolve_name(run, run.requested)
        return force(
            run,
            backend,
            f"--moe-backend {run.requested}: all predicates pass",
            f"--moe-backend {run.requested!r} ({backend.value}) cannot run on {run.where()}",
        )
    forced, removed = apply_env_overrides(run)
    if forced is not None:
        return forced
    chosen = first_passing(run, run.style.priority, removed)
    if chosen is not None:
        return chosen
    raise run.refuse(
        f"no NVFP4 MoE backend supports {run.where()} with this deployment (vLLM raises NotImplementedError)"
    )


#: Shapes the weight preparations refuse: this revision pads nothing.
SHAPE_RULES: tuple[tuple[frozenset, ShapeRule], ...] = (
    (
        frozenset({N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTLASS, N.FLASHINFER_CUTEDSL, N.VLLM_CUTLASS}),
        needs_2n_multiple_of_128("this revision pads nothing: the shape is refused"),
    ),
)


def _fi_cutlass_device_0151(ctx: Context) -> Reason:
    # 0.15.1 FlashInferExperts._supports_current_device: cap == 9.0 or family 10.x, 11.x or 12.x.
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] in (10, 11, 12)):
        return None
    return f"kernel requires CUDA capability 9.0 or family 10.x, 11.x or 12.x, {where(p)}"


def _nvfp4_fi_cutlass_scheme_0151(ctx: Context) -> Reason:
    # 0.15.1 FlashInferExperts._supports_quant_scheme: (kNvfp4Static, kNvfp4Dynamic) on cc >= 10.0.
    if ctx.activation != "nvfp4":
        return f"kernel does not support NVFP4 weights with {ctx.activation} activations (supports nvfp4)"
    p = ctx.profile
    return (
        None if p.cap >= (10, 0) else f"NVFP4 weights with nvfp4 activations need CUDA capability >= 10.0, {where(p)}"
    )


#: vLLM 0.15.1 (tests/golden/selection/vllm-0.15.1-nvfp4.json): 0.15.0's oracle with
#: FlashInferExperts widened to SM90 and the 10.x, 11.x and 12.x families, NVFP4 from cc 10.0
#: (fused_moe/flashinfer_cutlass_moe.py); so SM110 and SM12x pick FLASHINFER_CUTLASS.
STYLE_0_15_1 = replace(
    STYLE,
    name="env-0.15.1",
    runtime="vLLM 0.15.1 (NVFP4 oracle)",
    classes=MappingProxyType(
        {
            **KERNEL_CLASSES,
            N.FLASHINFER_CUTLASS: (
                replace(
                    KERNEL_CLASSES[N.FLASHINFER_CUTLASS][0],
                    device=(
                        require_cuda,
                        _fi_cutlass_device_0151,
                        has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE"),
                    ),
                    quant=_nvfp4_fi_cutlass_scheme_0151,
                ),
            ),
        }
    ),
)


def _not_sequence_parallel(ctx: Context) -> Reason:
    # 0.16.0 FlashInferExperts._supports_parallel_config: `not is_sequence_parallel` (mxconvert's
    # deployments have no sequence parallelism), where 0.15.x required dp == 1 or dp == ep.
    return None


#: vLLM 0.16.0 (tests/golden/selection/vllm-0.16.0-nvfp4.json): 0.15.1's oracle, except that
#: FlashInferExperts takes any dp / ep split (only sequence parallelism is refused).
STYLE_0_16 = replace(
    STYLE_0_15_1,
    name="env-0.16",
    runtime="vLLM 0.16.0 (NVFP4 oracle)",
    classes=MappingProxyType(
        {
            **STYLE_0_15_1.classes,
            N.FLASHINFER_CUTLASS: (
                replace(STYLE_0_15_1.classes[N.FLASHINFER_CUTLASS][0], parallel=_not_sequence_parallel),
            ),
        }
    ),
)


#: vLLM 0.17.0 (tests/golden/selection/vllm-0.17.0-nvfp4.json): 0.16.0's oracle plus
#: `map_nvfp4_backend`, whose name is tried (`_return_or_raise`) before the env overrides, and
#: with the TRTLLM expert classes (TrtLlmNvFp4ExpertsMonolithic / Modular: 0.33.0's predicates
#: without its flashinfer availability and LoRA checks).
STYLE_0_17 = replace(
    STYLE_0_16,
    name="env-0.17",
    runtime="vLLM 0.17.0 (NVFP4 oracle)",
    classes=MappingProxyType(
        {
            **STYLE_0_16.classes,
            N.FLASHINFER_TRTLLM: tuple(
                replace(c, device=(require_cuda, cuda_family(10)), lora=True)
                for c in _V033_CLASSES[N.FLASHINFER_TRTLLM]
            ),
        }
    ),
    names=MappingProxyType(
        {
            "cutlass": (N.VLLM_CUTLASS,),
            "flashinfer_trtllm": (N.FLASHINFER_TRTLLM,),
            "flashinfer_cutlass": (N.FLASHINFER_CUTLASS,),
            "flashinfer_cutedsl": (N.FLASHINFER_CUTEDSL,),
            "marlin": (N.MARLIN,),
        }
    ),
)

#: vLLM 0.18.0-0.19.1 (their records): 0.17.0's oracle, except that MarlinExperts refuses both
#: FlashInfer NVLink all2all kinds (which exist from 0.18.0).
STYLE_0_18 = replace(
    STYLE_0_17,
    name="env-0.18",
    runtime="vLLM 0.18.0-0.19.1 (NVFP4 oracle)",
    classes=MappingProxyType(
        {**STYLE_0_17.classes, N.MARLIN: (replace(STYLE_0_17.classes[N.MARLIN][0], parallel=marlin_no_fi_nvl),)}
    ),
)

#: vLLM 0.19.0-0.19.1 (their records): 0.18.0's oracle, except that the TRTLLM classes ask for
#: FlashInfer's TRT-LLM fused MoE (0.33.0's device check) and the CuteDSL class for FlashInfer's
#: CuteDSL grouped GEMM.
STYLE_0_19 = replace(
    STYLE_0_18,
    name="env-0.19",
    runtime="vLLM 0.19.0-0.19.1 (NVFP4 oracle)",
    classes=MappingProxyType(
        {
            **STYLE_0_18.classes,
            N.FLASHINFER_TRTLLM: tuple(replace(c, lora=True) for c in _V033_CLASSES[N.FLASHINFER_TRTLLM]),
            N.FLASHINFER_CUTEDSL: (
                replace(
                    STYLE_0_18.classes[N.FLASHINFER_CUTEDSL][0],
                    device=(
                        require_cuda,
                        cuda_family(10),
                        has_extra("has_flashinfer_cutedsl", "flashinfer CuteDSL NVFP4 MoE", lambda p: p.has_flashinfer),
                    ),
                ),
            ),
        }
    ),
)

#: vLLM 0.22.0-0.23.0 (their records): 0.24.0's oracle (nvfp4_0_29.py `STYLE_0_24`, 0.33.0's flow)
#: that still reads 0.15.0's VLLM_USE_FLASHINFER_MOE_FP4 / VLLM_FLASHINFER_MOE_BACKEND /
#: VLLM_TEST_FORCE_FP8_MARLIN overrides, after an explicit name and before the list.
STYLE_0_22 = replace(
    _v029.STYLE_0_24,
    name="oracle-0.22",
    runtime="vLLM 0.22.0-0.23.0 (NVFP4 oracle)",
    env_overrides=STYLE.env_overrides,
    env_choices=STYLE.env_choices,
    env_removed=MappingProxyType({}),
)

#: vLLM 0.21.0: 0.22.0's, without the flashinfer_b12x name.
STYLE_0_21 = replace(
    STYLE_0_22,
    name="oracle-0.21",
    runtime="vLLM 0.21.0 (NVFP4 oracle)",
    names=MappingProxyType({n: b for n, b in STYLE_0_22.names.items() if n != "flashinfer_b12x"}),
)


def _fi_cutlass_device_020(ctx: Context) -> Reason:
    # 0.20.0 FlashInferExperts._supports_current_device: cap == 9.0 or family 10.x, 11.x or 12.x
    # (SM110 included, unlike 0.21.0 on).
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] in (10, 11, 12)):
        return None
    return f"kernel requires CUDA capability 9.0 or family 10.x, 11.x or 12.x, {where(p)}"


#: vLLM 0.20.0-0.20.2: 0.21.0's, with FlashInferExperts on SM110 too.
STYLE_0_20 = replace(
    STYLE_0_21,
    name="oracle-0.20",
    runtime="vLLM 0.20.0-0.20.2 (NVFP4 oracle)",
    classes=MappingProxyType(
        {
            **STYLE_0_21.classes,
            N.FLASHINFER_CUTLASS: (
                replace(
                    STYLE_0_21.classes[N.FLASHINFER_CUTLASS][0],
                    device=(
                        require_cuda,
                        _fi_cutlass_device_020,
                        has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE"),
                    ),
                ),
            ),
        }
    ),
)
