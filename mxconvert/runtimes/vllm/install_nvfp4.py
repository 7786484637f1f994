"""Install an NVFP4 artifact's expert tensors into vLLM 0.33.0 (and 0.26.0) MoE layers (imports vLLM;
plugin only).

vLLM 0.33.0's NVFP4 MoE methods (`ModelOptNvFp4FusedMoE` in vllm/model_executor/layers/quantization/
modelopt.py, `CompressedTensorsW4A4Nvfp4MoEMethod` in .../compressed_tensors/compressed_tensors_moe/
compressed_tensors_moe_w4a4_nvfp4.py) run, in `process_weights_after_loading`: one conversion
function, `convert_to_nvfp4_moe_kernel_format` (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py,
imported by name into both modules), then `replace_parameter` of the eight tensors (compressed-tensors:
six, plus the activation scales as plain attributes), the quant config (`make_nvfp4_moe_quant_config`),
the modular kernel (`make_nvfp4_moe_kernel`) and the expert class's own `process_weights_after_loading`,
which folds the activation scales into the global scales in place (`w13_weight_scale_2 *= a13`; all
NVFP4 expert classes but Marlin's) and, for TRTLLM, registers `g1_scale_c`.

Two ways in, as vLLM allows:
  * ModelOpt with FLASHINFER_TRTLLM declares `supports_pre_processed_weights`: the plugin installs the
    eight tensors as the conversion and the fold leave them (the artifact holds exactly that) and runs
    vLLM's own method under `weights_already_processed()`, for that layer only; vLLM then restores the
    padded sizes from the weights and builds the kernel, and the TRTLLM experts skip their fold.
  * every other case: only the conversion function is bypassed. It returns the artifact's tensors and
    reproduces the conversion's side effects on `layer.moe_config` (TRTLLM and CuteDSL pad the hidden
    and intermediate sizes). The artifact's global scales are already folded, and the expert class folds
    again, so the bypass hands vLLM, for each element, an unfolded value `x` with `fl32(x * a) == folded`
    exactly (checked element by element; refused otherwise): after vLLM's own fold the parameter holds
    the artifact's bytes.

vLLM 0.26.0 has the same conversion function, method classes and module paths, but no pre-processed
path, only its TRTLLM conversion pads `moe_config`, its Marlin conversion sets `layer.workspace`, and its
FlashInfer backends return the shared activation scales as a stride-0 expand: what differs is a field of
the release's NVFP4 adapter (adapters.py: `nvfp4_pre_processed`, `nvfp4_pads_moe_config`,
`nvfp4_conversion_effects`, `nvfp4_input_scale`, `nvfp4_a16`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.common.layer_source import LayerSource
from mxconvert.runtimes.vllm.adapters import CT_NVFP4_MODULE, ReleaseAdapter, installed_adapter, live_adapter
from mxconvert.runtimes.vllm.dependency import missing_vllm
from mxconvert.target.backends import NVFP4_GLOBAL_SF_BACKENDS

ORACLE_MODULE = "vllm.model_executor.layers.fused_moe.oracle.nvfp4"
MODELOPT_MODULE = "vllm.model_executor.layers.quantization.modelopt"
#: vLLM 0.20.0+'s compressed-tensors NVFP4 MoE module (the live release's: its adapter's `nvfp4_ct_module`)
CT_MODULE = CT_NVFP4_MODULE
CONVERTER_NAME = "convert_to_nvfp4_moe_kernel_format"
#: The tensors vLLM's conversion returns, in its order (the artifact holds them under these names).
RETURNED = (
    "w13_weight",
    "w13_weight_scale",
    "w13_weight_scale_2",
    "w13_input_scale",
    "w2_weight",
    "w2_weight_scale",
    "w2_weight_scale_2",
    "w2_input_scale",
)
#: The conversion's keyword argument each returned tensor comes from (`convert_to_nvfp4_moe_kernel_format`).
GIVEN_AS = {
    "w13_weight": "w13",
    "w13_weight_scale": "w13_scale",
    "w13_weight_scale_2": "w13_scale_2",
    "w13_input_scale": "a13_scale",
    "w2_weight": "w2",
    "w2_weight_scale": "w2_scale",
    "w2_weight_scale_2": "w2_scale_2",
    "w2_input_scale": "a2_scale",
}
#: Attributes `replace_parameter` never carries over from the tensor it is given (vllm/model_executor/utils.py).
NOT_CARRIED = ("weight_loader", "_weight_loader")
#: Layout steps vLLM's NVFP4 conversion does in place, returning the tensor it was given:
#: `reorder_w1w3_to_w3w1` (quantization/utils/flashinfer_fp4_moe.py, in place in vLLM 0.26.0-0.33.0).
IN_PLACE_STEPS = frozenset({"reorder w1w3 -> w3w1"})
#: What the plugin reads of an NVFP4 layer: the returned tensors and TRTLLM's `g1_scale_c` (checked).
NVFP4_NAMES = (*RETURNED, "g1_scale_c")
#: Checkpoint-shaped parameters `create_weights` allocates, per method class name. The artifact
#: replaces the first group; compressed-tensors' global scales stay on the layer in vLLM (read only by
#: its conversion step), see `CT_LEFTOVER_SCALES`.
CHECKPOINT_PARAMS = {
    "ModelOptNvFp4FusedMoE": (
        "w13_weight",
        "w2_weight",
        "w13_weight_scale",
        "w2_weight_scale",
        "w13_weight_scale_2",
        "w2_weight_scale_2",
        "w13_input_scale",
        "w2_input_scale",
    ),
    "CompressedTensorsW4A4Nvfp4MoEMethod": (
        "w13_weight_packed",
        "w2_weight_packed",
        "w13_weight_scale",
        "w2_weight_scale",
    ),
}
#: Compressed-tensors' checkpoint global scales: vLLM 0.33.0 leaves them on the layer after conversion
#: (nothing reads them afterwards); the artifact does not hold them, so the plugin zero-fills them.
CT_LEFTOVER_SCALES = (
    "w13_weight_global_scale",
    "w2_weight_global_scale",
    "w13_input_global_scale",
    "w2_input_global_scale",
)


def method_names() -> tuple[str, ...]:
    return tuple(CHECKPOINT_PARAMS)


def uses_pre_processed_path(method, backends: frozenset[str]) -> bool:
    """vLLM's own condition for loading pre-processed NVFP4 MoE weights (`backends`: the live release's,
    its adapter's `nvfp4_pre_processed`; vLLM 0.33.0: FLASHINFER_TRTLLM, modelopt.py)."""
    return (
        bool(getattr(type(method), "supports_pre_processed_weights", False))
        and type(method).__name__ == "ModelOptNvFp4FusedMoE"
        and method.nvfp4_backend.value in backends
    )


