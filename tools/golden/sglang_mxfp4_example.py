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

import json
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_mxfp4_trtllm as trtllm  # noqa: E402 - the sibling tools, by path
from sglang_common import (  # noqa: E402
    NAMES,
    OUT,
    ROOT,
    compile_functions,
    cuda_is_identity,
    digest,
    fused_moe_fast_path,
    pinned_flashinfer,
    round_up,
    sglang_wheel,
    wheel_reader,
)

EXAMPLE = ROOT / "examples" / "tiny-gpt-oss"
DIGESTS = OUT / "trtllm-sm100_sglang-0.5.23_example_digests.json"
MODEL_SOURCE = "sglang/srt/models/gpt_oss.py"
TP_SIZES = (1, 2)


def loader_namespace() -> dict:
    """sglang_mxfp4_trtllm.py's namespace plus what the model's expert loader looks up
    (`default_weight_loader`: the fast path, since the stubbed `set_weight_attrs` attaches no loader)."""
    return trtllm._namespace() | {"math": math, "default_weight_loader": fused_moe_fast_path}


def expert_loader(read: Callable[[str], str], namespace: dict):
    """`GptOssForCausalLM._load_mxfp4_experts_weights`, compiled from gpt_oss.py into `namespace`."""
    compile_functions(read, MODEL_SOURCE, {"GptOssForCausalLM": {"_load_mxfp4_experts_weights"}}, namespace)
    return namespace["_load_mxfp4_experts_weights"]


def checkpoint_layer(layer: int) -> list[tuple[str, torch.Tensor]]:
    """The example's expert tensors of one layer, by checkpoint name, as the model loader receives them."""
    prefix = f"model.layers.{layer}.mlp.experts."
    out = []
    for path in sorted(EXAMPLE.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out += [(k, f.get_tensor(k)) for k in f.keys() if k.startswith(prefix)]
    return out


def load_example_layer(load_experts, layer: torch.nn.Module, layer_id: int, config: dict) -> str:
    """Run SGLang's expert loader on the example's layer `layer_id` into `layer`, through a stand-in
    for the model object it is a method of (its `config`, and `named_parameters` / `get_submodule`
    answering for this one MoE layer); the layer's prefix."""
    prefix = f"model.layers.{layer_id}.mlp.experts"
    model = types.SimpleNamespace(
        config=types.SimpleNamespace(
            intermediate_size=config["intermediate_size"], num_local_experts=config["num_local_experts"]
        ),
        named_parameters=lambda: [(f"{prefix}.{n}", p) for n, p in layer.named_parameters()],
        get_submodule=lambda name: layer if name == prefix else None,
    )
    load_experts(model, checkpoint_layer(layer_id))
    return prefix


def _rank_layer(fns: dict, load_experts, config: dict, layer_id: int, tp: int, rank: int) -> dict:
    """SGLang's expert parameters of one layer on one TP rank, after post-processing."""
    experts, hidden, intermediate = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]
    method = types.SimpleNamespace(
        use_marlin=False, use_mega_moe=False, use_deep_gemm=False, use_flashinfer=True, _fi_kernel="trtllm_sm100"
    )
    layer: Any = torch.nn.Module()  # FusedMoE's attributes are set on it below
    layer.num_local_experts = experts
    layer.hidden_size = round_up(hidden, 256)  # FusedMoE.__init__ for mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate // tp  # FusedMoE.__init__
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](
        method, layer, experts, layer.hidden_size, layer.intermediate_size_per_partition, torch.bfloat16, with_bias=True
    )
    load_example_layer(load_experts, layer, layer_id, config)
    with cuda_is_identity():  # stand-in: gemm1_* tensors stay on the CPU
        fns["process_weights_after_loading"](method, layer)
    return {n: getattr(layer, n).data.contiguous() for n in NAMES}


def example_digests(run_layer: Callable[[int, int, int], dict[str, torch.Tensor]], config: dict) -> dict:
    """{tpN: {rankR: {layerL: {parameter: digest}}}} of `run_layer(layer_id, tp, rank)` over the example."""
    digests: dict = {}
    for tp in TP_SIZES:
        for rank in range(tp):
            for layer in range(config["num_hidden_layers"]):
                tensors = run_layer(layer, tp, rank)
                digests.setdefault(f"tp{tp}", {}).setdefault(f"rank{rank}", {})[f"layer{layer}"] = {
                    n: digest(t) for n, t in tensors.items()
                }
    return digests


def main() -> None:
    wheel = sglang_wheel()
    flashinfer = pinned_flashinfer()
    namespace = trtllm.sglang_functions(wheel, loader_namespace())
    load_experts = expert_loader(wheel_reader(wheel), namespace)
    config = json.loads((EXAMPLE / "config.json").read_text())
    document = {
        "what": "sha256 of SGLang 0.5.23's expert parameters after process_weights_after_loading (trtllm_sm100)",
        "checkpoint": "examples/tiny-gpt-oss",
        "sglang": "0.5.23",
        "flashinfer": flashinfer.__version__,
        "torch": torch.__version__,
        "made_by": "tools/golden/sglang_mxfp4_example.py",
        "digests": example_digests(
            lambda layer, tp, rank: _rank_layer(namespace, load_experts, config, layer, tp, rank), config
        ),
    }
    DIGESTS.write_text(json.dumps(document, indent=1) + "\n")
    print("wrote", DIGESTS)


if __name__ == "__main__":
    main()
