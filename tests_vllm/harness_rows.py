"""The installed vLLM release's own GPT-OSS MoE block on a CPU, loaded the normal way (path A) or
through the mxconvert plugin (path B), for any release the plugin serves for MXFP4
(`dependency.PLUGIN_PROVEN`): harness_0_26.py's paths, made release-neutral.

Everything harness.py's docstring lists as vLLM's own code is the installed release's here (its
wheel's Python files: config, `gpt_oss.MLPBlock`, `GptOssMxfp4MoEMethod`, the oracle module's
conversion, `_swizzle_mxfp4`, Marlin's preparation, the GPT-OSS weight loading and the model
loader's `process_weights_after_loading`), with harness.py's stand-ins (process groups, the CUDA
device and its capability, the oracle's pick, `gptq_marlin_repack` by vLLM's own test reference).
Where releases differ in what the *harness* calls, it follows the release's own signature, never
its version number:

  * the platform: releases before 0.28.0 have no `VLLM_TARGET_DEVICE=cpu` detection
    (vllm/platforms/__init__.py `cpu_platform_plugin`), so `import vllm` settles on
    `UnspecifiedPlatform`; `use_cpu_platform()` puts vLLM's own `CpuPlatform()` in its place
    (harness_0_26.use_cpu_platform, which this generalises to releases without `PIN_MEMORY`);
  * `GptOssModel._load_weights_mxfp4` takes the rank's attention heads (`heads_per_rank`,
    `head_start`, for the sinks) up to 0.32.0 and not in 0.33.0;
  * `ops.gptq_marlin_repack` takes the (empty) act-order `perm` up to 0.29.0 and not from 0.30.0;
  * the GPT-OSS MXFP4 quant method is `Mxfp4MoEMethod` in 0.19.x (`GptOssMxfp4MoEMethod` from 0.20.0):
    `routed_experts` finds the MoE modules by the class the plugin's adapter names (the plugin itself is
    the code under test there, and path A = path B fails if it names another).

For test_release_rows_backends.py (the other MXFP4 backends, and EP), further stand-ins, each named:
  * `flashinfer_ops`: FlashInfer's CUDA-only 128x4 scale swizzle (`block_scale_interleave`,
    `nvfp4_block_scale_interleave`) -> FlashInfer 0.7.2.post1's pure-torch `_swizzle_sf_128x4`, compiled
    from the base venv's file (the release's own FlashInfer does not ship it; harness.py uses the same);
  * `batched_prepare_finalize_in`: harness.batched_deployment's `all2all_utils.BatchedPrepareAndFinalize`
    where the release defines it elsewhere (0.19.0-0.26.0);
  * `set_aside_custom_op_counts`: the custom-op log counters of the `VllmConfig` a release's `FusedMoE`
    holds (0.19.0-0.23.0), compared apart (path B builds no op path A does not);
  * `ep_worker` / `ep_path_a` / `ep_path_b`: test_ep.py's EP 2 worker (TP and EP groups of the rank,
    vLLM's own `ParallelConfig(enable_expert_parallel=True)`) with this module's release-neutral pieces.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import json
import sys
from pathlib import Path

import harness as H
import torch


def installed_release() -> str | None:
    try:
        return importlib.metadata.version("vllm").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


#: The vLLM release this harness drives: the venv's.
RELEASE = installed_release()


def vendored_triton_kernels(release: str | None = RELEASE) -> str:
    """The triton_kernels generation the release's wheel vendors (vllm/third_party/triton_kernels), as
    its decision-symbol record says (tools/vllm_releases/records/vllm-X.Y.Z.json, made from the wheel):
    "3.6" in 0.20.0-0.21.0, "3.5.1" from 0.22.0."""
    record = H.REPO / "tools" / "vllm_releases" / "records" / f"vllm-{release}.json"
    return json.loads(record.read_text())["triton_kernels"]["generation"]


def runtime_args(release: str | None = RELEASE) -> tuple[str, ...]:
    """`mxconvert convert` arguments of the artifacts the tests load: the row that covers `release`."""
    return ("--runtime", f"vllm=={release}")


def use_cpu_platform() -> None:
    """vLLM's own `CpuPlatform()` as the current platform where the release's detection settled on
    `UnspecifiedPlatform` (releases before 0.28.0); a no-op where it found the CPU platform itself.
    No module may hold the replaced object (checked); `PIN_MEMORY` (vllm/utils/torch_utils.py, from
    0.22.0; read only by attention and KV offload) takes CpuPlatform's answer."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import UnspecifiedPlatform

    with contextlib.suppress(ImportError):  # resolves the platform, as `import vllm` does in most releases
        import vllm.utils.torch_utils  # noqa: F401
    current = platforms.current_platform
    if isinstance(current, CpuPlatform):
        return
    assert isinstance(current, UnspecifiedPlatform), current
    modules = list(sys.modules.items())
    holders = [name for name, m in modules if getattr(m, "__dict__", {}).get("current_platform") is current]
    assert holders == [], holders
    platforms._current_platform = CpuPlatform()
    torch_utils = sys.modules.get("vllm.utils.torch_utils")
    if torch_utils is not None and hasattr(torch_utils, "PIN_MEMORY"):
        torch_utils.PIN_MEMORY = platforms._current_platform.is_pin_memory_available()


