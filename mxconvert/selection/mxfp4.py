"""MXFP4 (GPT-OSS) backend selection: `select_backend` runs the oracle of the revision's row."""

from __future__ import annotations

from collections.abc import Callable

from mxconvert.core.errors import InputError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.engine import Run, SelectionStyle, normalise_name
from mxconvert.selection.report import Selection
from mxconvert.selection.sglang import mxfp4_0_5_23 as sglang_0_5_23
from mxconvert.selection.vllm import mxfp4_0_20 as vllm_0_20
from mxconvert.selection.vllm import mxfp4_0_26 as vllm_0_26
from mxconvert.selection.vllm import mxfp4_0_32 as vllm_0_32
from mxconvert.selection.vllm import mxfp4_0_33 as vllm_0_33
from mxconvert.target.backends import Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision

SELECTION_STYLES: dict[str, SelectionStyle] = {
    s.name: s
    for s in (
        vllm_0_33.STYLE,
        vllm_0_32.STYLE,
        vllm_0_32.STYLE_0_31,
        vllm_0_32.STYLE_0_30,
        vllm_0_32.STYLE_0_29,
        vllm_0_26.STYLE_0_27,
        vllm_0_26.STYLE,
        vllm_0_26.STYLE_0_24,
        vllm_0_20.STYLE_0_23,
        vllm_0_20.STYLE_0_22,
        vllm_0_20.STYLE_0_21,
        vllm_0_20.STYLE,
        vllm_0_20.STYLE_0_19,
    )
}

#: --moe-backend names per selection style.
MOE_BACKEND_NAMES_BY_STYLE: dict[str, dict[str, tuple[Backend, ...]]] = {
    s.name: dict(s.names) for s in SELECTION_STYLES.values()
}


def style_for(revision: RuntimeRevision) -> SelectionStyle:
    try:
        return SELECTION_STYLES[revision.selection]
    except KeyError:
        raise InputError(
            f"runtime revision {revision.name} uses selection style {revision.selection!r}, which "
            f"mxconvert does not know (known: {', '.join(SELECTION_STYLES)})"
        ) from None


def moe_backend_names(revision: RuntimeRevision) -> tuple[str, ...]:
    """The --moe-backend names valid for `revision`, "auto" first (SGLang rows: its
    --moe-runner-backend names for GPT-OSS MXFP4)."""
    if revision.selection in _SGLANG_ALGORITHMS:
        return sglang_0_5_23.RUNNER_NAMES
    return ("auto", *style_for(revision).names)


_ALGORITHMS: dict[str, Callable[[Run], Selection]] = {
    vllm_0_33.STYLE.name: vllm_0_33.select,
    vllm_0_32.STYLE.name: vllm_0_32.select,
    vllm_0_32.STYLE_0_31.name: vllm_0_32.select,
    vllm_0_32.STYLE_0_30.name: vllm_0_32.select,
    vllm_0_32.STYLE_0_29.name: vllm_0_32.select,
    vllm_0_26.STYLE.name: vllm_0_26.select,
    vllm_0_26.STYLE_0_27.name: vllm_0_26.select,
    vllm_0_26.STYLE_0_24.name: vllm_0_26.select,
    vllm_0_20.STYLE_0_23.name: vllm_0_26.select,
    vllm_0_20.STYLE_0_22.name: vllm_0_26.select,
    vllm_0_20.STYLE_0_21.name: vllm_0_26.select,
    vllm_0_20.STYLE.name: vllm_0_20.select,
    vllm_0_20.STYLE_0_19.name: vllm_0_20.select,
}

#: SGLang rows' selections (docs/sglang.md): SGLang's choice is no vLLM oracle, so they take the
#: request as given rather than a `Run` of the engine.
_SGLANG_ALGORITHMS = {sglang_0_5_23.STYLE_NAME: sglang_0_5_23.select}


def select_backend(
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment = Deployment(),
    moe_backend: str = "auto",
    hidden_size: int | None = None,
) -> Selection:
    """Pick the MXFP4 MoE backend and kernel class vLLM `revision` would pick on `profile`.

    `moe_backend` is "auto" or a vLLM --moe-backend name. `hidden_size` is the unpadded hidden size
    (vLLM checks `_supports_shape` before padding); no class on this path constrains it today.
    Raises InputError for bad input (unknown names, malformed overrides) and UnsupportedError when
    the requested or every backend is refused; the message lists the per-backend reasons.
    """
    if not isinstance(deployment, Deployment):
        raise InputError(f"deployment must be a Deployment, got {type(deployment).__name__}")
    if hidden_size is not None and (
        isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size <= 0
    ):
        raise InputError(f"hidden_size must be a positive integer, got {hidden_size!r}")
    if revision.selection in _SGLANG_ALGORITHMS:
        return _SGLANG_ALGORITHMS[revision.selection](profile, revision, deployment, moe_backend, hidden_size)
    style = style_for(revision)
    run = Run(style, profile, revision, deployment, normalise_name(moe_backend), hidden_size)
    return _ALGORITHMS[style.name](run)
