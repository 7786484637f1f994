"""SGLang 0.5.23's own GPT-OSS MXFP4 MoE code, run on CPU (path A), and the loader's install of an
artifact into a layer SGLang's own `create_weights` built (path B).

What runs of SGLang is its source, read from the installed sglang package and compiled function by
function into a namespace holding what those functions look up (importing the modules needs SGLang's
CUDA stack): `Mxfp4MoEMethod.create_weights`, `Mxfp4MoEMethod.process_weights_after_loading`,
`_get_flashinfer_mxfp4_device_permute_indices` (layers/quantization/mxfp4.py) and
`GptOssForCausalLM._load_mxfp4_experts_weights` (models/gpt_oss.py), with FlashInfer 0.7.2.

Stood in (the same as tools/golden/sglang_mxfp4_trtllm.py and sglang_mxfp4_example.py, whose
namespace, compile and model stand-in this reuses; sglang_common.py holds the shared ones):
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

import functools
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-gpt-oss"
sys.path.insert(0, str(REPO / "tools" / "golden"))
import sglang_mxfp4_example as golden_example  # noqa: E402 - the golden tools, by path
import sglang_mxfp4_trtllm as golden_trtllm  # noqa: E402
from sglang_common import compile_functions, cuda_is_identity, installed_reader, round_up  # noqa: E402


@functools.cache
def sglang_root() -> Path:
    """The installed sglang package folder (found, not imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed: bash tools/sglang_env/setup.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def read_installed(path: str) -> str:
    """A source file of the installed sglang, by its path in the wheel (`sglang/srt/...`)."""
    return installed_reader(sglang_root().parent)(path)


class SglangCode:
    """SGLang's own functions, compiled once: what sglang_mxfp4_trtllm.py runs of mxfp4.py, and the
    model's expert loader (sglang_mxfp4_example.py's), from the installed package."""

    def __init__(self) -> None:
        self.namespace = golden_example.loader_namespace()
        compile_functions(read_installed, golden_trtllm.SOURCE, golden_trtllm.FUNCTIONS, self.namespace)
        golden_example.expert_loader(read_installed, self.namespace)


class Method:
    """An `Mxfp4MoEMethod` as SGLang 0.5.23's `__init__` leaves it on SM100 with
    `--moe-runner-backend flashinfer_mxfp4` (or auto), its methods SGLang's compiled source."""

    moe_runner_config: Any  # set where FusedMoE.__init__ creates the runner (build_layer)

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
        with cuda_is_identity():  # stand-in: the gemm1_* tensors stay on the CPU
            return self._code.namespace["process_weights_after_loading"](self, layer)


@dataclass
class Built:
    prefix: str
    method: Method
    layer: torch.nn.Module


def config() -> dict:
    return json.loads((EXAMPLE / "config.json").read_text())


def build_layer(code: SglangCode, layer_id: int, tp: int, rank: int, ep: int = 1) -> Built:
    """What `FusedMoE.__init__` + `Mxfp4MoEMethod.create_weights` make for one layer of the example:
    at MoE TP `tp`, rank `rank`; with `ep` > 1 at MoE EP `ep` (MoE TP 1), EP rank `rank` instead
    (`expert_parallel`)."""
    cfg = config()
    experts, hidden, intermediate = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    method = Method(code)
    layer: Any = torch.nn.Module()  # FusedMoE's attributes are set on it below
    layer.num_experts = experts
    layer.num_local_experts = experts // ep
    layer.num_fused_shared_experts = 0
    layer.hidden_size = round_up(hidden, 256)  # FusedMoE.__init__, mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate // tp
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    if ep > 1:
        expert_parallel(layer, experts, ep, rank)
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    layer.quant_method = method
    method.create_weights(
        layer, layer.num_local_experts, layer.hidden_size, layer.intermediate_size_per_partition, torch.bfloat16,
        with_bias=True,
    )  # fmt: skip
    return Built(f"model.layers.{layer_id}.mlp.experts", method, layer)


def expert_parallel(layer: Any, experts: int, ep: int, rank: int) -> None:
    """The parallel attributes `FusedMoE.__init__` (layers/moe/fused_moe_triton/layer.py:383-416) sets
    at `--tp-size ep --ep-size ep` for EP rank `rank` (SGLang 0.5.23 runtime_context.py: moe_tp_size =
    tp_size // ep_size = 1, moe_ep_rank = tp_rank): `num_experts` global, `num_local_experts` E / ep
    (what `create_weights` is called with, layer.py:563). SGLang's `_load_mxfp4_experts_weights` reads
    `moe_ep_rank` / `moe_ep_size` off the layer and loads the rank's experts (models/gpt_oss.py:1009)."""
    layer.num_experts = experts
    layer.num_local_experts = experts // ep
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = 0, 1, rank, ep


def load_checkpoint(code: SglangCode, built: Built) -> None:
    """SGLang's `_load_mxfp4_experts_weights` of the example's expert tensors into the layer."""
    layer_id = int(built.prefix.split(".")[2])
    golden_example.load_example_layer(code.namespace["_load_mxfp4_experts_weights"], built.layer, layer_id, config())


#: Plain attributes SGLang's TRT-LLM post-processing sets on the layer (besides parameters).
ATTRIBUTES = ("_situ_routing_bias_bf16",)


def parameter_state(param: torch.nn.Parameter) -> tuple:
    """What the kernel can read of one parameter: type, requires_grad, dtype, shape, device, bytes."""
    data = param.data.contiguous()
    return (
        type(param).__name__,
        param.requires_grad,
        str(data.dtype),
        tuple(data.shape),
        str(data.device),
        data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"",
    )


def layer_state(layer: torch.nn.Module) -> dict[str, object]:
    """Everything the kernel can read of a layer after post-processing: every parameter (type,
    requires_grad, dtype, shape, bytes) and the plain attributes SGLang sets."""
    state: dict[str, object] = {name: parameter_state(param) for name, param in layer.named_parameters()}
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


def convert(source: Path, out: Path, *args: str) -> Path:
    """`python -m mxconvert convert SOURCE ARGS -o OUT` in a subprocess (this venv's mxconvert); OUT."""
    cmd = [sys.executable, "-m", "mxconvert", "convert", str(source), *args, "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def all_differences(a: dict[str, dict], b: dict[str, dict]) -> list[str]:
    """`differences` of every layer (by prefix) of two runs over the same layers."""
    assert set(a) == set(b)
    return [f"{prefix}: {line}" for prefix in a for line in differences(a[prefix], b[prefix])]


def flipped_copy(artifact: Path, copy: Path, key: str = "model.layers.1.mlp.experts.w2_weight") -> Path:
    """A copy of `artifact` at `copy` with one bit flipped in the last byte of the rank-0 shard that
    holds tensor `key` (the last byte of the shard's data section: some expert tensor)."""
    shutil.copytree(artifact, copy)
    manifest = json.loads((copy / "mxconvert.json").read_text())
    shard = copy / manifest["ranks"][0]["tensors"][key]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    return copy


def assert_matches_digest(data: torch.Tensor, want: dict, where: str) -> None:
    """`data` has the dtype, shape and byte sha256 a golden's example digest records (`want`)."""
    data = data.contiguous()
    got = hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()
    assert (str(data.dtype).removeprefix("torch."), list(data.shape), got) == (
        want["dtype"],
        want["shape"],
        want["sha256"],
    ), where
