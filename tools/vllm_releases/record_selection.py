#!/usr/bin/env python3
"""Selection records: what one vLLM release's OWN backend selection picks, run on CPU.

    python tools/vllm_releases/record_selection.py mxfp4 0.19.0 0.26.0 ...   # or `all`
    python tools/vllm_releases/record_selection.py nvfp4 0.15.0 ...

For each release it builds (or reuses) a Python environment holding that release's vLLM files
(`release_env.py`: the cached wheel installed with `--no-deps`, compiled libraries dropped, torch
and the other imports from .venv-vllm), runs itself there with `--inside`, and writes
tests/golden/selection/vllm-X.Y.Z-FORMAT.json: for every built-in device profile x `--moe-backend`
request ("auto" and every name the release's `map_*_backend` accepts) x deployment, the backend
and kernel class the release's selection returns, or that it raises. tests/test_selection_records.py
holds mxconvert's rows to every entry with no vLLM installed.

What is the release's own code: the format's oracle (`vllm/model_executor/layers/fused_moe/oracle/
mxfp4.py` from 0.19.0; `oracle/nvfp4.py`) and everything it calls (the backend name map, priority
lists, env overrides, `backend_to_kernel_cls`, every expert class's `is_supported_config` and
`_supports_*`), `FusedMoEConfig` and `FusedMoEParallelConfig` (its `use_*` properties decide
all2all, batched format and the FlashInfer NVLink kinds), and `vllm.envs` (VLLM_* overrides are set
in the process environment, as a user would).

The profiles are the built-in ones and `PROFILE_VARIANTS` (a built-in profile with a library flag
changed). What is stood in, per profile, and only this (a CPU has no GPU or CUDA libraries to ask):
  * `current_platform`: is_cuda / is_rocm / is_xpu / is_cpu / is_cuda_alike and the capability
    queries answer as the profile (ROCm profiles report vLLM's pseudo-capability, 9.4 / 9.5);
  * the CPU the `cpu` profile stands for: x86-64 with AMX tiles (`get_cpu_architecture`,
    `torch.cpu._is_amx_tile_supported`; 0.33.0's CPUExpertsMxfp4 asks both), as mxconvert assumes;
  * the gfx predicates `on_gfx9 / on_gfx1x / on_gfx942 / on_gfx950 / on_gfx1100 / on_gfx1250` of
    `vllm.platforms.rocm`, wherever a vLLM module holds them (the rocm module cannot be imported
    without an AMD GPU, so a module of that name holds them when it fails);
  * `rocm_aiter_ops.is_enabled / is_fused_moe_enabled`: ROCm and the profile's
    VLLM_ROCM_USE_AITER / VLLM_ROCM_USE_AITER_MOE;
  * the library probes in `PROBES` (`has_flashinfer`, `has_triton_kernels`, ...), wherever a vLLM
    module holds them by name: the profile's fields (the `extra` keys mxconvert's predicates read
    for the probes a profile has no field for);
  * `_user_moe_activation_override()` (the `quantization_config.moe.activation` of releases that
    have it): the deployment's `activation`;
  * the current `VllmConfig` (read by the FlashInfer MoE-EP classes of NVFP4 from 0.32.0): vLLM's
    default one;
  * the `FusedMoEConfig` the oracle reads: vLLM's own dataclass with the format's model fields
    (`MODEL`), the deployment's parallel config, `is_lora_enabled`, and `moe_backend` = the request.
Per-release differences in what is called or stood in are rows of `ERAS`, nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "tests" / "golden" / "selection"
GENERATOR = "tools/vllm_releases/record_selection.py"
SCHEMA = "mxconvert.selection-record/2"

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))


@dataclasses.dataclass(frozen=True)
class Era:
    """What differs, for the recorder, from the release `first` on (until the next era)."""

    first: str
    #: The oracle module and the function that selects for the model (GPT-OSS for MXFP4).
    oracle: str
    entry: str
    #: The backend-name map whose refusal lists the names ("Expected one of [...]"); None: the
    #: release takes no name for this format (only "auto" is recorded).
    name_map: str | None
    #: Whether the oracle has `_user_moe_activation_override` (the `activation` deployment).
    activation_override: bool
    #: The VLLM_* settings the oracle reads, one recorded deployment each ("env-VAR=VALUE,...").
    env_cases: tuple[tuple[tuple[str, str], ...], ...] = ()
    #: Env cases recorded with LoRA too (the LoRA branch of 0.19-0.20 reads VLLM_MXFP4_USE_MARLIN).
    lora_env: tuple[tuple[tuple[str, str], ...], ...] = ()
    #: The oracle's classes read the current VllmConfig (0.32.0's FlashInfer MoE-EP classes): run
    #: under vLLM's default one (older releases cannot build a default one on a CPU).
    vllm_config: bool = False


def _on_off(*names: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Each variable set to 1, then to 0."""
    return tuple(((name, value),) for name in names for value in ("1", "0"))


