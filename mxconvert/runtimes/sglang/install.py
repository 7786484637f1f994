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

tests_sglang/test_equivalence.py compares the whole layer state (every parameter, its dtype,
shape and bytes, and these attributes) with SGLang's own post-processing of the checkpoint.
"""

from __future__ import annotations

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


def release_checkpoint_params(layer: torch.nn.Module) -> None:
    """Drop the memory of the checkpoint-shaped expert parameters (never filled: the artifact's
    shared files hold no expert tensor); each keeps its object, dtype, shape and device, backed by
    one element, until `install_trtllm_sm100` rebinds it as SGLang's post-processing does."""
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