def uses_a16(method) -> bool:
    """The NVFP4 method runs bf16 activations (a W4A16 checkpoint), as the installed vLLM records it (its
    NVFP4 adapter). A vLLM the plugin loads no NVFP4 artifact into has none: there the layer is refused
    by its format (an NVFP4 artifact was refused by its row before), and the value only shows in that
    refusal: vLLM 0.33.0's attribute where the method has it."""
    adapter = installed_adapter("nvfp4")
    if adapter is None:
        return bool(getattr(method, "use_a16", False))
    return adapter.nvfp4_a16(method)


def release_nvfp4_params(layer: torch.nn.Module) -> None:
    """Checkpoint-shaped parameters keep object, dtype, shape and device, backed by one element (the
    artifact replaces them); compressed-tensors' leftover global scales are zero-filled."""
    for name in CHECKPOINT_PARAMS[type(layer.quant_method).__name__]:
        param = getattr(layer, name, None)
        if isinstance(param, torch.nn.Parameter):
            param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)
    for name in CT_LEFTOVER_SCALES:
        param = getattr(layer, name, None)
        if isinstance(param, torch.nn.Parameter):
            with torch.no_grad():
                param.data.zero_()


def unfold(folded: torch.Tensor, scale: torch.Tensor, what: str) -> torch.Tensor:
    """`x` with `x * scale == folded` bit for bit in float32 (what the expert's in-place fold computes)."""
    if folded.dtype != torch.float32 or scale.dtype != torch.float32 or folded.shape != scale.shape:
        raise MismatchError(
            f"{what}: expected float32 tensors of one shape, got {folded.dtype} {list(folded.shape)} "
            f"and {scale.dtype} {list(scale.shape)}"
        )
    if not bool(torch.isfinite(folded).all() and torch.isfinite(scale).all() and (scale > 0).all()):
        raise MismatchError(f"{what}: the global or activation scales are not finite and positive")
    x = (folded.double() / scale.double()).float()
    for _ in range(4):
        product = x * scale
        if bool((product == folded).all()):
            return x
        low = product < folded
        high = product > folded
        x = torch.where(low, torch.nextafter(x, torch.full_like(x, float("inf"))), x)
        x = torch.where(high, torch.nextafter(x, torch.full_like(x, float("-inf"))), x)
    raise MismatchError(
        f"{what}: no float32 value folds to the artifact's global scale; the artifact's scales "
        "are inconsistent (re-create it with mxconvert convert)"
    )


