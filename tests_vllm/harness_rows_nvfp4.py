"""The installed vLLM release's own NVFP4 MoE blocks (Qwen3-MoE, ModelOpt or compressed-tensors) on a CPU,
loaded the normal way (path A) or through the plugin (path B), for any release the plugin serves for NVFP4
(`dependency.PLUGIN_PROVEN`): harness_0_26_nvfp4.py's paths, made release-neutral.

Everything harness_nvfp4.py's docstring lists as vLLM's own code is the installed release's here (its
wheel's Python files), with harness_nvfp4.py's stand-ins. Where releases differ in what the *harness*
calls, it follows the release's own signature or contents, never its version number:

  * the platform: releases before 0.28.0 settle on `UnspecifiedPlatform` (harness_rows.use_cpu_platform,
    run once per session by conftest.py);
  * `ops.gptq_marlin_repack` takes the (empty) act-order `perm` up to 0.29.0: inside harness.cuda_only_ops
    its stand-in is the reference with the release's signature (harness_rows._repack_with_perm there);
  * `Qwen3MoeModel.hf_to_vllm_mapper` (harness_nvfp4.load_weights' name mapper) from 0.25.0; before, the
    model's own `Qwen3MoeModel.load_weights` maps the names (`load_weights_by_the_model`);
  * harness.py's stand-in for FlashInfer's 128x4 scale swizzle is FlashInfer's own pure-torch
    `_swizzle_sf_128x4` (flashinfer/diffusion_ops/minimax_h3_fc1_swiglu.py), a file the releases' older
    FlashInfer pins lack: there it is taken from the base venv's FlashInfer (`base_flashinfer_swizzle`);
  * vLLM 0.20.0-0.23.0's `FusedMoE` keeps the `VllmConfig` (whose random `instance_id` is fixed,
    harness_rows.same_instance) and 0.21.0 numbers the MoE layers of the process (harness_rows.fresh_process_counters);
  * `fused_moe/all2all_utils.py` imports `BatchedPrepareAndFinalize` (which harness.batched_deployment
    builds for CuteDSL batched) from 0.27.0; vLLM 0.26.0 has it only in
    `fused_moe/prepare_finalize/batched.py` (0.15.0-0.19.1: `fused_moe/fused_batched_moe.py`), so it is
    put there under that name (the object all2all_utils holds from 0.27.0);
  * vLLM 0.15.0-0.17.1's `CpuPlatform.import_kernels` asks torch 2.10's `torch._C._cpu._is_avx512_supported`
    (the base venv's torch: `torch.cpu._is_avx512_supported`, the same question), put there for the import;
  * vLLM 0.15.0-0.19.1's `CpuPlatform` has no `num_compute_units` (Marlin's workspace size): 0.24.0's
    answer, `torch.get_num_threads()`, stands in (`cpu_compute_units`);
  * vLLM 0.15.0-0.16.0's Marlin workspace asks torch.cuda for the SM count (`device_properties_for_marlin`);
  * vLLM 0.15.0-0.16.0's FlashInfer has no `convert_sf_to_mma_layout` for harness.py to stand in
    (`cute_dsl_utils_of_the_release`);
  * vLLM 0.15.0-0.16.0's `backend_to_kernel_cls` (which harness_nvfp4.oracle_picks asks) returns one class, and
    nothing for FLASHINFER_TRTLLM (`kernel_classes`);
  * vLLM 0.15.0-0.19.1 keep the compressed-tensors NVFP4 MoE method in compressed_tensors_moe.py (the
    release's adapter names it, `nvfp4_ct_module`, which harness_nvfp4.oracle_picks patches), and their
    FLASHINFER_CUTEDSL is the batched kernel (`cutedsl_batched_only`): it runs there in harness.py's
    batched deployment (harness_nvfp4.BATCHED_BACKENDS), from the row's `--backend flashinfer_cutedsl
    --batched` artifact (0.15.0-0.16.0: `ARGS_WITHOUT_NAMES`), and that release has no
    FLASHINFER_CUTEDSL_BATCHED to run.

Expert parallelism (`ep_path_a`, `ep_path_b`): `--tensor-parallel-size 2 --enable-expert-parallel` as
test_ep.py runs it in vLLM 0.33.0 (vLLM's own `ParallelConfig`, the EP group spanning the TP ranks), in the
release's own MoE layers, weight loading and post-processing, against the `--ep 2` artifact.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import harness as H
import harness_nvfp4 as N
import harness_rows as R
import torch

#: The vLLM release this harness drives: the venv's.
RELEASE = R.RELEASE


def runtime_args(release: str | None = RELEASE) -> tuple[str, ...]:
    """`mxconvert convert` arguments of the artifacts the tests load: the NVFP4 row that covers `release`."""
    return ("--runtime", f"vllm=={release}")


def nvfp4_row(release: str | None = RELEASE):
    """The runtime revision row `convert --runtime vllm==X.Y.Z` writes for an NVFP4 checkpoint."""
    from mxconvert.target.releases import row_for_release

    row = row_for_release(release or "", "nvfp4")
    assert row is not None, f"no row covers vLLM {release} for NVFP4"
    return row


def written_backends(release: str | None = RELEASE) -> dict[str, tuple[str, tuple[str, ...], tuple[int, int]]]:
    """harness_nvfp4.BACKENDS less the backends the release's NVFP4 row leaves unproven (its
    `unproven_layouts`: `convert` refuses to write them for that row) and, in the live release, those the
    CPU does not stand in (`not_stood_in`) and the one it has no `NvFp4MoeBackend` for
    (FLASHINFER_CUTEDSL_BATCHED where `cutedsl_batched_only`: there the row's FLASHINFER_CUTEDSL is the
    batched artifact, `--backend flashinfer_cutedsl --batched`)."""
    unproven = {backend for backend, _ in nvfp4_row(release).unproven_layouts}
    args_of = {b: args for b, (_, args, _) in N.BACKENDS.items()}
    if release == RELEASE:
        unproven |= set(not_stood_in())
        if cutedsl_batched_only():
            unproven.add("FLASHINFER_CUTEDSL_BATCHED")
            args_of["FLASHINFER_CUTEDSL"] = args_of["FLASHINFER_CUTEDSL_BATCHED"]
        if not names_backends():
            args_of |= ARGS_WITHOUT_NAMES
    return {b: (profile, args_of[b], cap) for b, (profile, _, cap) in N.BACKENDS.items() if b not in unproven}


#: `convert` arguments for releases whose NVFP4 oracle takes no backend name (vLLM 0.15.0-0.16.0; mxconvert's
#: mirror, selection/vllm/nvfp4_0_15.py, knows only `auto` and the printed names there): the printed name, and
#: the env overrides that make that oracle pick it (FLASHINFER_CUTEDSL: `masked_gemm`, in a batched deployment).
ARGS_WITHOUT_NAMES = {
    "FLASHINFER_CUTLASS": (
        "--backend",
        "FLASHINFER_CUTLASS",
        "--env",
        "VLLM_USE_FLASHINFER_MOE_FP4=1",
        "--env",
        "VLLM_FLASHINFER_MOE_BACKEND=throughput",
    ),
    "VLLM_CUTLASS": ("--backend", "VLLM_CUTLASS", "--env", "VLLM_USE_FLASHINFER_MOE_FP4=0"),
    "FLASHINFER_CUTEDSL": (
        "--backend",
        "FLASHINFER_CUTEDSL",
        "--batched",
        "--env",
        "VLLM_USE_FLASHINFER_MOE_FP4=1",
        "--env",
        "VLLM_FLASHINFER_MOE_BACKEND=masked_gemm",
    ),
}


def names_backends() -> bool:
    """Whether the live release's NVFP4 oracle takes a backend by name (`map_nvfp4_backend`, fused_moe/oracle/
    nvfp4.py, from 0.17.0), read from its file as `cutedsl_batched_only`."""
    return "def map_nvfp4_backend(" in _oracle_file().read_text()


def _oracle_file() -> Path:
    """The live release's fused_moe/oracle/nvfp4.py (read, not imported: the tests are collected before
    conftest.py settles vLLM's platform)."""
    import importlib.metadata

    return Path(
        str(importlib.metadata.distribution("vllm").locate_file("vllm/model_executor/layers/fused_moe/oracle/nvfp4.py"))
    )