def routed_experts(model) -> list:
    """harness.routed_experts for the installed release: the MoE modules whose quant method is the
    release's GPT-OSS MXFP4 method (adapters.py `mxfp4_method_class`; 0.19.x's `Mxfp4MoEMethod`)."""
    from mxconvert.runtimes.vllm.adapters import live_adapter

    method = live_adapter("mxfp4").mxfp4_method_class()
    found = [m for m in model.modules() if isinstance(getattr(m, "quant_method", None), method)]
    assert len(found) == H.NUM_LAYERS
    return found


def load_mxfp4(model, weights, tp: int, rank: int) -> None:
    """The release's GPT-OSS MXFP4 weight loading (no expert parallelism: all experts); the heads
    of the rank as the release's `GptOssModel.load_weights` computes them, where it takes them."""
    from vllm.model_executor.models.gpt_oss import GptOssModel

    num_experts = model.config.num_local_experts
    if "heads_per_rank" in inspect.signature(GptOssModel._load_weights_mxfp4).parameters:
        heads_per_rank = model.config.num_attention_heads // tp
        GptOssModel._load_weights_mxfp4(model, num_experts, 0, heads_per_rank, rank * heads_per_rank, weights, [])
    else:
        GptOssModel._load_weights_mxfp4(model, num_experts, 0, weights, [])


@contextlib.contextmanager
def process_groups(tp: int, rank: int):
    """harness.py's process groups, each also with the worker's global `rank` (vLLM's
    `GroupCoordinator.rank`, which 0.24.0's `GptOssModel.load_weights` reads of the EP group): the
    TP rank, as in a worker without pipeline or data parallelism."""
    import vllm.distributed.parallel_state as ps

    with H.process_groups(tp, rank):
        for name in ("_TP", "_DP", "_PCP", "_EP", "_PP"):
            getattr(ps, name).rank = rank
        yield


@contextlib.contextmanager
def oracle_picks(backend_value: str):
    """harness.oracle_picks, also under the name 0.20.0-0.21.0's `GptOssMxfp4MoEMethod` calls
    (quantization/mxfp4.py `select_gpt_oss_mxfp4_moe_backend`; 0.22.0 went back to `select_mxfp4_moe_backend`)."""
    from vllm.model_executor.layers.fused_moe import all2all_utils
    from vllm.model_executor.layers.quantization import mxfp4 as quant

    with H.oracle_picks(backend_value), batched_prepare_finalize_in(all2all_utils, backend_value == "BATCHED_MARLIN"):
        if hasattr(quant, "select_gpt_oss_mxfp4_moe_backend"):
            with H.patched(quant, select_gpt_oss_mxfp4_moe_backend=quant.select_mxfp4_moe_backend):
                yield
        else:
            yield


@contextlib.contextmanager
def batched_prepare_finalize_in(all2all_utils, on: bool):
    """harness.batched_deployment (`on`: BATCHED_MARLIN) builds `all2all_utils.BatchedPrepareAndFinalize`; releases
    whose all2all_utils.py does not import it define it in fused_moe/prepare_finalize/batched.py (0.20.0-0.26.0)
    or fused_moe/fused_batched_moe.py (0.19.x), with the same signature."""
    if not on or hasattr(all2all_utils, "BatchedPrepareAndFinalize"):
        yield
        return
    import importlib

    fused_moe = "vllm.model_executor.layers.fused_moe"
    for name in (f"{fused_moe}.prepare_finalize.batched", f"{fused_moe}.fused_batched_moe"):
        try:
            defining = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(defining, "BatchedPrepareAndFinalize"):
            break
    else:
        raise AssertionError(f"vLLM {RELEASE}: no BatchedPrepareAndFinalize in all2all_utils or {fused_moe}")
    with H.patched(all2all_utils, BatchedPrepareAndFinalize=defining.BatchedPrepareAndFinalize):
        yield


