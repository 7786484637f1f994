"""The `mxconvert` load format for vLLM 0.19.0-0.33.0 (imports vLLM; only the plugin imports this module).

What differs between those releases' internals is adapters.py's (here: the triton_kernels generation,
the MoE module class, the GPT-OSS MXFP4 method class, the expert map, ROCm's CDNA4 scale rule); the rest
this module touches is the same in all of them.

`vllm serve ART --load-format mxconvert` (ART = an mxconvert artifact folder) runs, in every worker:
the runtime checks, vLLM's own model construction (`create_model`: the quant method and its oracle
pick the backend), the per-layer checks, vLLM's normal weight loading for the non-expert tensors
of `shared/`, and vLLM's own `process_weights_after_loading` for every module, in which only the
MoE conversion function is bypassed for the artifact's layers (install.py; NVFP4: install_nvfp4.py,
which uses vLLM's pre-processed path where the quant method has one).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import nn

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.dependency import missing_vllm

try:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
except ImportError as exc:
    raise missing_vllm(exc) from exc

if TYPE_CHECKING:  # the method classes; install_nvfp4.py imports the NVFP4 ones' modules when it patches them
    # vLLM 0.24.0+'s MoE module (adapters.py `moe_module_class`: 0.20.0-0.23.0 call it FusedMoE) and 0.20.0+'s
    # GPT-OSS MXFP4 method (adapters.py `mxfp4_method_class`: 0.19.x's `Mxfp4MoEMethod`)
    try:  # guarded like every vLLM import here (vLLM is the optional `mxconvert[vllm]` extra)
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4 import (  # noqa: E501
            CompressedTensorsW4A4Nvfp4MoEMethod,
        )
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE
        from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod
    except ImportError as exc:
        raise missing_vllm(exc) from exc

from mxconvert.runtimes.common.mismatch import public_release
from mxconvert.runtimes.vllm.adapters import installed_adapter, live_adapter
from mxconvert.runtimes.vllm.checks import LiveLayer, LiveRuntime, _vtuple
from mxconvert.runtimes.vllm.installer import PREFETCH_BYTES, ArtifactInstaller
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.releases import installed_vllm

#: Keys of `--model-loader-extra-config` this loader reads (the rest go to vLLM's default loader).
OWN_KEYS = ("on_mismatch", "verify_checksums")


def live_runtime() -> LiveRuntime:
    """The worker as vLLM sees it."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise missing_vllm(exc) from exc

    if current_platform.is_cuda():
        platform = "cuda"
    elif current_platform.is_rocm():
        platform = "rocm"
    elif current_platform.is_xpu():
        platform = "xpu"
    elif current_platform.is_cpu():
        platform = "cpu"
    else:
        platform = str(getattr(current_platform, "device_type", "unknown"))
    cap = current_platform.get_device_capability() if platform in ("cuda", "rocm") else None
    adapter = installed_adapter()  # None: a release the plugin does not serve, refused by check_runtime
    gfx = None
    cdna4 = None
    if platform == "rocm":
        gfx = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        cdna4 = adapter.cdna4_scale_swizzle() if adapter is not None else None
    tk = adapter.triton_kernels_generation() if adapter is not None else None
    if tk is not None:  # vLLM names generations "3.5.1" / "3.6" / "3.8"; manifests "3.5.1" / "3.6.0"
        tk = ".".join(str(p) for p in (_vtuple(tk) + (0, 0))[:3])
    return LiveRuntime(
        vllm.__version__,
        platform,
        [cap.major, cap.minor] if cap is not None else None,
        gfx,
        tk,
        cdna4_scale_swizzle=cdna4,
    )


