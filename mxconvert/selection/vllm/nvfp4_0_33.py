"""The NVFP4 oracle of vLLM 0.33.0, as data for the engine.

Mirrors vllm/model_executor/layers/fused_moe/oracle/nvfp4.py of vLLM 0.33.0 (``AVAILABLE_BACKENDS``,
``NVFP4_BACKENDS_WITH_CLAMP``, ``map_nvfp4_backend``, ``backend_to_kernel_cls``,
``select_nvfp4_moe_backend``; read at commit 01362014) and the ``is_supported_config`` predicates
of the expert classes it names (vllm/model_executor/layers/fused_moe/experts/: trtllm_nvfp4_moe.py,
flashinfer_cutedsl_moe.py, flashinfer_cutedsl_batched_moe.py, flashinfer_cutlass_moe.py,
cutlass_moe.py, marlin_moe.py, fused_humming_moe.py, nvfp4_emulation_moe.py, flashinfer_b12x_moe.py).
`SHAPE_RULES` are the refusals of its weight preparations (``prepare_nvfp4_moe_layer_for_*``).
"""

from __future__ import annotations

from types import MappingProxyType

from mxconvert.core.errors import UnsupportedError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.engine import (
    Check,
    Context,
    KernelClass,
    PriorityMove,
    Reason,
    Run,
    SelectionStyle,
    apply_env_overrides,
    first_passing,
    force,
    moved_priority,
    parse_env,
    resolve_name,
)
from mxconvert.selection.nvfp4_common import (
    APPLY_SET,
    FI_NVL,
    ShapeRule,
    activation_of,
    choose,
    common_gate,
    marlin_k_rule,
    needs_2n_multiple_of_128,
)
from mxconvert.selection.predicates import (
    HUMMING_DEVICE,
    MARLIN_DEVICE,
    activations,
    any_scheme,
    cuda_family,
    cutlass_device,
    emulation_device,
    has,
    has_extra,
    not_fi_nvl_two_sided,
    require_cuda,
    schemes,
    where,
)
from mxconvert.selection.report import Selection
from mxconvert.target.backends import Backend, Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile

N = Nvfp4Backend


def _fi_default(p: DeviceProfile) -> bool:
    return p.has_flashinfer


def _uses_all2all_kernels(d: Deployment) -> str | None:
    """``moe_parallel_config.use_all2all_kernels`` (dp > 1 with EP), or an explicit all2all backend."""
    if d.uses_all2all:
        return f"all2all={d.all2all}"
    if d.dp > 1 and d.ep > 1:
        return f"dp={d.dp} with ep={d.ep}"
    return None


def _nvfp4_monolithic_parallel(ctx: Context) -> Reason:
    # TRTLLM Monolithic: not use_all2all_kernels and not EPLB.
    d = ctx.deployment
    why = _uses_all2all_kernels(d)
    if why:
        return f"monolithic kernel does not support all2all kernels ({why})"
    if d.eplb:
        return "monolithic kernel does not support EPLB"
    return None


def _not_all2all(*names: str) -> Check:
    banned = frozenset(names)

    def check(ctx: Context) -> Reason:
        a2a = ctx.deployment.all2all
        return f"kernel does not support the {a2a} all2all backend" if a2a in banned else None

    return check


def _no_ep(ctx: Context) -> Reason:
    # FLASHINFER_B12X: not use_ep.
    d = ctx.deployment
    return f"kernel does not support expert parallelism (ep={d.ep})" if d.ep > 1 else None


def _b12x_parallel(ctx: Context) -> Reason:
    # B12X: no EP, ep_size 1, no all2all, no EPLB.
    d = ctx.deployment
    if d.ep > 1:
        return f"kernel does not support expert parallelism (ep={d.ep})"
    if d.uses_all2all:
        return f"kernel does not support all2all kernels (all2all={d.all2all})"
    if d.eplb:
        return "kernel does not support EPLB"
    return None


def _vllm_cutlass_device(ctx: Context) -> Reason:
    # CutlassExpertsFp4: fam100, fam110, fam120.
    p = ctx.profile
    if p.platform == "cuda" and p.cap[0] in (10, 11, 12):
        return None
    return f"kernel requires CUDA capability family 10.x, 11.x or 12.x, {where(p)}"


