"""The NVFP4 internals of the vLLM releases the plugin loads NVFP4 artifacts into: the values of the NVFP4
fields of adapters.py's `ReleaseAdapter`, one dict per group of releases (`_NVFP4_*`), and the functions they
name. Moved out of adapters.py (its 500-line limit, tests/test_architecture.py); adapters.py gives each row its
dict. Like adapters.py, it imports no vLLM at import time; each function imports vLLM when called.
"""

from __future__ import annotations

import inspect
from typing import Any

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.common.mismatch import public_release
from mxconvert.runtimes.vllm.dependency import missing_vllm
from mxconvert.target.releases import installed_vllm

#: vLLM 0.20.0+: compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py (a package of one module per method)
CT_NVFP4_MODULE = (
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a4_nvfp4"
)
#: vLLM 0.15.0-0.19.1: every compressed-tensors MoE method in one module, compressed_tensors_moe.py
CT_NVFP4_MODULE_0_19 = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe"


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


def _nvfp4_a16_0_21(method: Any) -> bool:
    """vLLM 0.20.0-0.21.0's `ModelOptNvFp4FusedMoE` has no `use_a16` (their W4A16_NVFP4 is a linear method
    only, modelopt.py): it runs NVFP4 activations; the compressed-tensors method as in 0.26.0."""
    if type(method).__name__ == "ModelOptNvFp4FusedMoE":
        return False
    return _nvfp4_a16_0_26(method)


def _no_conversion_effects(backend: str, layer: Any, device: Any, returned: dict[str, Any]) -> None:
    """vLLM 0.33.0's NVFP4 conversion changes the layer only through what it returns and `moe_config`."""


#: The vLLM releases whose `prepare_nvfp4_moe_layer_for_marlin` (quantization/utils/marlin_utils_fp4.py) sets
#: `layer.workspace`: 0.24.0-0.30.0 (0.31.0 dropped it; it shares row vllm-0.29 with 0.29.0 and 0.30.0 for NVFP4).
MARLIN_WORKSPACE_RELEASES = frozenset(
    {"0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0"}
)


def _conversion_effects_0_26(backend: str, layer: Any, device: Any, returned: dict[str, Any]) -> None:
    """vLLM 0.24.0-0.30.0's `prepare_nvfp4_moe_layer_for_marlin` (quantization/utils/marlin_utils_fp4.py) also
    sets `layer.workspace = marlin_make_workspace_new(device, 4)` (from 0.27.0 with `existing=` the layer's
    workspace; 0.31.0 dropped it): the same call, in the releases of `MARLIN_WORKSPACE_RELEASES`."""
    if (
        backend != "MARLIN"
        or public_release(installed_vllm() or "") not in MARLIN_WORKSPACE_RELEASES | MARLIN_WORKSPACE_0_18
    ):
        return
    _marlin_workspace(layer, device)


def _marlin_workspace(layer: Any, device: Any) -> None:
    """`layer.workspace = marlin_make_workspace_new(device, 4)` (quantization/utils/marlin_utils.py), with
    `existing=` the layer's workspace where the release's function takes it (0.27.0+)."""
    try:
        from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_make_workspace_new
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    if "existing" in inspect.signature(marlin_make_workspace_new).parameters:
        layer.workspace = marlin_make_workspace_new(device, 4, existing=getattr(layer, "workspace", None))
    else:
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
        release = public_release(installed_vllm() or "0.26.0")
        raise MismatchError(
            f"{what}: vLLM {release} shares one activation scale over the experts for {backend}, and the "
            "artifact's differ; it was not made for this vLLM (re-create it with mxconvert convert "
            f"--runtime vllm=={release})"
        )
    return shared.expand(scale.numel())