def _is_folded(source: LayerSource, side: str) -> bool:
    """The artifact's `{side}_weight_scale_2` holds the product with the activation scale (the manifest
    records what each derived tensor was computed from)."""
    return f"{side}_input_scale" in source.entries[f"{side}_weight_scale_2"]["layout"].get("derived_from", ())


def _pad_moe_config(layer: Any, backend: str, tensors: dict[str, torch.Tensor], adapter: ReleaseAdapter) -> None:
    """The conversion's side effects on `layer.moe_config` (the live release's backends that pad, its
    adapter's `nvfp4_pads_moe_config`; vLLM 0.33.0: TRTLLM and CuteDSL, flashinfer_fp4_moe.py): padded
    sizes, read from the kernel weights as vLLM 0.33.0's own `ModelOptNvFp4FusedMoE._restore_padded_moe_dims`
    reads them; the intermediate size only where the release pads no hidden size (`nvfp4_pads_hidden_dim`:
    vLLM 0.17.0-0.19.1's TRTLLM sets `intermediate_size_per_partition` alone, and their `moe_config` up to
    0.18.1 has no `hidden_dim_unpadded`)."""
    if backend not in adapter.nvfp4_pads_moe_config:
        return
    mc = layer.moe_config
    if adapter.nvfp4_pads_hidden_dim:
        if mc.hidden_dim_unpadded is None:
            mc.hidden_dim_unpadded = mc.hidden_dim
        mc.hidden_dim = tensors["w2_weight"].shape[1]
    mc.intermediate_size_per_partition = tensors["w2_weight"].shape[2] * 2


def returned_as_given(backend: str, name: str, entry: dict, given: Any) -> bool:
    """Whether vLLM's conversion returns, for `name`, the very parameter the method gave it (so that it comes
    back with its attributes), as the artifact's layout records the tensor: every step but the expert class's
    own fold (done after the conversion) keeps the object, i.e. is `IN_PLACE_STEPS` or a "pad" that left the
    shape as it was (flashinfer_utils.py's `align_fp4_moe_*` return their inputs when aligned already; vLLM
    0.26.0-0.33.0). Input scales: only `w2_input_scale` on a backend without one shared activation scale
    comes back as given (`prepare_nvfp4_moe_layer_for_fi_or_cutlass`, flashinfer_fp4_moe.py)."""
    if not isinstance(given, torch.nn.Parameter):
        return False
    steps = [step for step in entry["layout"].get("steps", ()) if not step.startswith("fold:")]
    if name.endswith("_input_scale"):
        shared = backend in {b.value for b in NVFP4_GLOBAL_SF_BACKENDS}
        return name == "w2_input_scale" and not shared and backend != "MARLIN"
    unchanged_shape = tuple(entry["shape"]) == tuple(given.shape)
    return all(step in IN_PLACE_STEPS or (step == "pad" and unchanged_shape) for step in steps)


def with_given_attributes(tensor: torch.Tensor, given: Any) -> torch.Tensor:
    """`tensor` with the attributes of the parameter vLLM's conversion was given and returned (vLLM
    0.28.0-0.32.0's `replace_parameter` carries a returned tensor's attributes over to the new parameter,
    `weight_loader` aside; 0.33.0 keeps the parameter object, attributes and all; 0.27.0 and before carry none)."""
    for attr, value in vars(given).items():
        if attr not in NOT_CARRIED:
            setattr(tensor, attr, value)
    return tensor


def converter_result(
    backend: str,
    layer: torch.nn.Module,
    source: LayerSource,
    device: torch.device,
    adapter: ReleaseAdapter,
    given: dict[str, Any] | None = None,
) -> tuple:
    """What `convert_to_nvfp4_moe_kernel_format` of the live vLLM (`adapter`) returns, read from the artifact
    (scales unfolded where the expert class folds them again), with its side effects on the layer; `given`:
    the tensors the method passed it, by returned name (a tensor returned as given keeps its attributes)."""
    tensors = source.read(device, RETURNED, as_buffer=True)
    _pad_moe_config(layer, backend, tensors, adapter)
    out = dict(tensors)
    for name in ("w13_input_scale", "w2_input_scale"):
        if name in tensors:  # Marlin returns none
            out[name] = adapter.nvfp4_input_scale(backend, tensors[name], f"{source.prefix}.{name}")
    for side in ("w13", "w2"):
        name = f"{side}_weight_scale_2"
        if _is_folded(source, side):
            out[name] = unfold(tensors[name], tensors[f"{side}_input_scale"], f"{source.prefix}.{name}")
    for name, given_tensor in (given or {}).items():
        if out.get(name) is not None and returned_as_given(backend, name, source.entries[name], given_tensor):
            out[name] = with_given_attributes(out[name], given_tensor)
    adapter.nvfp4_conversion_effects(backend, layer, device, out)
    return tuple(out.get(name) for name in RETURNED)