def _nvfp4_fi_cutlass_scheme(ctx: Context) -> Reason:
    # FlashInferExperts: (S, Dyn), and the NVFP4 scheme needs cc >= 100.
    if ctx.activation != "nvfp4":
        return f"kernel does not support NVFP4 weights with {ctx.activation} activations (supports nvfp4)"
    p = ctx.profile
    if p.cap >= (10, 0):
        return None
    return f"NVFP4 weights with nvfp4 activations need CUDA capability >= 10.0, {where(p)}"


_NV_TRTLLM_DEVICE = (
    require_cuda,
    cuda_family(10),
    has_extra("has_flashinfer_trtllm", "flashinfer TRT-LLM fused MoE (trtllm_fp4_block_scale_moe)", _fi_default),
)
_NV_TRTLLM_ACTS = activations(
    "silu", "relu2_no_mul", "gelu", "gelu_tanh", "swigluoai_uninterleave", situ_flag="flashinfer_situ"
)
_NV_CUTEDSL_DEVICE = (
    require_cuda,
    cuda_family(10),
    has_extra("has_flashinfer_cutedsl", "flashinfer CuteDSL NVFP4 MoE", _fi_default),
)


def _humming(name: str, formats: frozenset[str] = frozenset({"standard"})) -> KernelClass:
    return KernelClass(
        name,
        False,
        HUMMING_DEVICE,
        schemes("bf16", "nvfp4"),
        formats=formats,
        activation=APPLY_SET,
        batch_invariant=True,
    )


#: vLLM 0.33.0 NVFP4 kernel classes per backend, in the order ``backend_to_kernel_cls`` returns them
#:.
KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    N.FLASHINFER_TRTLLM: (
        KernelClass(
            "TrtLlmNvFp4ExpertsMonolithic",
            True,
            _NV_TRTLLM_DEVICE,
            schemes("nvfp4"),
            _nvfp4_monolithic_parallel,
            activation=_NV_TRTLLM_ACTS,
            routing=frozenset(
                {"DeepSeekV3", "Renormalize", "RenormalizeNaive", "Llama4", "SigmoidRenorm", "Sigmoid", "MiniMax2"}
            ),
        ),
        KernelClass(
            "TrtLlmNvFp4ExpertsModular", False, _NV_TRTLLM_DEVICE, schemes("nvfp4"), activation=_NV_TRTLLM_ACTS
        ),
    ),
    N.FLASHINFER_CUTEDSL: (
        KernelClass(
            "FlashInferCuteDSLExperts",
            False,
            _NV_CUTEDSL_DEVICE,
            schemes("nvfp4"),
            activation=activations("silu", "swigluoai", "swigluoai_uninterleave", "relu2_no_mul", "situ"),
        ),
    ),
    N.FLASHINFER_CUTEDSL_BATCHED: (
        KernelClass(
            "FlashInferCuteDSLBatchedExperts",
            False,
            _NV_CUTEDSL_DEVICE,
            schemes("nvfp4"),
            formats=frozenset({"batched"}),
            no_act_and_mul=False,
            activation=activations("silu"),
        ),
    ),
    N.FLASHINFER_CUTLASS: (
        KernelClass(
            "FlashInferExperts",
            False,
            (require_cuda, cutlass_device, has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
            _nvfp4_fi_cutlass_scheme,
            activation=activations("silu", "gelu_tanh", "relu2_no_mul", "swigluoai", "swigluoai_uninterleave"),
        ),
    ),
    N.VLLM_CUTLASS: (
        KernelClass(
            "CutlassExpertsFp4",
            False,
            (require_cuda, _vllm_cutlass_device),
            schemes("nvfp4"),
            _not_all2all(
                "flashinfer_nvlink_two_sided",
                "flashinfer_all2allv",
                "deepep_high_throughput",
                "flashinfer_nvlink_one_sided",
            ),
            activation=APPLY_SET,
            batch_invariant=True,
        ),
    ),
    # MarlinExperts only: W == kNvfp4Static, the activation key is ignored.
    N.MARLIN: (
        KernelClass(
            "MarlinExperts", False, MARLIN_DEVICE, any_scheme, not_fi_nvl_two_sided, lora=True, activation=APPLY_SET
        ),
    ),
    N.HUMMING: (
        _humming("BatchedHummingGroupedExperts", formats=frozenset({"batched"})),
        _humming("HummingGroupedExperts"),
        _humming("HummingIndexedExperts"),
    ),
    # experts/nvfp4_emulation_moe.py: TritonExperts' device (CUDA-alike or XPU), (S, Dyn) only, no LoRA.
    N.EMULATION: (
        KernelClass(
            "Nvfp4QuantizationEmulationTritonExperts",
            False,
            (emulation_device,),
            schemes("nvfp4"),
            _not_all2all(*sorted(FI_NVL)),
            activation=APPLY_SET,
        ),
    ),
    N.FLASHINFER_B12X: (
        KernelClass(
            "FlashInferB12xExperts",
            False,
            (
                require_cuda,
                cuda_family(12),
                has_extra("has_flashinfer_b12x", "flashinfer b12x fused MoE (b12x_fused_moe)", _fi_default),
            ),
            schemes("nvfp4", "bf16"),
            _no_ep,
            activation=activations("silu", "gelu_tanh", "relu2_no_mul"),
        ),
    ),
    N.B12X: (
        KernelClass(
            "B12xExperts",
            False,
            (require_cuda, cuda_family(12), has_extra("has_b12x", "the b12x package", lambda p: False)),
            schemes("nvfp4", "bf16", "mxfp8"),
            _b12x_parallel,
            activation=activations("silu", "situ", "swigluoai_uninterleave", "relu2_no_mul"),
        ),
    ),
}