@functools.cache
def cutedsl_batched_only() -> bool:
    """Whether the live release has no FLASHINFER_CUTEDSL_BATCHED (fused_moe/oracle/nvfp4.py `NvFp4MoeBackend`,
    from 0.20.0; vLLM 0.15.0-0.19.1): there FLASHINFER_CUTEDSL is the batched kernel (`FlashInferCuteDSLExperts`
    takes the batched activation format only), run in harness.py's batched deployment."""
    import ast

    (enum,) = (
        n
        for n in ast.parse(_oracle_file().read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "NvFp4MoeBackend"
    )
    members = {t.id for n in enum.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert "FLASHINFER_CUTEDSL" in members, members
    return "FLASHINFER_CUTEDSL_BATCHED" not in members


def not_stood_in() -> dict[str, str]:
    """Backends the live release's row writes that the CPU does not stand in here -> why (each named in the
    release's record by test_release_rows_nvfp4.py). vLLM 0.15.0-0.15.1's `make_nvfp4_moe_kernel`
    (fused_moe/oracle/nvfp4.py) always builds `MoEPrepareAndFinalizeNoEP` (standard activation format),
    so their FLASHINFER_CUTEDSL (batched only) is built only by `make_nvfp4_moe_kernel_for_mkm`, the modular
    kernel vLLM makes from a DeepEP low-latency all2all manager after loading (CUDA and NVSHMEM); from 0.16.0
    `maybe_make_prepare_finalize` builds it, which harness.batched_deployment stands in."""
    if cutedsl_batched_only() and "prepare_finalize = MoEPrepareAndFinalizeNoEP(" in _oracle_file().read_text():
        return {
            "FLASHINFER_CUTEDSL": (
                f"vLLM {RELEASE} builds its batched CuteDSL kernel only from a DeepEP low-latency all2all "
                "manager (make_nvfp4_moe_kernel_for_mkm), which needs CUDA and NVSHMEM"
            )
        }
    return {}


@contextlib.contextmanager
def release() -> Iterator[None]:
    """The release's stand-ins around harness_nvfp4's paths (this module's docstring)."""
    # vLLM 0.15.0-0.17.1's `CpuPlatform.import_kernels` (run by importing `_custom_ops`) asks
    # `torch._C._cpu._is_avx512_supported`, which the base venv's torch has as `torch.cpu._is_avx512_supported`
    cpu = torch._C._cpu
    avx512 = {} if hasattr(cpu, "_is_avx512_supported") else {"_is_avx512_supported": torch.cpu._is_avx512_supported}
    with H.patched(cpu, **avx512):
        import vllm._custom_ops as ops

    R.use_cpu_platform()
    original = H.cuda_only_ops
    takes_perm = "perm" in inspect.signature(ops.gptq_marlin_repack).parameters  # the release's own op
    repack = R._repack_with_perm if takes_perm else H.marlin_repack_reference

    @contextlib.contextmanager
    def cuda_only_ops_of_the_release():
        with original(), H.patched(ops, gptq_marlin_repack=repack):
            yield

    from vllm.model_executor.layers.fused_moe import all2all_utils

    try:
        from vllm.model_executor.layers.fused_moe.prepare_finalize.batched import BatchedPrepareAndFinalize
    except ImportError:  # vLLM 0.15.0-0.19.1: fused_moe/fused_batched_moe.py
        from vllm.model_executor.layers.fused_moe.fused_batched_moe import BatchedPrepareAndFinalize
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeModel
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform

    mapped = hasattr(Qwen3MoeModel, "hf_to_vllm_mapper")
    # Marlin's workspace (`marlin_make_workspace_new`) sizes by `num_compute_units`: vLLM 0.15.0-0.19.1's
    # CpuPlatform has none; 0.24.0's answers `torch.get_num_threads()`, given to them here (both paths)
    units = {} if "num_compute_units" in vars(CpuPlatform) else {"num_compute_units": cpu_compute_units}
    # DeepSeek's NVFP4 shared experts only (never built here): vLLM 0.15.0-0.19.1 have no kernels/linear/nvfp4/
    try:
        has_linear_kernels = importlib.util.find_spec("vllm.model_executor.kernels.linear.nvfp4") is not None
    except ModuleNotFoundError:  # no vllm/model_executor/kernels/ at all (0.15.0-0.16.0)
        has_linear_kernels = False
    linear_kernels = N.nvfp4_linear_kernels_on_cpu if has_linear_kernels else contextlib.nullcontext
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    original_config = N.vllm_config
    batched = N.BATCHED_BACKENDS | ({"FLASHINFER_CUTEDSL"} if cutedsl_batched_only() else set())
    R.fresh_process_counters()
    with (
        H.patched(N, BATCHED_BACKENDS=frozenset(batched)),
        H.patched(oracle, backend_to_kernel_cls=kernel_classes(oracle.backend_to_kernel_cls)),
        H.patched(H, cute_dsl_utils_without_cutlass=cute_dsl_utils_of_the_release(H.cute_dsl_utils_without_cutlass)),
        H.patched(N, vllm_config=lambda target: R.same_instance(original_config(target))),
        module_in_place(base_flashinfer_swizzle()),
        H.patched(H, cuda_only_ops=cuda_only_ops_of_the_release),
        H.patched(all2all_utils, BatchedPrepareAndFinalize=BatchedPrepareAndFinalize),  # the same class from 0.27.0
        H.patched(N, load_weights=N.load_weights if mapped else load_weights_by_the_model),
        H.patched(N, nvfp4_linear_kernels_on_cpu=linear_kernels),
        H.patched(current_platform, **units),
        H.patched(torch.cuda, **device_properties_for_marlin()),
    ):
        yield


def kernel_classes(of_the_release):
    """harness_nvfp4.oracle_picks answers with `backend_to_kernel_cls(backend)[0]`, the first of the list the
    release's oracle (fused_moe/oracle/nvfp4.py) returns from 0.17.0. vLLM 0.15.0-0.16.0's returns one class,
    and for FLASHINFER_TRTLLM raises NotImplementedError (no modular kernel: their `select_nvfp4_moe_backend`
    answers `(FLASHINFER_TRTLLM, None)` and the method applies the monolithic kernel itself): given to the
    harness as a one-item list, `[None]` for TRTLLM (only `select_nvfp4_moe_backend` calls it, and the
    harness replaces that)."""
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

    if isinstance(of_the_release(NvFp4MoeBackend.MARLIN), list):
        return of_the_release

    def as_list(backend):
        if backend == NvFp4MoeBackend.FLASHINFER_TRTLLM:
            return [None]
        return [of_the_release(backend)]

    return as_list


def cute_dsl_utils_of_the_release(stand_in):
    """harness.cute_dsl_utils_without_cutlass (`flashinfer.cute_dsl.utils` with FlashInfer's own
    `convert_sf_to_mma_layout`), where the release's FlashInfer has that function; vLLM 0.15.0-0.16.0 pin
    FlashInfer 0.6.1 / 0.6.3, whose cute_dsl/utils.py has none, and their vLLM reads none (their CuteDSL is
    not run here, `cutedsl_batched_only`): nothing stands in there."""
    import importlib.metadata

    utils = Path(str(importlib.metadata.distribution("flashinfer-python").locate_file("flashinfer/cute_dsl/utils.py")))
    if "def convert_sf_to_mma_layout(" in utils.read_text():
        return stand_in
    return lambda: None


def device_properties_for_marlin() -> dict:
    """vLLM 0.15.0-0.16.0's `marlin_make_workspace_new` (quantization/utils/marlin_utils.py) sizes Marlin's
    workspace by `torch.cuda.get_device_properties(device).multi_processor_count` (0.17.0 asks
    `num_compute_units`): `cpu_compute_units` answers there too (both paths), where the release's function
    asks torch."""
    import types

    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_make_workspace_new

    if "torch.cuda.get_device_properties" not in inspect.getsource(marlin_make_workspace_new):
        return {}
    return {
        "get_device_properties": lambda device=None: types.SimpleNamespace(multi_processor_count=cpu_compute_units())
    }


def cpu_compute_units(device_id: int = 0) -> int:
    """vLLM 0.24.0's `CpuPlatform.num_compute_units` (vllm/platforms/cpu.py)."""
    return torch.get_num_threads()


@contextlib.contextmanager
def module_in_place(module: types.ModuleType) -> Iterator[None]:
    """`module` in sys.modules under its name inside, what was there (or nothing) after."""
    name = module.__name__
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def base_flashinfer_swizzle() -> types.ModuleType:
    """harness._swizzle_128x4's reference, `flashinfer.diffusion_ops.minimax_h3_fc1_swiglu._swizzle_sf_128x4`
    (pure torch), from the FlashInfer of the release's own venv where it has that module, else from the
    base venv's FlashInfer (vLLM 0.33.0's pin; the release's older FlashInfer has no such file): that one
    function and the tile constant it reads, compiled from the file (the module itself imports FlashInfer's
    JIT kernels)."""
    import ast

    with contextlib.suppress(ImportError):
        return importlib.import_module("flashinfer.diffusion_ops.minimax_h3_fc1_swiglu")
    relative = Path("flashinfer", "diffusion_ops", "minimax_h3_fc1_swiglu.py")
    path = next(Path(p) / relative for p in sys.path if (Path(p) / relative).is_file())
    tree = ast.parse(path.read_text())
    body: list[ast.stmt] = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name == "_swizzle_sf_128x4")
        or (isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["_SF_TILE_ROWS"])
    ]
    assert sorted(type(n).__name__ for n in body) == ["Assign", "FunctionDef"], body
    assert not any(n.decorator_list for n in body if isinstance(n, ast.FunctionDef))
    module = types.ModuleType("flashinfer.diffusion_ops.minimax_h3_fc1_swiglu")
    module.__dict__.update(torch=torch, __file__=str(path))
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module


