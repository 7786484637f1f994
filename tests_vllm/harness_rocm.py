"""The installed vLLM release's own GPT-OSS MoE block on a CPU standing in for an AMD Instinct GPU (ROCm
gfx950 / gfx942), loaded the normal way (path A) or through the mxconvert plugin (path B): vLLM 0.33.0 in
test_rocm.py, every release the plugin serves for MXFP4 in test_release_rows_backends.py (0.19.0-0.32.0 in their
thin venvs). What follows names 0.33.0's code; the other releases run the same-named code of their own wheel
(their `vllm.platforms.rocm` arch flags, `vllm._aiter_ops`, oracle and conversion), with the release-neutral
pieces of harness_rows.py: `routed_experts` (0.19.x's `Mxfp4MoEMethod`), `same_instance` and
`fresh_process_counters` (what 0.20.0-0.23.0's `FusedMoE` holds or counts), each group's global `rank` (read by
0.24.0's `load_weights`). Releases differ only in data read here, never by a version test: the backend's name in
the release's `Mxfp4MoeBackend` (0.19.x "CK", 0.20.0-0.21.0 "AITER": `picked_backends` maps it with
`Mxfp4Backend.parse`), and AITER's shuffle file, taken from the base venv (`BASE_VENV`), whose site-packages
every thin venv appends.

vLLM's own code here is everything harness.py lists (config, `MLPBlock`, `GptOssMxfp4MoEMethod`,
GPT-OSS weight loading, the loader's `process_weights_after_loading`), and in addition, unlike the
CUDA cases, vLLM's own MXFP4 oracle `select_mxfp4_moe_backend`: it walks its GPT-OSS priority list
and asks every kernel class's `is_supported_config` (AITER CK: `rocm_aiter_ops.is_fused_moe_enabled()`
and `on_gfx950()`; AITER Triton: `rocm_aiter_ops.is_enabled()` and the gfx; OAI Triton: `on_gfx9()`),
so the backend each test runs is the one vLLM itself picks on that device (asserted equal to the
artifact's). The conversion is vLLM's `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` with its
ROCm branches: `_swizzle_mxfp4` (StridedLayout weights; CDNA4MXScaleLayout scales on gfx950 at TP <= 2
by `should_use_cdna4_mx_scale_swizzle()`, StridedLayout otherwise) and the AITER CK de-interleave +
`rocm_aiter_ops.shuffle_weight_a16w4` / `shuffle_scale_a16w4`.

What is stood in (beyond harness.py's process groups and `torch.accelerator` answers):
  * `aiter.ops.shuffle` (AITER is a ROCm package; `import aiter` needs ROCm): the module file
    `aiter/ops/shuffle.py` read out of the amd-aiter 0.1.7.post2.dev18 wheel (pure torch; AITER's
    real code, as tools/golden/mxfp4_vllm_backends.py uses it; tools/vllm_env/setup.sh extracts it
    into .venv-vllm/aiter-0.1.7.post2.dev18/, its sha256 is checked here), registered as
    `aiter`, `aiter.ops`, `aiter.ops.shuffle` in sys.modules inside `rocm_device()` only;
  * the gfx arch: `vllm.platforms.rocm` is imported (and re-imported when the arch changes) while
    `torch.cuda.get_device_properties` answers `gcnArchName = "<gfx>:sramecc+:xnack-"` -- vLLM's own
    fallback query when amdsmi is absent -- so its module-level `_GCN_ARCH` / `_ON_GFX950` / ... and
    `on_gfx950()`, `on_gfx942()`, `get_cdna_version()` are computed by vLLM's own code; the plugin's
    `live_runtime()` reads the same answer;
  * `current_platform` (vLLM's CpuPlatform instance) answers as ROCm: `is_rocm()` True, `is_cuda()`
    and `is_cpu()` False, `is_cuda_alike()` True, and the device capability vLLM derives from the arch
    (`_capability_from_gcn_arch`: gfx950 -> 9.5, gfx942 -> 9.4);
  * AITER availability: `vllm._aiter_ops.IS_AITER_FOUND` (a `find_spec("aiter")` taken at import)
    is True, and `rocm_aiter_ops.refresh_env_variables()` (vLLM's own hook for tests) re-reads
    `VLLM_ROCM_USE_AITER` as the profile sets it (`mi355x-aiter`: 1; `mi355x`: unset);
  * triton_kernels' target queries in `tensor_details.layout`: `cuda_capability_geq` False,
    `is_hip_cdna4` True on gfx950 (vLLM 0.33.0 with triton_kernels 3.5.1 names the layout classes
    itself on ROCm, so these are not consulted for the layout; set for consistency).
No CUDA-only op is reached on these paths (no Marlin repack, no FlashInfer), so none is substituted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

import harness as H
import harness_rows as RR
import torch

#: The 0.33.0 base venv (.venv-vllm): `sys.prefix` there, and the venv whose site-packages a release's thin venv
#: appends (tools/vllm_env/release_env.sh `zz_deps.pth`; torch is always the base's).
BASE_VENV = Path(torch.__file__).resolve().parents[4]
#: `aiter/ops/shuffle.py` of the amd-aiter 0.1.7.post2.dev18 wheel (tools/vllm_env/setup.sh puts it in the base).
AITER_SHUFFLE = BASE_VENV / "aiter-0.1.7.post2.dev18" / "aiter" / "ops" / "shuffle.py"
AITER_SHUFFLE_SHA256 = "8cbf0cf9a78cf9d6dc1e8fb75d64f6e67bf0dad7f2c24c41b07e50171905f37d"


@dataclasses.dataclass
class RocmTarget:
    backend: str  # the backend vLLM's own oracle must pick (the artifact's)
    gfx: str  # "gfx950" (MI355X) / "gfx942" (MI300X)
    aiter: bool  # VLLM_ROCM_USE_AITER=1
    tp: int
    rank: int
    moe_backend: str = "auto"  # vLLM's --moe-backend
    expert_parallel: bool = False  # --enable-expert-parallel
    dp: int = 1  # --data-parallel-size (this worker is DP rank `dp_rank`)
    dp_rank: int = 0

    @contextlib.contextmanager
    def groups(self):
        """The worker's process groups. vLLM's EP group spans DP x TP (parallel_state), at the
        flattened rank; a TP-only worker's MoE layers never ask for it (left at size 1, as harness.py).
        Its all2all manager is asked for its world size only: at DP > 1 without expert parallelism,
        vLLM's `maybe_make_prepare_finalize` falls back to the naive all-gather / reduce-scatter
        dispatch over that group (`num_dispatchers`)."""
        import vllm.distributed.parallel_state as ps

        flat = self.expert_parallel or self.dp > 1
        ep, ep_rank = (self.dp * self.tp, self.dp_rank * self.tp + self.rank) if flat else (1, 0)
        with H.process_groups(self.tp, self.rank, ep=ep, ep_rank=ep_rank, dp=self.dp, dp_rank=self.dp_rank):
            for name in ("_TP", "_DP", "_PCP", "_EP", "_PP"):  # the worker's global rank (harness_rows.process_groups)
                getattr(ps, name).rank = self.dp_rank * self.tp + self.rank
            manager = types.SimpleNamespace(world_size=ep, rank=ep_rank)
            ps._EP.device_communicator = types.SimpleNamespace(all2all_manager=manager)
            yield


def aiter_shuffle_module(path: Path = AITER_SHUFFLE) -> types.ModuleType:
    """AITER's own `aiter/ops/shuffle.py`, loaded from the file under its module name."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: run `bash tools/vllm_env/setup.sh`")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == AITER_SHUFFLE_SHA256, f"{path}: sha256 {digest}, expected amd-aiter 0.1.7.post2.dev18's"
    spec = importlib.util.spec_from_file_location("aiter.ops.shuffle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def aiter_modules(path: Path = AITER_SHUFFLE):
    """`aiter`, `aiter.ops`, `aiter.ops.shuffle` in sys.modules (only the shuffle file is real;
    bench/bench_vs_vllm.py uses the same stand-in)."""
    shuffle = aiter_shuffle_module(path)
    mods = {
        "aiter": types.ModuleType("aiter"),
        "aiter.ops": types.ModuleType("aiter.ops"),
        "aiter.ops.shuffle": shuffle,
    }
    for name in ("aiter", "aiter.ops"):
        mods[name].__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mods[name].__path__ = []
    mods["aiter"].ops = mods["aiter.ops"]  # type: ignore[attr-defined]
    mods["aiter.ops"].shuffle = shuffle  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def device_properties(gfx: str):
    """What `torch.cuda.get_device_properties` reports on a ROCm build for this arch."""
    return types.SimpleNamespace(gcnArchName=f"{gfx}:sramecc+:xnack-", name="AMD Instinct (stand-in)")


def rocm_platform_module(gfx: str) -> types.ModuleType:
    """`vllm.platforms.rocm` with its module-level arch flags computed for `gfx` by vLLM's own code."""
    with H.patched(torch.cuda, get_device_properties=lambda *a, **k: device_properties(gfx)):
        module = sys.modules.get("vllm.platforms.rocm")
        if module is None:
            module = importlib.import_module("vllm.platforms.rocm")
        elif module._GCN_ARCH.split(":")[0] != gfx:
            module = importlib.reload(module)
    assert module._GCN_ARCH.split(":")[0] == gfx
    return module


@contextlib.contextmanager
def aiter_env(enabled: bool):
    """VLLM_ROCM_USE_AITER as the profile sets it, re-read by vLLM's `refresh_env_variables()`."""
    import vllm._aiter_ops as aiter_ops  # imported before any `aiter` stand-in: its find_spec stays honest

    saved = os.environ.get("VLLM_ROCM_USE_AITER")
    os.environ.pop("VLLM_ROCM_USE_AITER", None)
    if enabled:
        os.environ["VLLM_ROCM_USE_AITER"] = "1"
    try:
        with H.patched(aiter_ops, IS_AITER_FOUND=True):
            aiter_ops.rocm_aiter_ops.refresh_env_variables()
            yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_ROCM_USE_AITER", None)
        else:
            os.environ["VLLM_ROCM_USE_AITER"] = saved
        aiter_ops.rocm_aiter_ops.refresh_env_variables()


@contextlib.contextmanager
def rocm_device(gfx: str, aiter: bool):
    """`current_platform`, vLLM's ROCm arch queries, AITER and triton_kernels answer as `gfx`."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    rocm = rocm_platform_module(gfx)
    dc = DeviceCapability(*rocm._capability_from_gcn_arch(gfx))

    def as_int(c):
        return c[0] * 10 + c[1] if isinstance(c, tuple) else int(c)

    tk_layout = importlib.import_module("triton_kernels.tensor_details.layout")
    with (
        H.patched(
            current_platform,
            is_cuda=lambda: False,
            is_rocm=lambda: True,
            is_cuda_alike=lambda: True,
            is_cpu=lambda: False,
            get_device_capability=lambda device_id=0: dc,
            is_device_capability=lambda c, device_id=0: as_int(c) == dc.to_int(),
            is_device_capability_family=lambda c, device_id=0: as_int(c) // 10 == dc.to_int() // 10,
            has_device_capability=lambda c, device_id=0: dc.to_int() >= as_int(c),
        ),
        H.patched(torch.cuda, get_device_properties=lambda *a, **k: device_properties(gfx)),
        H.patched(tk_layout, cuda_capability_geq=lambda major, minor=0: False, is_hip_cdna4=lambda: gfx == "gfx950"),
        H.patched(
            torch.accelerator,
            current_device_index=lambda: "cpu",
            empty_cache=lambda: None,
            max_memory_allocated=lambda *a, **k: 0,
        ),
        aiter_env(aiter),
        aiter_modules(),
    ):
        yield


def vllm_config(target: RocmTarget):
    from vllm.config import KernelConfig, ModelConfig, ParallelConfig, VllmConfig

    parallel = ParallelConfig(
        tensor_parallel_size=target.tp,
        data_parallel_size=target.dp,
        data_parallel_rank=target.dp_rank,
        enable_expert_parallel=target.expert_parallel,
        distributed_executor_backend="mp",
    )
    return VllmConfig(
        model_config=ModelConfig(model=str(H.EXAMPLE)),
        parallel_config=parallel,
        kernel_config=KernelConfig(moe_backend=target.moe_backend),
    )


def picked_backends(model) -> set[str]:
    """The backends vLLM's oracle picked for the MoE layers, by mxconvert's names (`Mxfp4Backend.parse`: vLLM
    0.19.x's enum calls AITER_MXFP4_BF16 "CK")."""
    from mxconvert.target.backends import Mxfp4Backend

    return {Mxfp4Backend.parse(m.quant_method.mxfp4_backend.value).value for m in RR.routed_experts(model)}


def path_a(target: RocmTarget):
    """Normal load on the stand-in device: vLLM's oracle, GPT-OSS weight loading, post-processing."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.gpt_oss import GptOssModel

    config = RR.same_instance(vllm_config(target))
    RR.fresh_process_counters()
    with target.groups(), rocm_device(target.gfx, target.aiter), set_current_vllm_config(config):
        model = H.build_model(config)
        assert picked_backends(model) == {target.backend}, picked_backends(model)
        GptOssModel.load_weights(model, H.checkpoint_weights())
        H.run_pwal(model, config, H.Target(target.backend, None, target.tp, target.rank))
    return model


def path_b(target: RocmTarget, artifact: Path, on_mismatch: str = "fail"):
    """The plugin on the stand-in device: checks, shared tensors through vLLM, experts from the artifact."""
    from vllm.config import set_current_vllm_config

    config = RR.same_instance(vllm_config(target))
    RR.fresh_process_counters()
    with target.groups(), rocm_device(target.gfx, target.aiter), set_current_vllm_config(config):
        return H.plugin_load_gpt_oss(
            config,
            artifact,
            on_mismatch,
            lambda model: H.run_pwal(model, config, H.Target(target.backend, None, target.tp, target.rank)),
        )