#: --moe-backend names of vLLM 0.33.0 for NVFP4 (``map_nvfp4_backend``).
NVFP4_MOE_BACKEND_NAMES: dict[str, tuple[Nvfp4Backend, ...]] = {
    "b12x": (N.B12X,),
    "cutlass": (N.VLLM_CUTLASS,),
    "flashinfer_trtllm": (N.FLASHINFER_TRTLLM,),
    "flashinfer_cutlass": (N.FLASHINFER_CUTLASS,),
    "flashinfer_cutedsl": (N.FLASHINFER_CUTEDSL,),
    "flashinfer_b12x": (N.FLASHINFER_B12X,),
    "marlin": (N.MARLIN,),
    "humming": (N.HUMMING,),
    "emulation": (N.EMULATION,),
}

#: ``NVFP4_BACKENDS_WITH_CLAMP`` (oracle/nvfp4.py @ 01362014: all but
#: FLASHINFER_CUTEDSL_BATCHED and FLASHINFER_B12X).
NVFP4_CLAMP_BACKENDS = frozenset(
    {
        N.B12X,
        N.FLASHINFER_TRTLLM,
        N.FLASHINFER_CUTLASS,
        N.FLASHINFER_CUTEDSL,
        N.VLLM_CUTLASS,
        N.MARLIN,
        N.EMULATION,
        N.HUMMING,
    }
)

