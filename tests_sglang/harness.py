"""SGLang 0.5.23's own GPT-OSS MXFP4 MoE code, run on CPU (path A), and the loader's install of an
artifact into a layer SGLang's own `create_weights` built (path B).

What runs of SGLang is its source, read from the installed sglang package and compiled function by
function into a namespace holding what those functions look up (importing the modules needs SGLang's
CUDA stack): `Mxfp4MoEMethod.create_weights`, `Mxfp4MoEMethod.process_weights_after_loading`,
`_get_flashinfer_mxfp4_device_permute_indices` (layers/quantization/mxfp4.py) and
`GptOssForCausalLM._load_mxfp4_experts_weights` (models/gpt_oss.py), with FlashInfer 0.7.2.

Stood in (the same as tools/golden/sglang_mxfp4_trtllm.py and sglang_mxfp4_example.py, whose
namespace this reuses):
  * `nvfp4_block_scale_interleave` (FlashInfer CUDA JIT) -> FlashInfer 0.7.2's pure-torch
    `_swizzle_sf_128x4`;
  * `torch.Tensor.cuda` (the gemm1_* tensors) -> identity on CPU;
  * `get_platform()` -> SM100; `get_moe_a2a_backend()` -> not MORI; `set_weight_attrs` -> no-op;
  * `FusedMoE.__init__` (the layer object): its attributes the code reads, set as SGLang sets them
    (hidden rounded to 256 for flashinfer_mxfp4, intermediate / TP, moe_tp_* / moe_ep_*, the runner
    config's gemm1_alpha / gemm1_clamp_limit None and gate_up_interleaved True);
  * the model object `_load_mxfp4_experts_weights` is a method of (config, named_parameters,
    get_submodule for the layer), and `default_weight_loader` as the MXFP4 fast path of
    `FusedMoE.weight_loader` (`param.data[:, :dim1, :dim2].copy_(loaded_weight)`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-gpt-oss"
sys.path.insert(0, str(REPO / "tools" / "golden"))
import sglang_mxfp4_example as golden_example  # noqa: E402 - the golden tools, by path
import sglang_mxfp4_trtllm as golden_trtllm  # noqa: E402

MXFP4_SOURCE = "srt/layers/quantization/mxfp4.py"
MODEL_SOURCE = "srt/models/gpt_oss.py"


@functools.cache
def sglang_root() -> Path:
    """The installed sglang package folder (found, not imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed: bash tools/sglang_env/setup.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def _members(rel: str, cls: str | None, names: set[str]) -> list[ast.FunctionDef]:
    tree = ast.parse((sglang_root() / rel).read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = names - {n.name for n in found}
    if missing:
        raise RuntimeError(f"sglang/{rel} lacks {sorted(missing)}")
    return found


def _compile(nodes: list[ast.FunctionDef], rel: str, namespace: dict) -> None:
    module = ast.Module(body=nodes, type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), f"sglang/{rel}", "exec"), namespace)  # noqa: S102


class SglangCode:
    """SGLang's own functions, compiled once."""

    def __init__(self) -> None:
        self.namespace = golden_trtllm._namespace() | {
            "math": math,
            "default_weight_loader": golden_example._fused_moe_fast_path,
        }
        _compile(
            _members(MXFP4_SOURCE, None, {"_get_flashinfer_mxfp4_device_permute_indices"}), MXFP4_SOURCE, self.namespace
        )
        _compile(
            _members(MXFP4_SOURCE, "Mxfp4MoEMethod", {"create_weights", "process_weights_after_loading"}),
            MXFP4_SOURCE,
            self.namespace,
        )
        _compile(
            _members(MODEL_SOURCE, "GptOssForCausalLM", {"_load_mxfp4_experts_weights"}), MODEL_SOURCE, self.namespace
        )