def set_aside_custom_op_counts(model) -> dict:
    """The `enabled_custom_ops` / `disabled_custom_ops` counters of the `VllmConfig` the MoE modules hold
    (vLLM 0.19.0-0.23.0's `FusedMoE` keeps it as an attribute), taken out of it and returned. vLLM's
    `CustomOp.__init__` (model_executor/custom_op.py) counts every custom-op object built in the process
    under the current config, for its log: the conversion path B bypasses builds some (Marlin's fp8 input
    `QuantFP8`), so path A counts ops no module keeps. Empty where no module holds a config."""
    from collections import Counter

    held = {id(c): c for m in model.modules() if (c := m.__dict__.get("vllm_config")) is not None}
    counts: dict = {"enabled": Counter(), "disabled": Counter()}
    for config in held.values():
        compilation = config.compilation_config
        counts["enabled"].update(compilation.enabled_custom_ops)
        counts["disabled"].update(compilation.disabled_custom_ops)
        compilation.enabled_custom_ops.clear()
        compilation.disabled_custom_ops.clear()
    return counts


def fresh_process_counters() -> None:
    """What a fresh worker process starts with, for the process-wide counters vLLM's MoE layers read
    at construction: vLLM 0.21.0's `FusedMoE._next_moe_layer_id` numbers the MoE layers of the
    process (`moe_layer_id`), so the second model built in one test process would number its layers
    on from the first's (a worker builds one model)."""
    from vllm.model_executor.layers.fused_moe import layer

    fused_moe = getattr(layer, "FusedMoE", None)  # 0.24.0 renamed it RoutedExperts (another module)
    if hasattr(fused_moe, "_next_moe_layer_id"):
        fused_moe._next_moe_layer_id = 0


@contextlib.contextmanager
def worker(target: H.Target, backend: str, config):
    """The worker context vLLM holds around `load_model`, with harness.py's stand-ins."""
    from vllm.config import set_current_vllm_config

    fresh_process_counters()

    with (
        process_groups(target.tp, target.rank),
        oracle_picks(backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
    ):
        yield


def same_instance(config):
    """`config` with a fixed `instance_id`: vLLM 0.20.0-0.23.0's `FusedMoE` keeps the `VllmConfig` as an
    attribute, whose `instance_id` is random per config object (an engine id, not loading state), so
    paths A and B, which build one config each, would differ by it alone."""
    if getattr(config, "instance_id", None) is not None:
        config.instance_id = "mxconvert-tests"
    return config


def path_a(target: H.Target):
    """Normal load: the release's GPT-OSS weight loading of the checkpoint, then its post-processing."""
    config = same_instance(H.vllm_config())
    with worker(target, target.backend, config):
        model = H.build_model(config)
        load_mxfp4(model, H.checkpoint_weights(), target.tp, target.rank)
        with marlin_repack():
            H.run_pwal(model, config, target)
    return model


def path_b(target: H.Target, artifact: Path, on_mismatch: str = "fail", verify_checksums: bool = True):
    """The plugin: checks, shared tensors through the release's loading, experts from the artifact."""
    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = same_instance(H.vllm_config())
    with worker(target, target.backend, config):
        installer = ArtifactInstaller(artifact, on_mismatch, verify_checksums)
        installer.check_runtime(live_runtime())
        model = H.build_model(config)
        installer.prepare(moe_layers(model))
        shared = H.vllm_names(t for t in iter_shared(installer.shared_files()) if ".mlp." in t[0])
        load_mxfp4(model, shared, target.tp, target.rank)
        with installer.conversion_bypass(), marlin_repack():
            H.run_pwal(model, config, target)
    return model, installer


def load_model(model_path, load_format: str, target: H.Target):
    """The release's model loader for `load_format` (`mxconvert` through the plugin's entry point),
    in the stood-in worker (as test_full_model.py for 0.33.0)."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = same_instance(
        VllmConfig(
            model_config=ModelConfig(model=str(model_path), enforce_eager=True),
            load_config=LoadConfig(load_format=load_format),
        )
    )
    loader = get_model_loader(config.load_config)
    with worker(target, target.backend, config), marlin_repack():
        return loader.load_model(config, config.model_config), loader


def _repack_with_perm(b_q_weight, perm, size_k, size_n, num_bits, is_a_8bit=False):
    """`gptq_marlin_repack` of the releases whose signature still has `perm` (MXFP4's Marlin
    preparation passes an empty one, i.e. none): vLLM's own test reference, as harness.py's."""
    assert perm.numel() == 0, "MXFP4 Marlin repacks without an act-order permutation"
    return H.marlin_repack_reference(b_q_weight, size_k, size_n, num_bits, is_a_8bit)


@contextlib.contextmanager
def marlin_repack():
    """The one CUDA-only op the release's TRITON / MARLIN conversion reaches on a CPU: Marlin's
    `gptq_marlin_repack`, by the reference with the release's own signature; `Tensor.cuda` as
    identity, as in harness.py. FlashInfer's ops are not reached by these backends."""
    import vllm._custom_ops as ops

    takes_perm = "perm" in inspect.signature(ops.gptq_marlin_repack).parameters
    reference = _repack_with_perm if takes_perm else H.marlin_repack_reference
    with H.patched(ops, gptq_marlin_repack=reference), H.patched(torch.Tensor, cuda=H._stay_on_cpu):
        yield


def flashinfer_128x4_swizzle():
    """Stand-in for FlashInfer's CUDA-only `block_scale_interleave` / `nvfp4_block_scale_interleave` (the
    MXFP8 backends' 128x4 scale swizzle): the pure-torch `_swizzle_sf_128x4` FlashInfer 0.7.2.post1 ships
    (diffusion_ops/minimax_h3_fc1_swiglu.py, as harness.py uses it for 0.33.0), compiled from the base venv's
    file, since the release's own FlashInfer (0.6.x, 0.7.0) does not ship it."""
    import ast
    import types

    path = Path(torch.__file__).resolve().parents[1] / "flashinfer" / "diffusion_ops" / "minimax_h3_fc1_swiglu.py"
    tree = ast.parse(path.read_text())

    def wanted(node) -> bool:
        if isinstance(node, ast.FunctionDef):
            return node.name == "_swizzle_sf_128x4"
        return isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["_SF_TILE_ROWS"]

    body = [n for n in tree.body if wanted(n)]
    assert len(body) == 2, f"{path}: no _swizzle_sf_128x4 / _SF_TILE_ROWS"
    module = types.ModuleType("flashinfer_swizzle_128x4")
    module.__dict__.update(torch=torch)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    swizzle_one = module._swizzle_sf_128x4

    def swizzle(sf: torch.Tensor) -> torch.Tensor:
        assert sf.dtype == torch.uint8 and sf.dim() in (2, 3)
        return torch.cat([swizzle_one(m) for m in sf]) if sf.dim() == 3 else swizzle_one(sf)

    return swizzle


@contextlib.contextmanager
def flashinfer_ops():
    """The CUDA-only FlashInfer ops the release's FlashInfer backends' conversion reaches (path A): the 128x4
    scale swizzle (`flashinfer_128x4_swizzle`) under every name vLLM imports it by. The TRTLLM shuffles
    (`shuffle_matrix_a`, `get_w2_permute_indices_with_cache`) are the release's FlashInfer's own torch code."""
    import flashinfer
    import flashinfer.fp4_quantization as fp4q

    swizzle = flashinfer_128x4_swizzle()
    with (
        H.patched(fp4q, nvfp4_block_scale_interleave=swizzle),
        H.patched(flashinfer, block_scale_interleave=swizzle, nvfp4_block_scale_interleave=swizzle),
    ):
        yield


def ep_config(tp: int):
    """vLLM's own `VllmConfig` of `--tensor-parallel-size tp --enable-expert-parallel` (executor "mp", as
    test_ep.py)."""
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig

    parallel = ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=True, distributed_executor_backend="mp")
    return same_instance(VllmConfig(model_config=ModelConfig(model=str(H.EXAMPLE)), parallel_config=parallel))


