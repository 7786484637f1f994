"""Install an artifact's expert tensors into an SGLang 0.5.23 GPT-OSS MXFP4 MoE layer in place of
SGLang's own post-processing (torch only; no SGLang import).

For the FlashInfer TRT-LLM backend (SM100, `Mxfp4MoEMethod._fi_kernel == "trtllm_sm100"`),
`Mxfp4MoEMethod.process_weights_after_loading` (sglang/srt/layers/quantization/mxfp4.py, the
`if self.use_flashinfer:` branch, lines 735-949 of the 0.5.23 wheel) does two things:

* moves bytes: biases to float32, `swap_every_two_rows`, FlashInfer's per-expert permutations,
  `nvfp4_block_scale_interleave` of the scales, scales viewed as float8_e4m3fn; then rebinds the
  six expert parameters to new `Parameter(..., requires_grad=False)` objects. The artifact holds
  those bytes already (layouts/trtllm.py; tests/test_sglang_golden.py), so here the six parameters
  are rebound to the artifact's tensors;
* sets state the kernel reads: `gemm1_alpha` / `gemm1_beta` / `gemm1_clamp_limit` (one float32 per
  local expert, from `moe_runner_config` or SGLang's defaults 1.702 / 1.0 / 7.0) and
  `_situ_routing_bias_bf16 = None`. `install_trtllm_sm100` sets the same, on the layer's device
  (SGLang: `.cuda()`, the scheduler's current device, where the layer lives).

For MARLIN (`--moe-runner-backend marlin`, SM90+; the `if self.use_marlin` branch), SGLang runs
`deinterleave_moe_mxfp4_w13_for_marlin` and `prepare_moe_mxfp4_layer_for_marlin`
(layers/quantization/marlin_utils_fp4.py): the bytes move (the artifact holds them: layouts/marlin.py
under the row's `mxfp4_marlin_w13_rows`, tests/test_sglang_marlin.py), the six parameters are rebound
(int32 repacked weights, float8_e8m0fnu scales, bfloat16 biases, new shapes: `marlin_shapes`), and
the layer gets `workspace = marlin_make_workspace(device, 4)` (int32 zeros, one per SM times 4: the
device's, so made at install by SGLang's own function, never stored) and `_mxfp4_backend = "marlin"`.

tests_sglang/test_equivalence.py (TRT-LLM) and tests_sglang/test_marlin.py (MARLIN) compare the whole
layer state (every parameter, its dtype, shape and bytes, and these attributes) with SGLang's own
post-processing of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import Parameter

#: SGLang's expert parameter name -> the artifact's tensor name (mxconvert's canonical names).
SGLANG_NAMES = {
    "w13_weight": "w13_weight",
    "w13_weight_scale": "w13_weight_scale",
    "w13_weight_bias": "w13_bias",
    "w2_weight": "w2_weight",
    "w2_weight_scale": "w2_weight_scale",
    "w2_weight_bias": "w2_bias",
}

#: The dtype of each expert parameter after SGLang 0.5.23's TRT-LLM post-processing (its shape is
#: the checkpoint-shaped parameter's: `create_weights` already allocates the padded sizes).
TRTLLM_DTYPES = {
    "w13_weight": torch.uint8,
    "w13_weight_scale": torch.float8_e4m3fn,
    "w13_weight_bias": torch.float32,
    "w2_weight": torch.uint8,
    "w2_weight_scale": torch.float8_e4m3fn,
    "w2_weight_bias": torch.float32,
}

#: The dtype of each expert parameter after SGLang 0.5.23's MARLIN post-processing (shapes: `marlin_shapes`).
MARLIN_DTYPES = {
    "w13_weight": torch.int32,
    "w13_weight_scale": torch.float8_e8m0fnu,
    "w13_weight_bias": torch.bfloat16,
    "w2_weight": torch.int32,
    "w2_weight_scale": torch.float8_e8m0fnu,
    "w2_weight_bias": torch.bfloat16,
}

#: `layer.workspace = marlin_make_workspace(device, 4)` (prepare_moe_mxfp4_layer_for_marlin).
MARLIN_WORKSPACE_BLOCKS_PER_SM = 4

#: SGLang's defaults where `moe_runner_config` leaves gemm1_alpha / gemm1_clamp_limit unset.
GEMM1_ALPHA_DEFAULT = 1.702
GEMM1_BETA = 1.0
GEMM1_CLAMP_LIMIT_DEFAULT = 7.0


def _parameter(layer: torch.nn.Module, name: str) -> torch.Tensor:
    param = getattr(layer, name)
    if not isinstance(param, torch.Tensor):
        raise TypeError(f"{type(layer).__name__}.{name} is a {type(param).__name__}, not SGLang's expert parameter")
    return param


def checkpoint_shapes(layer: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The shapes of the expert parameters SGLang's `create_weights` allocated for the layer."""
    return {name: tuple(_parameter(layer, name).shape) for name in SGLANG_NAMES}


