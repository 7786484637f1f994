"""vLLM 0.33.0's own GPT-OSS MoE block on a CPU, loaded the normal way (path A) or through the
mxconvert plugin (path B), and a deep snapshot of everything vLLM leaves on it.

What is vLLM's own code here: the config (`ModelConfig` of the example checkpoint, `VllmConfig`),
`gpt_oss.MLPBlock` (router + `FusedMoEFactory` -> `MoERunner` -> `GptOssRoutedExperts`), the quant
method `GptOssMxfp4MoEMethod` (create_weights, round-up, process_weights_after_loading, quant config,
`make_mxfp4_moe_kernel`, the expert class's own post-processing), the GPT-OSS weight loading
(`GptOssModel._load_weights_mxfp4` with `GptOssForCausalLM.hf_to_vllm_mapper`) and the model loader's
`process_weights_after_loading`.

What is stood in (CPU has no GPU, no vLLM custom ops, no process groups):
  * process groups: `parallel_state._TP/_DP/_PCP/_EP/_PP` are objects with `world_size` and
    `rank_in_group` (TP=2 rank r is built in one process);
  * `current_platform` (vLLM's CpuPlatform instance) answers as a CUDA device of the target's
    capability inside `cuda_device(cap)`; triton_kernels' `cuda_capability_geq` likewise;
    `torch.accelerator.current_device_index()` (where expert classes place their small constant
    tensors) answers "cpu", `torch.accelerator.empty_cache()` a no-op and `max_memory_allocated()` 0;
  * the oracle's choice: `select_mxfp4_moe_backend` returns the artifact's backend and vLLM's own
    `backend_to_kernel_cls(backend)[0]` (the real oracle's kernel predicates query the GPU);
  * CUDA-only ops inside vLLM's conversion (path A only), as tools/golden does:
    `gptq_marlin_repack` -> vLLM's test reference `marlin_utils_test.marlin_weights`;
    FlashInfer's `nvfp4_block_scale_interleave` / `block_scale_interleave` -> the pure-torch 128x4
    swizzle FlashInfer 0.7.2.post1 ships (`diffusion_ops.minimax_h3_fc1_swiglu._swizzle_sf_128x4`);
    `Tensor.cuda` -> identity (vLLM's `swizzle_blockscale` ends with `.cuda()`, as tools/golden);
    `flashinfer.cute_dsl.utils` -> FlashInfer's own `convert_sf_to_mma_layout` without `import cutlass`;
    FlashInfer's `interleave_moe_weights_for_sm90_mixed_gemm` (FLASHINFER_CUTLASS_MXFP4_BF16, SM90;
    test_sm90.py only) -> a replay, keyed by input sha256, of the outputs FlashInfer 0.7.2.post1's own
    kernel produced on an H100 for exactly path A's inputs (harness_sm90.py, tests_vllm/data/sm90_interleave/;
    an input with no recorded output fails);
  * BATCHED_MARLIN (and NVFP4 CuteDSL batched): the batched deployment (`batched_deployment`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import importlib
import os
import types
from pathlib import Path

import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-gpt-oss"
NUM_LAYERS = 2  # the example's MoE layers


def prefix(layer: int) -> str:
    return f"model.layers.{layer}.mlp"


# ---- stand-ins ------------------------------------------------------------------------------------
class FakeGroup:
    def __init__(self, world_size: int, rank: int):
        self.world_size = world_size
        self.rank_in_group = rank
        # the torch process group some models read (`get_ep_group().device_group.size()`)
        self.device_group = FakeTorchGroup(world_size, rank)


class FakeTorchGroup:
    def __init__(self, world_size: int, rank: int):
        self._size, self._rank = world_size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@contextlib.contextmanager
def process_groups(tp: int, rank: int, ep: int = 1, ep_rank: int = 0, dp: int = 1, dp_rank: int = 0):
    import vllm.distributed.parallel_state as ps

    names = ("_TP", "_DP", "_PCP", "_EP", "_PP")
    saved = {n: getattr(ps, n, None) for n in names}
    ps._TP, ps._DP, ps._PCP, ps._EP, ps._PP = (
        FakeGroup(tp, rank),
        FakeGroup(dp, dp_rank),
        FakeGroup(1, 0),
        FakeGroup(ep, ep_rank),
        FakeGroup(1, 0),
    )
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(ps, n, v)


@contextlib.contextmanager
def patched(obj, **attrs):
    missing = object()
    saved = {
        k: obj.__dict__.get(k, missing)
        if isinstance(obj, types.ModuleType) or hasattr(obj, "__dict__")
        else getattr(obj, k, missing)
        for k in attrs
    }
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                delattr(obj, k)
            else:
                setattr(obj, k, v)


@contextlib.contextmanager
def cuda_device(cap: tuple[int, int] | None):
    """`current_platform` (and triton_kernels' capability query) answer as CUDA `cap`."""
    if cap is None:
        yield
        return
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    dc = DeviceCapability(*cap)

    def as_int(c):
        return c[0] * 10 + c[1] if isinstance(c, tuple) else int(c)

    tk_layout = importlib.import_module("triton_kernels.tensor_details.layout")
    with (
        patched(
            current_platform,
            is_cuda=lambda: True,
            is_cuda_alike=lambda: True,
            is_rocm=lambda: False,
            get_device_capability=lambda device_id=0: dc,
            is_device_capability=lambda c, device_id=0: as_int(c) == dc.to_int(),
            is_device_capability_family=lambda c, device_id=0: as_int(c) // 10 == dc.to_int() // 10,
            has_device_capability=lambda c, device_id=0: dc.to_int() >= as_int(c),
        ),
        patched(
            tk_layout, cuda_capability_geq=lambda major, minor=0: cap >= (major, minor), is_hip_cdna4=lambda: False
        ),
        patched(
            torch.accelerator,
            current_device_index=lambda: "cpu",
            empty_cache=lambda: None,
            max_memory_allocated=lambda *a, **k: 0,
        ),
    ):
        yield


def _swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """FlashInfer's (nvfp4_)block_scale_interleave: the 128x4 swizzle of each [M, K] matrix, flat."""
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4

    assert sf.dtype == torch.uint8 and sf.dim() in (2, 3)
    if sf.dim() == 3:
        return torch.cat([_swizzle_sf_128x4(m) for m in sf])
    return _swizzle_sf_128x4(sf)


def marlin_repack_reference(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
    """Stand-in for the CUDA op `gptq_marlin_repack` (vLLM's own test reference, as tools/golden)."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_test import get_weight_perm, marlin_weights

    assert num_bits == 4 and b_q_weight.dtype == torch.int32
    shifts = (4 * torch.arange(8, dtype=torch.int32)).view(1, 8, 1)
    q_w = ((b_q_weight.unsqueeze(1) >> shifts) & 0xF).reshape(size_k, size_n)
    return marlin_weights(q_w, size_k, size_n, num_bits, get_weight_perm(num_bits, is_a_8bit), is_a_8bit=is_a_8bit)


def cute_dsl_utils_without_cutlass() -> types.ModuleType:
    """`flashinfer.cute_dsl.utils` holding only FlashInfer's own `convert_sf_to_mma_layout` and
    `ceil_div` (pure torch: a view + permute), compiled from that file: the module itself imports the
    CUTLASS DSL (`import cutlass`), a CUDA package the CPU venv does not install."""
    import ast
    import sys

    import flashinfer

    path = Path(flashinfer.__file__).parent / "cute_dsl" / "utils.py"
    wanted = {"convert_sf_to_mma_layout", "ceil_div"}
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in body} == wanted and not any(n.decorator_list for n in body)
    module = types.ModuleType("flashinfer.cute_dsl.utils")
    module.__dict__.update(torch=torch, Tuple=tuple, Union=object, __file__=str(path))
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    sys.modules.setdefault("flashinfer.cute_dsl.utils", module)
    return sys.modules["flashinfer.cute_dsl.utils"]


@contextlib.contextmanager
def cuda_only_ops():
    """vLLM's conversion (path A) calls these CUDA-only ops; give it the CPU references."""
    import flashinfer
    import flashinfer.fp4_quantization as fp4q
    import vllm._custom_ops as ops

    cute_dsl_utils_without_cutlass()

    with (
        patched(fp4q, nvfp4_block_scale_interleave=_swizzle_128x4),
        patched(flashinfer, block_scale_interleave=_swizzle_128x4, nvfp4_block_scale_interleave=_swizzle_128x4),
        patched(ops, gptq_marlin_repack=marlin_repack_reference),
        patched(torch.Tensor, cuda=_stay_on_cpu),
    ):
        yield


def _stay_on_cpu(self, *args, **kwargs):
    """`Tensor.cuda` as identity: vLLM's `swizzle_blockscale` ends with `.cuda()` (as tools/golden)."""
    return self


@contextlib.contextmanager
def oracle_picks(backend_value: str):
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.quantization import mxfp4 as quant

    backend = oracle.Mxfp4MoeBackend(backend_value)
    with (
        patched(quant, select_mxfp4_moe_backend=lambda moe: (backend, oracle.backend_to_kernel_cls(backend)[0])),
        batched_deployment(oracle, backend_value == "BATCHED_MARLIN"),
    ):
        yield


@contextlib.contextmanager
def batched_deployment(oracle_module, on: bool):
    """A batched-activation deployment without its all2all backend (DeepEP low-latency needs CUDA and
    NVSHMEM): the oracle module's `maybe_make_prepare_finalize` returns vLLM's own
    `BatchedPrepareAndFinalize(max_num_tokens, num_local_experts, num_dispatchers=1, rank)` and, where
    the module has it, `_activation_format_for_config` answers BatchedExperts (what
    `moe_parallel_config.use_batched_activation_format` says under DeepEP low-latency)."""
    if not on:
        yield
        return
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe import all2all_utils

    def make(moe, quant_config, *args, **kwargs):
        return all2all_utils.BatchedPrepareAndFinalize(
            max_num_tokens=moe.max_num_tokens,
            num_local_experts=moe.num_local_experts,
            num_dispatchers=1,
            rank=moe.moe_parallel_config.ep_rank,
        )

    attrs = {"maybe_make_prepare_finalize": make}
    if hasattr(oracle_module, "_activation_format_for_config"):
        attrs["_activation_format_for_config"] = lambda config: mk.FusedMoEActivationFormat.BatchedExperts
    with patched(oracle_module, **attrs):
        yield


# ---- the block ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Target:
    backend: str
    cap: tuple[int, int] | None
    tp: int
    rank: int


def vllm_config():
    from vllm.config import ModelConfig, VllmConfig

    return VllmConfig(model_config=ModelConfig(model=str(EXAMPLE)))


def build_model(config):
    """A `GptOssModel` (no __init__: no attention, embedding or norm) whose layers hold vLLM's own
    `MLPBlock`s, built as `TransformerBlock` builds them, so that vLLM's `_load_weights_mxfp4` and
    `process_weights_after_loading` walk them."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.gpt_oss import GptOssModel, MLPBlock
    from vllm.utils.torch_utils import set_default_torch_dtype

    model = GptOssModel.__new__(GptOssModel)
    torch.nn.Module.__init__(model)
    layers = []
    # as BaseModelLoader.load_model: the model is built under the model's dtype (bf16 for GPT-OSS)
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype):
        for i in range(NUM_LAYERS):
            layer = torch.nn.Module()
            layer.mlp = MLPBlock(config, i, prefix=prefix(i))
            layers.append(layer)
    model.layers = torch.nn.ModuleList(layers)
    model.config = config.model_config.hf_config
    model.parallel_config = config.parallel_config
    return model


def vllm_names(weights) -> list[tuple[str, torch.Tensor]]:
    """Checkpoint names -> vLLM's (its own `hf_to_vllm_mapper`), relative to `GptOssModel`."""
    from vllm.model_executor.models.gpt_oss import GptOssForCausalLM

    return [(k.removeprefix("model."), v) for k, v in GptOssForCausalLM.hf_to_vllm_mapper.apply(weights)]


def checkpoint_weights():
    """The MoE blocks' tensors (router + experts) of the example checkpoint, one at a time as
    vLLM's safetensors iterator yields them."""
    from safetensors import safe_open

    def raw():
        for path in sorted(EXAMPLE.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():
                    if ".mlp." in k:
                        yield k, f.get_tensor(k)

    from vllm.model_executor.models.gpt_oss import GptOssForCausalLM

    return ((k.removeprefix("model."), v) for k, v in GptOssForCausalLM.hf_to_vllm_mapper.apply(raw()))


def routed_experts(model) -> list:
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod

    found = [m for m in model.modules() if isinstance(getattr(m, "quant_method", None), GptOssMxfp4MoEMethod)]
    assert len(found) == NUM_LAYERS
    return found


def run_pwal(model, config, target: Target):
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    with cuda_device(target.cap):
        process_weights_after_loading(model, config.model_config, torch.device("cpu"))


def path_a(target: Target):
    """Normal load: vLLM's GPT-OSS weight loading of the checkpoint, then its post-processing."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.gpt_oss import GptOssModel

    config = vllm_config()
    with (
        process_groups(target.tp, target.rank),
        oracle_picks(target.backend),
        cuda_device(target.cap),
        set_current_vllm_config(config),
    ):  # as vLLM's worker holds it around load_model
        model = build_model(config)
        GptOssModel._load_weights_mxfp4(model, 4, 0, checkpoint_weights(), [])
        with cuda_only_ops():
            run_pwal(model, config, target)
    return model


def path_b(
    target: Target,
    artifact: Path,
    on_mismatch: str = "fail",
    live_backend: str | None = None,
    verify_checksums: bool = True,
    prefetch_bytes: int | None = None,
):
    """The plugin: checks, shared tensors through vLLM's loading, experts from the artifact (read
    ahead with the plugin's default budget unless `prefetch_bytes` says otherwise)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.gpt_oss import GptOssModel

    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = vllm_config()
    backend = live_backend or target.backend
    with (
        process_groups(target.tp, target.rank),
        oracle_picks(backend),
        cuda_device(target.cap),
        set_current_vllm_config(config),
    ):
        budget = {} if prefetch_bytes is None else {"prefetch_bytes": prefetch_bytes}
        installer = ArtifactInstaller(artifact, on_mismatch, verify_checksums, **budget)
        installer.check_runtime(live_runtime())
        model = build_model(config)
        installer.prepare(moe_layers(model))
        shared = vllm_names(t for t in iter_shared(installer.shared_files()) if ".mlp." in t[0])
        GptOssModel._load_weights_mxfp4(model, 4, 0, shared, [])
        with installer.conversion_bypass(), cuda_only_ops():
            run_pwal(model, config, target)
    return model, installer


def plugin_load_gpt_oss(config, artifact: Path, on_mismatch: str, post_process) -> tuple:
    """The plugin's steps on a GPT-OSS model, inside the caller's worker context (process groups,
    device, oracle, current vLLM config): runtime check, vLLM's model, per-layer checks, the shared
    tensors through `GptOssModel.load_weights` (which slices the EP rank's experts itself), then
    `post_process(model)` (vLLM's post-processing) with the MoE conversion bypassed."""
    from vllm.model_executor.models.gpt_oss import GptOssModel

    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    installer = ArtifactInstaller(artifact, on_mismatch)
    installer.check_runtime(live_runtime())
    model = build_model(config)
    installer.prepare(moe_layers(model))
    shared = vllm_names(t for t in iter_shared(installer.shared_files()) if ".mlp." in t[0])
    GptOssModel.load_weights(model, shared)
    with installer.conversion_bypass():
        post_process(model)
    return model, installer


def opt_flags_state():
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags

    return dict(opt_flags._opt_flags_constraints)


def reset_opt_flags():
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags

    opt_flags.reset_opt_flags_constraints()


def state(model) -> tuple:
    """The model's snapshot and the process-wide triton_kernels opt-flag constraints."""
    return (module_snapshot(model), ("opt_flags", tuple(sorted(opt_flags_state().items()))))


# ---- snapshot -------------------------------------------------------------------------------------
#: Left out of the comparison, and why:
#: `_cache_permute_indices`: FlashInfer's permute-index cache, filled by the conversion itself
#: (path B never runs the conversion, so it stays empty).
#: `data_parallel_master_port`, `_data_parallel_master_port_list`: free ports of this host, which vLLM's
#: `ParallelConfig` picks when DP > 1 (each path builds its own config; the model keeps a reference).
IGNORED_ATTRS = frozenset({"_cache_permute_indices", "data_parallel_master_port", "_data_parallel_master_port_list"})


def tensor_facts(t: torch.Tensor) -> tuple:
    data = t.detach()
    flat = data.contiguous().reshape(-1)
    # as bytes, empty tensors too (vLLM 0.20.0-0.23.0's FusedMoE holds an empty bf16 one; numpy has no bf16)
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    return (
        "tensor",
        type(t).__name__,
        str(t.dtype),
        tuple(t.shape),
        tuple(t.stride()),
        hashlib.sha256(raw.numpy().tobytes()).hexdigest(),
        tuple(sorted((k, snapshot(v, 3)) for k, v in vars(t).items() if k != "weight_loader"))
        if hasattr(t, "__dict__")
        else (),
    )


def snapshot(obj, depth: int = 8, seen: set | None = None):
    """A comparable picture of `obj`: tensors by dtype/shape/stride/bytes/attributes, objects by
    class and (recursively) their fields."""
    seen = set() if seen is None else seen
    if isinstance(obj, (type(None), bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, torch.dtype | torch.device | torch.Size):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__name__}.{obj.name}"
    if isinstance(obj, torch.Tensor):
        return tensor_facts(obj)
    if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type)):
        return ("callable", getattr(obj, "__qualname__", repr(obj)))
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if depth <= 0:
        return ("class", type(obj).__qualname__)
    if id(obj) in seen:
        return ("cycle", type(obj).__qualname__)
    seen = seen | {id(obj)}
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(snapshot(v, depth - 1, seen) for v in obj))
    if isinstance(obj, dict):
        return (
            "dict",
            tuple(
                sorted((str(k), snapshot(v, depth - 1, seen)) for k, v in obj.items() if str(k) not in IGNORED_ATTRS)
            ),
        )
    if isinstance(obj, torch.nn.Module):
        return module_snapshot(obj, depth - 1, seen)
    fields = (
        vars(obj)
        if hasattr(obj, "__dict__")
        else {s: getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)}
    )
    return (
        "object",
        type(obj).__module__ + "." + type(obj).__qualname__,
        tuple(sorted((k, snapshot(v, depth - 1, seen)) for k, v in fields.items() if k not in IGNORED_ATTRS)),
    )