_ORACLE = "vllm.model_executor.layers.fused_moe.oracle"
_MXFP4_ENV = _on_off(
    "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
    "VLLM_MXFP4_USE_MARLIN",
)
_LORA_ENV = _on_off("VLLM_MXFP4_USE_MARLIN")
_FP4 = "VLLM_USE_FLASHINFER_MOE_FP4"
_NVFP4_ENV = (
    *_on_off(_FP4),
    *(((_FP4, "1"), ("VLLM_FLASHINFER_MOE_BACKEND", kind)) for kind in ("throughput", "latency", "masked_gemm")),
    (("VLLM_TEST_FORCE_FP8_MARLIN", "1"),),
)
_B12X_ENV = _on_off("VLLM_B12X_MOE_FP4_FORCE_A16")
_MX, _NV = f"{_ORACLE}.mxfp4", f"{_ORACLE}.nvfp4"

#: Per format, oldest first: the release that starts each era.
ERAS: dict[str, tuple[Era, ...]] = {
    "mxfp4": (
        Era("0.19.0", _MX, "select_mxfp4_moe_backend", "map_mxfp4_backend", False, _MXFP4_ENV, lora_env=_LORA_ENV),
        # 0.20.x: a GPT-OSS selector beside the generic one (which 0.21.0 moves to DeepSeek-V4).
        Era(
            "0.20.0",
            _MX,
            "select_gpt_oss_mxfp4_moe_backend",
            "map_mxfp4_backend",
            False,
            _MXFP4_ENV,
            lora_env=_LORA_ENV,
        ),
        # 0.21.0: one selector again, without the LoRA branch.
        Era("0.21.0", _MX, "select_mxfp4_moe_backend", "map_mxfp4_backend", False, _MXFP4_ENV),
        Era("0.22.0", _MX, "select_mxfp4_moe_backend", "map_mxfp4_backend", True, _MXFP4_ENV),
        # 0.24.0 drops the VLLM_USE_FLASHINFER_MOE_MXFP4_* / VLLM_MXFP4_USE_MARLIN overrides.
        Era("0.24.0", _MX, "select_mxfp4_moe_backend", "map_mxfp4_backend", True),
    ),
    "nvfp4": (
        # 0.15.x-0.16.x: no --moe-backend for NVFP4, FlashInfer chosen by environment variables.
        Era("0.15.0", _NV, "select_nvfp4_moe_backend", None, False, _NVFP4_ENV),
        Era("0.17.0", _NV, "select_nvfp4_moe_backend", "map_nvfp4_backend", False, _NVFP4_ENV),
        # 0.24.0 drops VLLM_USE_FLASHINFER_MOE_FP4 / VLLM_FLASHINFER_MOE_BACKEND.
        Era("0.24.0", _NV, "select_nvfp4_moe_backend", "map_nvfp4_backend", False, _NVFP4_ENV[-1:]),
        # 0.29.0 drops VLLM_TEST_FORCE_FP8_MARLIN and reads VLLM_B12X_MOE_FP4_FORCE_A16.
        Era("0.29.0", _NV, "select_nvfp4_moe_backend", "map_nvfp4_backend", False, _B12X_ENV),
        # 0.32.0 adds the FlashInfer MoE-EP classes, which read the current VllmConfig.
        Era("0.32.0", _NV, "select_nvfp4_moe_backend", "map_nvfp4_backend", False, _B12X_ENV, vllm_config=True),
    ),
}