STYLE = SelectionStyle(
    name="oracle-0.33",
    runtime="vLLM 0.33.0 (NVFP4 oracle)",
    # AVAILABLE_BACKENDS; B12X, FLASHINFER_B12X are explicit-only.
    priority=(
        N.FLASHINFER_TRTLLM,
        N.FLASHINFER_CUTEDSL,
        N.FLASHINFER_CUTEDSL_BATCHED,
        N.FLASHINFER_CUTLASS,
        N.VLLM_CUTLASS,
        N.MARLIN,
        N.HUMMING,
        N.EMULATION,
    ),
    moves=(
        # quantization/utils/humming/priority.py: capability int exactly 90.
        PriorityMove(
            N.HUMMING,
            lambda p: p.capability is not None and p.cap == (9, 0),
            "capability 90: prioritize_humming puts HUMMING before MARLIN",
            before=N.MARLIN,
        ),
    ),
    names=MappingProxyType(NVFP4_MOE_BACKEND_NAMES),
    unsupported_names=MappingProxyType(
        {
            "flashinfer_moe_ep_cutedsl": (
                "FLASHINFER_MOE_EP_CUTEDSL is taken by the quant method before the oracle runs, and its "
                "megakernel transforms the checkpoint tensors itself at init, so there is no "
                "pre-laid-out format to write; serve the checkpoint as it is (vLLM also limits this backend "
                "to MistralLarge3 on SM100 with DP4/EP4, compressed_tensors_moe_w4a4_nvfp4.py)"
            )
        }
    ),
    classes=MappingProxyType(KERNEL_CLASSES),
    env_overrides=(),
    activation_override=False,
    fmt="nvfp4",
    activation_of=activation_of,
    choose=choose,
    clamp=NVFP4_CLAMP_BACKENDS,
    batched_variants=MappingProxyType({N.FLASHINFER_CUTEDSL: N.FLASHINFER_CUTEDSL_BATCHED}),
    env_flags=("VLLM_BATCH_INVARIANT", "VLLM_B12X_MOE_FP4_FORCE_A16"),
    env_removed=MappingProxyType(
        {
            "VLLM_USE_FLASHINFER_MOE_FP4": "removed in v0.33.0; use --moe-backend",
            "VLLM_FLASHINFER_MOE_BACKEND": "removed in v0.33.0; use --moe-backend "
            "flashinfer_cutlass / flashinfer_trtllm / flashinfer_cutedsl",
            "VLLM_TEST_FORCE_FP8_MARLIN": "removed in v0.33.0; use --moe-backend marlin",
        }
    ),
)


def select(run: Run) -> Selection:
    """``select_nvfp4_moe_backend`` of vLLM 0.33.0."""
    parse_env(run)
    common_gate(run)
    style, d, limit = run.style, run.deployment, run.model.swiglu_limit
    clamp = style.clamp or frozenset()
    if run.requested != "auto":
        (backend,) = resolve_name(run, run.requested)
        if d.batched and backend in style.batched_variants:
            backend = style.batched_variants[backend]
        if limit is not None and backend not in clamp:
            able = [n for n, (b,) in style.names.items() if b in clamp]
            raise UnsupportedError(
                f"the model sets swiglu_limit={limit}, but the explicitly requested moe_backend="
                f"{run.requested!r} ({backend.value}) does not apply the SwiGLU clamp; use one of " + ", ".join(able)
            )
        return force(
            run,
            backend,
            f"--moe-backend {run.requested}: all predicates pass",
            f"--moe-backend {run.requested!r} ({backend.value}) cannot run on {run.where()}",
        )
    # Before 0.29.0 (VLLM_TEST_FORCE_FP8_MARLIN) an env override may force a backend here; 0.33.0's
    # style has none.
    forced, removed = apply_env_overrides(run)
    if forced is not None:
        return forced
    order = moved_priority(run)
    skipped = dict(removed)
    if limit is not None:
        skipped |= {
            b: f"dropped: does not apply the SwiGLU clamp (swiglu_limit={limit})" for b in order if b not in clamp
        }
    chosen = first_passing(run, order, skipped)
    if chosen is not None:
        return chosen
    raise run.refuse(
        f"no NVFP4 MoE backend supports {run.where()} with this deployment (vLLM raises NotImplementedError)"
    )


#: Shapes the weight preparations refuse (vLLM accepts every shape in selection: ``_supports_shape``
#: is True for all NVFP4 classes). Padding vLLM does itself is a layout matter, not a refusal.
SHAPE_RULES: tuple[tuple[frozenset, ShapeRule], ...] = (
    (
        frozenset({N.FLASHINFER_CUTLASS, N.VLLM_CUTLASS, N.FLASHINFER_CUTEDSL_BATCHED, N.FLASHINFER_B12X}),
        needs_2n_multiple_of_128(
            "prepare_nvfp4_moe_layer_for_fi_or_cutlass raises NotImplementedError for gated padding"
        ),
    ),
    (frozenset({N.MARLIN}), marlin_k_rule),
)