#: NVFP4 internals of vLLM 0.33.0 (also given to 0.31.0-0.32.0, whose rows serve MXFP4 only: unused there).
_NVFP4_0_33: dict[str, Any] = {
    "nvfp4_pre_processed": frozenset({"FLASHINFER_TRTLLM"}),
    "nvfp4_pads_moe_config": frozenset({"FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL"}),
    "nvfp4_padding": "0.33.0",
    "nvfp4_a16": _nvfp4_a16_0_33,
    "nvfp4_conversion_effects": _no_conversion_effects,
    "nvfp4_input_scale": _input_scale_0_33,
}
#: NVFP4 internals of vLLM 0.26.0 (row vllm-0.25-nvfp4; also given to the 0.20.0-0.26.0 rows that serve
#: MXFP4 only: unused there).
_NVFP4_0_26: dict[str, Any] = {
    "nvfp4_pre_processed": frozenset(),
    "nvfp4_pads_moe_config": frozenset({"FLASHINFER_TRTLLM"}),
    "nvfp4_padding": "0.26.0",
    "nvfp4_a16": _nvfp4_a16_0_26,
    "nvfp4_conversion_effects": _conversion_effects_0_26,
    "nvfp4_input_scale": _input_scale_0_26,
}
#: NVFP4 internals of vLLM 0.27.0-0.31.0 (rows vllm-0.27 and vllm-0.29; also given to vllm-0.30, MXFP4 only):
#: 0.26.0's, but the shared activation scales are `.repeat`ed as in 0.33.0 (flashinfer_fp4_moe.py
#: `prepare_nvfp4_moe_layer_for_fi_or_cutlass`, from 0.27.0), and Marlin's workspace as `_conversion_effects_0_26`
#: says per release.
_NVFP4_0_27: dict[str, Any] = {**_NVFP4_0_26, "nvfp4_input_scale": _input_scale_0_33}
#: NVFP4 internals of vLLM 0.20.0-0.21.0 (rows vllm-0.20-nvfp4, vllm-0.21-nvfp4): 0.26.0's, but ModelOpt's MoE
#: method has no `use_a16` (`_nvfp4_a16_0_21`).
_NVFP4_0_21: dict[str, Any] = {**_NVFP4_0_26, "nvfp4_a16": _nvfp4_a16_0_21}

# ---- NVFP4 in vLLM 0.18.0-0.19.1 (rows vllm-0.18, vllm-0.19-nvfp4; NVFP4 only) ---------------------------
#: vLLM 0.18.0-0.18.1's `prepare_nvfp4_moe_layer_for_marlin` (marlin_utils_fp4.py) sets `layer.workspace =
#: marlin_make_workspace_new(device, 4)` as 0.24.0-0.30.0's does (0.19.x does too; its row leaves MARLIN unproven).
MARLIN_WORKSPACE_0_18 = frozenset({"0.18.0", "0.18.1"})
#: NVFP4 internals of vLLM 0.18.0-0.19.1 (rows vllm-0.18, vllm-0.19-nvfp4): 0.20.0's (`_NVFP4_0_21`:
#: no pre-processed path, Marlin's workspace, the stride-0 expand of the shared activation scales, no ModelOpt
#: `use_a16`), but the compressed-tensors method lives in compressed_tensors_moe.py, and TRTLLM's
#: `prepare_nvfp4_moe_layer_for_fi_or_cutlass` pads only the intermediate size (`align_fp4_moe_weights_for_fi`,
#: alignment 16 gated, else 128; it sets `moe_config.intermediate_size_per_partition` alone: no
#: `align_trtllm_fp4_moe_hidden_dim_for_fi`, added in 0.20.0), and MARLIN pads nothing (nvfp4_padding.py).
_NVFP4_0_19: dict[str, Any] = {
    **_NVFP4_0_21,
    "nvfp4_ct_module": CT_NVFP4_MODULE_0_19,
    "nvfp4_pads_hidden_dim": False,
    "nvfp4_padding": "0.19.1",
}