#: Library probes (vllm.utils.* functions, imported by name into the expert modules) and the
#: profile's answer: its field of that name, else `profile.extra[key]` (mxconvert's
#: selection/predicates.py `extra_flag`) defaulting to the named field or to "True" / "False".
PROBES: dict[str, tuple[str, str | None]] = {
    "has_flashinfer": ("has_flashinfer", None),
    "has_flashinfer_cutlass_fused_moe": ("has_flashinfer_cutlass", None),
    "has_triton_kernels": ("has_triton_kernels", None),
    "has_humming": ("has_humming", None),
    "has_flashinfer_trtllm_fused_moe": ("has_flashinfer_trtllm", "has_flashinfer"),
    "has_flashinfer_cutedsl_grouped_gemm_nt_masked": ("has_flashinfer_cutedsl", "has_flashinfer"),
    "has_flashinfer_cutedsl_moe_nvfp4": ("has_flashinfer_cutedsl", "has_flashinfer"),
    "has_flashinfer_b12x_moe": ("has_flashinfer_b12x", "has_flashinfer"),
    "has_flashinfer_situ_activation": ("flashinfer_situ", "False"),
    # vllm/utils/b12x.py (0.29.0 on): the b12x package's fused-MoE module, None when not installed;
    # stood in by a module whose `is_supported()` is true where the profile has the package.
    "get_b12x_fused_moe": ("has_b12x", "False"),
    # vllm/utils/import_utils.py (0.30.0 on): amd-quark, which the MXFP4 emulation class requires.
    # mxconvert's EMULATION predicates assume it is installed wherever the class can run.
    "has_quark": ("has_quark", "True"),
}
#: Probes that return a module (or None) rather than a bool.
_MODULE_PROBES = frozenset({"get_b12x_fused_moe"})

#: Built-in profiles with a library flag changed, so the records also show the paths a default
#: profile never takes (HUMMING and `prioritize_humming`, Blackwell without FlashInfer, SM90
#: without triton_kernels): name -> (built-in profile, fields replaced).
PROFILE_VARIANTS: dict[str, tuple[str, dict[str, typing.Any]]] = {
    "h100+humming": ("h100", {"has_humming": True}),
    "a100+humming": ("a100", {"has_humming": True}),
    "b200-flashinfer": ("b200", {"has_flashinfer": False, "has_flashinfer_cutlass": False}),
    "h100-triton_kernels": ("h100", {"has_triton_kernels": False}),
}

#: The deployments, as mxconvert's `Deployment` fields. vLLM runs all2all kernels only with expert
#: parallelism and dp > 1 (`FusedMoEParallelConfig.use_all2all_kernels`), so every all2all case
#: has ep = dp = 2. A deployment whose all2all backend the release does not have is left out (vLLM
#: refuses it at start-up), and `activation` only where the era has the override.
DEPLOYMENTS: dict[str, dict] = {
    "tp1": {},
    "tp2": {"tp": 2},
    "ep2": {"ep": 2},
    "dp2": {"dp": 2},
    "ep2-eplb": {"ep": 2, "eplb": True},
    "lora": {"lora": True},
    "mxfp8": {"activation": "mxfp8"},
    "ep2dp2-deepep-ht": {"ep": 2, "dp": 2, "all2all": "deepep_high_throughput"},
    "ep2dp2-deepep-ll-batched": {"ep": 2, "dp": 2, "all2all": "deepep_low_latency", "batched": True},
    "ep2dp2-ag-rs": {"ep": 2, "dp": 2, "all2all": "allgather_reducescatter"},
    "ep2dp2-fi-nvl-two-sided": {"ep": 2, "dp": 2, "all2all": "flashinfer_nvlink_two_sided"},
    "ep2dp2-fi-nvl-one-sided": {"ep": 2, "dp": 2, "all2all": "flashinfer_nvlink_one_sided"},
}

