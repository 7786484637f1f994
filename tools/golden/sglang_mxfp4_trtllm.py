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
    re-enacted in `_load` (both are a few lines of layers/moe/fused_moe_triton/layer.py).
"""

from __future__ import annotations

import argparse
import ast
import glob
import os
import types
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "sglang"
WHEEL_GLOB = os.path.expanduser("~/.cache/mxconvert-wheels/sglang-0.5.23-*.whl")
SOURCE = "sglang/srt/layers/quantization/mxfp4.py"
#: (experts, hidden, intermediate) per case: one padded (H 160 -> 256, I 160 -> 256), one not.
CASES = ((2, 160, 160), (1, 256, 256))


def _round_up(x: int, y: int) -> int:
    return -(-x // y) * y


def _sglang_functions(wheel: str) -> dict[str, ast.FunctionDef]:
    """The functions this tool runs, parsed from the wheel's mxfp4.py."""
    tree = ast.parse(zipfile.ZipFile(wheel).read(SOURCE).decode())
    out: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "_get_flashinfer_mxfp4_device_permute_indices":
            out[node.name] = node
        if isinstance(node, ast.ClassDef) and node.name == "Mxfp4MoEMethod":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in (
                    "create_weights",
                    "process_weights_after_loading",
                ):
                    out[item.name] = item
    missing = {"_get_flashinfer_mxfp4_device_permute_indices", "create_weights", "process_weights_after_loading"} - set(
        out
    )
    if missing:
        raise SystemExit(f"{SOURCE} of {wheel} lacks {sorted(missing)}")
    return out


def _compile(functions: dict[str, ast.FunctionDef], namespace: dict) -> dict:
    module = ast.Module(body=list(functions.values()), type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), SOURCE, "exec"), namespace)  # noqa: S102 - SGLang's own code
    return {name: namespace[name] for name in functions}


def _namespace() -> dict:
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4
    from flashinfer.fused_moe.core import get_w2_permute_indices_with_cache

    platform = types.SimpleNamespace(is_sm100=True, is_sm90=False, is_sm120=False, is_cuda=True)
    return {
        "torch": torch,
        "Parameter": torch.nn.Parameter,
        "Optional": __import__("typing").Optional,
        "round_up": _round_up,
        "set_weight_attrs": lambda weight, attrs: None,
        "_UE8M0_ONE": 127,
        "_is_hip": False,
        "_is_xpu": False,
        "_is_cpu": False,
        "_use_aiter": False,
        "has_triton_kernels": False,
        "get_platform": lambda: platform,
        "get_moe_a2a_backend": lambda: types.SimpleNamespace(is_mori=lambda: False),
        "get_w2_permute_indices_with_cache": get_w2_permute_indices_with_cache,
        "nvfp4_block_scale_interleave": lambda sf: _swizzle_sf_128x4(sf).reshape(-1),
        "_flashinfer_mxfp4_permute_indices_cache": {},
        "_flashinfer_mxfp4_permute_indices_device_cache": {},
    }


def checkpoint(experts: int, hidden: int, intermediate: int, seed: int) -> dict[str, torch.Tensor]:
    """One TP=1 rank of a GPT-OSS checkpoint's expert tensors (blocks flattened as the loader does)."""
    g = torch.Generator().manual_seed(seed)
    u8 = lambda *shape: torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)  # noqa: E731
    scale = lambda *shape: torch.randint(110, 140, shape, generator=g, dtype=torch.uint8)  # noqa: E731
    bf16 = lambda *shape: torch.randn(shape, generator=g).to(torch.bfloat16)  # noqa: E731
    return {
        "w13_weight": u8(experts, 2 * intermediate, hidden // 2),
        "w13_weight_scale": scale(experts, 2 * intermediate, hidden // 32),
        "w13_weight_bias": bf16(experts, 2 * intermediate),
        "w2_weight": u8(experts, hidden, intermediate // 2),
        "w2_weight_scale": scale(experts, hidden, intermediate // 32),
        "w2_weight_bias": bf16(experts, hidden),
    }


def _load(fns: dict, ckpt: dict[str, torch.Tensor], experts: int, hidden: int, intermediate: int) -> dict:
    """SGLang's parameters after create_weights, loading and process_weights_after_loading."""
    method = types.SimpleNamespace(
        use_marlin=False, use_mega_moe=False, use_deep_gemm=False, use_flashinfer=True, _fi_kernel="trtllm_sm100"
    )
    layer = torch.nn.Module()
    layer.num_local_experts = experts
    layer.hidden_size = _round_up(hidden, 256)  # FusedMoE.__init__ for mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](method, layer, experts, layer.hidden_size, intermediate, torch.bfloat16, with_bias=True)
    for name, loaded in ckpt.items():  # FusedMoE.weight_loader, MXFP4 fast path (expert_id None)
        param = getattr(layer, name)
        if loaded.dim() == 2:
            param.data[:, : loaded.shape[1]].copy_(loaded)
        else:
            param.data[:, : loaded.shape[1], : loaded.shape[2]].copy_(loaded)
    saved_cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # stand-in: gemm1_* tensors stay on the CPU
    try:
        fns["process_weights_after_loading"](method, layer)
    finally:
        torch.Tensor.cuda = saved_cuda
    names = ("w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight", "w2_weight_scale", "w2_weight_bias")
    return {f"out.{n}": getattr(layer, n).data.contiguous() for n in names} | {
        "params.hidden_padded": torch.tensor([method.hidden_size]),
        "params.intermediate_padded": torch.tensor([method.intermediate_size_per_partition]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--wheel", default=None, help="the sglang 0.5.23 wheel (default: the cached one)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    wheel = args.wheel or next(iter(sorted(glob.glob(WHEEL_GLOB))), None)
    if wheel is None:
        raise SystemExit(
            f"no wheel at {WHEEL_GLOB}: pip download --no-deps sglang==0.5.23 -d ~/.cache/mxconvert-wheels"
        )
    import flashinfer

    if flashinfer.__version__ != "0.7.2":
        raise SystemExit(f"FlashInfer {flashinfer.__version__} found; SGLang 0.5.23 pins 0.7.2")
    namespace = _namespace()
    fns = _compile(_sglang_functions(wheel), namespace)
    fns["_get_flashinfer_mxfp4_device_permute_indices"] = namespace["_get_flashinfer_mxfp4_device_permute_indices"]
    args.out.mkdir(parents=True, exist_ok=True)
    for seed, (experts, hidden, intermediate) in enumerate(CASES):
        ckpt = checkpoint(experts, hidden, intermediate, seed)
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
