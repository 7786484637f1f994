#!/usr/bin/env python3
"""Digests of the expert bytes SGLang 0.5.23 holds after loading the committed example checkpoint
(examples/tiny-gpt-oss) for its FlashInfer TRT-LLM (SM100) backend, at TP 1 and TP 2, made by
RUNNING SGLang's own loading and post-processing on CPU (docs/sglang.md, "Goldens").

tests/test_sglang_golden.py converts the same checkpoint with `--runtime sglang==0.5.23 --profile
b200` and compares every expert tensor of every rank with these digests (sha256 of the bytes, dtype
and shape): the artifact is SGLang's bytes bit for bit, padding included.

What runs is SGLang's code, from the wheel: `GptOssForCausalLM._load_mxfp4_experts_weights`
(models/gpt_oss.py: the TP slicing of the checkpoint, down_proj bias zeroed off rank 0),
`Mxfp4MoEMethod.create_weights` and `process_weights_after_loading` (layers/quantization/mxfp4.py),
with FlashInfer 0.7.2. Stood in, besides those of tools/golden/sglang_mxfp4_trtllm.py (whose
namespace this tool reuses): the model object the loader is a method of (its `config`,
`named_parameters` and `get_submodule` answer for one MoE layer), and `default_weight_loader` is the
MXFP4 fast path of `FusedMoE.weight_loader` (`param.data[:, :dim1, :dim2].copy_(loaded_weight)`,
layers/moe/fused_moe_triton/layer.py), since the stubbed `set_weight_attrs` attaches no loader.

    /tmp/sglang-env/bin/python tools/golden/sglang_mxfp4_example.py   # environment: see sglang_mxfp4_trtllm.py
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import sys
import types
import zipfile
from pathlib import Path

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_mxfp4_trtllm as trtllm  # noqa: E402 - the sibling tool, by path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-gpt-oss"
OUT = ROOT / "tests" / "golden" / "sglang" / "trtllm-sm100_sglang-0.5.23_example_digests.json"
MODEL_SOURCE = "sglang/srt/models/gpt_oss.py"
NAMES = ("w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight", "w2_weight_scale", "w2_weight_bias")
TP_SIZES = (1, 2)


def _expert_loader(wheel: str, namespace: dict):
    """`GptOssForCausalLM._load_mxfp4_experts_weights`, compiled from the wheel's gpt_oss.py."""
    tree = ast.parse(zipfile.ZipFile(wheel).read(MODEL_SOURCE).decode())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "GptOssForCausalLM":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "_load_mxfp4_experts_weights":
                    module = ast.Module(body=[item], type_ignores=[])
                    exec(compile(ast.fix_missing_locations(module), MODEL_SOURCE, "exec"), namespace)  # noqa: S102
                    return namespace[item.name]
    raise SystemExit(f"{MODEL_SOURCE} of {wheel} lacks GptOssForCausalLM._load_mxfp4_experts_weights")


def _fused_moe_fast_path(param, loaded_weight, weight_name=None, shard_id=None, expert_id=None):
    """FusedMoE.weight_loader's MXFP4 path for a whole-layer tensor (expert_id None)."""
    if loaded_weight.dim() == 2:
        param.data[:, : loaded_weight.shape[1]].copy_(loaded_weight)
    else:
        param.data[:, : loaded_weight.shape[1], : loaded_weight.shape[2]].copy_(loaded_weight)


def _checkpoint_layer(layer: int) -> list[tuple[str, torch.Tensor]]:
    prefix = f"model.layers.{layer}.mlp.experts."
    out = []
    for path in sorted(EXAMPLE.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out += [(k, f.get_tensor(k)) for k in f.keys() if k.startswith(prefix)]
    return out


def _rank_layer(fns: dict, load_experts, config: dict, layer_id: int, tp: int, rank: int) -> dict:
    """SGLang's expert parameters of one layer on one TP rank, after post-processing."""
    experts, hidden, intermediate = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]
    method = types.SimpleNamespace(
        use_marlin=False, use_mega_moe=False, use_deep_gemm=False, use_flashinfer=True, _fi_kernel="trtllm_sm100"
    )
    layer = torch.nn.Module()
    layer.num_local_experts = experts
    layer.hidden_size = trtllm._round_up(hidden, 256)  # FusedMoE.__init__ for mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate // tp  # FusedMoE.__init__
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](
        method, layer, experts, layer.hidden_size, layer.intermediate_size_per_partition, torch.bfloat16, with_bias=True
    )
    prefix = f"model.layers.{layer_id}.mlp.experts"
    model = types.SimpleNamespace(
        config=types.SimpleNamespace(intermediate_size=intermediate, num_local_experts=experts),
        named_parameters=lambda: [(f"{prefix}.{n}", p) for n, p in layer.named_parameters()],
        get_submodule=lambda name: layer if name == prefix else None,
    )
    load_experts(model, _checkpoint_layer(layer_id))
    saved_cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # stand-in: gemm1_* tensors stay on the CPU
    try:
        fns["process_weights_after_loading"](method, layer)
    finally:
        torch.Tensor.cuda = saved_cuda
    return {n: getattr(layer, n).data.contiguous() for n in NAMES}


def _digest(t: torch.Tensor) -> dict:
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def main() -> None:
    wheel = next(iter(sorted(glob.glob(trtllm.WHEEL_GLOB))), None)
    if wheel is None:
        raise SystemExit(f"no wheel at {trtllm.WHEEL_GLOB}")
    import flashinfer

    if flashinfer.__version__ != "0.7.2":
        raise SystemExit(f"FlashInfer {flashinfer.__version__} found; SGLang 0.5.23 pins 0.7.2")
    namespace = trtllm._namespace() | {"math": __import__("math"), "default_weight_loader": _fused_moe_fast_path}
    fns = trtllm._compile(trtllm._sglang_functions(wheel), namespace)
    load_experts = _expert_loader(wheel, namespace)
    config = json.loads((EXAMPLE / "config.json").read_text())
    digests: dict = {}
    for tp in TP_SIZES:
        for rank in range(tp):
            for layer in range(config["num_hidden_layers"]):
                tensors = _rank_layer(fns, load_experts, config, layer, tp, rank)
                digests.setdefault(f"tp{tp}", {}).setdefault(f"rank{rank}", {})[f"layer{layer}"] = {
                    n: _digest(t) for n, t in tensors.items()
                }
    document = {
        "what": "sha256 of SGLang 0.5.23's expert parameters after process_weights_after_loading (trtllm_sm100)",
        "checkpoint": "examples/tiny-gpt-oss",
        "sglang": "0.5.23",
        "flashinfer": flashinfer.__version__,
        "torch": torch.__version__,
        "made_by": "tools/golden/sglang_mxfp4_example.py",
        "digests": digests,
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
