"""vLLM 0.26.0's own GPT-OSS MoE block on a CPU, loaded the normal way (path A) or through the
mxconvert plugin (path B): harness.py's paths for the vLLM 0.26.0 venv (.venv-vllm-0.26).

Everything harness.py's docstring lists as vLLM's own code is vLLM 0.26.0's here (the wheel's Python
files: config, `gpt_oss.MLPBlock`, `GptOssMxfp4MoEMethod` and its `_setup_kernel`, the oracle module's
`convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`, `_swizzle_mxfp4`, Marlin's preparation, the
GPT-OSS weight loading and the model loader's `process_weights_after_loading`), and the same
stand-ins are used (harness.py: process groups, the CUDA device and its capability, the oracle's
pick, `gptq_marlin_repack` by vLLM's own test reference, here with 0.26.0's signature), plus one
for this release:

  * the platform: vLLM 0.26.0 has no `VLLM_TARGET_DEVICE=cpu` detection (vllm/platforms/__init__.py
    `cpu_platform_plugin` finds the CPU platform only in a "+cpu" build or on macOS, and `import vllm`
    already resolves the platform), so `use_cpu_platform()` replaces the `UnspecifiedPlatform` it
    settles on with vLLM's own `CpuPlatform()` (`cuda_device(cap)` then answers as CUDA on top of
    it, as in harness.py).

What differs from harness.py's paths is one call: vLLM 0.26.0's `GptOssModel._load_weights_mxfp4`
takes the attention heads of the rank (`heads_per_rank`, `head_start`, for the sinks; the MoE
tensors fed here never read them), computed as 0.26.0's `GptOssModel.load_weights` does.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from pathlib import Path

import harness as H
import torch

#: The vLLM release this harness drives (the venv must have it installed).
RELEASE = "0.26.0"
#: `mxconvert convert` arguments of every artifact the 0.26.0 tests load (the row of vLLM 0.26.0).
RUNTIME = ("--runtime", "vllm-0.26")


def installed_release() -> str | None:
    try:
        return importlib.metadata.version("vllm").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def use_cpu_platform() -> None:
    """vLLM's own `CpuPlatform()` as the current platform, in place of the `UnspecifiedPlatform` that
    0.26.0's detection settles on during `import vllm` (vllm/utils/torch_utils.py computes
    `PIN_MEMORY` at import, which resolves `current_platform`). No module holds the replaced object
    (checked); `PIN_MEMORY` takes CpuPlatform's answer (False; read only by attention and KV offload)."""
    import sys

    import vllm.platforms as platforms
    import vllm.utils.torch_utils as torch_utils
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import UnspecifiedPlatform

    current = platforms._current_platform
    if isinstance(current, CpuPlatform):
        return
    assert isinstance(current, UnspecifiedPlatform), current
    modules = list(sys.modules.items())
    holders = [name for name, m in modules if getattr(m, "__dict__", {}).get("current_platform") is current]
    assert holders == [], holders
    platforms._current_platform = CpuPlatform()
    torch_utils.PIN_MEMORY = platforms._current_platform.is_pin_memory_available()


def load_mxfp4(model, weights, tp: int, rank: int) -> None:
    """vLLM 0.26.0's GPT-OSS MXFP4 weight loading (no expert parallelism: all experts)."""
    from vllm.model_executor.models.gpt_oss import GptOssModel

    heads_per_rank = model.config.num_attention_heads // tp
    num_experts = model.config.num_local_experts
    GptOssModel._load_weights_mxfp4(model, num_experts, 0, heads_per_rank, rank * heads_per_rank, weights, [])


@contextlib.contextmanager
def worker(target: H.Target, backend: str, config):
    """The worker context vLLM holds around `load_model`, with harness.py's stand-ins."""
    from vllm.config import set_current_vllm_config

    with (
        H.process_groups(target.tp, target.rank),
        H.oracle_picks(backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
    ):
        yield


def path_a(target: H.Target):
    """Normal load: vLLM 0.26.0's GPT-OSS weight loading of the checkpoint, then its post-processing."""
    config = H.vllm_config()
    with worker(target, target.backend, config):
        model = H.build_model(config)
        load_mxfp4(model, H.checkpoint_weights(), target.tp, target.rank)
        with marlin_repack():
            H.run_pwal(model, config, target)
    return model


def path_b(target: H.Target, artifact: Path, on_mismatch: str = "fail", live_backend: str | None = None):
    """The plugin: checks, shared tensors through vLLM 0.26.0's loading, experts from the artifact."""
    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = H.vllm_config()
    with worker(target, live_backend or target.backend, config):
        installer = ArtifactInstaller(artifact, on_mismatch)
        installer.check_runtime(live_runtime())
        model = H.build_model(config)
        installer.prepare(moe_layers(model))
        shared = H.vllm_names(t for t in iter_shared(installer.shared_files()) if ".mlp." in t[0])
        load_mxfp4(model, shared, target.tp, target.rank)
        with installer.conversion_bypass(), marlin_repack():
            H.run_pwal(model, config, target)
    return model, installer


def marlin_repack_reference(b_q_weight, perm, size_k, size_n, num_bits, is_a_8bit=False):
    """Stand-in for vLLM 0.26.0's `ops.gptq_marlin_repack`, whose signature still has `perm` (the
    act-order permutation; MXFP4's Marlin preparation passes an empty one, i.e. none): vLLM's own test
    reference, as harness.marlin_repack_reference for 0.33.0, which dropped the argument."""
    assert perm.numel() == 0, "MXFP4 Marlin repacks without an act-order permutation"
    return H.marlin_repack_reference(b_q_weight, size_k, size_n, num_bits, is_a_8bit)


@contextlib.contextmanager
def marlin_repack():
    """The one CUDA-only op vLLM 0.26.0's TRITON / MARLIN conversion reaches on a CPU: Marlin's
    `gptq_marlin_repack` (`marlin_repack_reference`); `Tensor.cuda` as identity, as in harness.py.
    FlashInfer's ops are not reached by these backends."""
    import vllm._custom_ops as ops

    with H.patched(ops, gptq_marlin_repack=marlin_repack_reference), H.patched(torch.Tensor, cuda=H._stay_on_cpu):
        yield
