"""The sizes vLLM 0.33.0 (and 0.26.0, `PADDING_0_26`) pads an NVFP4 MoE layer to, asked of vLLM and of
the layer it built (imports vLLM; plugin only).

vLLM pads inside `convert_to_nvfp4_moe_kernel_format` (vllm/model_executor/layers/fused_moe/oracle/
nvfp4.py), the conversion the plugin bypasses, so nothing in vLLM checks an artifact's padded sizes
(its pre-processed path even takes them from the installed weights). The plugin therefore asks vLLM
what it would pad this layer to, before any weight is read, and `checks.nvfp4_padding_mismatches`
compares the artifact's recorded `hidden_padded` / `intermediate_padded` with the answer, never with
mxconvert's own padding rule (the one that wrote the artifact):

  * FLASHINFER_TRTLLM (`prepare_nvfp4_moe_layer_for_fi_or_cutlass`) and FLASHINFER_CUTEDSL
    (`prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`), quantization/utils/flashinfer_fp4_moe.py: vLLM's
    own round-up helpers `align_fp4_moe_hidden_dim_for_fi` and `align_fp4_moe_weights_for_fi`
    (quantization/utils/flashinfer_utils.py) run on meta tensors of the shapes of the checkpoint-shaped
    parameters `create_weights` allocated (no memory, no copy), with the alignments vLLM's callers pass:
    TRTLLM's hidden alignment from the method (ModelOpt: `trtllm_nvfp4_hidden_alignment`; compressed-
    tensors: the default of the conversion's `trtllm_hidden_alignment`), CuteDSL's the helper's default,
    and the intermediate alignment 64 for a gated activation, else 128 (both prepare functions);
  * MARLIN (`prepare_nvfp4_moe_layer_for_marlin`, quantization/utils/marlin_utils_fp4.py): vLLM 0.33.0
    has no helper; its rule, from the layer's `hidden_size` and `intermediate_size_per_partition`, with
    vLLM's `round_up`: the intermediate size to a multiple of 64 when hidden is a multiple of 128, else
    of 128 (hidden must be a multiple of 64);
  * FLASHINFER_CUTLASS, VLLM_CUTLASS, FLASHINFER_CUTEDSL_BATCHED: no MoE size is padded (the 128x4
    block-scale swizzle pads scale rows inside the layout, whose shapes `verify` checks).

vLLM 0.26.0 (`PADDING_0_26`, the table its adapter names, adapters.py): the same for MARLIN (its
`prepare_nvfp4_moe_layer_for_marlin` rounds up as 0.33.0's), FLASHINFER_CUTLASS, VLLM_CUTLASS and CuteDSL
batched; FLASHINFER_TRTLLM pads the hidden size with its `align_trtllm_fp4_moe_hidden_dim_for_fi` at
that helper's default alignment (256, for both methods: 0.26.0 has no `trtllm_nvfp4_hidden_alignment`)
and the intermediate size as 0.33.0; FLASHINFER_CUTEDSL pads nothing (0.26.0's
`prepare_nvfp4_moe_layer_for_flashinfer_cutedsl` calls no round-up helper).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from mxconvert.runtimes.vllm.adapters import installed_adapter
from mxconvert.runtimes.vllm.dependency import missing_vllm
from mxconvert.runtimes.vllm.install_nvfp4 import CHECKPOINT_PARAMS

#: (layout field, padded size) pairs, as `LiveLayer.padded` holds them.
Padded = tuple[tuple[str, int], ...]


def live_nvfp4_padding(method: Any, module: torch.nn.Module) -> Padded | None:
    """What the installed vLLM's conversion pads this layer to for the backend its oracle picked (the
    table of its NVFP4 adapter); None for a backend whose padding this plugin does not know (or a size
    vLLM's conversion refuses), or a vLLM the plugin loads no NVFP4 artifact into (refused by its row)."""
    adapter = installed_adapter("nvfp4")
    table = PADDING_TABLES[adapter.nvfp4_padding] if adapter is not None else {}
    rule = table.get(method.nvfp4_backend.value)
    return None if rule is None else rule(method, module)


def _meta_params(method: Any, module: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """w13, w13 block scales, w2, w2 block scales: empty meta tensors of the live parameters' shapes."""
    w13, w2, s13, s2 = (getattr(module, name) for name in CHECKPOINT_PARAMS[type(method).__name__][:4])
    return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (w13, s13, w2, s2))


def _fi_padding(method: Any, module: Any, hidden_alignment: int | None, hidden_helper: str) -> Padded:
    """`hidden_helper`: the name of vLLM's hidden-size round-up helper in flashinfer_utils.py
    (0.33.0: `align_fp4_moe_hidden_dim_for_fi`, 0.26.0: `align_trtllm_fp4_moe_hidden_dim_for_fi`)."""
    try:
        from vllm.model_executor.layers.quantization.utils import flashinfer_utils
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    align_hidden = getattr(flashinfer_utils, hidden_helper)
    gated = bool(module.activation.is_gated)
    w13, s13, w2, s2 = _meta_params(method, module)
    if hidden_alignment is None:  # CuteDSL (0.33.0) and TRTLLM (0.26.0) call the helper with its default
        *_, hidden = align_hidden(w13, s13, w2, s2)
    else:
        *_, hidden = align_hidden(w13, s13, w2, s2, min_alignment=hidden_alignment)
    *_, intermediate = flashinfer_utils.align_fp4_moe_weights_for_fi(w13, s13, w2, s2, gated, 64 if gated else 128)
    return (("hidden_padded", int(hidden)), ("intermediate_padded", int(intermediate)))


def _trtllm_padding(method: Any, module: Any) -> Padded:
    alignment = TRTLLM_HIDDEN_ALIGNMENT[type(method).__name__](method)
    return _fi_padding(method, module, alignment, "align_fp4_moe_hidden_dim_for_fi")


def _cutedsl_padding(method: Any, module: Any) -> Padded:
    return _fi_padding(method, module, None, "align_fp4_moe_hidden_dim_for_fi")


def _trtllm_padding_0_26(method: Any, module: Any) -> Padded:
    """vLLM 0.26.0 `prepare_nvfp4_moe_layer_for_fi_or_cutlass`: `align_trtllm_fp4_moe_hidden_dim_for_fi`
    with its default alignment, then `align_fp4_moe_weights_for_fi` (64 gated, else 128)."""
    return _fi_padding(method, module, None, "align_trtllm_fp4_moe_hidden_dim_for_fi")


def _marlin_padding(method: Any, module: Any) -> Padded | None:
    try:
        from vllm.utils.math_utils import round_up
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    hidden, intermediate = int(module.hidden_size), int(module.intermediate_size_per_partition)
    if hidden % 128 == 0:
        return (("intermediate_padded", round_up(intermediate, 64)),)
    if hidden % 64 == 0:
        return (("intermediate_padded", round_up(intermediate, 128)),)
    return None  # vLLM asserts: no Marlin tile fits this hidden size


def _pads_nothing(method: Any, module: Any) -> Padded:
    return ()


def _modelopt_trtllm_hidden_alignment(method: Any) -> int:
    """modelopt.py `ModelOptNvFp4FusedMoE.process_weights_after_loading`."""
    try:
        from vllm.model_executor.layers.quantization.utils.flashinfer_utils import trtllm_nvfp4_hidden_alignment
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return int(
        trtllm_nvfp4_hidden_alignment(
            per_token_activation=method.per_token_activation, is_act_and_mul=method.moe.is_act_and_mul
        )
    )


def _conversion_default_hidden_alignment(method: Any) -> int:
    """compressed_tensors_moe_w4a4_nvfp4.py calls the conversion without `trtllm_hidden_alignment`."""
    try:
        from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import convert_to_nvfp4_moe_kernel_format
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    return int(inspect.signature(convert_to_nvfp4_moe_kernel_format).parameters["trtllm_hidden_alignment"].default)


#: The hidden alignment each NVFP4 method class passes to TRTLLM's preparation.
TRTLLM_HIDDEN_ALIGNMENT: dict[str, Callable[[Any], int]] = {
    "ModelOptNvFp4FusedMoE": _modelopt_trtllm_hidden_alignment,
    "CompressedTensorsW4A4Nvfp4MoEMethod": _conversion_default_hidden_alignment,
}

#: vLLM 0.33.0 NVFP4 backend -> how its conversion pads the layer (see the module docstring).
PADDING: dict[str, Callable[[Any, Any], Padded | None]] = {
    "FLASHINFER_TRTLLM": _trtllm_padding,
    "FLASHINFER_CUTEDSL": _cutedsl_padding,
    "MARLIN": _marlin_padding,
    "FLASHINFER_CUTLASS": _pads_nothing,
    "VLLM_CUTLASS": _pads_nothing,
    "FLASHINFER_CUTEDSL_BATCHED": _pads_nothing,
}

#: vLLM 0.26.0 NVFP4 backend -> how its conversion pads the layer (see the module docstring).
PADDING_0_26: dict[str, Callable[[Any, Any], Padded | None]] = {
    "FLASHINFER_TRTLLM": _trtllm_padding_0_26,
    "FLASHINFER_CUTEDSL": _pads_nothing,
    "MARLIN": _marlin_padding,
    "FLASHINFER_CUTLASS": _pads_nothing,
    "VLLM_CUTLASS": _pads_nothing,
    "FLASHINFER_CUTEDSL_BATCHED": _pads_nothing,
}

# ---- vLLM 0.18.0-0.19.1 (rows vllm-0.18, vllm-0.19-nvfp4) -------------------------------------------------


def _trtllm_padding_0_19(method: Any, module: Any) -> Padded:
    """vLLM 0.18.0-0.19.1 `prepare_nvfp4_moe_layer_for_fi_or_cutlass` (flashinfer_fp4_moe.py): the intermediate
    size by `align_fp4_moe_weights_for_fi` (flashinfer_utils.py) with `min_alignment = 16 if is_gated else
    128`; the hidden size stays (no hidden round-up helper before 0.20.0)."""
    try:
        from vllm.model_executor.layers.quantization.utils import flashinfer_utils
    except ImportError as exc:
        raise missing_vllm(exc) from exc
    gated = bool(module.activation.is_gated)
    w13, s13, w2, s2 = _meta_params(method, module)
    is_act_and_mul = bool(module.moe_config.is_act_and_mul)
    *_, intermediate = flashinfer_utils.align_fp4_moe_weights_for_fi(
        w13, s13, w2, s2, is_act_and_mul, 16 if gated else 128
    )
    return (("hidden_padded", int(w2.shape[1])), ("intermediate_padded", int(intermediate)))


def _marlin_padding_0_19(method: Any, module: Any) -> Padded:
    """vLLM 0.18.0-0.19.1 `prepare_nvfp4_moe_layer_for_marlin` (marlin_utils_fp4.py) repacks the layer's sizes
    as they are (the round-up of the intermediate size came in a later release)."""
    return (("intermediate_padded", int(module.intermediate_size_per_partition)),)


#: vLLM 0.18.0-0.19.1 NVFP4 backend -> how its conversion pads the layer (the CuteDSL of these releases is the
#: batched kernel under the name FLASHINFER_CUTEDSL, prepared as CUTLASS: nothing padded).
PADDING_0_19: dict[str, Callable[[Any, Any], Padded | None]] = {
    "FLASHINFER_TRTLLM": _trtllm_padding_0_19,
    "FLASHINFER_CUTEDSL": _pads_nothing,
    "MARLIN": _marlin_padding_0_19,
    "FLASHINFER_CUTLASS": _pads_nothing,
    "VLLM_CUTLASS": _pads_nothing,
}

# ---- vLLM 0.15.0-0.16.0 (rows vllm-0.15, vllm-0.15.1, vllm-0.16) ---------------------------------------------


def _trtllm_padding_0_16(method: Any, module: Any) -> Padded:
    """vLLM 0.15.0-0.16.0 `prepare_nvfp4_moe_layer_for_fi_or_cutlass` (flashinfer_fp4_moe.py) shuffles TRTLLM's
    weights at the layer's own sizes: no round-up helper is called (0.17.0 added `align_fp4_moe_weights_for_fi`)."""
    _, _, w2, _ = _meta_params(method, module)
    return (("hidden_padded", int(w2.shape[1])), ("intermediate_padded", int(module.intermediate_size_per_partition)))


#: vLLM 0.15.0-0.16.0 NVFP4 backend -> how its conversion pads the layer: 0.18.0's (`PADDING_0_19`; 0.17.x's too),
#: but TRTLLM pads nothing.
PADDING_0_16: dict[str, Callable[[Any, Any], Padded | None]] = {
    **PADDING_0_19,
    "FLASHINFER_TRTLLM": _trtllm_padding_0_16,
}

#: The padding rules of each vLLM release the plugin loads NVFP4 into, by the key its adapter names
#: (adapters.py `ReleaseAdapter.nvfp4_padding`).
PADDING_TABLES: dict[str, dict[str, Callable[[Any, Any], Padded | None]]] = {
    "0.33.0": PADDING,
    "0.26.0": PADDING_0_26,
    "0.19.1": PADDING_0_19,
    "0.16.0": PADDING_0_16,
}