#: The model whose MoE layer is selected for, as vLLM builds its FusedMoEConfig: GPT-OSS-120B for
#: MXFP4; for NVFP4 Qwen3-30B-A3B (a W4A4 ModelOpt / compressed-tensors checkpoint: weight key
#: kNvfp4Static, activation key kNvfp4Dynamic). `mxconvert` holds the arguments mxconvert's
#: selection takes for the same model (no sizes: the shape refusals of weight preparation are not
#: the oracle's, see tests/test_selection_records.py).
MODEL: dict[str, dict[str, typing.Any]] = {
    "mxfp4": {
        "num_experts": 128,
        "experts_per_token": 4,
        "hidden": 2880,
        "intermediate": 2880,
        "bias": True,
        "activation": "SWIGLUOAI",
        "routing": "RenormalizeNaive",
        "mxconvert": {},
    },
    "nvfp4": {
        "num_experts": 128,
        "experts_per_token": 8,
        "hidden": 2048,
        "intermediate": 768,
        "bias": False,
        "activation": "SILU",
        "routing": "Renormalize",
        "mxconvert": {"activation_fn": "silu", "routing_method": "Renormalize", "w4a16": False},
    },
}


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def era_of(fmt: str, release: str) -> Era:
    eras = [e for e in ERAS[fmt] if release_key(e.first) <= release_key(release)]
    if not eras:
        raise SystemExit(f"no {fmt} era for vLLM {release}: the oldest is {ERAS[fmt][0].first}")
    return eras[-1]


def record_path(fmt: str, release: str) -> Path:
    return OUT_DIR / f"vllm-{release}-{fmt}.json"


# ------------------------------------------------------------------------------------------------
# Inside the release's environment


def _patched(obj, attrs: dict):
    @contextlib.contextmanager
    def cm():
        missing = object()
        saved = {k: obj.__dict__.get(k, missing) for k in attrs}
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

    return cm()


_GFX = ("on_gfx9", "on_gfx1x", "on_gfx942", "on_gfx950", "on_gfx1100", "on_gfx1250")


def _rocm_module():
    """`vllm.platforms.rocm`, or a module of that name holding the `on_gfx*` functions when its
    import fails (it asks torch for the GPU's gfx arch)."""
    try:
        return importlib.import_module("vllm.platforms.rocm")
    except (AssertionError, RuntimeError, ImportError):
        module = types.ModuleType("vllm.platforms.rocm")
        for name in _GFX:
            setattr(module, name, lambda: False)
        sys.modules["vllm.platforms.rocm"] = module
        return module


def _gfx_answers(profile) -> dict:
    gfx = profile.gfx or "" if profile.platform == "rocm" else ""
    return {
        "on_gfx9": lambda: gfx in ("gfx90a", "gfx942", "gfx950"),
        "on_gfx1x": lambda: gfx.startswith(("gfx11", "gfx12")),
        "on_gfx942": lambda: gfx == "gfx942",
        "on_gfx950": lambda: gfx == "gfx950",
        "on_gfx1100": lambda: gfx == "gfx1100",
        "on_gfx1250": lambda: gfx == "gfx1250",
    }


def _probe_answers(profile) -> dict:
    from mxconvert.selection.predicates import extra_flag

    answers: dict[str, typing.Callable[..., object]] = {}
    for name, (key, fallback) in PROBES.items():
        if hasattr(profile, key):
            value = bool(getattr(profile, key))
        else:
            default = fallback == "True" if fallback in (None, "False", "True") else bool(getattr(profile, fallback))
            value = extra_flag(profile, key, default)
        if name in _MODULE_PROBES:
            answers[name] = (lambda v: lambda *a, **k: v)(
                types.SimpleNamespace(is_supported=lambda: True) if value else None
            )
        else:
            answers[name] = (lambda v: lambda *a, **k: v)(value)
    return answers


def _modules_holding(names) -> list[tuple[types.ModuleType, dict]]:
    """(module, {name: current}) for every loaded vllm module that holds one of `names`."""
    found = []
    for mod_name, module in list(sys.modules.items()):
        if not (mod_name == "vllm" or mod_name.startswith("vllm.")) or module is None:
            continue
        held = {n: module.__dict__[n] for n in names if n in getattr(module, "__dict__", {})}
        if held:
            found.append((module, held))
    return found


