"""vLLM 0.33.0's own NVFP4 MoE blocks (Qwen3-MoE or DeepSeek-V3, ModelOpt or compressed-tensors
checkpoint) on a CPU, loaded the normal way (path A) or through the mxconvert plugin (path B).

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
    norm; whole-model loading is covered in test_full_model.py and test_nvfp4_deepseek.py). DeepSeek-V3:
    a `DeepseekV2Model` made without its __init__ whose `layers[i].mlp` (i >= first_k_dense_replace) are
    vLLM's own `DeepseekV2MoE` blocks (router, NVFP4 shared experts, routed experts) and whose
    `load_weights` is vLLM's own (`DeepseekV2Model.load_weights`: stacked shared-expert params and the
    expert params mapping), fed the MoE layers' checkpoint tensors;
  * the NVFP4 oracle's choice: `select_nvfp4_moe_backend` (imported by name into both quant method
    modules) returns the artifact's backend and `backend_to_kernel_cls(backend)[0]` (the real
    oracle's predicates query the GPU and FlashInfer's CUDA builds);
  * `torch.Tensor.cuda` -> identity (vLLM's `swizzle_blockscale` ends with `.cuda()`; as tools/golden);
  * `flashinfer.cute_dsl.utils`: FlashInfer's own `convert_sf_to_mma_layout` (a view + permute),
    compiled from that file without the module's `import cutlass` (a CUDA package);
  * CuteDSL batched only: `maybe_make_prepare_finalize` (in oracle/nvfp4.py) returns vLLM's own
    `BatchedPrepareAndFinalize(max_num_tokens, num_local_experts, num_dispatchers=1, rank)`, the
    batched prepare/finalize vLLM builds without an all2all backend (the real batched deployment
    uses DeepEP low-latency, which needs CUDA and NVSHMEM); the expert class is built from it;
  * DeepSeek's NVFP4 shared experts (linear layers, not MoE): the CPU entry of vLLM's NVFP4
    linear-kernel table is vLLM's own `EmulationNvFp4LinearKernel`, and the CUDA custom op
    `_C.silu_and_mul` that `SiluAndMul` looks up under the CUDA answers is a placeholder
    (`nvfp4_linear_kernels_on_cpu`); both paths run them the same way.
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
    "modelopt-deepseek": H.REPO / "examples" / "tiny-nvfp4-modelopt-deepseek",
    "ct-deepseek": H.REPO / "examples" / "tiny-nvfp4-ct-deepseek",
}
NUM_LAYERS = 2  # MoE layers of every example (DeepSeek: after first_k_dense_replace dense layers)
#: compressed-tensors' checkpoint global scales: vLLM 0.33.0 leaves them on the layer after its
#: conversion; the artifact does not hold them (the plugin zero-fills them).
CT_LEFTOVER_SCALES = (
    "w13_weight_global_scale",
    "w2_weight_global_scale",
    "w13_input_global_scale",
    "w2_input_global_scale",
)


@dataclasses.dataclass
class Target:
    checkpoint: str  # a key of EXAMPLES ("modelopt", "ct", "modelopt-deepseek", "ct-deepseek")
    backend: str
    cap: tuple[int, int]
    tp: int
    rank: int
    #: another checkpoint of the same format and architecture (e.g. one made in a test); None: the example
    source: Path | None = None

    @property
    def path(self) -> Path:
        return self.source or EXAMPLES[self.checkpoint]

    @property
    def is_ct(self) -> bool:
        return self.checkpoint.startswith("ct")


def checkpoint_path(checkpoint: str | Path) -> Path:
    """A key of EXAMPLES, or a checkpoint folder."""
    return EXAMPLES[checkpoint] if isinstance(checkpoint, str) and checkpoint in EXAMPLES else Path(checkpoint)


@functools.cache
def model_config(checkpoint: str | Path):
    """vLLM's `ModelConfig` of a checkpoint (its architecture inspection is the slow part: made once)."""
    from vllm.config import ModelConfig

    return ModelConfig(model=str(checkpoint_path(checkpoint)))


def vllm_config(target: Target):
    """A fresh `VllmConfig` per model (the layers register themselves in its forward context)."""
    from vllm.config import VllmConfig

    return VllmConfig(model_config=model_config(target.path))


def is_deepseek(config) -> bool:
    return config.model_config.hf_config.model_type in ("deepseek_v3", "deepseek_v2")


def moe_layer_indices(config) -> list[int]:
    hf = config.model_config.hf_config
    first = getattr(hf, "first_k_dense_replace", 0) if is_deepseek(config) else 0
    return list(range(first, hf.num_hidden_layers))


#: The backends that run in a batched-activation deployment (harness.batched_deployment): vLLM 0.33.0's
#: FLASHINFER_CUTEDSL_BATCHED; harness_rows_nvfp4.release() adds FLASHINFER_CUTEDSL for vLLM 0.15.0-0.19.1,
#: whose FLASHINFER_CUTEDSL is the batched kernel (`FlashInferCuteDSLExperts`, batched activation format only).
BATCHED_BACKENDS = frozenset({"FLASHINFER_CUTEDSL_BATCHED"})


