"""What differs between the vLLM releases the plugin loads into: one adapter per runtime revision row.

The plugin touches a handful of vLLM internals (loader.py, install.py). Most are the same code in
every release it serves; where a release differs, the difference is a field of that release's
`ReleaseAdapter` here, chosen by the row the *installed* vLLM is (`live_adapter`), never a version
comparison elsewhere. This module imports no vLLM at import time (the checks use it without vLLM);
each adapter's functions import vLLM when called.

Which row a vLLM release is, for the plugin (`serving_row`): the row of `dependency.PLUGIN_PROVEN`
that lists the release (for the artifact's format, where one release is proven under one row per
format: vLLM 0.26.0 is vllm-0.26 for MXFP4 and vllm-0.25-nvfp4 for NVFP4), a table of the releases
where the plugin's path B was shown equal to the release's own path A. It is not the rows' `releases`
(which releases `convert --runtime vllm==X.Y.Z` may claim): a row proves an artifact's bytes for a
release, not that the plugin's hooks into that release's internals hold, so a new row (vllm-0.30 ...)
never makes the plugin accept a new release.

Differences, each from the release's own files:

* triton_kernels generation: vLLM 0.31.0 added `vllm.utils.import_utils.get_triton_kernels_version`
  ("3.8" without `triton_kernels.matmul_ogs`, "3.5.1" without `triton_kernels.tensor.SparseMatrix`,
  else "3.6"). vLLM 0.26.0 has no such function and drives the `matmul_ogs` API only; the adapter asks
  the same two questions of the triton_kernels vLLM 0.26.0 imports (`has_triton_kernels`).
* the precision config of the TRITON backends: vLLM 0.33.0's `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`
  builds `PrecisionConfig(**_mx_scale_kwargs(scale), flex_ctx=FlexCtx(rhs_data=flex))` with the names
  its oracle module imports; vLLM 0.26.0 (fused_moe/oracle/mxfp4.py) imports `FlexCtx, PrecisionConfig`
  from `triton_kernels.matmul_ogs` inside the converter and passes `weight_scale=scale`.
* the opt-flags module `_swizzle_mxfp4` updates: `triton_kernels.matmul_details.opt_flags` for a
  "3.8" triton_kernels (0.33.0), `triton_kernels.matmul_ogs_details.opt_flags` otherwise (0.26.0 always).

NVFP4 (vLLM 0.26.0 under row vllm-0.25-nvfp4, against 0.33.0's files):

* the pre-processed path: vLLM 0.33.0's `ModelOptNvFp4FusedMoE` declares `supports_pre_processed_weights`
  and loads FLASHINFER_TRTLLM weights under `vllm.model_executor.utils.weights_already_processed()`;
  vLLM 0.26.0 has neither (modelopt.py, model_executor/utils.py), so every NVFP4 layer goes through the
  bypassed conversion (`nvfp4_pre_processed`).
* which conversions pad `layer.moe_config` (`nvfp4_pads_moe_config`): 0.33.0 FLASHINFER_TRTLLM and
  FLASHINFER_CUTEDSL; 0.26.0 FLASHINFER_TRTLLM only (its `prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`
  pads nothing, quantization/utils/flashinfer_fp4_moe.py).
* the sizes the conversion pads to (`nvfp4_padding`, nvfp4_padding.py): 0.26.0's TRTLLM pads the hidden
  size with `align_trtllm_fp4_moe_hidden_dim_for_fi` (alignment 256 for both methods; 0.33.0 has
  `align_fp4_moe_hidden_dim_for_fi` with the method's `trtllm_nvfp4_hidden_alignment`), its CuteDSL
  pads nothing; MARLIN, FLASHINFER_CUTLASS, VLLM_CUTLASS and CuteDSL batched pad as in 0.33.0.
* what the conversion leaves on the layer besides its result (`nvfp4_conversion_effects`): 0.26.0's
  Marlin preparation sets `layer.workspace` (`marlin_make_workspace_new(device, 4)`); 0.33.0's nothing.
* the form of the shared activation scales (`nvfp4_input_scale`): 0.26.0's FlashInfer backends return
  `a_scale.max().to(torch.float32).expand(num_experts)` (stride 0), 0.33.0's a contiguous `.repeat`.
* whether the method runs bf16 activations (`nvfp4_a16`): 0.33.0's methods keep `use_a16`; vLLM 0.26.0's
  `CompressedTensorsW4A4Nvfp4MoEMethod` only passes it to its oracle (see `_nvfp4_a16_0_26`).

The same in both (checked against both releases' files): `register_model_loader`,
`_LOAD_FORMAT_TO_MODEL_LOADER`, `DefaultModelLoader` and `BaseModelLoader.load_model` (which calls
`process_weights_after_loading` after `load_weights`), `RoutedExperts` with its `expert_map_manager`,
`GptOssMxfp4MoEMethod` calling `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` by the name
quantization/mxfp4.py imports, `marlin_utils_fp4.get_marlin_input_dtype` and
`should_use_cdna4_mx_scale_swizzle`; for NVFP4 the module paths of the oracle and of both MoE methods,
`convert_to_nvfp4_moe_kernel_format` imported by that name into both method modules and called with
keywords, `replace_parameter`, the checkpoint-shaped parameters `create_weights` allocates and the
expert classes' own fold of the activation scales. NVFP4 artifacts load only where `PLUGIN_PROVEN`
lists the release for NVFP4 (0.33.0 under vllm-0.33, 0.26.0 under vllm-0.25-nvfp4, the row
`convert --runtime vllm==0.26.0` writes for an NVFP4 checkpoint).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.dependency import (
    PLUGIN_PROVEN,
    PLUGIN_ROWS,
    missing_vllm,
    proven_releases,
    served_releases,
)
from mxconvert.target.releases import installed_vllm, release_key
from mxconvert.target.revisions import REVISIONS, RuntimeRevision


@dataclass(frozen=True)
class ReleaseAdapter:
    """The vLLM internals that differ between the releases the plugin serves, for one row."""

    #: the runtime revision row (mxconvert/target/revisions.py) whose reference release this is
    row: str
    #: the triton_kernels MoE-API generation vLLM uses ("3.5.1", "3.6", "3.8"), None without one
    triton_kernels_generation: Callable[[], str | None]
    #: `(oracle module, swizzled scale, flex data)` -> the `PrecisionConfig` vLLM's converter builds
    precision_config: Callable[[ModuleType, Any, Any], Any]
    #: the triton_kernels opt-flags module `_swizzle_mxfp4` updates
    opt_flags_module: Callable[[], ModuleType]
    #: NVFP4 backends whose ModelOpt weights vLLM loads pre-processed (`weights_already_processed`)
    nvfp4_pre_processed: frozenset[str]
    #: NVFP4 backends whose conversion pads `layer.moe_config`'s hidden and intermediate sizes
    nvfp4_pads_moe_config: frozenset[str]
    #: NVFP4: the key of `nvfp4_padding.PADDING_TABLES` whose rules give the sizes vLLM's conversion pads
    #: a layer to, per backend (a key, not the table: nvfp4_padding.py imports this module)
    nvfp4_padding: str
    #: NVFP4: the method runs bf16 activations (a W4A16 checkpoint)
    nvfp4_a16: Callable[[Any], bool]
    #: NVFP4: `(backend, layer, device)` -> what vLLM's conversion leaves on the layer beyond the tensors it
    #: returns and the `moe_config` padding (the plugin bypasses the conversion, so it does this itself)
    nvfp4_conversion_effects: Callable[[str, Any, Any], None]
    #: NVFP4: `(backend, the artifact's activation scale, what)` -> the tensor the conversion returns for it
    #: (same values; the form: 0.26.0 returns a stride-0 expand of one value where 0.33.0 repeats it)
    nvfp4_input_scale: Callable[[str, Any, str], Any]


def _generation_0_33() -> str | None:
    try:
        from vllm.utils.import_utils import get_triton_kernels_version
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return get_triton_kernels_version()


def _generation_0_26() -> str | None:
    """vLLM 0.31.0's `get_triton_kernels_version`, asked of what vLLM 0.26.0 imports (0.26.0 has no
    such function; `has_triton_kernels` imports vLLM's vendored copy as `triton_kernels`)."""
    try:
        from vllm.utils.import_utils import has_triton_kernels
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    if not has_triton_kernels():
        return None
    try:
        importlib.import_module("triton_kernels.matmul_ogs")
    except ImportError:
        return "3.8"
    if not hasattr(importlib.import_module("triton_kernels.tensor"), "SparseMatrix"):
        return "3.5.1"
    return "3.6"


