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

What differs, each from the release's own files, is listed field by field in `ReleaseAdapter` below
(each field names the upstream file and the releases) and in docs/vllm-plugin.md ("The vLLM releases
it loads into"): for GPT-OSS MXFP4 (served in 0.19.0-0.33.0) the triton_kernels generation, the TRITON
`PrecisionConfig` and opt-flags module, what the TRITON conversion leaves on the layer, the MoE module
class and its expert map, ROCm's CDNA4 scale rule, and the quant method and conversion function names
(`Mxfp4MoEMethod` / `convert_to_mxfp4_moe_kernel_format` in 0.19.x); for NVFP4 (served in
0.15.0-0.33.0) the pre-processed path, which conversions pad `layer.moe_config` and to what sizes
(nvfp4_padding.py), what a conversion leaves on the layer (Marlin's `layer.workspace`), the form of the
shared activation scales, bf16 activations, and the compressed-tensors method's module (their values:
adapters_nvfp4.py).

The same in every served release (their A = B runs, tests_vllm/test_release_rows.py and
test_release_rows_nvfp4.py, go through it): `register_model_loader`, `_LOAD_FORMAT_TO_MODEL_LOADER`,
`DefaultModelLoader` and `BaseModelLoader.load_model` (which calls `process_weights_after_loading` after
`load_weights`), the MXFP4 method's `_setup_kernel` calling the conversion function by the name
quantization/mxfp4.py imports (the adapter's `mxfp4_converter`), `marlin_utils_fp4.get_marlin_input_dtype`,
and for NVFP4 `convert_to_nvfp4_moe_kernel_format` imported by that name into both method modules and
called with keywords, the checkpoint-shaped parameters `create_weights` allocates and the expert classes'
own fold of the activation scales (`replace_parameter` differs in what it keeps of the replaced
parameter; install_nvfp4.with_given_attributes).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.common.mismatch import public_release
from mxconvert.runtimes.vllm.adapters_nvfp4 import (
    _NVFP4_0_16,
    _NVFP4_0_17,
    _NVFP4_0_19,
    _NVFP4_0_21,
    _NVFP4_0_26,
    _NVFP4_0_27,
    _NVFP4_0_33,
    CT_NVFP4_MODULE,
)
from mxconvert.runtimes.vllm.dependency import (
    PLUGIN_PROVEN,
    PLUGIN_ROWS,
    missing_vllm,
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
    #: NVFP4: `(backend, layer, device, the tensors the conversion returns by name)` -> what vLLM's conversion
    #: leaves on the layer beyond the tensors it returns and the `moe_config` padding (the plugin bypasses the
    #: conversion, so it does this itself: Marlin's workspace, 0.15.0-0.17.1's TRTLLM scale attributes)
    nvfp4_conversion_effects: Callable[[str, Any, Any, dict[str, Any]], None]
    #: NVFP4: `(backend, the artifact's activation scale, what)` -> the tensor the conversion returns for it
    #: (same values; the form: 0.26.0 returns a stride-0 expand of one value where 0.33.0 repeats it)
    nvfp4_input_scale: Callable[[str, Any, str], Any]
    #: whether the release's TRITON conversion leaves the checkpoint-shaped `w13_weight_scale` /
    #: `w2_weight_scale` parameters on the layer, holding the loaded scales (0.24.0 and before: its
    #: `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` deletes only the two weights; 0.25.0 added
    #: `del layer.w13_weight_scale` / `w2_weight_scale`, fused_moe/oracle/mxfp4.py)
    triton_keeps_checkpoint_scales: bool = False
    #: the module class vLLM hangs GPT-OSS's MoE quant method on (`RoutedExperts`, from 0.24.0)
    moe_module_class: Callable[[], type[Any]] = lambda: _routed_experts()
    #: `module` -> the layer's global-id -> local-slot expert map (None: every expert, in order)
    expert_map: Callable[[Any], Any] = lambda module: module.expert_map_manager.expert_map
    #: ROCm: whether the release's `_swizzle_mxfp4` lays the MXFP4 scales out for CDNA4
    cdna4_scale_swizzle: Callable[[], bool] = lambda: _cdna4_scale_swizzle_0_24()
    #: GPT-OSS MXFP4: the vLLM quant-method class of GPT-OSS's MoE layers (`GptOssMxfp4MoEMethod` from 0.20.0)
    mxfp4_method_class: Callable[[], type[Any]] = lambda: _gpt_oss_mxfp4_method()
    #: GPT-OSS MXFP4: the name under which quantization/mxfp4.py imports the conversion function its
    #: method's `_setup_kernel` calls (the one the plugin bypasses, install.py)
    mxfp4_converter: str = "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"
    #: NVFP4: the module of vLLM's `CompressedTensorsW4A4Nvfp4MoEMethod` (which imports the conversion by name)
    nvfp4_ct_module: str = CT_NVFP4_MODULE
    #: NVFP4: whether the conversions of `nvfp4_pads_moe_config` pad `moe_config.hidden_dim` too (keeping
    #: `hidden_dim_unpadded`), not only `intermediate_size_per_partition` (vLLM 0.17.0-0.19.1's TRTLLM)
    nvfp4_pads_hidden_dim: bool = True


def _gpt_oss_mxfp4_method() -> type[Any]:
    """vLLM 0.20.0+: quantization/mxfp4.py `GptOssMxfp4MoEMethod`."""
    try:
        from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return GptOssMxfp4MoEMethod


def _cdna4_scale_swizzle_0_24() -> bool:
    """vLLM 0.24.0+: quantization/utils/mxfp4_utils.py `should_use_cdna4_mx_scale_swizzle()` (gfx950, TP <= 2)."""
    try:
        from vllm.model_executor.layers.quantization.utils.mxfp4_utils import should_use_cdna4_mx_scale_swizzle
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return bool(should_use_cdna4_mx_scale_swizzle())


def _cdna4_scale_swizzle_0_23() -> bool:
    """vLLM 0.20.0-0.23.0: `_swizzle_mxfp4` (quantization/utils/mxfp4_utils.py) takes the CDNA4 scale
    layout on every gfx950 (`vllm.platforms.rocm.on_gfx950()`), whatever the TP size."""
    try:
        from vllm.platforms.rocm import on_gfx950
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return bool(on_gfx950())


def _routed_experts() -> type[Any]:
    """vLLM 0.24.0+: fused_moe/routed_experts.py `RoutedExperts`."""
    try:
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return RoutedExperts


def _fused_moe() -> type[Any]:
    """vLLM 0.20.0-0.23.0: fused_moe/layer.py `FusedMoE` (0.24.0 renamed it `RoutedExperts`)."""
    try:
        from vllm.model_executor.layers.fused_moe.layer import FusedMoE
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return FusedMoE


def _expert_map_0_21(module: Any) -> Any:
    """vLLM 0.20.0-0.21.0: the layer's own `_expert_map` (fused_moe/layer.py `FusedMoE.__init__`, from
    `determine_expert_map`; its `expert_map` property answers AITER's mask instead); 0.22.0 moved it
    into `expert_map_manager`."""
    return module._expert_map


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


def _adapter_0_33(row: str) -> ReleaseAdapter:
    """vLLM 0.31.0-0.33.0: `get_triton_kernels_version` (vllm/utils/import_utils.py, added in 0.31.0)
    and the oracle's `PrecisionConfig(**_mx_scale_kwargs(scale), ...)` (fused_moe/oracle/mxfp4.py)."""
    return ReleaseAdapter(row, _generation_0_33, _precision_config_0_33, _opt_flags_0_33, **_NVFP4_0_33)


def _adapter_0_26(row: str, nvfp4: dict[str, Any] = _NVFP4_0_26, **older: Any) -> ReleaseAdapter:
    """vLLM 0.20.0-0.30.0: no `get_triton_kernels_version`; fused_moe/oracle/mxfp4.py imports
    `FlexCtx, PrecisionConfig` from `triton_kernels.matmul_ogs` inside the converter and passes
    `weight_scale=` (the same lines in every one of these releases' wheels); `nvfp4`: the row's NVFP4 internals;
    `older`: the fields where releases before 0.25.0 differ."""
    return ReleaseAdapter(row, _generation_0_26, _precision_config_0_26, _opt_flags_0_26, **nvfp4, **older)


#: What vLLM 0.20.0-0.23.0 do otherwise than 0.24.0 (each field's docstring names the files).
_BEFORE_0_24: dict[str, Any] = {
    "triton_keeps_checkpoint_scales": True,
    "moe_module_class": _fused_moe,
    "cdna4_scale_swizzle": _cdna4_scale_swizzle_0_23,
}

# ---- vLLM 0.19.0-0.19.1 (row vllm-0.19, GPT-OSS MXFP4) ---------------------------------------------------------
# One mechanism for every release (install.py): 0.19.x's `Mxfp4MoEMethod._setup_kernel` also calls one conversion
# function, `convert_to_mxfp4_moe_kernel_format` (fused_moe/oracle/mxfp4.py; 0.20.0's signature, results and side
# effects for TRITON and MARLIN), by keywords, so the plugin bypasses it by that name and vLLM's own post-processing
# runs; otherwise 0.19.x is 0.20.0 (`_BEFORE_0_24`, `_expert_map_0_21`; triton_kernels 3.6 vendored).


def _mxfp4_moe_method_0_19() -> type[Any]:
    """vLLM 0.19.x: quantization/mxfp4.py `Mxfp4MoEMethod` (0.20.0 renamed it `GptOssMxfp4MoEMethod`)."""
    try:
        from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return Mxfp4MoEMethod


#: The MXFP4 quant method's class before 0.20.0, for every row of those releases: the NVFP4-only rows
#: (vllm-0.18, vllm-0.19-nvfp4) need it too, since `loader.moe_layers` tells a GPT-OSS MXFP4 layer by it.
_MXFP4_METHOD_0_19: dict[str, Any] = {"mxfp4_method_class": _mxfp4_moe_method_0_19}
#: What vLLM 0.19.x does otherwise than 0.20.0 for GPT-OSS MXFP4 (quantization/mxfp4.py).
_MXFP4_0_19: dict[str, Any] = {**_MXFP4_METHOD_0_19, "mxfp4_converter": "convert_to_mxfp4_moe_kernel_format"}
_ADAPTER_0_19 = _adapter_0_26("vllm-0.19", **_BEFORE_0_24, expert_map=_expert_map_0_21, **_MXFP4_0_19)
# ---- end of vLLM 0.19.x ---------------------------------------------------------------------------------------

#: One adapter per row of `PLUGIN_ROWS` (the rows whose vLLM releases the plugin loads into), in that
#: order.
ADAPTERS: dict[str, ReleaseAdapter] = {
    a.row: a
    for a in (
        _adapter_0_33("vllm-0.33"),
        _adapter_0_33("vllm-0.32"),
        _adapter_0_33("vllm-0.31"),
        _adapter_0_26("vllm-0.30", _NVFP4_0_27),
        _adapter_0_26("vllm-0.29", _NVFP4_0_27),  # NVFP4: vLLM 0.29.0-0.31.0
        _adapter_0_26("vllm-0.27", _NVFP4_0_27),
        _adapter_0_26("vllm-0.26"),
        _adapter_0_26("vllm-0.25-nvfp4"),  # vLLM 0.26.0 for NVFP4: the same internals as vllm-0.26
        _adapter_0_26("vllm-0.25"),
        _adapter_0_26("vllm-0.24", triton_keeps_checkpoint_scales=True),
        _adapter_0_26("vllm-0.23", **_BEFORE_0_24),
        _adapter_0_26("vllm-0.22-nvfp4", **_BEFORE_0_24),  # vLLM 0.22.0-0.23.0 for NVFP4
        _adapter_0_26("vllm-0.22", **_BEFORE_0_24),
        _adapter_0_26("vllm-0.21-nvfp4", _NVFP4_0_21, **_BEFORE_0_24, expert_map=_expert_map_0_21),
        _adapter_0_26("vllm-0.21", **_BEFORE_0_24, expert_map=_expert_map_0_21),
        _adapter_0_26("vllm-0.20-nvfp4", _NVFP4_0_21, **_BEFORE_0_24, expert_map=_expert_map_0_21),
        _adapter_0_26("vllm-0.20", **_BEFORE_0_24, expert_map=_expert_map_0_21),
        # NVFP4 0.18.0-0.19.1: 0.20.0's FusedMoE and `_expert_map` (fused_moe/layer.py), their NVFP4 internals
        _adapter_0_26(
            "vllm-0.19-nvfp4", _NVFP4_0_19, **_BEFORE_0_24, expert_map=_expert_map_0_21, **_MXFP4_METHOD_0_19
        ),
        _ADAPTER_0_19,
        _adapter_0_26("vllm-0.18", _NVFP4_0_19, **_BEFORE_0_24, expert_map=_expert_map_0_21, **_MXFP4_METHOD_0_19),
        # NVFP4 0.15.0-0.17.1: 0.18.0's, with their conversions' effects and padding (adapters_nvfp4.py)
        *(
            _adapter_0_26(row, nvfp4, **_BEFORE_0_24, expert_map=_expert_map_0_21, **_MXFP4_METHOD_0_19)
            for row, nvfp4 in (
                ("vllm-0.17", _NVFP4_0_17),
                ("vllm-0.16", _NVFP4_0_16),
                ("vllm-0.15.1", _NVFP4_0_16),
                ("vllm-0.15", _NVFP4_0_16),
            )
        ),
    )
}
if tuple(ADAPTERS) != PLUGIN_ROWS:  # pragma: no cover - a row added to one list and not the other
    raise AssertionError(f"adapters.py: ADAPTERS {tuple(ADAPTERS)} != dependency.PLUGIN_ROWS {PLUGIN_ROWS}")


#: The format whose row is a release's own when the format is not asked (`serving_row(version)`): MXFP4's
#: row where the release has one (vLLM 0.32.0 is vllm-0.32, though row vllm-0.33 lists it for NVFP4).
FORMAT_PREFERENCE = ("mxfp4", "nvfp4")


def serving_row(version: str, fmt: str | None = None) -> RuntimeRevision | None:
    """The row the plugin serves vLLM `version` as: the first row of `PLUGIN_PROVEN` that lists the
    release for `fmt` ("mxfp4", "nvfp4"), or, when `fmt` is None, for the first format of
    `FORMAT_PREFERENCE` it is listed for (a local build label, `0.33.0+cpu`, is the same release); None:
    the plugin does not load into that release (for that format). Which artifacts it loads there:
    `checks.artifact_fits_release`."""
    if fmt is None:
        return next((row for f in FORMAT_PREFERENCE if (row := serving_row(version, f)) is not None), None)
    release = public_release(version)
    for name in PLUGIN_ROWS:
        if release in PLUGIN_PROVEN[name].get(fmt, ()):
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
