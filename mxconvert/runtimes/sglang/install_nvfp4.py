"""Install an NVFP4 artifact's expert tensors into an SGLang 0.5.23 ModelOpt NVFP4 MoE layer in place of
SGLang's own post-processing (torch only; no SGLang import). docs/sglang.md, "NVFP4".

For FlashInfer TRT-LLM (`--moe-runner-backend flashinfer_trtllm`, what SGLang's overrides make of
"auto" on SM100), `ModelOptNvFp4FusedMoEMethod.process_weights_after_loading`
(sglang/srt/layers/quantization/modelopt_quant.py) does, for a gated SiLU layer without per-token
activations, SwiGLU clamp or NVFP4 dispatch:

* moves bytes: `align_fp4_moe_weights_for_flashinfer_trtllm` (layers/moe/moe_runner/flashinfer_trtllm.py:
  FlashInfer's w3/w1 interleave and row shuffle, the 128x4 scale interleave) and `copy_or_rebind_param`
  of the four expert parameters, whose shapes and dtypes stay those `create_weights` allocated. The
  artifact holds those bytes (layouts/trtllm.py under the row's `nvfp4_fi_padding`;
  tests/test_sglang_nvfp4_golden.py), so the parameters are rebound to the artifact's tensors;
* computes the kernel's scalars: `g1_alphas` = a13 x w13's gate global scale, `g1_alphas_up` (the up
  half's; equal, since convert refuses checkpoints where the two differ), `g2_alphas` = a2 x w2's,
  `w13_input_scale_quant` = 1 / a13, `w2_input_scale_quant` = 1 / a2 (a13, a2: the maxima of the input
  scales) and `g1_scale_c` = w2_input_scale_quant x g1_alphas_up. The artifact holds the first, third
  and last as its folded `w13_weight_scale_2`, `w2_weight_scale_2` and `g1_scale_c`, and the reduced
  input scales, whose reciprocals (one float32 division, as SGLang's) are the other two;
* aliases `w13_blockscale_swizzled` / `w2_blockscale_swizzled` to the scale parameters, sets
  `trtllm_padded_hidden_size = None` (SGLang pads the hidden size only for per-token, non-gated
  layers) and `intermediate_size_per_partition`, and hands the dispatcher its input global scale
  (None without NVFP4 dispatch).

For MARLIN (`--moe-runner-backend marlin`, SGLang's auto on SM80-SM90), the method collapses w13's
global scales to the gate's and runs `prepare_moe_nvfp4_layer_for_marlin`
(layers/quantization/marlin_utils_fp4.py): six new parameters (int32 repacked weights, the Marlin
block scales, bf16 global scales x 2^119; the artifact holds them: layouts/marlin.py under the row's
`nvfp4_marlin_scales` "plain") and `workspace = marlin_make_workspace(device, 4)` (the device's, made
at install by SGLang's own function). `install_nvfp4_marlin` sets the same.

For FLASHINFER_CUTLASS (`--moe-runner-backend flashinfer_cutlass` on Blackwell), the method loads w13 as
[up; gate] (`load_up_proj_weight_first`) and its CUTLASS branch, for a gated SiLU layer whose 2I is a
multiple of 128 (it asserts otherwise; convert refuses):

* `swizzle_blockscale` of both block scales, bound by `alias_or_bind_derived_param`: where the swizzled
  scales have the allocated shape (H/16 and I/16 multiples of 4, 2I and H of 128) they are written into
  `w13_weight_scale` / `w2_weight_scale` and `w13_blockscale_swizzled` / `w2_blockscale_swizzled` alias
  them; otherwise the swizzled parameter `create_weights` made takes them and the raw scale parameter
  keeps the checkpoint's (which no kernel reads: `apply` hands `cutlass_fused_moe` the swizzled ones).
  The weights stay as loaded. The artifact holds those bytes (layouts/cutlass.py, vLLM's FlashInfer
  CUTLASS NVFP4 layout; tests/test_sglang_nvfp4_cutlass.py);
* the scalars `apply` reads: `g1_alphas`, `g2_alphas`, `w13_input_scale_quant`, `w2_input_scale_quant`
  as for TRT-LLM (and `g1_alphas_up`, unread), `_cutlass_swiglu_params` (None, None, None) without a
  clamp, and the dispatcher's input global scale (SGLang's `_use_nvfp4_dispatch` or
  `should_use_flashinfer_cutlass_moe_fp4_allgather`: loader.py passes both as one callable).
`install_nvfp4_cutlass` sets the same.

For FLASHINFER_CUTEDSL (`--moe-runner-backend flashinfer_cutedsl` with `--moe-a2a-backend none`: the CuTe
DSL v2 standard path, `_is_cutedsl_v2_standard`), the method loads w13 as [up; gate] and, for a gated
SiLU layer whose I / tp is a multiple of 64 (`interleave_w13_halves` raises otherwise; convert refuses):

* `interleave_w13_halves(group_size=64)` of w13's weights and block scales (`copy_or_rebind_param`: the
  allocated shapes), then CUTLASS's `swizzle_blockscale` + `alias_or_bind_derived_param` of both block
  scales, then `w13_blockscale_mma` / `w2_blockscale_mma` = FlashInfer's `convert_sf_to_mma_layout` of the
  swizzled scales as uint8 (a strided view of their storage, no copy). The artifact holds those bytes
  (layouts/cutedsl.py, vLLM 0.33's "interleaved" layout; tests/test_sglang_nvfp4_cutedsl.py); the views
  are made here as FlashInfer makes them (`cutedsl_mma_view`);
* the scalars: w13's input scale reduced to one maximum repeated per expert, w2's per expert;
  `g1_alphas` = a13 x gate's global scale (and `g1_alphas_up`), `g2_alphas` = a2[e] x w2's,
  `w13_input_scale_quant` = 1 / a13, `w2_input_scale_quant` = 1 / a2[e]; the raw `w13_weight_scale_2`
  ([gate, up], equal: convert refuses otherwise) and `w2_weight_scale_2` as loaded, since the runner's
  `resolve_cutedsl_standard_scales` divides them by 1 / max(a) at the first forward. The artifact holds
  the reduced input scales, the raw global scales and both alphas (the row's `nvfp4_cutedsl_prepare`
  "interleaved-unfolded"); the reciprocals are one float32 division each, as SGLang's;
* the dispatcher's input global scale where SGLang's `_use_nvfp4_dispatch()` holds (w13's input scale
  then a single value); `layer._cutedsl_wrapper` stays as `create_moe_runner` left it (None: the runner
  makes it, and its scalars, at the first forward). `install_nvfp4_cutedsl` sets the same.

For a compressed-tensors checkpoint on SM80-SM90 (`CompressedTensorsFusedMoEMethod` with
`layer.scheme` SGLang's `CompressedTensorsW4A16Nvfp4MoE`, layers/quantization/compressed_tensors/schemes/
compressed_tensors_w4a16_nvfp4_moe.py), `create_weights` allocates `w13/w2_weight_packed`, the block
scales, `w13/w2_weight_global_scale` and, for a W4A4 checkpoint, `w13/w2_input_global_scale`; its
`process_weights_after_loading` deletes all of those but the block scales, takes the reciprocal of
gate's global scale and runs the same `prepare_moe_nvfp4_layer_for_marlin`: the artifact holds those
six tensors (the row's Marlin layout; tests/test_sglang_nvfp4_ct.py). `install_nvfp4_ct_marlin` deletes
the same parameters and sets the same. `nvfp4_layer` reports its scheme's backend (`nvfp4_ct_backend`).

For TRT-LLM and CUTLASS, SGLang's raw `w13_weight_scale_2` / `w2_weight_scale_2` / `w13_input_scale` / `w2_input_scale`
parameters, which their kernels do not read after post-processing, keep what `create_weights`
made of them: the artifact has no checkpoint-shaped copy. tests_sglang/test_nvfp4.py (TRT-LLM, Marlin)
and tests_sglang/test_nvfp4_cutlass.py compare everything else of the layer with SGLang's own
post-processing of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import Parameter

from mxconvert.core.arith import round_up
from mxconvert.runtimes.sglang.checks import NO_A2A, SglangLayer

#: SGLang's moved expert parameters, by name (also the artifact's names).
MOVED = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
#: The artifact's per-expert scalars (float32, one per local expert).
SCALARS = ("w13_weight_scale_2", "w2_weight_scale_2", "g1_scale_c", "w13_input_scale", "w2_input_scale")
#: Every tensor a FLASHINFER_TRTLLM NVFP4 artifact holds for a layer (what `LayerSource` reads).
NVFP4_TRTLLM_NAMES = MOVED + SCALARS
#: Every tensor a FLASHINFER_CUTLASS NVFP4 artifact holds for a layer (no `g1_scale_c`: TRT-LLM's only).
NVFP4_CUTLASS_NAMES = MOVED + tuple(name for name in SCALARS if name != "g1_scale_c")
#: Every tensor a FLASHINFER_CUTEDSL NVFP4 artifact holds for a layer (layouts/nvfp4_scales.py
#: `cutedsl_standard_scales`: raw global scales, reduced input scales and SGLang's two alphas).
NVFP4_CUTEDSL_NAMES = MOVED + ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale",
                               "g1_alphas", "g2_alphas")  # fmt: skip
#: Every tensor a MARLIN NVFP4 artifact holds for a layer: SGLang's six Marlin parameters.
NVFP4_MARLIN_NAMES = MOVED + ("w13_weight_scale_2", "w2_weight_scale_2")
#: `layer.workspace = marlin_make_workspace(device, 4)` (prepare_moe_nvfp4_layer_for_marlin).
MARLIN_WORKSPACE_BLOCKS_PER_SM = 4
#: The dtype of each moved parameter after SGLang's TRT-LLM post-processing (`create_weights`' dtypes).
MOVED_DTYPES = {
    "w13_weight": torch.uint8,
    "w13_weight_scale": torch.float8_e4m3fn,
    "w2_weight": torch.uint8,
    "w2_weight_scale": torch.float8_e4m3fn,
}


def nvfp4_backend(method: Any) -> str:
    """The mxconvert backend of the path `ModelOptNvFp4FusedMoEMethod.process_weights_after_loading`
    takes for a layer, in its order (Marlin, MegaMoE, FlashInfer TRT-LLM, CuTe DSL, CUTLASS); paths
    the loader does not install are named as SGLang names them."""
    runner = str(getattr(getattr(method, "_moe_runner_backend", None), "value", "auto"))
    if runner in ("marlin", "lora_marlin"):
        return "MARLIN"
    if runner == "flashinfer_megamoe":
        return "FLASHINFER_MEGAMOE (SGLang's MegaMoE; no mxconvert layout)"
    if getattr(method, "enable_flashinfer_trtllm_moe", False):
        if not getattr(method, "use_flashinfer_trtllm_weight_layout", False):
            return "FLASHINFER_TRTLLM under --moe-a2a-backend megamoe (canonical w13; not installed)"
        if runner not in ("flashinfer_trtllm", "flashinfer_trtllm_routed"):
            return f"FLASHINFER_TRTLLM bytes for the {runner} runner (SGLang's auto: not coherent)"
        return "FLASHINFER_TRTLLM"
    if runner == "flashinfer_cutedsl":
        return "FLASHINFER_CUTEDSL"
    return (
        "FLASHINFER_CUTLASS" if runner == "flashinfer_cutlass" else f"FLASHINFER_CUTLASS bytes for the {runner} runner"
    )


#: compressed-tensors NVFP4 MoE scheme (`layer.scheme`'s class) -> the mxconvert backend of what it prepares.
CT_SCHEMES = {
    "CompressedTensorsW4A16Nvfp4MoE": "MARLIN",
    "CompressedTensorsW4A4Nvfp4MoE": "FLASHINFER_CUTLASS",  # its TRT-LLM branch: `CT_W4A4_TRTLLM`
}
#: The W4A4 scheme with `use_flashinfer_trtllm` (`--moe-runner-backend flashinfer_trtllm`).
CT_W4A4_TRTLLM = "FLASHINFER_TRTLLM"
#: Every tensor a compressed-tensors W4A4 FLASHINFER_CUTLASS artifact holds for a layer (layouts/nvfp4_scales.py
#: `ct_w4a4_cutlass_scales`): what the scheme's CUTLASS `apply` hands `cutlass_fused_moe`, and the reciprocal
#: global scales it also sets.
NVFP4_CT_CUTLASS_NAMES = MOVED + ("w13_weight_scale_2", "w2_weight_scale_2", "g1_alphas", "g2_alphas",
                                  "w13_input_scale_quant", "w2_input_scale_quant")  # fmt: skip
#: What `CompressedTensorsW4A16Nvfp4MoE.create_weights` allocates under compressed-tensors' names that its
#: `process_weights_after_loading` deletes (the input global scales only for a W4A4 checkpoint).
CT_DELETED = ("w13_weight_packed", "w2_weight_packed", "w13_weight_global_scale", "w2_weight_global_scale",
              "w13_input_global_scale", "w2_input_global_scale")  # fmt: skip
#: The block-scale group SGLang's NVFP4 Marlin preparation asserts (`prepare_moe_nvfp4_layer_for_marlin`).
NVFP4_GROUP_SIZE = 16


def nvfp4_ct_scheme(module: Any) -> Any:
    """The layer's compressed-tensors NVFP4 MoE scheme (`FusedMoE.scheme`, set by
    `CompressedTensorsConfig.get_quant_method`), or None for any other layer."""
    scheme = getattr(module, "scheme", None)
    return scheme if type(scheme).__name__ in CT_SCHEMES else None


def nvfp4_ct_backend(scheme: Any) -> str:
    """The mxconvert backend of what a compressed-tensors NVFP4 scheme prepares (MARLIN for the W4A16
    scheme, FLASHINFER_CUTLASS for the W4A4 scheme's CUTLASS branch, FLASHINFER_TRTLLM for its TRT-LLM
    branch)."""
    name = type(scheme).__name__
    if name == "CompressedTensorsW4A4Nvfp4MoE" and bool(getattr(scheme, "use_flashinfer_trtllm", False)):
        return CT_W4A4_TRTLLM
    return CT_SCHEMES[name]


def _expert_param(module: Any, name: str) -> Any:
    """`w13_weight` / `w2_weight`, or a compressed-tensors layer's `w13_weight_packed` / `w2_weight_packed`
    (the same bytes under compressed-tensors' name until its post-processing renames them)."""
    return getattr(module, f"{name}_packed") if nvfp4_ct_scheme(module) is not None else getattr(module, name)


def nvfp4_layer(prefix: str, method: Any, module: Any, a2a_backend: str = NO_A2A) -> SglangLayer:
    """The facts the checks compare for one NVFP4 MoE layer as SGLang built it (`FusedMoE` and
    `ModelOptNvFp4FusedMoEMethod` after `create_weights` and `create_moe_runner`; duck-typed)."""
    config = module.moe_runner_config
    quant = getattr(method, "quant_config", None)
    ep_size = int(module.moe_ep_size)
    num_experts = int(module.num_local_experts)
    expected: tuple[tuple[str, object, object], ...] = (
        ("is_gated", True, bool(getattr(config, "is_gated", True))),
        ("activation", "silu", getattr(config, "activation", "silu")),
        ("gemm1_alpha", None, getattr(config, "gemm1_alpha", None)),
        ("gemm1_clamp_limit / swiglu_limit", None,
         getattr(config, "gemm1_clamp_limit", None) or getattr(config, "swiglu_limit", None)),
        ("use_per_token_activation", False, bool(getattr(quant, "use_per_token_activation", False))),
        ("checkpoint NVFP4-serialized", True, bool(getattr(quant, "is_checkpoint_nvfp4_serialized", True))),
        ("inference_moe_w13_interleaved", False, bool(getattr(module, "inference_moe_w13_interleaved", False))),
    )  # fmt: skip
    backend = nvfp4_backend(method)
    if backend == "FLASHINFER_CUTEDSL":  # W4A16 mode: input scales of one, BF16 activations (not mirrored)
        expected += (("SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16", False, cutedsl_w4a16_env()),)
    scheme = nvfp4_ct_scheme(module)
    if scheme is not None:  # compressed-tensors: the scheme's group size (prepare_moe_nvfp4_layer_for_marlin)
        expected += (("NVFP4 group_size", NVFP4_GROUP_SIZE, getattr(scheme, "group_size", None)),)
    return SglangLayer(
        prefix=prefix,
        backend=nvfp4_ct_backend(scheme) if scheme is not None else backend,
        hidden_size_padded=int(_expert_param(module, "w2_weight").shape[1]),
        intermediate_size_padded=int(module.intermediate_size_per_partition),
        tp_size=int(module.moe_tp_size),
        ep_size=ep_size,
        rank=int(module.moe_ep_rank if ep_size > 1 else module.moe_tp_rank),
        num_experts=num_experts,
        # SGLang's placement (checks.SglangLayer.first_expert): FusedMoE's weight loader maps global expert
        # ids to local ones from moe_ep_rank * E_local (layers/moe/fused_moe_triton/layer.py:1153-1161)
        first_expert=int(module.moe_ep_rank) * num_experts if ep_size > 1 else 0,
        fused_shared_experts=int(getattr(module, "num_fused_shared_experts", 0) or 0),
        a2a_backend=str(a2a_backend).lower(),
        format="nvfp4",
        expected=expected,
    )


def cutedsl_w4a16_env() -> bool | str:
    """SGLang 0.5.23's `envs.SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16.get()` (environ.py `EnvBool(False)`): False
    unset or "false" / "0" / "no" / "n" (any case); anything else is reported as given (True for "true" /
    "1" / "yes" / "y"; SGLang raises on the rest), so the check fails closed."""
    import os

    value = os.environ.get("SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16")
    if value is None or value.lower() in ("false", "0", "no", "n"):
        return False
    return True if value.lower() in ("true", "1", "yes", "y") else value


def nvfp4_specs(layer: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """dtype and shape of each artifact tensor SGLang's TRT-LLM post-processing would give the layer:
    the moved parameters keep what `create_weights` allocated; the scalars are one float32 per expert."""
    specs = {name: (MOVED_DTYPES[name], tuple(getattr(layer, name).shape)) for name in MOVED}
    experts = int(getattr(layer, "num_local_experts"))  # noqa: B009 - a plain int attribute of SGLang's FusedMoE
    return specs | {name: (torch.float32, (experts,)) for name in SCALARS}


def nvfp4_marlin_specs(layer: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """dtype and shape of each artifact tensor SGLang's `prepare_moe_nvfp4_layer_for_marlin` gives the
    layer: `gptq_marlin_repack` of each expert's `[K/8, N]` int32 view makes `[K/16, 2N]`, the scales
    `[K/16, N]`, the global scales one bf16 per expert (w13: N = 2I, K = H; w2: N = H, K = I; a gated
    layer is not padded)."""
    e, two_i, half_h = _expert_param(layer, "w13_weight").shape  # SGLang's allocated parameter
    i, h = two_i // 2, 2 * half_h
    return {
        "w13_weight": (torch.int32, (e, h // 16, 2 * (2 * i))),
        "w13_weight_scale": (torch.float8_e4m3fn, (e, h // 16, 2 * i)),
        "w2_weight": (torch.int32, (e, i // 16, 2 * h)),
        "w2_weight_scale": (torch.float8_e4m3fn, (e, i // 16, h)),
        "w13_weight_scale_2": (torch.bfloat16, (e,)),
        "w2_weight_scale_2": (torch.bfloat16, (e,)),
    }


def nvfp4_cutlass_specs(layer: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """dtype and shape of each artifact tensor SGLang's CUTLASS post-processing gives the layer: the
    weights keep what `create_weights` allocated; `swizzle_blockscale` pads each block scale's rows to
    128 and its columns to 4; the scalars are one float32 per expert."""
    e, two_i, half_h = getattr(layer, "w13_weight").shape  # noqa: B009 - SGLang's allocated parameter
    i, h = two_i // 2, 2 * half_h
    return {
        "w13_weight": (torch.uint8, (e, two_i, half_h)),
        "w13_weight_scale": (torch.float8_e4m3fn, (e, round_up(two_i, 128), round_up(h // 16, 4))),
        "w2_weight": (torch.uint8, (e, h, i // 2)),
        "w2_weight_scale": (torch.float8_e4m3fn, (e, round_up(h, 128), round_up(i // 16, 4))),
    } | {name: (torch.float32, (e,)) for name in NVFP4_CUTLASS_NAMES if name not in MOVED}


def release_nvfp4_params(layer: torch.nn.Module) -> None:
    """Drop the memory of the four moved parameters (never filled; each keeps its object, dtype, shape
    and device, backed by one element, until `install_nvfp4_trtllm` rebinds its data). A compressed-tensors
    layer's are `w13/w2_weight_packed` and the block scales."""
    ct = nvfp4_ct_scheme(layer) is not None
    for name in MOVED:
        param = getattr(layer, f"{name}_packed" if ct and name in ("w13_weight", "w2_weight") else name)
        param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)


def _rebind(layer: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """SGLang's `copy_or_rebind_param` (layers/utils/common.py) with the value already in place: an
    existing parameter of the same shape and dtype keeps its object, anything else is a new one."""
    param = getattr(layer, name, None)
    if isinstance(param, Parameter) and param.shape == value.shape and param.dtype == value.dtype:
        param.data = value
        param.requires_grad_(False)
    else:
        setattr(layer, name, Parameter(value, requires_grad=False))


def install_nvfp4_trtllm(
    layer: torch.nn.Module, tensors: dict[str, torch.Tensor], nvfp4_dispatch: Callable[[], bool]
) -> None:
    """What SGLang 0.5.23's `process_weights_after_loading` leaves on a ModelOpt NVFP4 TRT-LLM layer,
    from the artifact's tensors (by the artifact's names). `nvfp4_dispatch` is SGLang's own
    `_use_nvfp4_dispatch` (modelopt_quant.py), which decides what the dispatcher is handed."""
    for name in MOVED:
        _rebind(layer, name, tensors[name])
    g1_alphas = tensors["w13_weight_scale_2"]
    _rebind(layer, "g1_alphas", g1_alphas)
    _rebind(layer, "g1_alphas_up", g1_alphas.clone())
    _rebind(layer, "g2_alphas", tensors["w2_weight_scale_2"])
    _rebind(layer, "w13_input_scale_quant", (1 / tensors["w13_input_scale"][0]).reshape(()))
    _rebind(layer, "w2_input_scale_quant", (1 / tensors["w2_input_scale"][0]).reshape(()))
    _rebind(layer, "g1_scale_c", tensors["g1_scale_c"])
    layer.w13_blockscale_swizzled = layer.w13_weight_scale
    layer.w2_blockscale_swizzled = layer.w2_weight_scale
    layer.trtllm_padded_hidden_size = None  # type: ignore[assignment]  # a plain attribute, as SGLang sets it
    layer.intermediate_size_per_partition = int(tensors["w2_weight"].shape[2]) * 2  # type: ignore[assignment]
    global_scale = layer.w13_input_scale_quant if nvfp4_dispatch() else None
    dispatcher: Any = getattr(layer, "dispatcher")  # noqa: B009 - SGLang's FusedMoE token dispatcher
    dispatcher.set_quant_config({"input_global_scale": global_scale})


def install_nvfp4_marlin(
    layer: torch.nn.Module, tensors: dict[str, torch.Tensor], make_workspace: Callable[..., torch.Tensor]
) -> None:
    """What SGLang 0.5.23's `process_weights_after_loading` leaves on a ModelOpt NVFP4 Marlin layer, from
    the artifact's six tensors. `make_workspace` is SGLang's own `marlin_make_workspace(device, n)`."""
    device = getattr(layer, "w13_weight").device  # noqa: B009 - SGLang's allocated parameter
    layer.workspace = make_workspace(device, MARLIN_WORKSPACE_BLOCKS_PER_SM)
    for name in NVFP4_MARLIN_NAMES:
        setattr(layer, name, Parameter(tensors[name], requires_grad=False))


def nvfp4_ct_device(layer: torch.nn.Module) -> torch.device:
    """Where SGLang put a compressed-tensors layer's expert parameters (the artifact's tensors go there)."""
    return _expert_param(layer, "w13_weight").device


def install_nvfp4_ct_marlin(
    layer: torch.nn.Module, tensors: dict[str, torch.Tensor], make_workspace: Callable[..., torch.Tensor]
) -> None:
    """What SGLang 0.5.23's `CompressedTensorsW4A16Nvfp4MoE.process_weights_after_loading` leaves on a
    compressed-tensors NVFP4 layer: compressed-tensors' parameters deleted (`CT_DELETED`, as it deletes
    them), then `prepare_moe_nvfp4_layer_for_marlin`'s six parameters and `workspace` (`install_nvfp4_marlin`)."""
    if nvfp4_ct_scheme(layer) is None:
        raise ValueError("install_nvfp4_ct_marlin on a layer without a compressed-tensors NVFP4 scheme (a bug)")
    device = nvfp4_ct_device(layer)
    for name in CT_DELETED:
        if hasattr(layer, name):
            delattr(layer, name)
    layer.workspace = make_workspace(device, MARLIN_WORKSPACE_BLOCKS_PER_SM)
    for name in NVFP4_MARLIN_NAMES:
        setattr(layer, name, Parameter(tensors[name], requires_grad=False))


def _bind_swizzled(layer: torch.nn.Module, source: str, derived: str, value: torch.Tensor) -> None:
    """SGLang's `alias_or_bind_derived_param` (layers/utils/common.py) for a swizzled block scale of
    the source parameter's dtype: the source takes it and `derived` aliases the source where the shapes
    agree; otherwise `derived` takes it (`copy_or_rebind_param`) and the source is left alone."""
    param = getattr(layer, source)
    if tuple(param.shape) == tuple(value.shape):
        _rebind(layer, source, value)
        setattr(layer, derived, getattr(layer, source))
    else:
        _rebind(layer, derived, value)


def install_nvfp4_cutlass(
    layer: torch.nn.Module, tensors: dict[str, torch.Tensor], nvfp4_dispatch: Callable[[], bool]
) -> None:
    """What SGLang 0.5.23's `process_weights_after_loading` leaves on a ModelOpt NVFP4 FlashInfer CUTLASS
    layer, from the artifact's tensors (by the artifact's names). `nvfp4_dispatch`: whether SGLang hands
    the dispatcher the input global scale (`_use_nvfp4_dispatch() or
    should_use_flashinfer_cutlass_moe_fp4_allgather()`, modelopt_quant.py)."""
    for name in ("w13_weight", "w2_weight"):
        _rebind(layer, name, tensors[name])
    _bind_swizzled(layer, "w13_weight_scale", "w13_blockscale_swizzled", tensors["w13_weight_scale"])
    _bind_swizzled(layer, "w2_weight_scale", "w2_blockscale_swizzled", tensors["w2_weight_scale"])
    g1_alphas = tensors["w13_weight_scale_2"]
    _rebind(layer, "g1_alphas", g1_alphas)
    _rebind(layer, "g1_alphas_up", g1_alphas.clone())
    _rebind(layer, "g2_alphas", tensors["w2_weight_scale_2"])
    _rebind(layer, "w13_input_scale_quant", (1 / tensors["w13_input_scale"][0]).reshape(()))
    _rebind(layer, "w2_input_scale_quant", (1 / tensors["w2_input_scale"][0]).reshape(()))
    # materialize_swiglu_params_for_cutlass without a clamp limit (nvfp4_layer checks there is none)
    layer._cutlass_swiglu_params = (None, None, None)  # type: ignore[assignment]  # a plain attribute, as SGLang's
    global_scale = layer.w13_input_scale_quant if nvfp4_dispatch() else None
    dispatcher: Any = getattr(layer, "dispatcher")  # noqa: B009 - SGLang's FusedMoE token dispatcher
    dispatcher.set_quant_config({"input_global_scale": global_scale})


def nvfp4_ct_cutlass_specs(layer: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """dtype and shape of each artifact tensor `CompressedTensorsW4A4Nvfp4MoE`'s CUTLASS branch gives the
    layer: the weights and swizzled block scales as ModelOpt's CUTLASS (`nvfp4_cutlass_specs`, of the
    `_packed` weights it allocated), the scalars one float32 per expert."""
    e, two_i, half_h = _expert_param(layer, "w13_weight").shape
    i, h = two_i // 2, 2 * half_h
    return {
        "w13_weight": (torch.uint8, (e, two_i, half_h)),
        "w13_weight_scale": (torch.float8_e4m3fn, (e, round_up(two_i, 128), round_up(h // 16, 4))),
        "w2_weight": (torch.uint8, (e, h, i // 2)),
        "w2_weight_scale": (torch.float8_e4m3fn, (e, round_up(h, 128), round_up(i // 16, 4))),
    } | {name: (torch.float32, (e,)) for name in NVFP4_CT_CUTLASS_NAMES if name not in MOVED}


def install_nvfp4_ct_cutlass(layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """What SGLang 0.5.23's `CompressedTensorsW4A4Nvfp4MoE.process_weights_after_loading` (the CUTLASS
    branch, layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py) leaves on
    a compressed-tensors NVFP4 layer, from the artifact's tensors: `w13/w2_weight` new parameters and
    `w13/w2_weight_packed` deleted (it renames them), the swizzled block scales, the reciprocal global
    scales, `g1/g2_alphas` and `w13/w2_input_scale_quant` new parameters (it makes each anew), and
    `_cutlass_swiglu_params` (None, None, None) (`materialize_swiglu_params_for_cutlass` without a clamp:
    `nvfp4_layer` checks there is none). Its raw `w13/w2_weight_global_scale` and `w13/w2_input_global_scale`
    parameters, which the kernel does not read, keep what `create_weights` made (the artifact holds no
    checkpoint-shaped copy); it sets nothing on the dispatcher."""
    if nvfp4_ct_scheme(layer) is None:
        raise ValueError("install_nvfp4_ct_cutlass on a layer without a compressed-tensors NVFP4 scheme (a bug)")
    for name in ("w13_weight_packed", "w2_weight_packed"):
        delattr(layer, name)
    for name in NVFP4_CT_CUTLASS_NAMES:
        setattr(layer, name, Parameter(tensors[name], requires_grad=False))
    layer._cutlass_swiglu_params = (None, None, None)  # type: ignore[assignment]  # a plain attribute, as SGLang's


#: FlashInfer's `convert_sf_to_mma_layout` block (flashinfer/cute_dsl/utils.py): 128 rows, 4 scale columns.
MMA_ROWS, MMA_COLUMNS = 128, 4


def nvfp4_cutedsl_specs(layer: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """dtype and shape of each artifact tensor SGLang's CuTe DSL v2 post-processing gives the layer: the
    weights and swizzled block scales as CUTLASS's (`nvfp4_cutlass_specs`), the scalars one float32 per
    expert."""
    e = int(getattr(layer, "w13_weight").shape[0])  # noqa: B009 - SGLang's allocated parameter
    moved = {name: spec for name, spec in nvfp4_cutlass_specs(layer).items() if name in MOVED}
    return moved | {name: (torch.float32, (e,)) for name in NVFP4_CUTEDSL_NAMES if name not in MOVED}


def cutedsl_mma_view(swizzled: torch.Tensor, m: int, k: int, experts: int) -> torch.Tensor:
    """FlashInfer 0.7.2's `convert_sf_to_mma_layout(swizzled.contiguous().view(uint8).reshape(-1), m, k,
    experts, 16)` (flashinfer/cute_dsl/utils.py, pure torch), as SGLang calls it: the storage viewed as
    `[E, m_tiles, k_tiles, 32, 4, 4]` and permuted to `(32, 4, m_tiles, 4, k_tiles, E)`, no copy."""
    m_tiles = round_up(m, MMA_ROWS) // MMA_ROWS
    k_tiles = round_up(round_up(k, 16) // 16, MMA_COLUMNS) // MMA_COLUMNS
    flat = swizzled.contiguous().view(torch.uint8).reshape(-1)
    if flat.numel() != experts * m_tiles * k_tiles * 32 * 4 * 4:
        raise ValueError(f"CuTe DSL MMA view of {tuple(swizzled.shape)} scales for m={m}, k={k}, E={experts} (a bug)")
    return flat.view(experts, m_tiles, k_tiles, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)


def install_nvfp4_cutedsl(
    layer: torch.nn.Module, tensors: dict[str, torch.Tensor], nvfp4_dispatch: Callable[[], bool]
) -> None:
    """What SGLang 0.5.23's `process_weights_after_loading` leaves on a ModelOpt NVFP4 CuTe DSL v2 layer,
    from the artifact's tensors (by the artifact's names). `nvfp4_dispatch`: SGLang's own
    `_use_nvfp4_dispatch()` (modelopt_quant.py; loader.py's callable, whose CUTLASS all-gather term is
    False for this runner)."""
    for name in ("w13_weight", "w2_weight"):
        _rebind(layer, name, tensors[name])
    _bind_swizzled(layer, "w13_weight_scale", "w13_blockscale_swizzled", tensors["w13_weight_scale"])
    _bind_swizzled(layer, "w2_weight_scale", "w2_blockscale_swizzled", tensors["w2_weight_scale"])
    experts, two_i, half_h = (int(n) for n in tensors["w13_weight"].shape)
    hidden = int(tensors["w2_weight"].shape[1])
    for name, m, k in (("w13", two_i, 2 * half_h), ("w2", hidden, 2 * int(tensors["w2_weight"].shape[2]))):
        swizzled = getattr(layer, f"{name}_blockscale_swizzled")
        _rebind(layer, f"{name}_blockscale_mma", cutedsl_mma_view(swizzled, m, k, experts))
    w13_global = getattr(layer, "w13_weight_scale_2")  # noqa: B009 - SGLang's raw [gate, up] parameter
    gate = tensors["w13_weight_scale_2"]
    _rebind(layer, "w13_weight_scale_2", gate.reshape(-1, 1).expand(w13_global.shape).contiguous())
    _rebind(layer, "w2_weight_scale_2", tensors["w2_weight_scale_2"])
    a13 = tensors["w13_input_scale"][0] if nvfp4_dispatch() else tensors["w13_input_scale"]
    _rebind(layer, "g1_alphas", tensors["g1_alphas"])
    _rebind(layer, "g1_alphas_up", tensors["g1_alphas"].clone())
    _rebind(layer, "g2_alphas", tensors["g2_alphas"])
    _rebind(layer, "w13_input_scale_quant", (1 / a13).to(torch.float32))
    _rebind(layer, "w2_input_scale_quant", (1 / tensors["w2_input_scale"]).to(torch.float32))
    global_scale = layer.w13_input_scale_quant if nvfp4_dispatch() else None
    dispatcher: Any = getattr(layer, "dispatcher")  # noqa: B009 - SGLang's FusedMoE token dispatcher
    dispatcher.set_quant_config({"input_global_scale": global_scale})