def _precision_config_0_33(oracle: ModuleType, scale: Any, flex: Any) -> Any:
    return oracle.PrecisionConfig(**oracle._mx_scale_kwargs(scale), flex_ctx=oracle.FlexCtx(rhs_data=flex))


def _precision_config_0_26(oracle: ModuleType, scale: Any, flex: Any) -> Any:
    # vLLM's vendored triton_kernels, as the other lookups here (the caller, install._triton_state,
    # has imported it already or said what is missing)
    matmul_ogs = importlib.import_module("triton_kernels.matmul_ogs")
    return matmul_ogs.PrecisionConfig(weight_scale=scale, flex_ctx=matmul_ogs.FlexCtx(rhs_data=flex))


def _opt_flags_0_33() -> ModuleType:
    if _generation_0_33() == "3.8":
        return importlib.import_module("triton_kernels.matmul_details.opt_flags")
    return importlib.import_module("triton_kernels.matmul_ogs_details.opt_flags")


def _opt_flags_0_26() -> ModuleType:
    return importlib.import_module("triton_kernels.matmul_ogs_details.opt_flags")


def _nvfp4_a16_0_33(method: Any) -> bool:
    return bool(method.use_a16)


def _nvfp4_a16_0_26(method: Any) -> bool:
    """vLLM 0.26.0's `ModelOptNvFp4FusedMoE` keeps `use_a16`; its `CompressedTensorsW4A4Nvfp4MoEMethod`
    takes `use_a16` (compressed_tensors_moe.py: no input quantization) only to ask its oracle for
    `activation_key=None`, which no NVFP4 expert class mxconvert writes accepts but Marlin's (weight-only,
    read as bf16 by the loader whatever this says): read as False for that method."""
    if type(method).__name__ == "CompressedTensorsW4A4Nvfp4MoEMethod":
        return False
    return bool(method.use_a16)


