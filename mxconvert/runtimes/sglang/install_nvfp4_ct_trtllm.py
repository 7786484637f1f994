"""The SGLang loader's install of a compressed-tensors NVFP4 W4A4 FLASHINFER_TRTLLM artifact: what SGLang
0.5.23's `CompressedTensorsW4A4Nvfp4MoE` leaves on a layer with `--moe-runner-backend flashinfer_trtllm`
(docs/sglang.md, "NVFP4"). Its own module beside install_nvfp4.py (which holds the other NVFP4 installs)
so that neither passes the 500-line limit (tests/test_architecture.py)."""

from __future__ import annotations

import torch
from torch.nn import Parameter

from mxconvert.core.errors import InputError
from mxconvert.runtimes.sglang.install_nvfp4 import MOVED, NVFP4_CT_CUTLASS_NAMES, _expert_param, nvfp4_ct_scheme

#: Every tensor a compressed-tensors W4A4 FLASHINFER_TRTLLM artifact holds for a layer (layouts/nvfp4_scales.py
#: `ct_w4a4_trtllm_scales`): what the scheme's TRT-LLM `apply` hands `FlashInferTrtllmFp4MoeQuantInfo`, and the
#: reciprocal global scales it also sets.
NVFP4_CT_TRTLLM_NAMES = NVFP4_CT_CUTLASS_NAMES + ("g1_scale_c",)
#: The TRT-LLM branch's input scales: `.min().expand(num_local_experts)`, one value viewed per expert.
CT_TRTLLM_EXPANDED = ("w13_input_scale_quant", "w2_input_scale_quant")


def nvfp4_ct_trtllm_specs(layer: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """dtype and shape of each artifact tensor `CompressedTensorsW4A4Nvfp4MoE`'s TRT-LLM branch gives the
    layer: `prepare_static_weights_for_trtllm_fp4_moe` keeps the shapes of the `_packed` weights and block
    scales it allocated (nothing padded: formats/nvfp4/format.py refuses what the row would pad), the
    scalars one float32 per expert."""
    e, two_i, half_h = _expert_param(layer, "w13_weight").shape
    i, h = two_i // 2, 2 * half_h
    return {
        "w13_weight": (torch.uint8, (e, two_i, half_h)),
        "w13_weight_scale": (torch.float8_e4m3fn, (e, two_i, h // 16)),
        "w2_weight": (torch.uint8, (e, h, i // 2)),
        "w2_weight_scale": (torch.float8_e4m3fn, (e, h, i // 16)),
    } | {name: (torch.float32, (e,)) for name in NVFP4_CT_TRTLLM_NAMES if name not in MOVED}


def install_nvfp4_ct_trtllm(layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """What SGLang 0.5.23's `CompressedTensorsW4A4Nvfp4MoE.process_weights_after_loading` (the
    `use_flashinfer_trtllm` branch, layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py)
    leaves on a compressed-tensors NVFP4 layer, from the artifact's tensors: `w13/w2_weight_packed` deleted;
    the weights and block scales new parameters (`replace_parameter` of a plain tensor over a parameter
    registers a new one); the reciprocal global scales, `g1/g2_alphas` and `g1_scale_c` new parameters;
    `w13/w2_input_scale_quant` new parameters over ONE value expanded per expert (`.min().expand(E)`: a
    stride-0 view, as SGLang's; its `apply` hands the kernel `[:1]`). Its raw `w13/w2_weight_global_scale`
    and `w13/w2_input_global_scale` keep what `create_weights` made; it sets nothing on the dispatcher and
    no `_cutlass_swiglu_params`."""
    if nvfp4_ct_scheme(layer) is None:
        raise ValueError("install_nvfp4_ct_trtllm on a layer without a compressed-tensors NVFP4 scheme (a bug)")
    for name in CT_TRTLLM_EXPANDED:
        if not bool((tensors[name] == tensors[name][0]).all()):
            raise InputError(
                f"{name}: the artifact's values differ per expert where SGLang holds one value for all "
                "(layouts/nvfp4_scales.py ct_w4a4_trtllm_scales writes it repeated): the artifact is damaged; "
                "convert it again"
            )
    for name in ("w13_weight_packed", "w2_weight_packed"):
        delattr(layer, name)
    for name in NVFP4_CT_TRTLLM_NAMES:
        value = tensors[name]
        if name in CT_TRTLLM_EXPANDED:
            value = value[0].expand(value.shape[0])
        layer.register_parameter(name, Parameter(value, requires_grad=False))
