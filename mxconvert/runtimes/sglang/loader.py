"""The `mxconvert` load format for SGLang 0.5.23 (imports SGLang; only SGLang's `get_model_loader`
reaches this module, through hook.py).

`MxconvertSglangLoader.load_model` is SGLang's `DefaultModelLoader.load_model`
(sglang/srt/model_loader/loader.py) with two changes, in this order:

1. before anything: the runtime checks (installer.py step 1);
2. SGLang builds the model as it does (`_get_quantization_config`, `_initialize_model`: the
   quant method's `create_weights` allocates and pads the expert parameters), then the per-layer
   checks, the layer set, the tensors' dtypes and shapes and every file's size (step 2), all before
   any weight is read; SGLang's own `load_weights_only` loads the non-expert tensors of `shared/`;
   the post-processing loop of `DefaultModelLoader.postprocess_weights` runs with
   `installer.postprocess` in place of `quant_method.process_weights_after_loading` (step 4): the
   artifact's tensors for its MoE layers (install.py, read ahead of the loop on all cores,
   `prefetch_bytes`), SGLang's own post-processing for every other module; the files' digests are
   computed meanwhile in the background and checked before the model is returned (step 5,
   `installer.finish`; on a failure in between, `installer.abort`), as the vLLM plugin does.

`--startup-weight-load-mode overlap` builds the model through other loader methods
(`initialize_model_for_startup`, `commit_model_weights`); the loader refuses it.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import time

import torch
from torch import nn

from mxconvert.core.errors import InputError
from mxconvert.runtimes.common.load_overlap import PREFETCH_BYTES
from mxconvert.runtimes.sglang.checks import LiveSglang, SglangLayer
from mxconvert.runtimes.sglang.dependency import missing_sglang
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_ct_scheme, nvfp4_layer
from mxconvert.runtimes.sglang.installer import OWN_KEYS, SglangArtifactInstaller
from mxconvert.runtimes.sglang.layer_state import sglang_layer

try:
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend, should_use_flashinfer_cutlass_moe_fp4_allgather
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsFusedMoEMethod
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod, _use_nvfp4_dispatch
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4MoEMethod
    from sglang.srt.model_loader.loader import (
        DefaultModelLoader,
        _get_quantization_config,
        _initialize_model,
        _modules_with_quant_method,
        device_loading_context,
    )
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
except ImportError as exc:
    raise missing_sglang(exc) from exc


def live_runtime() -> LiveSglang:
    """The scheduler process as SGLang and torch see it."""
    try:
        import sglang
    except ImportError as exc:
        raise missing_sglang(exc) from exc

    if torch.version.hip is not None:
        platform = "rocm"
    elif torch.cuda.is_available():
        platform = "cuda"
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        platform = "xpu"
    else:
        platform = "cpu"
    capability = list(torch.cuda.get_device_capability()) if platform in ("cuda", "rocm") else None
    try:
        flashinfer: str | None = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        flashinfer = None
    return LiveSglang(str(sglang.__version__), platform, capability, flashinfer)


def moe_layers(model: nn.Module) -> list[tuple[str, nn.Module, SglangLayer]]:
    """Every GPT-OSS MXFP4 MoE layer of `model` (a module whose quant method is SGLang's
    `Mxfp4MoEMethod`) and every ModelOpt NVFP4 one (`ModelOptNvFp4FusedMoEMethod`, install_nvfp4.py),
    by its checkpoint prefix, with what SGLang decided for it."""
    a2a = get_moe_a2a_backend().value
    # mxfp4.py's module-level `_use_aiter` (SGLANG_USE_AITER on ROCm, read when SGLang imported it)
    use_aiter = bool(getattr(importlib.import_module(Mxfp4MoEMethod.__module__), "_use_aiter", False))
    found = []
    for prefix, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, ModelOptNvFp4FusedMoEMethod):
            found.append((prefix, module, nvfp4_layer(prefix, method, module, a2a)))
        elif isinstance(method, CompressedTensorsFusedMoEMethod) and nvfp4_ct_scheme(module) is not None:
            # a compressed-tensors NVFP4 MoE layer (its `scheme`: install_nvfp4.py `nvfp4_ct_scheme`)
            found.append((prefix, module, nvfp4_layer(prefix, method, module, a2a)))
        elif isinstance(method, Mxfp4MoEMethod):
            marlin_ok = _marlin_supports(module) if getattr(method, "use_marlin", False) else True
            found.append((prefix, module, sglang_layer(prefix, method, module, a2a, marlin_ok, use_aiter)))
    return found


def _marlin_supports(module: nn.Module) -> bool:
    """SGLang's own `check_moe_marlin_supports_layer(layer, 32, allow_tile_padding=True)`, the check
    its MXFP4 marlin post-processing raises on (imported here, for marlin layers only)."""
    try:  # guarded like every SGLang import here (SGLang is the optional `mxconvert[sglang]` extra)
        from sglang.srt.layers.quantization.marlin_utils import check_moe_marlin_supports_layer
    except ImportError as exc:
        raise missing_sglang(exc) from exc

    return bool(check_moe_marlin_supports_layer(module, 32, allow_tile_padding=True))


def _nvfp4_dispatch() -> bool:
    """Whether SGLang's NVFP4 post-processing hands the dispatcher the input global scale:
    `_use_nvfp4_dispatch() or should_use_flashinfer_cutlass_moe_fp4_allgather()` (modelopt_quant.py
    `process_weights_after_loading`; the second is False unless the runner is FlashInfer CUTLASS)."""
    return bool(_use_nvfp4_dispatch() or should_use_flashinfer_cutlass_moe_fp4_allgather())


def _marlin_workspace(device: torch.device, max_blocks_per_sm: int = 1) -> torch.Tensor:
    """SGLang's own `marlin_make_workspace` (int32 zeros, SM count x blocks), as its marlin
    post-processing makes `layer.workspace`."""
    try:
        from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace
    except ImportError as exc:
        raise missing_sglang(exc) from exc

    return marlin_make_workspace(device, max_blocks_per_sm)


class MxconvertSglangLoader(DefaultModelLoader):
    """SGLang's default loader, fed from an mxconvert artifact, skipping the MoE post-processing."""

    def __init__(self, load_config: LoadConfig):
        extra = dict(load_config.model_loader_extra_config or {})
        self.verify_checksums = bool(extra.pop(OWN_KEYS[0], True))
        self.prefetch_bytes = extra.pop(OWN_KEYS[1], PREFETCH_BYTES)  # checked by the installer
        inner = copy.copy(load_config)  # SGLang's default loader refuses keys it does not know
        inner.model_loader_extra_config = extra
        super().__init__(inner)

    def download_model(self, model_config: ModelConfig) -> None:
        SglangArtifactInstaller(model_config.model_path, verify_checksums=False)

    def load_model(self, *, model_config: ModelConfig, device_config: DeviceConfig) -> nn.Module:
        installer = SglangArtifactInstaller(
            model_config.model_path,
            self.verify_checksums,
            _marlin_workspace,
            _nvfp4_dispatch,
            prefetch_bytes=self.prefetch_bytes,
        )
        installer.check_runtime(live_runtime())  # before the model is built
        target_device = torch.device(device_config.device)
        quant_config = _get_quantization_config(model_config, self.load_config)
        with set_default_torch_dtype(model_config.dtype):
            with target_device:
                model = _initialize_model(model_config, self.load_config, quant_config)
            # every check but the digests passes before any weight is read; the digests are computed
            # meanwhile and checked (`finish`) before SGLang gets the model
            installer.prepare(moe_layers(model), overlapped=True)
            try:
                DefaultModelLoader.load_weights_only(
                    model, safetensors_weights_iterator(installer.shared_files()), target_device
                )
                for module, quant_method in _modules_with_quant_method(model):
                    with device_loading_context(module, target_device):
                        installer.postprocess(module, quant_method)
            except BaseException as exc:  # e.g. a shared/ file SGLang cannot parse: a digest that differs says why
                installer.abort(exc)
                raise
            installer.finish()
        self.counter_after_loading_weights = time.perf_counter()
        return model.eval()

    def initialize_model_for_startup(self, *, model_config: ModelConfig, device_config: DeviceConfig) -> nn.Module:
        raise InputError(
            "--load-format mxconvert does not support --startup-weight-load-mode overlap (it builds the model "
            "and post-processes sentinel weights through other loader methods); start SGLang without it"
        )
