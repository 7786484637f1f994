"""vLLM 0.33.0's own NVFP4 MoE blocks (Qwen3-MoE, ModelOpt or compressed-tensors checkpoint) on a
CPU, loaded the normal way (path A) or through the mxconvert plugin (path B).

vLLM's own code here: the config (`ModelConfig` of the example checkpoint with its quantization
config, `VllmConfig`), `qwen3_moe.Qwen3MoeSparseMoeBlock` (router `GateLinear` + `FusedMoEFactory`
-> `RoutedExperts`), the quant methods `ModelOptNvFp4FusedMoE` / `CompressedTensorsW4A4Nvfp4MoEMethod`
(create_weights, process_weights_after_loading with `convert_to_nvfp4_moe_kernel_format`,
`make_nvfp4_moe_quant_config`, `make_nvfp4_moe_kernel`, the expert class's own post-processing),
the weight loading (`AutoWeightsLoader` with `Qwen3MoeModel.hf_to_vllm_mapper`, the experts' own
weight loaders with their TP slicing) and the model loader's `process_weights_after_loading`.

Stood in, beyond harness.py's (process groups, CUDA answers of `current_platform`,
`gptq_marlin_repack` -> vLLM's test reference, FlashInfer's `(nvfp4_)block_scale_interleave` ->
FlashInfer's pure-torch 128x4 swizzle):
  * the model around the blocks: a module holding `layers[i].mlp` only (no attention, embedding,
    norm; whole-model loading is covered for MXFP4 in test_full_model.py);
  * the NVFP4 oracle's choice: `select_nvfp4_moe_backend` (imported by name into both quant method
    modules) returns the artifact's backend and `backend_to_kernel_cls(backend)[0]` (the real
    oracle's predicates query the GPU and FlashInfer's CUDA builds);
  * `torch.Tensor.cuda` -> identity (vLLM's `swizzle_blockscale` ends with `.cuda()`; as tools/golden);
  * `flashinfer.cute_dsl.utils`: FlashInfer's own `convert_sf_to_mma_layout` (a view + permute),
    compiled from that file without the module's `import cutlass` (a CUDA package);
  * CuteDSL batched only: `maybe_make_prepare_finalize` (in oracle/nvfp4.py) returns vLLM's own
    `BatchedPrepareAndFinalize(max_num_tokens, num_local_experts, num_dispatchers=1, rank)`, the
    batched prepare/finalize vLLM builds without an all2all backend (the real batched deployment
    uses DeepEP low-latency, which needs CUDA and NVSHMEM); the expert class is built from it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path

import harness as H
import torch

EXAMPLES = {
    "modelopt": H.REPO / "examples" / "tiny-nvfp4-modelopt-qwen3",
    "ct": H.REPO / "examples" / "tiny-nvfp4-ct-qwen3",
}
NUM_LAYERS = 2
#: compressed-tensors' checkpoint global scales: vLLM 0.33.0 leaves them on the layer after its
#: conversion; the artifact does not hold them (the plugin zero-fills them).
CT_LEFTOVER_SCALES = ("w13_weight_global_scale", "w2_weight_global_scale", "w13_input_global_scale",
                      "w2_input_global_scale")


@dataclasses.dataclass
class Target:
    checkpoint: str  # "modelopt" or "ct"
    backend: str
    cap: tuple[int, int]
    tp: int
    rank: int


@functools.cache
def model_config(checkpoint: str):
    """vLLM's `ModelConfig` of the example (its architecture inspection is the slow part: made once)."""
    from vllm.config import ModelConfig

    return ModelConfig(model=str(EXAMPLES[checkpoint]))


def vllm_config(checkpoint: str):
    """A fresh `VllmConfig` per model (the layers register themselves in its forward context)."""
    from vllm.config import VllmConfig

    return VllmConfig(model_config=model_config(checkpoint))


@contextlib.contextmanager
def oracle_picks(backend_value: str):
    import importlib

    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    from mxconvert.vllm_plugin.install_nvfp4 import CT_MODULE, MODELOPT_MODULE

    backend = oracle.NvFp4MoeBackend(backend_value)

    def pick(config, weight_key, activation_key):
        return backend, oracle.backend_to_kernel_cls(backend)[0]

    modelopt, ct = importlib.import_module(MODELOPT_MODULE), importlib.import_module(CT_MODULE)
    with H.patched(modelopt, select_nvfp4_moe_backend=pick), H.patched(ct, select_nvfp4_moe_backend=pick), \
            H.batched_deployment(oracle, backend_value == "FLASHINFER_CUTEDSL_BATCHED"):
        yield


def build_model(config):
    """`layers[i].mlp`: vLLM's own `Qwen3MoeSparseMoeBlock`s, built under the model's dtype."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeSparseMoeBlock
    from vllm.utils.torch_utils import set_default_torch_dtype

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList()
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype):
        for i in range(NUM_LAYERS):
            layer = torch.nn.Module()
            layer.mlp = Qwen3MoeSparseMoeBlock(config, prefix=f"model.layers.{i}.mlp")
            model.layers.append(layer)
    return model


def load_weights(model, weights) -> set[str]:
    """vLLM's Qwen3-MoE weight loading (AutoWeightsLoader, the model's name mapper)."""
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeModel
    from vllm.model_executor.models.utils import AutoWeightsLoader

    names = ((k.removeprefix("model."), v) for k, v in weights if ".mlp." in k)
    return AutoWeightsLoader(model).load_weights(names, mapper=Qwen3MoeModel.hf_to_vllm_mapper)


def checkpoint_weights(checkpoint: str):
    from safetensors import safe_open

    for path in sorted(Path(EXAMPLES[checkpoint]).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                yield k, f.get_tensor(k)


def run_pwal(model, config, target: Target):
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    process_weights_after_loading(model, config.model_config, torch.device("cpu"))


def path_a(target: Target):
    """Normal load: vLLM's weight loading of the checkpoint, then its post-processing."""
    from vllm.config import set_current_vllm_config

    config = vllm_config(target.checkpoint)
    with H.process_groups(target.tp, target.rank), oracle_picks(target.backend), H.cuda_device(target.cap), \
            set_current_vllm_config(config):
        model = build_model(config)
        load_weights(model, checkpoint_weights(target.checkpoint))
        with H.cuda_only_ops():
            run_pwal(model, config, target)
    return model


def path_b(target: Target, artifact: Path, live_backend: str | None = None, on_mismatch: str = "fail"):
    """The plugin: checks, shared tensors through vLLM's loading, experts from the artifact."""
    from vllm.config import set_current_vllm_config

    from mxconvert.vllm_plugin.installer import ArtifactInstaller, iter_shared
    from mxconvert.vllm_plugin.loader import live_runtime, moe_layers

    config = vllm_config(target.checkpoint)
    with H.process_groups(target.tp, target.rank), oracle_picks(live_backend or target.backend), \
            H.cuda_device(target.cap), set_current_vllm_config(config):
        installer = ArtifactInstaller(artifact, on_mismatch)
        installer.check_runtime(live_runtime())
        model = build_model(config)
        installer.prepare(moe_layers(model))
        load_weights(model, iter_shared(installer.shared_files()))
        with installer.conversion_bypass(), H.cuda_only_ops():
            run_pwal(model, config, target)
    return model, installer


def routed_experts(model) -> list:
    found = [m for m in model.modules() if type(getattr(m, "quant_method", None)).__name__ in
             ("ModelOptNvFp4FusedMoE", "CompressedTensorsW4A4Nvfp4MoEMethod")]
    assert len(found) == NUM_LAYERS
    return found