def moe_layers(model: nn.Module) -> list[tuple[str, nn.Module, LiveLayer]]:
    """Every GPT-OSS MXFP4 and NVFP4 (ModelOpt, compressed-tensors) MoE layer of `model`, with what
    vLLM decided for it."""
    from mxconvert.runtimes.vllm.install_nvfp4 import method_names

    found: list[tuple[str, nn.Module, LiveLayer]] = []
    adapter = live_adapter()
    moe_class = adapter.moe_module_class()
    mxfp4_method = adapter.mxfp4_method_class()
    for prefix, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, mxfp4_method):
            read_layer = live_layer
        elif type(method).__name__ in method_names():
            read_layer = live_nvfp4_layer
        else:
            continue
        if not isinstance(module, moe_class):  # vLLM 0.33.0 hangs MoE quant methods on RoutedExperts only
            raise MismatchError(
                f"{prefix}: a {type(method).__name__} on a {type(module).__name__}, not on vLLM's "
                f"{moe_class.__name__}; this plugin knows vLLM {public_release(installed_vllm() or '?')}'s "
                "MoE modules only"
            )
        name = getattr(module, "layer_name", prefix)  # the checkpoint prefix, e.g. model.layers.0.mlp.experts
        found.append((name, module, read_layer(name, method, module)))
    return found


def live_nvfp4_layer(
    prefix: str, method: ModelOptNvFp4FusedMoE | CompressedTensorsW4A4Nvfp4MoEMethod, module: RoutedExperts
) -> LiveLayer:
    """What vLLM's NVFP4 MoE method holds for one layer after `create_weights`: the backend its oracle
    picked, the parallel setup, the activation, the checkpoint-shaped parameters it allocated and the
    sizes its conversion pads them to (nvfp4_padding.py)."""
    from mxconvert.runtimes.vllm.install_nvfp4 import CHECKPOINT_PARAMS, uses_a16
    from mxconvert.runtimes.vllm.nvfp4_padding import live_nvfp4_padding

    parallel = method.moe.moe_parallel_config
    # Marlin is weight-only: it runs bf16 activations whatever the checkpoint quantizes them to
    activation = "bf16" if uses_a16(method) or method.nvfp4_backend.value == "MARLIN" else "nvfp4"
    if getattr(method, "per_token_activation", False):
        activation = "nvfp4_per_token"
    shapes = []
    for name in CHECKPOINT_PARAMS[type(method).__name__][:4]:  # weights and block scales
        param = getattr(module, name)
        shapes.append((name.replace("_packed", ""), tuple(param.shape)))
    return LiveLayer(
        prefix=prefix,
        backend=method.nvfp4_backend.value,
        hidden_size_padded=module.hidden_size,
        intermediate_size_padded=module.intermediate_size_per_partition,
        tp_size=1 if parallel.use_ep else parallel.tp_size,
        ep_size=parallel.ep_size if parallel.use_ep else 1,
        rank=parallel.ep_rank if parallel.use_ep else parallel.tp_rank,
        num_experts=module.num_experts,
        params_dtype=str(module.params_dtype).removeprefix("torch."),
        fmt="nvfp4",
        checkpoint_shapes=tuple(shapes),
        padded=live_nvfp4_padding(method, module),
        activation=activation,
        eplb=bool(parallel.enable_eplb),
        global_experts=held_experts(module),
        dp_size=parallel.dp_size,
    )


def live_layer(prefix: str, method: GptOssMxfp4MoEMethod, module: RoutedExperts) -> LiveLayer:
    """What vLLM's quant method holds for one layer after `create_weights`."""
    parallel = method.moe.moe_parallel_config
    backend = Mxfp4Backend.artifact_name(method.mxfp4_backend.value)
    marlin_dtype = None
    if backend in ("MARLIN", "BATCHED_MARLIN"):
        try:
            from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4
        except ImportError as exc:
            raise missing_vllm(exc) from exc
        dtype = marlin_utils_fp4.get_marlin_input_dtype()
        marlin_dtype = {torch.float8_e4m3fn: "fp8", torch.int8: "int8"}.get(dtype)
    return LiveLayer(
        prefix=prefix,
        backend=backend,
        hidden_size_padded=method.hidden_size,
        intermediate_size_padded=method.intermediate_size,
        tp_size=1 if parallel.use_ep else parallel.tp_size,
        ep_size=parallel.ep_size if parallel.use_ep else 1,
        rank=parallel.ep_rank if parallel.use_ep else parallel.tp_rank,
        num_experts=method.num_experts,
        marlin_input_dtype=marlin_dtype,
        params_dtype=str(module.params_dtype).removeprefix("torch."),
        eplb=bool(parallel.enable_eplb),
        global_experts=held_experts(module),
        dp_size=parallel.dp_size,
    )


