"""What the NVFP4 oracles of every revision share: the activation functions and routing methods
a model may name, the activation each backend runs with, the global-scale-factor rule, the shape
refusals of the weight preparations, and the `Selection` a chosen backend gives."""

from __future__ import annotations

from collections.abc import Callable

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.selection.deployment import FI_NVL_TWO_SIDED
from mxconvert.selection.engine import Run
from mxconvert.selection.predicates import activations, where
from mxconvert.selection.report import Considered, Selection, SelectionRefused
from mxconvert.target.backends import NVFP4_GLOBAL_SF_BACKENDS, Backend, Mxfp4Backend, Nvfp4Backend

N = Nvfp4Backend

#: ``MoEActivation`` values (``fused_moe/activation.py``). All of them form the "apply set"
#: (``_APPLY_MOE_ACTIVATIONS``); names ending in "_no_mul" are non-gated (``is_gated``).
NVFP4_ACTIVATION_FNS = (
    "silu",
    "gelu",
    "gelu_tanh",
    "situ",
    "swigluoai",
    "swigluoai_uninterleave",
    "swiglustep",
    "silu_no_mul",
    "gelu_no_mul",
    "gelu_tanh_no_mul",
    "relu2_no_mul",
)

#: ``RoutingMethodType`` names a ``routing_method`` may give (the TRTLLM kernel's list plus the
#: generic ones of vLLM's/FlashInfer's enum).
ROUTING_METHODS = (
    "Default",
    "Renormalize",
    "DeepSeekV3",
    "Llama4",
    "RenormalizeNaive",
    "TopK",
    "SigmoidRenorm",
    "Sigmoid",
    "MiniMax2",
    "Custom",
    "Unspecified",
)

APPLY_SET = activations(*NVFP4_ACTIVATION_FNS)

#: FlashInfer all2all backends: NVLink two-sided (incl. the older name) and one-sided.
FI_NVL = FI_NVL_TWO_SIDED | {"flashinfer_nvlink_one_sided"}


def activation_of(run: Run, backend: Backend) -> str:
    # vLLM passes activation_key=None for W4A16 checkpoints, and for B12X when
    # VLLM_B12X_MOE_FP4_FORCE_A16=1 (``_use_a16``, oracle/nvfp4.py @ 01362014); else kNvfp4Dynamic.
    if run.model.w4a16 or (backend == N.B12X and run.env.get("VLLM_B12X_MOE_FP4_FORCE_A16")):
        return "bf16"
    return "nvfp4"


def is_global_sf_supported_for_nvfp4_backend(backend: Nvfp4Backend | str) -> bool:
    """vLLM's ``is_global_sf_supported_for_nvfp4_backend``.

    True for the FlashInfer backends: their activation input scales are reduced to one scalar over
    all experts, and ModelOpt loads the input scales of all *global* experts on every EP rank. The
    set is the same in both revisions (≈0.15 lacks CUTEDSL_BATCHED and FLASHINFER_B12X altogether).
    Backend selection itself does not depend on it in either revision; it shapes the layout.
    """
    if isinstance(backend, Mxfp4Backend):
        raise InputError(f"{backend.value} is an MXFP4 backend; global scale factors are an NVFP4 notion")
    if not isinstance(backend, Nvfp4Backend):
        try:
            backend = Nvfp4Backend.parse(str(backend))
        except ValueError:
            raise InputError(
                f"unknown NVFP4 backend {backend!r}; known: {', '.join(b.value for b in Nvfp4Backend)}"
            ) from None
    return backend in NVFP4_GLOBAL_SF_BACKENDS


# Shape refusals. vLLM 0.33.0 accepts every shape in selection (``_supports_shape`` is True for all
# NVFP4 classes); the refusals happen in the weight preparation. `nvfp4_shape_refusal` exposes them;
# `select_nvfp4_backend` applies it to the backend vLLM picks (when the sizes are given), since
# vLLM would pick that backend and then fail at load.


def needs_2n_multiple_of_128(where: str) -> Callable[[int | None, int | None, bool], str | None]:
    def rule(k: int | None, n: int | None, gated: bool) -> str | None:
        if n is None or not gated or (2 * n) % 128 == 0:
            return None
        return f"gated w13 has 2N = {2 * n} rows (N = {n} per partition), not a multiple of 128, and {where}"

    return rule


def marlin_k_rule(k: int | None, n: int | None, gated: bool) -> str | None:
    # prepare_nvfp4_moe_layer_for_marlin: N' = ceil_64(N) if K % 128 == 0, else it requires K % 64 == 0.
    if k is None or k % 64 == 0:
        return None
    return f"prepare_nvfp4_moe_layer_for_marlin requires hidden size % 64 == 0, got {k}"


def choose(run: Run, backend: Backend, name: str, activation: str, reason: str) -> Selection:
    d = run.deployment
    global_sf = is_global_sf_supported_for_nvfp4_backend(backend)
    if global_sf and d.ep > 1:
        reason += "; EP with a global scale factor: the input scales of all global experts are reduced to one scalar"
    run.considered.append(Considered(backend, name, True, reason))
    if backend == N.MARLIN and d.marlin_input_dtype is not None:
        raise SelectionRefused(
            f"VLLM_MARLIN_INPUT_DTYPE={d.marlin_input_dtype} is refused for NVFP4 Marlin: "
            'prepare_nvfp4_moe_layer_for_marlin accepts only 16-bit activations (docs/layouts.md, "MARLIN"); '
            f"profile {run.profile.name} selected MARLIN under {run.revision.name}",
            tuple(run.considered),
        )
    use_a16 = activation == "bf16"
    return run.selection(
        backend,
        name,
        # What the kernel computes with: MARLIN is weight-only (nvfp4_w4a16 quant config, a13 = a2 = None).
        "bf16" if use_a16 or backend == N.MARLIN else "nvfp4",
        format="nvfp4",
        use_global_sf=global_sf,
        use_a16=use_a16,
        activation_fn=run.model.activation_fn,
    )


def common_gate(run: Run) -> None:
    d = run.deployment
    if d.activation is not None:
        raise InputError(
            f"the MoE activation override ({d.activation}) is an MXFP4 setting; NVFP4 selection takes "
            "w4a16= for weight-only checkpoints (ModelOpt's nvfp4_per_token override is not modelled)"
        )
    # ModelOptNvFp4Config.get_min_capability() = 75 (modelopt.py).
    p = run.profile
    if p.platform == "cuda" and p.cap < (7, 5):
        raise UnsupportedError(
            f"NVFP4 needs CUDA capability >= 7.5 (ModelOptNvFp4Config.get_min_capability() = 75), {where(p)}"
        )


#: A shape rule: (K, N per partition, gated) -> why the weight preparation refuses, or None.
ShapeRule = Callable[[int | None, int | None, bool], str | None]