@contextlib.contextmanager
def as_profile(profile, holders):
    """The release's platform and library probes answer as `profile` (module docstring);
    `holders` is `_modules_holding` of the stood-in names, found once per release."""
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    plat = profile.platform
    cap = DeviceCapability(*profile.capability) if profile.capability else None
    cap_int = cap.to_int() if cap else -1

    def as_int(c):
        return c[0] * 10 + c[1] if isinstance(c, tuple) else int(c)

    aiter = plat == "rocm" and profile.rocm_use_aiter
    gfx, probes = _gfx_answers(profile), _probe_answers(profile)
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            _patched(
                current_platform,
                {
                    "is_cuda": lambda: plat == "cuda",
                    "is_rocm": lambda: plat == "rocm",
                    "is_xpu": lambda: plat == "xpu",
                    "is_cpu": lambda: plat == "cpu",
                    "is_cuda_alike": lambda: plat in ("cuda", "rocm"),
                    "get_device_capability": lambda device_id=0: cap,
                    "is_device_capability": lambda c, device_id=0: cap is not None and as_int(c) == cap_int,
                    "is_device_capability_family": lambda c, device_id=0: (
                        cap is not None and as_int(c) // 10 == cap_int // 10
                    ),
                    "has_device_capability": lambda c, device_id=0: cap is not None and cap_int >= as_int(c),
                    "device_name": profile.name,
                },
            )
        )
        cpu_arch = getattr(importlib.import_module("vllm.platforms"), "CpuArchEnum", None)
        if cpu_arch is not None:
            stack.enter_context(_patched(current_platform, {"get_cpu_architecture": lambda: cpu_arch.X86}))
        import torch

        stack.enter_context(_patched(torch.cpu, {"_is_amx_tile_supported": lambda: True}))
        for module, held in holders:
            stack.enter_context(_patched(module, {n: gfx.get(n) or probes[n] for n in held}))
        stack.enter_context(
            _patched(
                rocm_aiter_ops,
                {
                    "is_enabled": staticmethod(lambda: aiter),
                    "is_fused_moe_enabled": staticmethod(lambda: aiter and profile.rocm_use_aiter_moe),
                },
            )
        )
        yield


@contextlib.contextmanager
def as_deployment(oracle, era: Era, deployment: dict):
    """The deployment's VLLM_* variables in the process environment (vllm.envs reads them there),
    and its activation request as `_user_moe_activation_override()` where the era has one."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(environment(deployment.get("env", {})))
        if era.activation_override:
            from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp8Dynamic

            key = kMxfp8Dynamic if deployment.get("activation") == "mxfp8" else None
            stack.enter_context(_patched(oracle, {"_user_moe_activation_override": lambda: key}))
        yield


def _dataclass(cls, values: dict):
    """`cls(**values)` restricted to the fields this release's dataclass has (they move between
    releases); a field without a default that `values` lacks is an error of this tool."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in values.items() if k in names})


def moe_config(fmt: str, deployment: dict, moe_backend: str, profile):
    import torch
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    model = MODEL[fmt]
    try:  # an enum from 0.17-ish on; a lower-case string before
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        activation = MoEActivation[model["activation"]]
    except ImportError:
        activation = model["activation"].lower()
    tp, ep, dp = deployment.get("tp", 1), deployment.get("ep", 1), deployment.get("dp", 1)
    moe_tp = 1 if ep > 1 else tp * dp  # FusedMoEParallelConfig.make flattens TP x DP
    parallel = _dataclass(
        FusedMoEParallelConfig,
        {
            "tp_size": moe_tp,
            "pcp_size": 1,
            "dp_size": dp,
            "ep_size": ep,
            "tp_rank": 0,
            "pcp_rank": 0,
            "dp_rank": 0,
            "ep_rank": 0,
            "sp_size": 1,
            "is_sequence_parallel": False,  # 0.15-0.16
            "use_ep": ep > 1,
            "all2all_backend": deployment.get("all2all") or "allgather_reducescatter",
            "enable_eplb": deployment.get("eplb", False),
        },
    )
    aiter_moe = profile.platform == "rocm" and profile.rocm_use_aiter and profile.rocm_use_aiter_moe
    return _dataclass(
        FusedMoEConfig,
        {
            "num_experts": model["num_experts"],
            "experts_per_token": model["experts_per_token"],
            "hidden_dim": model["hidden"],
            "intermediate_size": model["intermediate"],
            "intermediate_size_per_partition": model["intermediate"] // moe_tp,
            "num_local_experts": model["num_experts"] // ep,
            "num_logical_experts": model["num_experts"],
            "activation": activation,
            "device": "cpu",
            "routing_method": RoutingMethodType[model["routing"]],
            "moe_parallel_config": parallel,
            "in_dtype": torch.bfloat16,
            "router_logits_dtype": torch.bfloat16,
            "moe_backend": moe_backend,
            "has_bias": model["bias"],
            "is_lora_enabled": deployment.get("lora", False),
            "rocm_aiter_fmoe_enabled": aiter_moe,
        },
    )