def load_weights_by_the_model(model, weights) -> set[str]:
    """harness_nvfp4.load_weights for releases whose `Qwen3MoeModel` has no `hf_to_vllm_mapper` (before 0.25.0):
    the release's own `Qwen3MoeModel.load_weights` (stacked and expert params mappings, its
    `get_expert_mapping`) on the MoE layers' tensors, with the attributes it reads of the model (`config`,
    `quant_config` (read by 0.20.0-0.23.0), `num_redundant_experts`: 0, as its __init__ sets them without
    EPLB) held only for the call."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeModel

    moe = tuple(f"model.layers.{i}.mlp." for i, layer in enumerate(model.layers) if hasattr(layer, "mlp"))
    names = ((k.removeprefix("model."), v) for k, v in weights if k.startswith(moe))
    vllm_config = get_current_vllm_config()
    mapping = functools.partial(Qwen3MoeModel.get_expert_mapping, model)
    held = {"config": vllm_config.model_config.hf_config, "quant_config": vllm_config.quant_config}
    with H.patched(model, **held, num_redundant_experts=0, get_expert_mapping=mapping):
        return Qwen3MoeModel.load_weights(model, names)


def path_a(target: N.Target):
    with release():
        return N.path_a(target)


def path_b(target: N.Target, artifact: Path, **kwargs):
    with release():
        return N.path_b(target, artifact, **kwargs)


# ---- expert parallelism ----------------------------------------------------------------------------
def ep_config(target: N.Target):
    """vLLM's own `VllmConfig` of `--tensor-parallel-size target.tp --enable-expert-parallel` (executor "mp",
    as test_ep.py) for the target's checkpoint."""
    from vllm.config import ParallelConfig, VllmConfig

    parallel = ParallelConfig(
        tensor_parallel_size=target.tp, enable_expert_parallel=True, distributed_executor_backend="mp"
    )
    return R.same_instance(VllmConfig(model_config=N.model_config(target.path), parallel_config=parallel))


