"""NVFP4 backend selection: `select_nvfp4_backend` runs the oracle of the revision's row, then
the shape refusals of the backend's weight preparation."""

from __future__ import annotations

from collections.abc import Callable

from mxconvert.core.errors import InputError
from mxconvert.selection.deployment import Deployment, moe_tp_origin
from mxconvert.selection.engine import Model, Run, SelectionStyle, normalise_name
from mxconvert.selection.nvfp4_common import NVFP4_ACTIVATION_FNS, ROUTING_METHODS
from mxconvert.selection.report import Selection, SelectionRefused
from mxconvert.selection.sglang import nvfp4_0_5_23 as sglang_0_5_23
from mxconvert.selection.vllm import nvfp4_0_15 as vllm_0_15
from mxconvert.selection.vllm import nvfp4_0_29 as vllm_0_29
from mxconvert.selection.vllm import nvfp4_0_33 as vllm_0_33
from mxconvert.target.backends import Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision, get_revision

#: The weight format these oracles select for (the revision rows' `formats` name it).
FORMAT = "nvfp4"
#: Every NVFP4 selection style with its control flow and shape rules (a module's extra styles are
#: its oracle with other data: the releases their records show).
_STYLES = (
    (vllm_0_33.STYLE, vllm_0_33.select, vllm_0_33.SHAPE_RULES),
    (vllm_0_29.STYLE_0_29, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
    (vllm_0_29.STYLE_0_27, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
    (vllm_0_29.STYLE_0_25, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
    (vllm_0_29.STYLE_0_24, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
    (vllm_0_15.STYLE, vllm_0_15.select, vllm_0_15.SHAPE_RULES),
    (vllm_0_15.STYLE_0_15_1, vllm_0_15.select, vllm_0_15.SHAPE_RULES),
    (vllm_0_15.STYLE_0_16, vllm_0_15.select, vllm_0_15.SHAPE_RULES),
    (vllm_0_15.STYLE_0_17, vllm_0_15.select, vllm_0_15.SHAPE_RULES),
    (vllm_0_15.STYLE_0_18, vllm_0_15.select, vllm_0_15.SHAPE_RULES),
    (vllm_0_15.STYLE_0_19, vllm_0_15.select, vllm_0_15.SHAPE_RULES),
    (vllm_0_15.STYLE_0_20, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
    (vllm_0_15.STYLE_0_21, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
    (vllm_0_15.STYLE_0_22, vllm_0_29.select, vllm_0_29.SHAPE_RULES),
)
NVFP4_SELECTION_STYLES: dict[str, SelectionStyle] = {style.name: style for style, _, _ in _STYLES}
_SHAPE_RULES = {style.name: rules for style, _, rules in _STYLES}


def nvfp4_shape_refusal(
    backend: Backend,
    revision: RuntimeRevision,
    hidden_size: int | None,
    intermediate_size_per_partition: int | None,
    *,
    gated: bool = True,
) -> str | None:
    """Why `revision`'s weight preparation for `backend` refuses this shape, or None.

    `hidden_size` is K, `intermediate_size_per_partition` is N of one rank (after TP), `gated` is
    is_act_and_mul. Every backend needs K and N to be multiples of the NVFP4 block (16). Padding
    that vLLM does itself (TRTLLM/CUTEDSL N to 64 and K to 256, MARLIN N to 64/128, B12X N to 64 in
    0.33) is a layout matter, not a refusal.
    """
    k, n = hidden_size, intermediate_size_per_partition
    if k is not None and k % 16:
        return f"hidden size {k} is not a multiple of the NVFP4 block size 16"
    if n is not None and n % 16:
        return (
            f"intermediate size per partition {n} is not a multiple of 16 (the w2 block-scale "
            "columns cannot be split into whole 16-value blocks)"
        )
    style = nvfp4_style_for(revision)
    for backends, rule in _SHAPE_RULES.get(style.name, ()):
        if backend in backends:
            reason = rule(k, n, gated)
            if reason:
                return reason
    return None


def nvfp4_style_for(revision: RuntimeRevision) -> SelectionStyle:
    if FORMAT not in revision.formats:
        get_revision(revision.name, fmt=FORMAT)  # raises the standard "defines no NVFP4 layouts"
        raise InputError(f"runtime revision {revision.name} defines no NVFP4 layouts")  # pragma: no cover
    try:
        return NVFP4_SELECTION_STYLES[revision.selection]
    except KeyError:
        raise InputError(
            f"runtime revision {revision.name} uses selection style {revision.selection!r}, which "
            f"mxconvert's NVFP4 oracle does not know (known: {', '.join(NVFP4_SELECTION_STYLES)})"
        ) from None


def nvfp4_moe_backend_names(revision: RuntimeRevision) -> tuple[str, ...]:
    """The NVFP4 --moe-backend names valid for `revision`, "auto" first (SGLang rows: its
    --moe-runner-backend names for NVFP4)."""
    if revision.selection == sglang_0_5_23.STYLE_NAME and FORMAT in revision.formats:
        return sglang_0_5_23.RUNNER_NAMES
    return ("auto", *nvfp4_style_for(revision).names)


_NVFP4_ALGORITHMS: dict[str, Callable[[Run], Selection]] = {style.name: select for style, select, _ in _STYLES}


def _positive_int(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise InputError(f"{name} must be a positive integer, got {value!r}")


def select_nvfp4_backend(
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment = Deployment(),
    moe_backend: str = "auto",
    *,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    w4a16: bool = False,
    swiglu_limit: float | None = None,
    activation_fn: str = "silu",
    routing_method: str | None = None,
    producer: str | None = None,
    model_type: str | None = None,
) -> Selection:
    """Pick the NVFP4 MoE backend and kernel class vLLM `revision` would pick on `profile`.

    `moe_backend` is "auto" or a vLLM --moe-backend name (0.33.0 only; ≈0.15 reads env overrides
    from `deployment.env` instead). `hidden_size` (K) and `intermediate_size` (the checkpoint's,
    unsharded; the per-rank N is intermediate_size / tp, or the whole when ep > 1) only feed the
    shape refusals of the weight preparation (`nvfp4_shape_refusal`). `w4a16`: the checkpoint has
    no input scales (ModelOpt W4A16_NVFP4, CT NVFP4A16). `swiglu_limit`: the model's SwiGLU clamp.
    `activation_fn`: a MoEActivation value ("silu", "swigluoai", "relu2_no_mul", ...).
    `routing_method`: a RoutingMethodType name; None assumes one the monolithic kernels support.
    `producer` ("modelopt" / "compressed-tensors") and `model_type` are read by SGLang rows only
    (selection/sglang/nvfp4_0_5_23.py: the quantization method and the model override SGLang takes).
    Raises InputError for bad input and UnsupportedError when the request cannot run; the message
    lists the per-backend reasons.
    """
    if not isinstance(deployment, Deployment):
        raise InputError(f"deployment must be a Deployment, got {type(deployment).__name__}")
    _positive_int("hidden_size", hidden_size)
    _positive_int("intermediate_size", intermediate_size)
    if not isinstance(w4a16, bool):
        raise InputError(f"w4a16 must be True or False, got {w4a16!r}")
    if swiglu_limit is not None and (isinstance(swiglu_limit, bool) or not isinstance(swiglu_limit, (int, float))):
        raise InputError(f"swiglu_limit must be a number or None, got {swiglu_limit!r}")
    act = activation_fn.strip().lower() if isinstance(activation_fn, str) else activation_fn
    if act not in NVFP4_ACTIVATION_FNS:
        raise InputError(f"unknown MoE activation {activation_fn!r}; known: {', '.join(NVFP4_ACTIVATION_FNS)}")
    routing = None
    if routing_method is not None:
        by_lower = {r.lower(): r for r in ROUTING_METHODS}
        key = routing_method.strip().lower() if isinstance(routing_method, str) else None
        if key not in by_lower:
            raise InputError(f"unknown routing method {routing_method!r}; known: {', '.join(ROUTING_METHODS)}")
        routing = by_lower[key]
    if revision.selection == sglang_0_5_23.STYLE_NAME:  # SGLang's choice is no vLLM oracle (docs/sglang.md)
        if FORMAT not in revision.formats:
            nvfp4_style_for(revision)  # raises "defines no NVFP4 ..."
        return sglang_0_5_23.select(
            profile,
            revision,
            deployment,
            moe_backend,
            producer=producer,
            model_type=model_type,
            w4a16=w4a16,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            swiglu_limit=None if swiglu_limit is None else float(swiglu_limit),
        )
    style = nvfp4_style_for(revision)
    n_part = None
    if intermediate_size is not None:
        moe_tp = deployment.moe_tp  # TP x DP without EP, 1 with it (FusedMoEParallelConfig.make)
        if intermediate_size % moe_tp:
            raise InputError(
                f"the MoE's tp {moe_tp} does not divide intermediate_size {intermediate_size} "
                f"({moe_tp_origin(deployment)}; vLLM asserts this)"
            )
        n_part = intermediate_size // moe_tp
    model = Model(
        routing=routing,
        activation_fn=act,
        w4a16=w4a16,
        swiglu_limit=None if swiglu_limit is None else float(swiglu_limit),
        intermediate_size=intermediate_size,
    )
    run = Run(style, profile, revision, deployment, normalise_name(moe_backend), hidden_size, model)
    selection = _NVFP4_ALGORITHMS[style.name](run)
    reason = nvfp4_shape_refusal(selection.backend, revision, hidden_size, n_part, gated=not act.endswith("_no_mul"))
    if reason:
        raise SelectionRefused(
            f"{style.runtime} selects {selection.backend.value} ({selection.kernel_class}) on "
            f"{run.where()}, but its weight preparation refuses this shape: {reason}",
            selection.considered,
        )
    return selection