def backend_names(oracle, era: Era) -> list[str]:
    """ "auto" and the names the release's backend map accepts (its refusal lists them)."""
    if era.name_map is None:
        return ["auto"]
    try:
        getattr(oracle, era.name_map)("?")
    except ValueError as exc:
        listed = str(exc).split("Expected one of ", 1)[1].rstrip(".")
        return ["auto", *json.loads(listed.replace("'", '"'))]
    raise SystemExit(f"{era.name_map}('?') did not refuse")


def deployments_of(era: Era) -> dict[str, dict]:
    """DEPLOYMENTS this release can run, plus one per env case of the era (and the same with LoRA
    where the era says so)."""
    from vllm.config import parallel as parallel_config

    all2all = set(typing.get_args(parallel_config.All2AllBackend))
    out = {}
    for name, dep in DEPLOYMENTS.items():
        if dep.get("all2all") and dep["all2all"] not in all2all:
            continue
        if "activation" in dep and not era.activation_override:
            continue
        out[name] = dep
    for case in era.env_cases:
        name = "env-" + ",".join(f"{k}={v}" for k, v in case)
        out[name] = {"env": dict(case)}
    for case in era.lora_env:
        name = "lora-env-" + ",".join(f"{k}={v}" for k, v in case)
        out[name] = {"lora": True, "env": dict(case)}
    return out