def _no_conversion_effects(backend: str, layer: Any, device: Any) -> None:
    """vLLM 0.33.0's NVFP4 conversion changes the layer only through what it returns and `moe_config`."""


def _conversion_effects_0_26(backend: str, layer: Any, device: Any) -> None:
    """vLLM 0.26.0's `prepare_nvfp4_moe_layer_for_marlin` (quantization/utils/marlin_utils_fp4.py) also
    sets `layer.workspace = marlin_make_workspace_new(device, 4)` (0.33.0 dropped it): the same call."""
    if backend != "MARLIN":
        return
    try:
        from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_make_workspace_new
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    layer.workspace = marlin_make_workspace_new(device, 4)


def _input_scale_0_33(backend: str, scale: Any, what: str) -> Any:
    """vLLM 0.33.0 returns a contiguous tensor (`amax_for_moe_activation_quant(...).repeat(E)` for the
    global-scale backends), as the artifact holds it."""
    return scale


def _input_scale_0_26(backend: str, scale: Any, what: str) -> Any:
    """vLLM 0.26.0's FlashInfer backends (`is_global_sf_supported_for_nvfp4_backend`: FLASHINFER_NVFP4_MOE_BACKENDS
    in fused_moe/oracle/nvfp4.py) share one activation scale over the experts, returned as
    `a_scale.max().to(torch.float32).expand(num_experts)` (flashinfer_fp4_moe.py, both prepare functions):
    the same expression on the artifact's scale, whose values must then all be that one value."""
    import torch

    try:
        from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import (
            NvFp4MoeBackend,
            is_global_sf_supported_for_nvfp4_backend,
        )
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    if not is_global_sf_supported_for_nvfp4_backend(NvFp4MoeBackend(backend)):
        return scale
    shared = scale.max().to(torch.float32)
    if not bool((scale == shared).all()):
        raise MismatchError(
            f"{what}: vLLM 0.26.0 shares one activation scale over the experts for {backend}, and the "
            "artifact's differ; it was not made for this vLLM (re-create it with mxconvert convert "
            "--runtime vllm==0.26.0)"
        )
    return shared.expand(scale.numel())