@contextlib.contextmanager
def bypass_nvfp4_conversion(sources: Callable[[torch.nn.Module], LayerSource | None]) -> Iterator[None]:
    """Inside: vLLM's NVFP4 MoE post-processing takes the artifact's tensors for the layers `sources`
    knows (pre-processed path or bypassed conversion, see the module docstring)."""
    adapter = live_adapter("nvfp4")
    try:
        from vllm.model_executor.utils import replace_parameter

        if adapter.nvfp4_pre_processed:  # vLLM 0.26.0 has no pre-processed path (adapters.py)
            from vllm.model_executor.utils import weights_already_processed
    except ImportError as exc:
        raise missing_vllm(exc) from exc

    oracle = importlib.import_module(ORACLE_MODULE)
    modelopt = importlib.import_module(MODELOPT_MODULE)
    ct = importlib.import_module(adapter.nvfp4_ct_module)
    original_convert = oracle.convert_to_nvfp4_moe_kernel_format
    method_classes = (modelopt.ModelOptNvFp4FusedMoE, ct.CompressedTensorsW4A4Nvfp4MoEMethod)

    def from_artifact(nvfp4_backend, layer, w13, *args, **kwargs):
        source = sources(layer)
        if source is None:
            return original_convert(nvfp4_backend, layer, w13, *args, **kwargs)
        given = {name: (w13 if arg == "w13" else kwargs.get(arg)) for name, arg in GIVEN_AS.items()}
        return converter_result(nvfp4_backend.value, layer, source, w13.device, adapter, given)

    def process(self, layer, _original):
        source = sources(layer)
        if source is None:
            return _original(self, layer)
        if uses_pre_processed_path(self, adapter.nvfp4_pre_processed):
            tensors = source.read(layer.w13_weight.device, RETURNED, as_buffer=True)
            backend = self.nvfp4_backend.value
            for name in RETURNED:
                # what the conversion would have been given: the layer's parameter (ModelOpt passes
                # `w13_weight_scale_2[:, 0].contiguous()`, a new tensor, for that one; modelopt.py)
                given = getattr(layer, name) if name != "w13_weight_scale_2" else None
                if returned_as_given(backend, name, source.entries[name], given):
                    tensors[name] = with_given_attributes(tensors[name], given)
                replace_parameter(layer, name, tensors[name])
            mc = layer.moe_config  # what the conversion sets and `_restore_padded_moe_dims` expects
            if mc.hidden_dim_unpadded is None:
                mc.hidden_dim_unpadded = mc.hidden_dim
            with weights_already_processed():
                _original(self, layer)
        else:
            _original(self, layer)  # the conversion inside is `from_artifact`
        check_scale_c(layer, source)

    originals = {cls: cls.__dict__["process_weights_after_loading"] for cls in method_classes}

    def wrapper(cls):
        def process_weights_after_loading(self, layer):
            return process(self, layer, originals[cls])

        return process_weights_after_loading

    saved = [
        (modelopt, CONVERTER_NAME, getattr(modelopt, CONVERTER_NAME)),
        (ct, CONVERTER_NAME, getattr(ct, CONVERTER_NAME)),
    ]
    saved += [(cls, "process_weights_after_loading", fn) for cls, fn in originals.items()]
    setattr(modelopt, CONVERTER_NAME, from_artifact)
    setattr(ct, CONVERTER_NAME, from_artifact)
    for cls in method_classes:
        cls.process_weights_after_loading = wrapper(cls)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def check_scale_c(layer: Any, source: LayerSource) -> None:
    """TRTLLM: the `g1_scale_c` vLLM computed from the installed scales is the artifact's (fail closed)."""
    if "g1_scale_c" not in source.entries:
        return
    stored = source.read(layer.g1_scale_c.device, ("g1_scale_c",), as_buffer=True)["g1_scale_c"]
    if not torch.equal(stored.view(torch.int32), layer.g1_scale_c.detach().contiguous().view(torch.int32)):
        raise MismatchError(
            f"{source.prefix}.g1_scale_c: vLLM computed other bytes from the installed scales than "
            "the artifact holds; the artifact does not fit this vLLM"
        )