def held_experts(module: RoutedExperts) -> tuple[int, ...]:
    """The global id of each of the layer's local expert slots, in slot order, from the expert map
    vLLM built (vLLM 0.33.0 fused_moe/expert_map_manager.py `determine_expert_map`: global id ->
    local slot, -1 elsewhere; None without expert parallelism, every expert held in order).

    Read from the layer's `ExpertMapManager`, whatever the kernel: the layer's `expert_map` property
    (routed_experts.py `RoutedExperts.expert_map`) answers, once the kernel is built, with the 0/1
    `expert_mask` for a kernel that `consumes_expert_mask` (ROCm AITER's `AiterMxfp4Experts`, the
    AITER_MXFP4_BF16 backend). Under AITER the map also ends with the slots of fused shared experts
    (ids from the routed expert count on), which no artifact holds: they are refused as experts."""
    expert_map = live_adapter().expert_map(module)  # vLLM 0.20.0-0.21.0 hold it elsewhere (adapters.py)
    if expert_map is None:
        return tuple(range(module.global_num_experts))
    slots = sorted((int(local), g) for g, local in enumerate(expert_map.tolist()) if local >= 0)
    return tuple(g for _, g in slots)


@runtime_checkable
class LoadsWeights(Protocol):
    """A vLLM model: `load_weights` takes (name, tensor) pairs (vLLM's `VllmModel` interface)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> object: ...


class MxconvertModelLoader(DefaultModelLoader):
    """vLLM's default loader, fed from an mxconvert artifact and skipping the MoE conversion."""

    def __init__(self, load_config: LoadConfig):
        extra = dict(load_config.model_loader_extra_config or {})
        self.on_mismatch = extra.pop("on_mismatch", "fail")
        self.verify_checksums = bool(extra.pop("verify_checksums", True))
        self.prefetch_bytes = extra.pop("prefetch_bytes", PREFETCH_BYTES)
        inner = copy.copy(load_config)
        inner.model_loader_extra_config = extra
        super().__init__(inner)
        self.installer: ArtifactInstaller | None = None

    def download_model(self, model_config: ModelConfig) -> None:
        ArtifactInstaller(model_config.model, self.on_mismatch, verify_checksums=False)

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        self.installer = ArtifactInstaller(
            model_config.model, self.on_mismatch, self.verify_checksums, self.prefetch_bytes
        )
        self.installer.check_runtime(live_runtime())  # before the model is built
        with self.installer.conversion_bypass():
            return super().load_model(vllm_config, model_config, prefix)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        installer = self.installer or ArtifactInstaller(
            model_config.model, self.on_mismatch, self.verify_checksums, self.prefetch_bytes
        )
        if installer.live is None:
            installer.check_runtime(live_runtime())
        if not isinstance(model, LoadsWeights):
            raise MismatchError(f"the model vLLM built ({type(model).__name__}) has no load_weights")
        # every check but the digests passes before any weight is read; the digests are computed
        # meanwhile and checked when `load_model`'s conversion bypass ends, before vLLM gets the model
        installer.prepare(moe_layers(model))
        try:
            model.load_weights(
                safetensors_weights_iterator(installer.shared_files(), self.load_config.use_tqdm_on_load)
            )
        except BaseException as exc:  # e.g. a shared/ file vLLM cannot parse: a digest that differs says why
            installer.abort(exc)
            raise
        if not installer.bypassing:  # called on its own (vLLM's reload_weights): no later point to check at
            installer.finish()