# ---- NVFP4 in vLLM 0.15.0-0.17.1 (rows vllm-0.15, vllm-0.15.1, vllm-0.16, vllm-0.17; NVFP4 only) ----------------
#: 0.18.0's internals (`_NVFP4_0_19`: the same conversion function, compressed-tensors module, stride-0 expand
#: of the shared activation scales, no ModelOpt `use_a16`), with what their conversions leave on the layer:
#: `prepare_nvfp4_moe_layer_for_marlin` (marlin_utils_fp4.py) sets `layer.workspace` in every one of them, and
#: TRTLLM's `prepare_nvfp4_moe_layer_for_fi_or_cutlass` (flashinfer_fp4_moe.py) sets `layer.g1_scale_c`,
#: `a1_gscale`, `g1_alphas` and `g2_alphas` (0.18.0 dropped them: its TRTLLM experts fold the activation
#: scales and register `g1_scale_c` themselves). Their TRTLLM experts fold nothing (the rows' artifacts hold
#: unfolded global scales, `nvfp4_fold_global_scales`), so the `g1_scale_c` the plugin checks is the one the
#: conversion leaves on the layer: 0.15.x-0.16.0's monolithic TRTLLM kernel reads it there
#: (flashinfer_fp4_moe.py `flashinfer_trtllm_fp4_moe`); 0.17.x's `TrtLlmNvFp4Experts` keeps a copy computed
#: from its quant config (`g1_alphas * a2_gscale`, fused_moe/experts/trtllm_nvfp4_moe.py).


def _trtllm_scale_attributes(layer: Any, returned: dict[str, Any], gated: bool) -> None:
    """The four attributes vLLM 0.15.0-0.17.1's TRTLLM conversion sets, by its expressions, from the tensors it
    returns (`w13_scale_2`, the reduced `a13_scale` and `a2_scale`, `w2_scale_2`)."""
    import torch

    a13, a2 = returned["w13_input_scale"], returned["w2_input_scale"]
    w13_scale_2, w2_scale_2 = returned["w13_weight_scale_2"], returned["w2_weight_scale_2"]
    layer.g1_scale_c = a13 * w13_scale_2 / a2 if gated else torch.ones_like(a13) / a2
    layer.a1_gscale = 1.0 / a13
    layer.g1_alphas = a13 * w13_scale_2
    layer.g2_alphas = a2 * w2_scale_2


def _conversion_effects_0_17(backend: str, layer: Any, device: Any, returned: dict[str, Any]) -> None:
    """vLLM 0.17.0-0.17.1: Marlin's workspace; TRTLLM's four attributes, `g1_scale_c` by the activation's
    `is_gated` (`torch.ones_like(a13_scale) / a2_scale` for a non-gated one)."""
    if backend == "MARLIN":
        _marlin_workspace(layer, device)
    elif backend == "FLASHINFER_TRTLLM":
        _trtllm_scale_attributes(layer, returned, bool(layer.activation.is_gated))


def _conversion_effects_0_16(backend: str, layer: Any, device: Any, returned: dict[str, Any]) -> None:
    """vLLM 0.15.0-0.16.0: Marlin's workspace; TRTLLM's four attributes, `g1_scale_c` always
    `a13_scale * w13_scale_2 / a2_scale` (their TRTLLM prepares gated activations only)."""
    if backend == "MARLIN":
        _marlin_workspace(layer, device)
    elif backend == "FLASHINFER_TRTLLM":
        _trtllm_scale_attributes(layer, returned, True)


#: vLLM 0.17.0-0.17.1 (row vllm-0.17): TRTLLM pads the intermediate size as 0.18.0's (nvfp4_padding.py "0.19.1").
_NVFP4_0_17: dict[str, Any] = {**_NVFP4_0_19, "nvfp4_conversion_effects": _conversion_effects_0_17}
#: vLLM 0.15.0-0.16.0 (rows vllm-0.15, vllm-0.15.1, vllm-0.16): TRTLLM pads nothing and leaves `moe_config` as
#: it is (no `align_fp4_moe_weights_for_fi` call; nvfp4_padding.py "0.16.0").
_NVFP4_0_16: dict[str, Any] = {
    **_NVFP4_0_19,
    "nvfp4_pads_moe_config": frozenset(),
    "nvfp4_padding": "0.16.0",
    "nvfp4_conversion_effects": _conversion_effects_0_16,
}