#: vLLM 0.26.0's internals, shared by its two rows (vllm-0.26 for MXFP4, vllm-0.25-nvfp4 for NVFP4).
_ADAPTER_0_26 = ReleaseAdapter(
    "vllm-0.26",
    _generation_0_26,
    _precision_config_0_26,
    _opt_flags_0_26,
    nvfp4_pre_processed=frozenset(),
    nvfp4_pads_moe_config=frozenset({"FLASHINFER_TRTLLM"}),
    nvfp4_padding="0.26.0",
    nvfp4_a16=_nvfp4_a16_0_26,
    nvfp4_conversion_effects=_conversion_effects_0_26,
    nvfp4_input_scale=_input_scale_0_26,
)


#: One adapter per row of `PLUGIN_ROWS` (the rows whose reference vLLM release the plugin loads
#: into), in that order.
ADAPTERS: dict[str, ReleaseAdapter] = {
    a.row: a
    for a in (
        ReleaseAdapter(
            "vllm-0.33",
            _generation_0_33,
            _precision_config_0_33,
            _opt_flags_0_33,
            nvfp4_pre_processed=frozenset({"FLASHINFER_TRTLLM"}),
            nvfp4_pads_moe_config=frozenset({"FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL"}),
            nvfp4_padding="0.33.0",
            nvfp4_a16=_nvfp4_a16_0_33,
            nvfp4_conversion_effects=_no_conversion_effects,
            nvfp4_input_scale=_input_scale_0_33,
        ),
        _ADAPTER_0_26,
        replace(_ADAPTER_0_26, row="vllm-0.25-nvfp4"),
    )
}
if tuple(ADAPTERS) != PLUGIN_ROWS:  # pragma: no cover - a row added to one list and not the other
    raise AssertionError(f"adapters.py: ADAPTERS {tuple(ADAPTERS)} != dependency.PLUGIN_ROWS {PLUGIN_ROWS}")


def public_release(version: str) -> str:
    """`0.33.0+cpu` -> `0.33.0`: a local build label is the same release."""
    return version.split("+", 1)[0]


def serving_row(version: str, fmt: str | None = None) -> RuntimeRevision | None:
    """The row the plugin serves vLLM `version` as: the first row of `PLUGIN_PROVEN` that lists the
    release for `fmt` ("mxfp4", "nvfp4"), or for some format when `fmt` is None (a local build label,
    `0.33.0+cpu`, is the same release); None: the plugin does not load into that release (for that
    format). Which artifacts it loads there: `checks.artifact_fits_release`."""
    release = public_release(version)
    for name in PLUGIN_ROWS:
        proven = PLUGIN_PROVEN[name].get(fmt, ()) if fmt is not None else proven_releases(name)
        if release in proven:
            return REVISIONS[name]
    return None


def installed_adapter(fmt: str | None = None) -> ReleaseAdapter | None:
    """The adapter of the installed vLLM (its package metadata; vLLM is not imported here) for `fmt`
    (`serving_row`), or None when the plugin does not load into that release (the runtime check then
    refuses it by name)."""
    version = installed_vllm()
    row = serving_row(version, fmt) if version is not None else None
    return ADAPTERS[row.name] if row is not None else None


def live_adapter(fmt: str | None = None) -> ReleaseAdapter:
    """`installed_adapter(fmt)`, for the steps that run after the runtime check passed."""
    adapter = installed_adapter(fmt)
    if adapter is None and fmt is not None and installed_adapter() is not None:
        releases = ", ".join(sorted({r for row in PLUGIN_PROVEN.values() for r in row.get(fmt, ())}, key=release_key))
        raise MismatchError(
            f"the mxconvert vLLM plugin loads {fmt.upper()} artifacts into vLLM {releases}; the installed "
            f"vLLM is {installed_vllm()}. Serve the checkpoint with vLLM's own loader, or install one of those releases"
        )
    if adapter is None:
        raise MismatchError(
            f"the mxconvert vLLM plugin loads into vLLM {served_releases()}; the installed vLLM is "
            f"{installed_vllm()}. Serve the checkpoint with vLLM's own loader, or install one of those releases"
        )
    return adapter