class Method:
    """An `Mxfp4MoEMethod` as SGLang 0.5.23's `__init__` leaves it on SM100 with
    `--moe-runner-backend flashinfer_mxfp4` (or auto), its methods SGLang's compiled source."""

    def __init__(self, code: SglangCode):
        self._code = code
        self.prefix = ""
        self.use_triton_kernels = False
        self.with_bias = False
        self.use_flashinfer = True
        self.use_marlin = False
        self.use_deep_gemm = False
        self.use_mega_moe = False
        self._use_sm90_humming = False
        self._fi_kernel = "trtllm_sm100"

    def create_weights(self, layer, *args, **kwargs):
        return self._code.namespace["create_weights"](self, layer, *args, **kwargs)

    def process_weights_after_loading(self, layer):
        saved = torch.Tensor.cuda
        torch.Tensor.cuda = lambda self, *a, **k: self  # stand-in: the gemm1_* tensors stay on the CPU
        try:
            return self._code.namespace["process_weights_after_loading"](self, layer)
        finally:
            torch.Tensor.cuda = saved


@dataclass
class Built:
    prefix: str
    method: Method
    layer: torch.nn.Module


def config() -> dict:
    return json.loads((EXAMPLE / "config.json").read_text())


def build_layer(code: SglangCode, layer_id: int, tp: int, rank: int) -> Built:
    """What `FusedMoE.__init__` + `Mxfp4MoEMethod.create_weights` make for one layer of the example."""
    cfg = config()
    experts, hidden, intermediate = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    method = Method(code)
    layer = torch.nn.Module()
    layer.num_experts = experts
    layer.num_local_experts = experts
    layer.num_fused_shared_experts = 0
    layer.hidden_size = golden_trtllm._round_up(hidden, 256)  # FusedMoE.__init__, mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate // tp
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    layer.quant_method = method
    method.create_weights(
        layer, experts, layer.hidden_size, layer.intermediate_size_per_partition, torch.bfloat16, with_bias=True
    )
    return Built(f"model.layers.{layer_id}.mlp.experts", method, layer)


def load_checkpoint(code: SglangCode, built: Built) -> None:
    """SGLang's `_load_mxfp4_experts_weights` of the example's expert tensors into the layer."""
    layer_id = int(built.prefix.split(".")[2])
    cfg = config()
    model = types.SimpleNamespace(
        config=types.SimpleNamespace(
            intermediate_size=cfg["intermediate_size"], num_local_experts=cfg["num_local_experts"]
        ),
        named_parameters=lambda: [(f"{built.prefix}.{n}", p) for n, p in built.layer.named_parameters()],
        get_submodule=lambda name: built.layer if name == built.prefix else None,
    )
    code.namespace["_load_mxfp4_experts_weights"](model, _checkpoint_layer(layer_id))


def _checkpoint_layer(layer_id: int) -> list[tuple[str, torch.Tensor]]:
    prefix = f"model.layers.{layer_id}.mlp.experts."
    out = []
    for path in sorted(EXAMPLE.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out += [(k, f.get_tensor(k)) for k in f.keys() if k.startswith(prefix)]
    return out


#: Plain attributes SGLang's TRT-LLM post-processing sets on the layer (besides parameters).
ATTRIBUTES = ("_situ_routing_bias_bf16",)


def layer_state(layer: torch.nn.Module) -> dict[str, object]:
    """Everything the kernel can read of a layer after post-processing: every parameter (type,
    requires_grad, dtype, shape, bytes) and the plain attributes SGLang sets."""
    state: dict[str, object] = {}
    for name, param in layer.named_parameters():
        data = param.data.contiguous()
        state[name] = (
            type(param).__name__,
            param.requires_grad,
            str(data.dtype),
            tuple(data.shape),
            str(data.device),
            data.view(torch.uint8).numpy().tobytes() if data.numel() else b"",
        )
    for name in ATTRIBUTES:
        state[name] = ("attribute", repr(getattr(layer, name, "<unset>")))
    return state


def differences(a: dict[str, object], b: dict[str, object]) -> list[str]:
    """The keys whose entries differ (a description per key; empty when the states are equal)."""
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            out.append(f"{key}: only in {'A' if key in a else 'B'}")
        elif a[key] != b[key]:
            left, right = a[key], b[key]
            assert isinstance(left, tuple) and isinstance(right, tuple)
            out.append(f"{key}: A {left[:5]} != B {right[:5]}" if left[:5] != right[:5] else f"{key}: bytes differ")
    return out