def module_snapshot(module: torch.nn.Module, depth: int = 8, seen: set | None = None):
    seen = set() if seen is None else seen
    out = {"class": type(module).__qualname__}
    out["parameters"] = {k: tensor_facts(v) for k, v in module._parameters.items() if v is not None}
    out["buffers"] = {k: tensor_facts(v) for k, v in module._buffers.items() if v is not None}
    out["modules"] = {
        k: module_snapshot(v, depth, seen | {id(module)}) for k, v in module._modules.items() if v is not None
    }
    skip = {
        "_parameters",
        "_buffers",
        "_modules",
        "training",
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
    } | IGNORED_ATTRS
    out["attrs"] = {
        k: snapshot(v, depth, seen | {id(module)})
        for k, v in vars(module).items()
        if k not in skip and not k.startswith("_forward") and not k.startswith("_backward")
    }
    return ("module", tuple((k, v if isinstance(v, str) else tuple(sorted(v.items()))) for k, v in sorted(out.items())))


def first_difference(a, b, path: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}: {str(a)[:200]} / {str(b)[:200]}"
    if isinstance(a, tuple):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}: {str(a)[:300]} / {str(b)[:300]}"
        for i, (x, y) in enumerate(zip(a, b)):
            label = x[0] if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) else str(i)
            found = first_difference(x, y, f"{path}/{label}")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {str(a)[:200]} != {str(b)[:200]}"
