"""The order `MxconvertSglangLoader.load_model` (runtimes/sglang/loader.py) runs things in, with the
SGLang names it imports stood in (the real ones need SGLang's CUDA stack; tests_sglang/ runs
SGLang's own post-processing against the installer the loader calls).

Stood in, each a few lines below: `DefaultModelLoader` (keeps the load config and refuses
model_loader_extra_config keys it does not know, as SGLang 0.5.23's does; its static
`load_weights_only` calls `model.load_weights`), `_initialize_model` (a GPT-OSS-shaped module tree
whose MoE layers hold an `Mxfp4MoEMethod` and the parameters its `create_weights` allocates on SM100),
`_get_quantization_config`, `_modules_with_quant_method`, `device_loading_context`,
`set_default_torch_dtype`, `safetensors_weights_iterator`, `get_moe_a2a_backend`.

Shown: the runtime checks run before the model is built, every layer check before any weight is
read, SGLang's own loading gets exactly the artifact's shared tensors, the artifact's layers are
installed and every other module runs its own post-processing; a mismatch stops the load before
any weight is read; the loader's own extra-config key does not reach SGLang's loader.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, run_cli
from safetensors import safe_open
from test_sglang_loader_checks import LIVE, stand_in_layer

from mxconvert.runtimes.common.mismatch import ArtifactMismatch

CONFIG = json.loads((EXAMPLE / "config.json").read_text())


class Mxfp4MoEMethod:
    """SGLang's quant method as `__init__` + `create_weights` leave it on SM100 (flashinfer_mxfp4)."""

    def __init__(self, tp: int):
        self.use_flashinfer, self._fi_kernel = True, "trtllm_sm100"
        self.use_marlin = self.use_deep_gemm = self.use_mega_moe = self.use_triton_kernels = False
        self.hidden_size = -(-CONFIG["hidden_size"] // 256) * 256
        self.intermediate_size_per_partition = -(-(CONFIG["intermediate_size"] // tp) // 128) * 128

    def process_weights_after_loading(self, layer):
        raise AssertionError("SGLang's own MoE post-processing ran for a layer the artifact holds")


class OtherMethod:
    def __init__(self, events: list):
        self.events = events

    def process_weights_after_loading(self, layer):
        self.events.append("own post-processing of a non-MoE module")


class Model(torch.nn.Module):
    def __init__(self, events: list, tp: int):
        super().__init__()
        self.events = events
        self.loaded: list[str] = []
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList()
        for _ in range(CONFIG["num_hidden_layers"]):
            block = torch.nn.Module()
            block.mlp = torch.nn.Module()
            experts = stand_in_layer(tp)
            experts.quant_method = Mxfp4MoEMethod(tp)
            experts.moe_tp_size, experts.moe_tp_rank, experts.moe_ep_size, experts.moe_ep_rank = tp, 0, 1, 0
            block.mlp.experts = experts
            block.qkv = torch.nn.Module()
            block.qkv.quant_method = OtherMethod(events)
            self.model.layers.append(block)

    def load_weights(self, weights):
        self.events.append("load_weights")
        self.loaded += [name for name, _ in weights]


@pytest.fixture
def sglang(monkeypatch):
    """The SGLang names loader.py imports, stood in; yields the loader module and the event log."""
    events: list[str] = []
    state = types.SimpleNamespace(events=events, tp=1)

    class DefaultModelLoader:
        def __init__(self, load_config):
            unknown = set(load_config.model_loader_extra_config or {}) - {"enable_multithread_load", "num_threads"}
            if unknown:
                raise ValueError(f"Unexpected extra config keys for load format: {unknown}")
            self.load_config = load_config

        @staticmethod
        def load_weights_only(model, weights, target_device):
            model.load_weights(weights)

    def initialize_model(model_config, load_config, quant_config):
        events.append("model built")
        return Model(events, state.tp)

    def safetensors_weights_iterator(files):
        for path in files:
            with safe_open(path, "pt") as f:
                yield from ((key, f.get_tensor(key)) for key in f.keys())

    def modules_with_quant_method(model):
        for _, module in model.named_modules():
            if getattr(module, "quant_method", None) is not None:
                yield module, module.quant_method

    names = {
        "sglang": {"__version__": "0.5.23"},
        "sglang.srt.configs.device_config": {"DeviceConfig": object},
        "sglang.srt.configs.load_config": {"LoadConfig": object},
        "sglang.srt.configs.model_config": {"ModelConfig": object},
        "sglang.srt.layers.moe.utils": {
            "get_moe_a2a_backend": lambda: types.SimpleNamespace(value="none"),
            "should_use_flashinfer_cutlass_moe_fp4_allgather": lambda: False,
        },
        "sglang.srt.layers.quantization.mxfp4": {"Mxfp4MoEMethod": Mxfp4MoEMethod},
        "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors": {
            "CompressedTensorsFusedMoEMethod": type("CompressedTensorsFusedMoEMethod", (), {}),
        },
        "sglang.srt.layers.quantization.modelopt_quant": {
            "ModelOptNvFp4FusedMoEMethod": type("ModelOptNvFp4FusedMoEMethod", (), {}),
            "_use_nvfp4_dispatch": lambda: False,
        },
        "sglang.srt.model_loader.loader": {
            "DefaultModelLoader": DefaultModelLoader,
            "_get_quantization_config": lambda model_config, load_config: None,
            "_initialize_model": initialize_model,
            "_modules_with_quant_method": modules_with_quant_method,
            "device_loading_context": lambda module, device: contextlib.nullcontext(),
        },
        "sglang.srt.model_loader.utils": {"set_default_torch_dtype": lambda dtype: contextlib.nullcontext()},
        "sglang.srt.model_loader.weight_utils": {"safetensors_weights_iterator": safetensors_weights_iterator},
    }
    for name, attrs in names.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    monkeypatch.delitem(sys.modules, "mxconvert.runtimes.sglang.loader", raising=False)
    loader = importlib.import_module("mxconvert.runtimes.sglang.loader")

    def live():
        events.append("runtime checked")
        return LIVE

    monkeypatch.setattr(loader, "live_runtime", live)
    yield types.SimpleNamespace(loader=loader, events=events, state=state)
    sys.modules.pop("mxconvert.runtimes.sglang.loader", None)  # built on the stand-ins: never reused
    vars(sys.modules["mxconvert.runtimes.sglang"]).pop("loader", None)


def _load(sglang, artifact: Path, extra: dict | None = None):
    config = types.SimpleNamespace(model_loader_extra_config=dict(extra or {}))
    loader = sglang.loader.MxconvertSglangLoader(config)
    model_config = types.SimpleNamespace(model_path=str(artifact), dtype=torch.bfloat16)
    return loader, loader.load_model(model_config=model_config, device_config=types.SimpleNamespace(device="cpu"))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-flow")
    out = {}
    for tp in (1, 2):
        result = run_cli(
            "convert",
            EXAMPLE,
            "--profile",
            "b200",
            "--runtime",
            "sglang==0.5.23",
            "--tp",
            tp,
            "--out",
            root / f"tp{tp}",
        )
        assert result.exit_code == 0, result.output
        out[tp] = root / f"tp{tp}"
    return out


def test_load_model_checks_then_loads_shared_then_installs(sglang, artifacts):
    loader, model = _load(sglang, artifacts[1], {"verify_checksums": False, "num_threads": 2})
    assert loader.verify_checksums is False
    assert loader.load_config.model_loader_extra_config == {"num_threads": 2}  # SGLang's loader never sees ours
    layers = CONFIG["num_hidden_layers"]
    assert (
        sglang.events
        == ["runtime checked", "model built", "load_weights"] + ["own post-processing of a non-MoE module"] * layers
    )
    with safe_open(str(artifacts[1] / "shared" / "model-00001-of-00001.safetensors"), "pt") as f:
        assert sorted(model.loaded) == sorted(f.keys())
    for block in model.model.layers:
        experts = block.mlp.experts
        assert experts.w13_weight.dtype == torch.uint8 and experts.w2_weight_scale.dtype == torch.float8_e4m3fn
        assert experts.gemm1_alpha.shape == (CONFIG["num_local_experts"],)
    assert not model.training  # model.eval(), as SGLang's loader returns it


def test_a_mismatch_stops_the_load_before_any_weight_is_read(sglang, artifacts):
    sglang.state.tp = 2  # the process runs TP 2, the artifact is TP 1
    with pytest.raises(ArtifactMismatch, match="tp_size") as error:
        _load(sglang, artifacts[1])
    assert "--tp 2" in str(error.value)
    assert sglang.events == ["runtime checked", "model built"]


def test_startup_overlap_is_refused(sglang):
    from mxconvert.core.errors import InputError

    loader = sglang.loader.MxconvertSglangLoader(types.SimpleNamespace(model_loader_extra_config=None))
    with pytest.raises(InputError, match="startup-weight-load-mode overlap"):
        loader.initialize_model_for_startup(model_config=None, device_config=None)


def test_live_runtime_reads_sglang_torch_and_flashinfer(sglang, monkeypatch):
    importlib.reload(sglang.loader)  # the real live_runtime (the fixture replaced it)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.7.2" if name == "flashinfer-python" else real_version(name)
    )
    assert sglang.loader.live_runtime() == LIVE