@contextlib.contextmanager
def oracle_picks(backend_value: str):
    import importlib

    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    from mxconvert.runtimes.vllm.adapters import installed_adapter
    from mxconvert.runtimes.vllm.install_nvfp4 import CT_MODULE, MODELOPT_MODULE

    backend = oracle.NvFp4MoeBackend(backend_value)

    def pick(config, weight_key, activation_key):
        return backend, oracle.backend_to_kernel_cls(backend)[0]

    adapter = installed_adapter("nvfp4")  # the release's compressed-tensors module (vLLM 0.15.0-0.19.1: another)
    ct_module = adapter.nvfp4_ct_module if adapter is not None else CT_MODULE
    modelopt, ct = importlib.import_module(MODELOPT_MODULE), importlib.import_module(ct_module)
    with (
        H.patched(modelopt, select_nvfp4_moe_backend=pick),
        H.patched(ct, select_nvfp4_moe_backend=pick),
        H.batched_deployment(oracle, backend_value in BATCHED_BACKENDS),
    ):
        yield


@contextlib.contextmanager
def nvfp4_linear_kernels_on_cpu():
    """DeepSeek's shared experts are NVFP4 linear layers: vLLM 0.33.0 picks their kernel from
    `_POSSIBLE_NVFP4_KERNELS[current_platform._enum]`, which has no CPU entry. Inside, the CPU entry is
    vLLM's own `EmulationNvFp4LinearKernel` (the dequantize + matmul fallback vLLM lists for CUDA and
    ROCm); its `process_weights_after_loading` is pure torch. Both paths run it the same way. Also
    `torch.ops._C.silu_and_mul` (a CUDA custom op the CPU build lacks) is a named placeholder."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum

    table = linear._POSSIBLE_NVFP4_KERNELS
    assert PlatformEnum.CPU not in table
    table[PlatformEnum.CPU] = [EmulationNvFp4LinearKernel]
    try:
        with H.patched(torch.ops._C, silu_and_mul=_cuda_silu_and_mul):
            yield
    finally:
        del table[PlatformEnum.CPU]


def _cuda_silu_and_mul(out, x):
    """Stand-in for the CUDA custom op `_C.silu_and_mul` that `SiluAndMul.__init__` (DeepSeek's shared
    experts) looks up when the platform answers CUDA; it is only looked up, never called (no forward)."""
    raise AssertionError("no forward pass in these tests")


def build_model(config):
    """`layers[i].mlp`: vLLM's own MoE blocks (`Qwen3MoeSparseMoeBlock`, DeepSeek's `DeepseekV2MoE`),
    built under the model's dtype."""
    from vllm.config import set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype

    if is_deepseek(config):
        from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model, DeepseekV2MoE

        model = DeepseekV2Model.__new__(DeepseekV2Model)
        torch.nn.Module.__init__(model)
        hf = config.model_config.hf_config
        # what DeepseekV2Model.load_weights reads of the model (as its __init__ sets them, for this config)
        model.config, model.use_mha = hf, False
        model.is_fused_shared_expert_enabled, model.num_redundant_experts = False, 0

        def block(i):
            return DeepseekV2MoE(hf, config.parallel_config, config.quant_config, prefix=f"model.layers.{i}.mlp")
    else:
        from vllm.model_executor.models.qwen3_moe import Qwen3MoeSparseMoeBlock

        model = torch.nn.Module()

        def block(i):
            return Qwen3MoeSparseMoeBlock(config, prefix=f"model.layers.{i}.mlp")

    model.layers = torch.nn.ModuleList()
    moe = moe_layer_indices(config)
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype):
        for i in range(max(moe) + 1):
            layer = torch.nn.Module()
            if i in moe:
                layer.mlp = block(i)
            model.layers.append(layer)
    return model