def checkpoint_device(layer: torch.nn.Module) -> torch.device:
    """Where SGLang put the layer's expert parameters (the artifact's tensors are read onto it)."""
    return _parameter(layer, "w13_weight").device


def marlin_shapes(allocated: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shapes SGLang 0.5.23's `prepare_moe_mxfp4_layer_for_marlin` gives the expert parameters
    `create_weights` allocated (`checkpoint_shapes`): `gptq_marlin_repack` of each expert's
    `[K/8, N]` int32 view makes `[K/16, 2N]`; scales `[K/32, N]`; biases keep their shape. N and K
    are w13's `2I` and `H`, w2's `H` and `I`. Its own intermediate padding (to 64 or 128) adds
    nothing: `create_weights` already rounded I to 128 for marlin."""
    e, two_i, half_h = allocated["w13_weight"]
    i, h = two_i // 2, 2 * half_h
    pad = 64 if h % 128 == 0 else 128
    i = -(-i // pad) * pad
    return {
        "w13_weight": (e, h // 16, 2 * (2 * i)),
        "w13_weight_scale": (e, h // 32, 2 * i),
        "w13_weight_bias": (e, 2 * i),
        "w2_weight": (e, i // 16, 2 * h),
        "w2_weight_scale": (e, i // 32, h),
        "w2_weight_bias": (e, h),
    }


def release_checkpoint_params(layer: torch.nn.Module) -> None:
    """Drop the memory of the checkpoint-shaped expert parameters (never filled: the artifact's
    shared files hold no expert tensor); each keeps its object, dtype, shape and device, backed by
    one element, until `install_trtllm_sm100` / `install_marlin` rebinds it as SGLang's
    post-processing does."""
    for name in SGLANG_NAMES:
        param = _parameter(layer, name)
        param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)


def install_trtllm_sm100(layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """What SGLang 0.5.23's `process_weights_after_loading` leaves on a `trtllm_sm100` layer, with
    the six expert tensors taken from the artifact (`tensors`, by the artifact's names)."""
    experts: int = getattr(layer, "num_local_experts")  # noqa: B009 - a plain int attribute of SGLang's FusedMoE
    device = _parameter(layer, "w13_weight").device
    config = layer.moe_runner_config
    alpha = getattr(config, "gemm1_alpha", None) or GEMM1_ALPHA_DEFAULT
    limit = getattr(config, "gemm1_clamp_limit", None) or GEMM1_CLAMP_LIMIT_DEFAULT

    def per_expert(value: float) -> Parameter:
        return Parameter(torch.tensor([value] * experts, dtype=torch.float32, device=device), requires_grad=False)

    layer.gemm1_alpha = per_expert(alpha)
    layer.gemm1_beta = per_expert(GEMM1_BETA)
    layer.gemm1_clamp_limit = per_expert(limit)
    layer._situ_routing_bias_bf16 = None  # type: ignore[assignment]  # a plain attribute, as SGLang sets it
    for sglang_name, name in SGLANG_NAMES.items():
        setattr(layer, sglang_name, Parameter(tensors[name], requires_grad=False))


def install_marlin(
    layer: torch.nn.Module, tensors: dict[str, torch.Tensor], make_workspace: Callable[..., torch.Tensor]
) -> None:
    """What SGLang 0.5.23's `process_weights_after_loading` leaves on a marlin layer, with the six
    expert tensors taken from the artifact. `make_workspace` is SGLang's own
    `marlin_make_workspace(device, max_blocks_per_sm)` (it reads the device's SM count)."""
    device = _parameter(layer, "w13_weight").device
    layer.workspace = make_workspace(device, MARLIN_WORKSPACE_BLOCKS_PER_SM)
    for sglang_name, name in SGLANG_NAMES.items():
        setattr(layer, sglang_name, Parameter(tensors[name], requires_grad=False))
    layer._mxfp4_backend = "marlin"  # type: ignore[assignment]  # a plain attribute, as SGLang sets it


#: The two FlashInfer CUTLASS backends: SGLang 0.5.23's `_fi_kernel` "cutlass_sm90" (16-bit
#: activations) and "cutlass_sm120" (MXFP8 activations).
CUTLASS_SM90 = "FLASHINFER_CUTLASS_MXFP4_BF16"
CUTLASS_SM120 = "FLASHINFER_CUTLASS_MXFP4_MXFP8"
#: `_padded_intermediate` / `_padded_hidden` (create_weights, cutlass branch): round_up(., 128).
CUTLASS_ALIGN = 128
#: The dtype of each expert parameter after either CUTLASS post-processing (shapes: `cutlass_shapes`).
CUTLASS_DTYPES = {
    "w13_weight": torch.uint8,
    "w13_weight_scale": torch.uint8,
    "w13_weight_bias": torch.bfloat16,
    "w2_weight": torch.uint8,
    "w2_weight_scale": torch.uint8,
    "w2_weight_bias": torch.bfloat16,
}


def cutlass_shapes(allocated: dict[str, tuple[int, ...]], backend: str) -> dict[str, tuple[int, ...]]:
    """The shapes SGLang 0.5.23's `_process_weights_for_sm{90,120}_cutlass` give the expert
    parameters `create_weights` allocated unpadded (`checkpoint_shapes`: I as loaded, H rounded by
    FusedMoE): I and H padded to 128 (w13 `[E, 2 N_pad, K_pad / 2]`, w2 `[E, K_pad, N_pad / 2]`);
    SM120 keeps the padded scale shapes `[E, 2 N_pad, K_pad / 32]` and `[E, K_pad, N_pad / 32]`
    (`reshape_as`), SM90's `interleave_moe_scales_for_sm90_mixed_gemm` folds them to
    `[E, rows / 64, K / 128, 16, 16]` (FlashInfer 0.7.2 fused_moe/prepare.py, uint8 scales)."""
    e, two_i, half_h = allocated["w13_weight"]
    n = -(-(two_i // 2) // CUTLASS_ALIGN) * CUTLASS_ALIGN
    k = -(-(2 * half_h) // CUTLASS_ALIGN) * CUTLASS_ALIGN
    scales: dict[str, tuple[int, ...]]
    if backend == CUTLASS_SM90:
        scales = {
            "w13_weight_scale": (e, 2 * n // 64, k // 128, 16, 16),
            "w2_weight_scale": (e, k // 64, n // 128, 16, 16),
        }
    else:
        scales = {"w13_weight_scale": (e, 2 * n, k // 32), "w2_weight_scale": (e, k, n // 32)}
    return {
        "w13_weight": (e, 2 * n, k // 2),
        "w13_weight_bias": (e, 2 * n),
        "w2_weight": (e, k, n // 2),
        "w2_weight_bias": (e, k),
        **scales,
    }


def install_cutlass(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], backend: str) -> None:
    """What SGLang 0.5.23's `_process_weights_for_sm90_cutlass` (`backend` CUTLASS_SM90, bf16, not
    Humming) or `_process_weights_for_sm120_cutlass` leaves on a layer, with the six expert tensors
    taken from the artifact: the six parameters rebound, `swiglu_alpha` / `swiglu_beta` /
    `swiglu_limit` (float32, one per local expert: SM90 from `moe_runner_config` or 1.702 / 7.0,
    SM120 always 1.702 / 7.0), and on SM120 `mxfp4_weight_global_scale` (ones) and
    `_mxfp4_backend = "flashinfer_cutlass_sm120"`."""
    experts: int = getattr(layer, "num_local_experts")  # noqa: B009 - a plain int attribute of SGLang's FusedMoE
    device = _parameter(layer, "w13_weight").device
    for sglang_name, name in SGLANG_NAMES.items():
        setattr(layer, sglang_name, Parameter(tensors[name], requires_grad=False))
    alpha, limit = GEMM1_ALPHA_DEFAULT, GEMM1_CLAMP_LIMIT_DEFAULT
    if backend == CUTLASS_SM90:
        config = layer.moe_runner_config
        alpha = getattr(config, "gemm1_alpha", None) or GEMM1_ALPHA_DEFAULT
        limit = getattr(config, "gemm1_clamp_limit", None) or GEMM1_CLAMP_LIMIT_DEFAULT

    def per_expert(value: float) -> Parameter:
        return Parameter(torch.full((experts,), value, dtype=torch.float32, device=device), requires_grad=False)

    layer.swiglu_alpha = per_expert(alpha)
    layer.swiglu_beta = per_expert(GEMM1_BETA)
    layer.swiglu_limit = per_expert(limit)
    if backend == CUTLASS_SM120:
        layer.mxfp4_weight_global_scale = per_expert(1.0)
        layer._mxfp4_backend = "flashinfer_cutlass_sm120"  # type: ignore[assignment]  # a plain attribute, as SGLang sets it


#: AITER_MXFP4_BF16 (ROCm gfx95x with SGLANG_USE_AITER=1; `Mxfp4MoEMethod.process_weights_after_loading`,
#: its `_use_aiter` branch, docs/sglang.md "AITER"): the dtype of each expert parameter the artifact
#: holds; the shapes are the ones `create_weights` allocated (it pads I and H to 256 itself), the
#: scales as stored `[E, N, groups]` (SGLang's parameter is the `[E * N, groups]` view, which the
#: artifact records and `LayerSource.read` returns).
AITER_DTYPES = {
    "w13_weight": torch.uint8,
    "w13_weight_scale": torch.uint8,
    "w13_weight_bias": torch.float32,
    "w2_weight": torch.uint8,
    "w2_weight_scale": torch.uint8,
    "w2_weight_bias": torch.float32,
}
AITER = "AITER_MXFP4_BF16"


def aiter_refusal(layer: torch.nn.Module, gu_interleave: bool) -> str | None:
    """Why the artifact's bytes (SGLang's `shuffle_weight_a16w4` / `shuffle_scale_a16w4` path) are
    not what SGLang 0.5.23's AITER branch would make for this layer, or None. That branch takes the
    gate/up-interleaved a16w4 shuffle when the activation is not "situ", SGLANG_USE_AITER_MOE_GU_ITLV
    (`gu_interleave`, SGLang's `envs.SGLANG_USE_AITER_MOE_GU_ITLV.get()`) is on and the runner config's
    `gate_up_interleaved` holds; otherwise aiter's `shuffle_weight` / `shuffle_scale`, other bytes."""
    config = layer.moe_runner_config
    if getattr(config, "activation", None) == "situ":
        return "the layer's activation is 'situ' (SGLang then picks the shuffle by AITER_SITUV2_*), not GPT-OSS's"
    if not gu_interleave:
        return "SGLANG_USE_AITER_MOE_GU_ITLV is off: SGLang would run aiter's shuffle_weight / shuffle_scale"
    if not getattr(config, "gate_up_interleaved", True):
        return "the layer's gate/up rows are not interleaved"
    return None


def install_aiter(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], gu_interleave: bool) -> None:
    """What SGLang 0.5.23's `_use_aiter` branch of `process_weights_after_loading` leaves on a layer,
    with the six expert tensors taken from the artifact (`tensors`, the recorded views: scales
    `[E * N, groups]`; weights labelled float4_e2m1fn_x2, held as uint8 as SGLang holds them): weights
    and biases keep their Parameter objects (SGLang assigns `.data`), both weights tagged
    `is_shuffled = True` (its `apply` hands that to aiter's fused_moe), the scales are new Parameters.
    Raises ValueError where SGLang would make other bytes (`aiter_refusal`)."""
    why = aiter_refusal(layer, gu_interleave)
    if why is not None:
        raise ValueError(f"mxconvert: an AITER_MXFP4_BF16 artifact cannot stand in here: {why}")
    for sglang_name in ("w13_weight", "w13_weight_bias", "w2_weight", "w2_weight_bias"):
        data = tensors[SGLANG_NAMES[sglang_name]]
        # The artifact records the weights' kernel dtype float4_e2m1fn_x2 (layouts/aiter.py); SGLang's
        # parameters stay uint8 (create_weights) and its apply views them as float4_e2m1fn_x2: same bytes.
        _parameter(layer, sglang_name).data = data.view(torch.uint8) if sglang_name.endswith("_weight") else data
    for sglang_name in ("w13_weight_scale", "w2_weight_scale"):
        setattr(layer, sglang_name, Parameter(tensors[SGLANG_NAMES[sglang_name]], requires_grad=False))
    for weight in ("w13_weight", "w2_weight"):  # a plain attribute of the Parameter, as SGLang sets it
        _parameter(layer, weight).is_shuffled = True  # type: ignore[attr-defined]


def sglang_gu_interleave_env() -> bool:
    """SGLang 0.5.23's `envs.SGLANG_USE_AITER_MOE_GU_ITLV.get()` (environ.py `EnvBool(True)`): unset is
    on; "true" / "1" / "yes" / "y" on, "false" / "0" / "no" / "n" off (any case); SGLang raises on
    anything else, and so does this."""
    import os

    value = os.environ.get("SGLANG_USE_AITER_MOE_GU_ITLV")
    if value is None:
        return True
    if value.lower() in ("true", "1", "yes", "y"):
        return True
    if value.lower() in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'SGLANG_USE_AITER_MOE_GU_ITLV: "{value.lower()}" is not a valid boolean value')
