#!/usr/bin/env python3
"""Golden data for SGLang 0.5.23's GPT-OSS MXFP4 FlashInfer TRT-LLM (SM100) expert bytes, made by
RUNNING SGLang's own weight creation and post-processing on CPU (docs/sglang.md, "Goldens").

Environment (CPU only; /tmp/sglang-env, torch and the rest from the vLLM test environment):

    /work/main/.venv-vllm/bin/python -m venv /tmp/sglang-env
    echo /work/main/.venv-vllm/lib/python3.11/site-packages \
        > /tmp/sglang-env/lib/python3.11/site-packages/vllm_env_torch.pth
    pip download --no-deps sglang==0.5.23 flashinfer-python==0.7.2 -d ~/.cache/mxconvert-wheels
    /tmp/sglang-env/bin/pip install --no-deps ~/.cache/mxconvert-wheels/flashinfer_python-0.7.2-*.whl
    /tmp/sglang-env/bin/python tools/golden/sglang_mxfp4_trtllm.py      # writes tests/golden/sglang/

What runs is SGLang's code, read from the wheel (sglang/srt/layers/quantization/mxfp4.py) and
executed as written: `Mxfp4MoEMethod.create_weights` (the parameters, their padding and the 0x7F
fill of the scales), `Mxfp4MoEMethod.process_weights_after_loading` (its `use_flashinfer` branch)
and `_get_flashinfer_mxfp4_device_permute_indices`, with FlashInfer 0.7.2 (SGLang's pin)
`get_w2_permute_indices_with_cache`. Importing the whole module needs SGLang's CUDA stack, so its
functions are compiled from the wheel's source into a namespace holding what they look up.

Stood in (named):
  * `nvfp4_block_scale_interleave` (FlashInfer, CUDA-only JIT) -> FlashInfer 0.7.2's own pure-torch
    128x4 swizzle `flashinfer.diffusion_ops.minimax_h3_fc1_swiglu._swizzle_sf_128x4` (the stand-in
    tools/golden/make_mxfp4_goldens.py uses for vLLM, cross-checked there);
  * `torch.Tensor.cuda` (gemm1_alpha / beta / clamp_limit tensors) -> identity on CPU;
  * `get_platform()` -> is_sm100 = True; `get_moe_a2a_backend()` -> not MORI;
  * `FusedMoE.__init__`'s hidden rounding (round_up(H, 256) for flashinfer_mxfp4) and the MXFP4
    fast path of `FusedMoE.weight_loader` (`param.data[:, :dim1, :dim2].copy_(loaded_weight)`) are
    re-enacted in `_load` (both are a few lines of layers/moe/fused_moe_triton/layer.py; the fast path
    is sglang_common.py's `fused_moe_fast_path`, which the other SGLang tools share).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_common import (  # noqa: E402 - the sibling module, by path
    NAMES,
    compile_functions,
    cuda_is_identity,
    golden_arguments,
    gpt_oss_checkpoint,
    load_fast_path,
    mxfp4_namespace,
    pinned_flashinfer,
    round_up,
    wheel_reader,
)

SOURCE = "sglang/srt/layers/quantization/mxfp4.py"
#: (experts, hidden, intermediate) per case: one padded (H 160 -> 256, I 160 -> 256), one not.
CASES = ((2, 160, 160), (1, 256, 256))
#: What this tool runs of SOURCE: a module function and two `Mxfp4MoEMethod` methods.
FUNCTIONS: dict[str | None, set[str]] = {
    None: {"_get_flashinfer_mxfp4_device_permute_indices"},
    "Mxfp4MoEMethod": {"create_weights", "process_weights_after_loading"},
}


def sglang_functions(wheel: str, namespace: dict) -> dict:
    """SGLang's functions this tool runs, compiled from the wheel's mxfp4.py into `namespace`."""
    return compile_functions(wheel_reader(wheel), SOURCE, FUNCTIONS, namespace)


def _namespace() -> dict:
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4
    from flashinfer.fused_moe.core import get_w2_permute_indices_with_cache

    platform = types.SimpleNamespace(is_sm100=True, is_sm90=False, is_sm120=False, is_cuda=True)
    return mxfp4_namespace(platform, has_triton_kernels=False) | {
        "get_w2_permute_indices_with_cache": get_w2_permute_indices_with_cache,
        "nvfp4_block_scale_interleave": lambda sf: _swizzle_sf_128x4(sf).reshape(-1),
        "_flashinfer_mxfp4_permute_indices_cache": {},
        "_flashinfer_mxfp4_permute_indices_device_cache": {},
    }


def _load(fns: dict, ckpt: dict[str, torch.Tensor], experts: int, hidden: int, intermediate: int) -> dict:
    """SGLang's parameters after create_weights, loading and process_weights_after_loading."""
    method = types.SimpleNamespace(
        use_marlin=False, use_mega_moe=False, use_deep_gemm=False, use_flashinfer=True, _fi_kernel="trtllm_sm100"
    )
    layer: Any = torch.nn.Module()  # FusedMoE's attributes are set on it below
    layer.num_local_experts = experts
    layer.hidden_size = round_up(hidden, 256)  # FusedMoE.__init__ for mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](method, layer, experts, layer.hidden_size, intermediate, torch.bfloat16, with_bias=True)
    load_fast_path(layer, ckpt)  # FusedMoE.weight_loader, MXFP4 fast path (expert_id None)
    with cuda_is_identity():  # stand-in: gemm1_* tensors stay on the CPU
        fns["process_weights_after_loading"](method, layer)
    return {f"out.{n}": getattr(layer, n).data.contiguous() for n in NAMES} | {
        "params.hidden_padded": torch.tensor([method.hidden_size]),
        "params.intermediate_padded": torch.tensor([method.intermediate_size_per_partition]),
    }


def main() -> None:
    args = golden_arguments(__doc__.split("\n", 1)[0])
    flashinfer = pinned_flashinfer()
    fns = sglang_functions(args.wheel, _namespace())
    args.out.mkdir(parents=True, exist_ok=True)
    for seed, (experts, hidden, intermediate) in enumerate(CASES):
        ckpt = gpt_oss_checkpoint(experts, hidden, intermediate, seed)
        tensors = {f"in.{n}": t for n, t in ckpt.items()} | _load(fns, ckpt, experts, hidden, intermediate)
        name = f"trtllm-sm100_sglang-0.5.23_e{experts}_h{hidden}_i{intermediate}.safetensors"
        save_file(
            tensors,
            str(args.out / name),
            metadata={"sglang": "0.5.23", "flashinfer": flashinfer.__version__, "torch": torch.__version__},
        )
        print("wrote", args.out / name)


if __name__ == "__main__":
    main()