def load_weights(model, weights) -> set[str]:
    """vLLM's own weight loading of the MoE layers' tensors (those of the layers `build_model` gave a
    block): Qwen3-MoE's (AutoWeightsLoader with the model's name mapper) or DeepSeek's
    (`DeepseekV2Model.load_weights`)."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

    moe = tuple(f"model.layers.{i}.mlp." for i, layer in enumerate(model.layers) if hasattr(layer, "mlp"))
    names = ((k.removeprefix("model."), v) for k, v in weights if k.startswith(moe))
    if isinstance(model, DeepseekV2Model):
        return DeepseekV2Model.load_weights(model, names)
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeModel
    from vllm.model_executor.models.utils import AutoWeightsLoader

    return AutoWeightsLoader(model).load_weights(names, mapper=Qwen3MoeModel.hf_to_vllm_mapper)


def checkpoint_weights(checkpoint: str | Path):
    from safetensors import safe_open

    for file in sorted(checkpoint_path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for k in f.keys():
                yield k, f.get_tensor(k)


def run_pwal(model, config, target: Target):
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    process_weights_after_loading(model, config.model_config, torch.device("cpu"))


def path_a(target: Target):
    """Normal load: vLLM's weight loading of the checkpoint, then its post-processing."""
    from vllm.config import set_current_vllm_config

    config = vllm_config(target)
    with (
        H.process_groups(target.tp, target.rank),
        oracle_picks(target.backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
        nvfp4_linear_kernels_on_cpu(),
    ):
        model = build_model(config)
        load_weights(model, checkpoint_weights(target.path))
        with H.cuda_only_ops():
            run_pwal(model, config, target)
    return model


def path_b(
    target: Target,
    artifact: Path,
    live_backend: str | None = None,
    on_mismatch: str = "fail",
    verify_checksums: bool = True,
):
    """The plugin: checks, shared tensors through vLLM's loading, experts from the artifact."""
    from vllm.config import set_current_vllm_config

    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = vllm_config(target)
    with (
        H.process_groups(target.tp, target.rank),
        oracle_picks(live_backend or target.backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
        nvfp4_linear_kernels_on_cpu(),
    ):
        installer = ArtifactInstaller(artifact, on_mismatch, verify_checksums)
        installer.check_runtime(live_runtime())
        model = build_model(config)
        installer.prepare(moe_layers(model))
        load_weights(model, iter_shared(installer.shared_files()))
        with installer.conversion_bypass(), H.cuda_only_ops():
            run_pwal(model, config, target)
    return model, installer


def routed_experts(model) -> list:
    found = [
        m
        for m in model.modules()
        if type(getattr(m, "quant_method", None)).__name__
        in ("ModelOptNvFp4FusedMoE", "CompressedTensorsW4A4Nvfp4MoEMethod")
    ]
    assert len(found) == NUM_LAYERS
    return found


# ---- what the tests share -------------------------------------------------------------------------
#: backend vLLM's oracle picks -> (profile, extra convert args, capability the worker stands in for)
BACKENDS = {
    "FLASHINFER_TRTLLM": ("b200", (), (10, 0)),
    "FLASHINFER_CUTLASS": ("b200", ("--backend", "flashinfer_cutlass"), (10, 0)),
    "VLLM_CUTLASS": ("b200", ("--backend", "cutlass"), (10, 0)),
    "FLASHINFER_CUTEDSL": ("b200", ("--backend", "flashinfer_cutedsl"), (10, 0)),
    "FLASHINFER_CUTEDSL_BATCHED": ("b200", ("--backend", "flashinfer_cutedsl", "--batched"), (10, 0)),
    "MARLIN": ("h100", (), (9, 0)),
}
#: parallel setup id -> (tp, rank)
PARALLEL = {"tp1": (1, 0), "tp2-rank0": (2, 0), "tp2-rank1": (2, 1)}


def target(checkpoint: str, backend: str, parallel: str, source: Path | None = None) -> Target:
    tp, rank = PARALLEL[parallel]
    return Target(checkpoint, backend, BACKENDS[backend][2], tp, rank, source)


def artifact_for(artifacts, target: Target) -> Path:
    """`mxconvert convert` of the target's checkpoint for its backend, TP=1 and TP=2 in one run
    (conftest `Artifacts.in_process`, cached per command line): this TP size's folder."""
    profile, args, _ = BACKENDS[target.backend]
    return artifacts.in_process(target.path, profile, *args) / f"{profile}-tp{target.tp}"


def assert_same_state(target: Target, model_a, model_b, installer, pre_processed_calls: list | None = None) -> None:
    """Path A and path B left identical state (module snapshot of every block), with the one allowed
    difference: compressed-tensors' checkpoint global scales, which vLLM keeps after its conversion
    and the plugin zero-fills (same name, dtype, shape, stride)."""
    assert len(installer.sources) == NUM_LAYERS and not installer.reconverted
    if pre_processed_calls is not None:
        # vLLM's pre-processed path where it has one (ModelOpt + TRTLLM), else the bypassed conversion
        uses_pre_processed = not target.is_ct and target.backend == "FLASHINFER_TRTLLM"
        assert len(pre_processed_calls) == (NUM_LAYERS if uses_pre_processed else 0)
    for layer_a, layer_b in zip(routed_experts(model_a), routed_experts(model_b)):
        assert layer_b.w13_weight.detach().view(torch.uint8).any()  # kernel data, not a released placeholder
        for name in CT_LEFTOVER_SCALES if target.is_ct else ():
            left_a, left_b = getattr(layer_a, name), getattr(layer_b, name)
            assert (left_a.dtype, left_a.shape, left_a.stride()) == (left_b.dtype, left_b.shape, left_b.stride())
            assert bool((left_a != 0).all()) and not left_b.any()
            left_a.data.zero_()  # the one allowed difference
    state_a, state_b = H.module_snapshot(model_a), H.module_snapshot(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)


def padded_sizes(model) -> list[tuple[int, int, int | None]]:
    """(hidden_dim, intermediate_size_per_partition, hidden_dim_unpadded) of each block's moe_config."""
    return [
        (m.moe_config.hidden_dim, m.moe_config.intermediate_size_per_partition, m.moe_config.hidden_dim_unpadded)
        for m in routed_experts(model)
    ]