@contextlib.contextmanager
def environment(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: The oracle's backend enum per format (NVFP4 oracles before 0.24 also import FlashInfer's
#: `FlashinferMoeBackend`, so the name is not a guess).
BACKEND_ENUMS = {"mxfp4": "Mxfp4MoeBackend", "nvfp4": "NvFp4MoeBackend"}


#: Packages whose modules are all imported before the first selection (`_preload`).
PRELOAD_PACKAGES = ("vllm.model_executor.layers.fused_moe", "vllm.model_executor.layers.quantization.utils")


def _preload(oracle, fmt: str) -> None:
    """Import every module the selection may import lazily (every expert module `backend_to_kernel_cls`
    names, the LoRA experts of `_requested_kernel_cls`, the FlashInfer helpers) before the first
    selection, so the probes they import by name are found and stood in for every profile; a module
    first imported inside a selection would keep the stand-in of the profile active then."""
    import pkgutil

    enum: typing.Any = getattr(oracle, BACKEND_ENUMS[fmt])
    for backend in enum:
        with contextlib.suppress(Exception):
            oracle.backend_to_kernel_cls(backend)
    for package_name in PRELOAD_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            with contextlib.suppress(Exception):
                importlib.import_module(info.name)


@contextlib.contextmanager
def default_vllm_config(era: Era):
    """vLLM's default `VllmConfig` as the current one, as it is while a model loads (0.32.0's
    FlashInfer MoE-EP classes read it: weight transfer, DBO, EPLB; all off by default)."""
    from vllm import config

    if not era.vllm_config:
        yield
        return
    with config.set_current_vllm_config(config.VllmConfig()):
        yield


def _selector(fmt: str, entry):
    """`entry` as a function of the config: NVFP4's oracle also takes the checkpoint's weight and
    activation quant keys (W4A4: kNvfp4Static, kNvfp4Dynamic, as ModelOpt and compressed-tensors pass)."""
    if fmt == "mxfp4":
        return entry
    from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4Dynamic, kNvfp4Static

    return lambda config: entry(config, kNvfp4Static, kNvfp4Dynamic)


def record_inside(fmt: str, release: str, out: Path) -> int:
    import importlib.metadata

    from mxconvert.target.profiles import BUILTIN_PROFILES, get_profile  # pure data, no vLLM

    version = importlib.metadata.version("vllm")
    if version != release:
        raise SystemExit(f"this records vLLM {release}; the python here imports vLLM {version}")
    era = era_of(fmt, release)
    oracle = importlib.import_module(era.oracle)
    select = _selector(fmt, getattr(oracle, era.entry))
    _rocm_module()
    _preload(oracle, fmt)
    names = backend_names(oracle, era)
    deployments = deployments_of(era)
    outcomes: list[list] = []
    table: dict[str, dict[str, list[int]]] = {}
    holders = _modules_holding((*_GFX, *PROBES))
    variants = [
        dataclasses.replace(get_profile(base), name=name, **fields) for name, (base, fields) in PROFILE_VARIANTS.items()
    ]
    for profile in (*BUILTIN_PROFILES, *variants):
        with default_vllm_config(era), as_profile(profile, holders):
            for dep_name, deployment in deployments.items():
                with as_deployment(oracle, era, deployment):
                    for name in names:
                        config = moe_config(fmt, deployment, name, profile)
                        try:
                            backend, cls = select(config)
                            result: list = [backend.value, cls.__name__ if cls else None]
                        except (ValueError, NotImplementedError, TypeError, ImportError) as exc:
                            # ImportError: a backend module that imports its library at import
                            # time (humming in 0.22-0.24) fails the same way in vLLM itself.
                            text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                            result = [None, text]
                        if result not in outcomes:
                            outcomes.append(result)
                        table.setdefault(profile.name, {}).setdefault(dep_name, []).append(outcomes.index(result))
    record = {
        "schema": SCHEMA,
        "what": f"vLLM {release} {era.entry} ({fmt}), run on CPU with the platform stood in",
        "generator": GENERATOR,
        "vllm": release,
        "format": fmt,
        "oracle": f"{era.oracle}.{era.entry}",
        "moe_backend_names": names,
        "profile_variants": PROFILE_VARIANTS,
        "model": {k: v for k, v in MODEL[fmt].items() if k != "mxconvert"},
        "model_args": MODEL[fmt]["mxconvert"],
        "deployments": deployments,
        "layout": "table[profile][deployment][i] = index into outcomes for moe_backend_names[i]; an outcome "
        "is [backend, kernel class] or [null, refusal]",
        "outcomes": outcomes,
        "table": table,
    }
    write_record(record, out)
    print(f"wrote {out} ({sum(len(v) for d in table.values() for v in d.values())} entries)")
    return 0


def write_record(record: dict, out: Path) -> None:
    """JSON with one outcome and one profile's table per line: small, and a diff shows which
    profiles' choices changed."""
    head = {k: v for k, v in record.items() if k not in ("outcomes", "table")}
    text = json.dumps(head, indent=1, sort_keys=True)[:-2]
    outcomes = ",\n".join("  " + json.dumps(o) for o in record["outcomes"])
    table = ",\n".join(f"  {json.dumps(p)}: {json.dumps(t)}" for p, t in record["table"].items())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f'{text},\n "outcomes": [\n{outcomes}\n ],\n "table": {{\n{table}\n }}\n}}\n')


# ------------------------------------------------------------------------------------------------
# Outside: one environment per release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("format", choices=sorted(ERAS))
    parser.add_argument(
        "releases", nargs="+", help="X.Y.Z ... or `all` (every release with a tools/vllm_releases record)"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        (release,) = args.releases
        return record_inside(args.format, release, args.out / f"vllm-{release}-{args.format}.json")
    import release_env

    releases = args.releases
    if releases == ["all"]:
        first = release_key(ERAS[args.format][0].first)
        known = sorted(
            (p.stem.removeprefix("vllm-") for p in (REPO / "tools/vllm_releases/records").glob("*.json")),
            key=release_key,
        )
        releases = [r for r in known if release_key(r) >= first]
    status = 0
    for release in releases:
        if not re.fullmatch(r"\d+\.\d+\.\d+", release):
            raise SystemExit(f"not a release number X.Y.Z: {release!r}")
        era_of(args.format, release)
        python = release_env.ensure(release)
        cmd = [str(python), __file__, args.format, release, "--inside", "--out", str(args.out)]
        done = subprocess.run(
            cmd, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(REPO)}, check=False
        )
        status = status or done.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main())