@contextlib.contextmanager
def ep_worker(target: H.Target, config):
    """Rank `target.rank` of a TP=`target.tp` group with expert parallelism: vLLM's EP group spans the TP ranks
    (as test_ep.py), each group with the worker's global rank (`process_groups`)."""
    import vllm.distributed.parallel_state as ps
    from vllm.config import set_current_vllm_config

    fresh_process_counters()
    with (
        H.process_groups(target.tp, target.rank, ep=target.tp, ep_rank=target.rank),
        oracle_picks(target.backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
    ):
        for name in ("_TP", "_DP", "_PCP", "_EP", "_PP"):
            getattr(ps, name).rank = target.rank
        yield


def ep_path_a(target: H.Target):
    """The release's GPT-OSS `load_weights` (it slices the EP rank's experts from `get_ep_group()`), then its
    post-processing."""
    from vllm.model_executor.models.gpt_oss import GptOssModel

    config = ep_config(target.tp)
    with ep_worker(target, config):
        model = H.build_model(config)
        GptOssModel.load_weights(model, H.checkpoint_weights())
        with marlin_repack():
            H.run_pwal(model, config, target)
    return model


def ep_path_b(target: H.Target, artifact: Path):
    """The plugin on the `--ep` artifact: harness.plugin_load_gpt_oss in the release's EP worker."""
    config = ep_config(target.tp)

    def post_process(model):
        with marlin_repack():
            H.run_pwal(model, config, target)

    with ep_worker(target, config):
        return H.plugin_load_gpt_oss(config, artifact, "fail", post_process)