@contextlib.contextmanager
def ep_worker(target: N.Target, config) -> Iterator[None]:
    """Rank `target.rank` of a TP=`target.tp` group with expert parallelism: vLLM's EP group spans the TP ranks
    (as test_ep.py), each group with the worker's global rank (harness_rows.ep_worker)."""
    import vllm.distributed.parallel_state as ps
    from vllm.config import set_current_vllm_config

    R.fresh_process_counters()
    with (
        H.process_groups(target.tp, target.rank, ep=target.tp, ep_rank=target.rank),
        N.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
        N.nvfp4_linear_kernels_on_cpu(),
    ):
        for name in ("_TP", "_DP", "_PCP", "_EP", "_PP"):
            getattr(ps, name).rank = target.rank
        yield


def ep_path_a(target: N.Target):
    """The release's weight loading of the checkpoint in its EP worker (the experts' weight loaders keep the
    rank's experts), then its post-processing."""
    with release():
        config = ep_config(target)
        with ep_worker(target, config):
            model = N.build_model(config)
            N.load_weights(model, N.checkpoint_weights(target.path))
            with H.cuda_only_ops():
                N.run_pwal(model, config, target)
    return model


def ep_path_b(target: N.Target, artifact: Path):
    """The plugin on the `--ep` artifact in the release's EP worker (harness_nvfp4.path_b's steps)."""
    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    with release():
        config = ep_config(target)
        with ep_worker(target, config):
            installer = ArtifactInstaller(artifact, "fail", True)
            installer.check_runtime(live_runtime())
            model = N.build_model(config)
            installer.prepare(moe_layers(model))
            N.load_weights(model, iter_shared(installer.shared_files()))
            with installer.conversion_bypass(), H.cuda_only_ops():
                N.run_pwal(model, config, target)
    return model, installer
