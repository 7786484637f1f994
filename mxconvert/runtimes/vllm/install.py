"""Install an artifact's expert tensors into vLLM 0.33.0 (and 0.19.0-0.32.0) MoE layers (imports vLLM; plugin only).

vLLM 0.33.0's `GptOssMxfp4MoEMethod.process_weights_after_loading` runs `_setup_kernel`, which calls
one conversion function, `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` (imported by name into
vllm/model_executor/layers/quantization/mxfp4.py), and then does everything else itself: installs
the parameters (`replace_parameter`), keeps the triton_kernels precision configs, builds the quant
config and the modular kernel (`make_mxfp4_moe_kernel`, `fused_experts.process_weights_after_loading`).
The method declares no `supports_pre_processed_weights` (and `weights_already_processed()` applies
to every module of the model, so it cannot be used for GPT-OSS in 0.33.0): here only that
conversion function is bypassed, for the layers whose tensors come from the artifact, and returns
what vLLM's conversion would have returned, read from the artifact. vLLM 0.20.0-0.32.0 have the same
`_setup_kernel` around the same conversion function (imported by the same name); what differs for
the tensors built here, the TRITON precision config and opt-flags module and (up to 0.24.0) the
scale parameters the conversion leaves on the layer, comes from the live release's adapter (adapters.py).
vLLM 0.19.x's `Mxfp4MoEMethod._setup_kernel` is the same around a function of the same signature and
results, `convert_to_mxfp4_moe_kernel_format` (called with keywords): the adapter's `mxfp4_converter` names
the function bypassed, so one mechanism serves 0.19.0-0.33.0 and vLLM's own post-processing always runs
(replacing 0.19.x's whole `process_weights_after_loading` instead would re-implement the parameters,
precision configs, quant config and modular kernel it builds after the conversion: a second copy of
vLLM's code that could drift from it).

`kernel_state` reproduces the conversion's *results and side effects*, never its transforms:
  * TRTLLM / CUTLASS / MARLIN / XPU / EMULATION: the six tensors as stored.
  * AITER_MXFP4_BF16: the same, with `is_shuffled = True` on the weights (as the converter sets it).
  * TRITON / TRITON_UNFUSED: triton_kernels `Tensor(Storage(buffer_view, LayoutClass(shape, **kwargs)))`
    with the layout class and arguments the manifest records, `PrecisionConfig(weight_scale=...,
    flex_ctx=FlexCtx(rhs_data=InFlexData()))`, the process-wide `opt_flags` constraints vLLM's
    `_swizzle_mxfp4` sets for the device, and the four checkpoint-shaped parameters deleted from
    the layer, as the converter does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from mxconvert.artifact.manifest import artifact_file
from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.common.layer_source import LayerSource
from mxconvert.runtimes.vllm.adapters import live_adapter
from mxconvert.runtimes.vllm.dependency import missing_vllm
from mxconvert.runtimes.vllm.install_nvfp4 import with_given_attributes
from mxconvert.storage.safetensors_io import ShardReader
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.releases import installed_vllm

MXFP4_QUANT_MODULE = "vllm.model_executor.layers.quantization.mxfp4"
#: vLLM 0.33.0 `TRITON_BACKENDS`: the backends whose weights are triton_kernels objects.
TRITON_WEIGHT_FORMAT = frozenset({"TRITON", "TRITON_UNFUSED", "AITER_TRITON_MXFP4_BF16"})
EXPERT_NAMES = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias")
#: Backend -> the tensors `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` returns as the very parameter
#: it was given (fused_moe/oracle/mxfp4.py, vLLM 0.28.0-0.33.0): CUTLASS MXFP8 returns `w2_weight` and
#: `w2_bias`, CUTLASS BF16 `w2_bias`, AITER CK the two weights it shuffles in place, XPU and EMULATION all
#: six. vLLM 0.28.0-0.32.0's `replace_parameter` carries such a parameter's attributes (`weight_loader`
#: aside) to the new parameter, so the artifact's tensor in its place carries them too
#: (install_nvfp4.with_given_attributes; 0.33.0 keeps the parameter itself, 0.27.0 and before carry none:
#: the same attributes either way).
RETURNED_AS_GIVEN: dict[str, tuple[str, ...]] = {
    "FLASHINFER_CUTLASS_MXFP4_MXFP8": ("w2_weight", "w2_bias"),
    "FLASHINFER_CUTLASS_MXFP4_BF16": ("w2_bias",),
    "AITER_MXFP4_BF16": ("w13_weight", "w2_weight"),
    "XPU": EXPERT_NAMES,
    "EMULATION": EXPERT_NAMES,
}


def kernel_state(
    backend_value: str, layer: torch.nn.Module, tensors: dict[str, torch.Tensor], target: dict, oracle
) -> tuple:
    """What `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` returns for this backend."""
    w13, w2 = tensors["w13_weight"], tensors["w2_weight"]
    s13, s2 = tensors["w13_weight_scale"], tensors["w2_weight_scale"]
    b13, b2 = tensors.get("w13_bias"), tensors.get("w2_bias")
    if backend_value in TRITON_WEIGHT_FORMAT:
        return _triton_state(layer, tensors, target, oracle)
    if backend_value == "AITER_MXFP4_BF16":
        # vLLM's converter tags the weights with a plain attribute the AITER CK kernel reads (torch's
        # Tensor type declares no such attribute)
        w13.is_shuffled = True  # type: ignore[attr-defined]
        w2.is_shuffled = True  # type: ignore[attr-defined]
    return w13, w2, s13, s2, b13, b2


def _triton_state(layer, tensors: dict, target: dict, oracle) -> tuple:
    try:  # vLLM ships triton_kernels (vllm/third_party); a vLLM without it cannot run TRITON
        from triton_kernels.numerics import InFlexData
        from triton_kernels.tensor import FP4, Storage, Tensor
        from triton_kernels.tensor_details import layout as tk_layout
    except ImportError as exc:
        raise ImportError(
            f"this artifact's backend {target['backend']} needs triton_kernels, which this vLLM install "
            f"lacks ({exc}); load it with a vLLM that has triton_kernels, or reconvert for another backend"
        ) from exc

    layout_params = target["layout"]
    _set_opt_flags(layout_params.get("opt_flags") or {})

    def wrap(name: str, info: dict):
        cls = getattr(tk_layout, info["layout_class"])
        logical = list(info["logical_shape"])
        is_value = info.get("dtype_label") == "FP4"
        # the unswizzled data vLLM handed to the layout: the [E, K, N] view, K counted in bytes for FP4
        initial = torch.Size([logical[0], logical[1] // 2, logical[2]] if is_value else logical)
        layout_obj = cls(initial, **info.get("layout_kwargs", {}))
        return Tensor(
            Storage(tensors[name], layout_obj),
            dtype=FP4 if is_value else tensors[name].dtype,
            shape=logical,
            shape_max=list(logical),
        )

    infos = layer._mxconvert_layouts
    w13 = wrap("w13_weight", infos["w13_weight"])
    w2 = wrap("w2_weight", infos["w2_weight"])
    s13 = wrap("w13_weight_scale", infos["w13_weight_scale"])
    s2 = wrap("w2_weight_scale", infos["w2_weight_scale"])
    adapter = live_adapter()  # vLLM 0.33.0 and 0.26.0 build the configs differently (adapters.py)
    pc13 = adapter.precision_config(oracle, s13, InFlexData())
    pc2 = adapter.precision_config(oracle, s2, InFlexData())
    # the converter frees the checkpoint-shaped parameters (their content lives in the configs); up to
    # vLLM 0.24.0 it keeps the two scale parameters, holding the loaded scales (`keep_checkpoint_scales`)
    del layer.w13_weight
    del layer.w2_weight
    if not adapter.triton_keeps_checkpoint_scales:
        del layer.w13_weight_scale
        del layer.w2_weight_scale
    return w13, w2, pc13, pc2, tensors.get("w13_bias"), tensors.get("w2_bias")


def keep_checkpoint_scales(layer: torch.nn.Module, source: LayerSource) -> None:
    """What a release whose TRITON conversion keeps the scale parameters (adapters.py
    `triton_keeps_checkpoint_scales`) leaves in them: the scales vLLM's weight loader put there,
    restored from the artifact's swizzled scales through their exact inverse layouts (as
    `on_mismatch: reconvert` restores every tensor, reconvert.py)."""
    from mxconvert.artifact.parts import read_stored
    from mxconvert.formats.registry import format_named
    from mxconvert.runtimes.vllm.checks import artifact_format

    layout = format_named(artifact_format(source.target)).layout_from_target(source.target)
    readers: dict[str, ShardReader] = {}

    def fetch(rel: str, key: str) -> torch.Tensor:
        if rel not in readers:
            readers[rel] = ShardReader(artifact_file(source.root, rel))
        return readers[rel].get(key)

    for name in ("w13_weight_scale", "w2_weight_scale"):
        key = f"{source.prefix}.{name}"
        desc = source.entries[name]["layout"]
        stored = read_stored(source.entries[name], key, fetch, where=f"{source.root}/")
        canonical = layout.tensors[name].inverse(
            stored, tuple(desc["canonical_shape"]), getattr(torch, desc["canonical_dtype"])
        )
        param = getattr(layer, name)
        if tuple(param.shape) != tuple(canonical.shape) or param.dtype != canonical.dtype:
            raise MismatchError(
                f"{key}: the artifact's scales restore to {canonical.dtype} {list(canonical.shape)}, the live "
                f"layer holds {param.dtype} {list(param.shape)}"
            )
        param.data = canonical.contiguous().to(param.device)


def _set_opt_flags(constraints: dict) -> None:
    """The process-wide constraints `_swizzle_mxfp4` sets (split_k on SM90; persistent on SM10x/12x)."""
    if not constraints:
        return
    try:
        opt_flags = live_adapter().opt_flags_module()
    except ImportError as exc:  # vLLM ships triton_kernels (vllm/third_party)
        raise missing_vllm(exc) from exc
    opt_flags.update_opt_flags_constraints(dict(constraints))


@contextlib.contextmanager
def bypass_conversion(sources: Callable[[torch.nn.Module], LayerSource | None]):
    """Inside: vLLM's GPT-OSS MXFP4 conversion returns artifact tensors for the layers `sources`
    knows; other layers (none, when the checks passed) go through vLLM's own conversion."""
    import importlib

    quant = importlib.import_module(MXFP4_QUANT_MODULE)
    oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
    converter = live_adapter().mxfp4_converter  # the release's name for it (vLLM 0.19.x: another, adapters.py)
    original = getattr(quant, converter, None)
    if original is None:  # files of another release than the package metadata says: nothing is loaded
        raise MismatchError(
            f"{MXFP4_QUANT_MODULE} has no {converter}, the GPT-OSS MXFP4 conversion the mxconvert plugin "
            f"bypasses in vLLM {installed_vllm()} (adapters.py); reinstall vLLM, or serve the checkpoint "
            "with vLLM's own loader"
        )

    def from_artifact(
        mxfp4_backend,
        layer,
        w13_weight,
        w2_weight,
        w13_weight_scale,
        w2_weight_scale,
        w13_bias=None,
        w2_bias=None,
        *args,
        **kwargs,
    ):
        source = sources(layer)
        if source is None:
            return original(
                mxfp4_backend,
                layer,
                w13_weight,
                w2_weight,
                w13_weight_scale,
                w2_weight_scale,
                w13_bias,
                w2_bias,
                *args,
                **kwargs,
            )
        tensors = source.read(w13_weight.device)
        backend = Mxfp4Backend.artifact_name(mxfp4_backend.value)  # the release's name, as the artifact names it
        layer._mxconvert_layouts = {name: info["layout"] for name, info in source.entries.items()}
        try:
            state = kernel_state(backend, layer, tensors, source.target, oracle)
        finally:
            del layer._mxconvert_layouts
        if backend in TRITON_WEIGHT_FORMAT and live_adapter().triton_keeps_checkpoint_scales:
            keep_checkpoint_scales(layer, source)
        given = dict(zip(EXPERT_NAMES, (w13_weight, w2_weight, w13_weight_scale, w2_weight_scale, w13_bias, w2_bias)))
        return tuple(
            with_given_attributes(tensor, given[name])
            if tensor is not None and given[name] is not None and name in RETURNED_AS_GIVEN.get(backend, ())
            else tensor
            for name, tensor in zip(EXPERT_NAMES, state)
        )

    setattr(quant, converter, from_artifact)
    try:
        yield
    finally:
        setattr(quant, converter, original)


def release_checkpoint_params(layer: torch.nn.Module) -> None:
    """Drop the memory of the checkpoint-shaped expert parameters (never filled from disk): each
    keeps its Parameter object, dtype, shape and device, backed by a single element, so vLLM's shape
    assertions still hold and `replace_parameter` rebinds (never copies into) them."""
    for name in EXPERT_NAMES:
        param = getattr(layer, name, None)
        if isinstance(param, torch.nn.Parameter):
            param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)
