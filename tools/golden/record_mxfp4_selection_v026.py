#!/usr/bin/env python3
"""The GPT-OSS MXFP4 selection record of vLLM 0.26.0, made by RUNNING 0.26.0's own oracle.

Writes tests/golden/selection/vllm-0.26.0-mxfp4.json: for every built-in device profile x
`--moe-backend` request ("auto" and every name of 0.26.0's `map_mxfp4_backend`) x deployment
(DEPLOYMENTS below), what vLLM 0.26.0's `select_mxfp4_moe_backend` returns (backend and kernel
class) or that it raises. tests/test_selection_v026_record.py holds mxconvert's `vllm-0.26` row
to every entry, with no vLLM installed.

Run it with a python that imports vLLM 0.26.0 (CPU only; nothing is compiled or run on a GPU):

    python3.11 -m venv /tmp/venv-vllm026
    /tmp/venv-vllm026/bin/pip install --no-deps ~/.cache/mxconvert-wheels/vllm-0.26.0-*.whl
    # the pure-Python modules vLLM imports, and torch: those of .venv-vllm (tools/vllm_env/setup.sh)
    echo "$PWD/.venv-vllm/lib/python3.11/site-packages" \\
        > /tmp/venv-vllm026/lib/python3.11/site-packages/zz_deps.pth
    VLLM_TARGET_DEVICE=cpu /tmp/venv-vllm026/bin/python tools/golden/record_mxfp4_selection_v026.py

What is vLLM 0.26.0's own code: `select_mxfp4_moe_backend` and everything it calls
(`map_mxfp4_backend`, `_filter_by_activation`, `_get_priority_backends_for_gpt_oss`,
`backend_to_kernel_cls`, `_return_or_raise`, every expert class's `is_supported_config` and
`_supports_*`), and `FusedMoEParallelConfig` (its `use_*` properties decide all2all, batched
format and the FlashInfer NVLink kinds).

What is stood in, per profile, and only this (a CPU has no GPU to ask):
  * `current_platform`: is_cuda / is_rocm / is_xpu / is_cpu / is_cuda_alike and the capability
    queries answer as the profile (ROCm profiles report vLLM's pseudo-capability, 9.4 / 9.5);
  * `vllm.platforms.rocm.on_gfx9 / on_gfx1x / on_gfx950 / on_gfx942`: the profile's gfx arch (the
    module itself cannot be imported without an AMD GPU, so a module of that name holds them);
  * `rocm_aiter_ops.is_enabled / is_fused_moe_enabled`: ROCm and the profile's
    VLLM_ROCM_USE_AITER / VLLM_ROCM_USE_AITER_MOE;
  * the library probes the expert modules imported by name: `has_flashinfer` (trtllm_mxfp4_moe),
    `has_flashinfer_cutlass_fused_moe` (flashinfer_cutlass_moe), `has_triton_kernels`
    (gpt_oss_triton_kernels_moe), `has_humming` (fused_humming_moe): the profile's fields;
  * `_user_moe_activation_override()` (quantization_config.moe.activation): the deployment's;
  * the `FusedMoEConfig` the oracle reads: vLLM's own dataclass with GPT-OSS-120B's fields
    (SWIGLUOAI, RenormalizeNaive routing, hidden 2880), the deployment's parallel config and
    `is_lora_enabled`, and `moe_backend` = the request.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "golden" / "selection" / "vllm-0.26.0-mxfp4.json"
sys.path.insert(0, str(REPO))

from mxconvert.target.profiles import BUILTIN_PROFILES  # noqa: E402  (pure data, no vLLM)

#: The deployments, as mxconvert's `Deployment` fields. vLLM runs all2all kernels only with expert
#: parallelism and dp > 1 (`FusedMoEParallelConfig.use_all2all_kernels`), so every all2all case
#: has ep = dp = 2.
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


def patched(obj, **attrs):
    @contextlib.contextmanager
    def cm():
        saved = {k: obj.__dict__.get(k, _MISSING) if hasattr(obj, "__dict__") else getattr(obj, k) for k in attrs}
        for k, v in attrs.items():
            setattr(obj, k, v)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is _MISSING:
                    delattr(obj, k)
                else:
                    setattr(obj, k, v)

    return cm()


_MISSING = object()


def _rocm_module():
    """`vllm.platforms.rocm`, whose import asks torch for the GPU's gfx arch (`_get_gcn_arch`) and
    fails without one: a module of that name holding only the `on_gfx*` functions the expert
    classes import from it (each is then patched per profile)."""
    try:
        return importlib.import_module("vllm.platforms.rocm")
    except (AssertionError, RuntimeError, ImportError):
        module = types.ModuleType("vllm.platforms.rocm")
        for name in ("on_gfx9", "on_gfx1x", "on_gfx950", "on_gfx942"):
            setattr(module, name, lambda: False)
        sys.modules["vllm.platforms.rocm"] = module
        return module


@contextlib.contextmanager
def as_profile(profile, activation: str | None):
    """vLLM 0.26.0's platform and library probes answer as `profile` (see the module docstring)."""
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.model_executor.layers.fused_moe.experts import (
        flashinfer_cutlass_moe,
        fused_humming_moe,
        gpt_oss_triton_kernels_moe,
        trtllm_mxfp4_moe,
    )
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp8Dynamic
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    rocm = _rocm_module()
    plat = profile.platform
    cap = DeviceCapability(*profile.capability) if profile.capability else None
    cap_int = cap.to_int() if cap else -1

    def as_int(c):
        return c[0] * 10 + c[1] if isinstance(c, tuple) else int(c)

    gfx = profile.gfx or ""
    aiter = plat == "rocm" and profile.rocm_use_aiter
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            patched(
                current_platform,
                is_cuda=lambda: plat == "cuda",
                is_rocm=lambda: plat == "rocm",
                is_xpu=lambda: plat == "xpu",
                is_cpu=lambda: plat == "cpu",
                is_cuda_alike=lambda: plat in ("cuda", "rocm"),
                get_device_capability=lambda device_id=0: cap,
                is_device_capability=lambda c, device_id=0: cap is not None and as_int(c) == cap_int,
                is_device_capability_family=lambda c, device_id=0: cap is not None and as_int(c) // 10 == cap_int // 10,
                has_device_capability=lambda c, device_id=0: cap is not None and cap_int >= as_int(c),
                device_name=profile.name,
            )
        )
        stack.enter_context(
            patched(
                rocm,
                on_gfx9=lambda: plat == "rocm" and gfx in ("gfx90a", "gfx942", "gfx950"),
                on_gfx1x=lambda: plat == "rocm" and gfx.startswith(("gfx11", "gfx12")),
                on_gfx950=lambda: plat == "rocm" and gfx == "gfx950",
                on_gfx942=lambda: plat == "rocm" and gfx == "gfx942",
            )
        )
        stack.enter_context(
            patched(
                rocm_aiter_ops,
                is_enabled=staticmethod(lambda: aiter),
                is_fused_moe_enabled=staticmethod(lambda: aiter and profile.rocm_use_aiter_moe),
            )
        )
        stack.enter_context(patched(trtllm_mxfp4_moe, has_flashinfer=lambda: profile.has_flashinfer))
        stack.enter_context(
            patched(flashinfer_cutlass_moe, has_flashinfer_cutlass_fused_moe=lambda: profile.has_flashinfer_cutlass)
        )
        stack.enter_context(patched(gpt_oss_triton_kernels_moe, has_triton_kernels=lambda: profile.has_triton_kernels))
        stack.enter_context(patched(fused_humming_moe, has_humming=lambda: profile.has_humming))
        key = kMxfp8Dynamic if activation == "mxfp8" else None
        stack.enter_context(patched(oracle, _user_moe_activation_override=lambda: key))
        yield oracle


def moe_config(deployment: dict, moe_backend: str):
    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    tp, ep, dp = deployment.get("tp", 1), deployment.get("ep", 1), deployment.get("dp", 1)
    parallel = FusedMoEParallelConfig(
        tp_size=1 if ep > 1 else tp * dp,  # FusedMoEParallelConfig.make flattens TP x DP
        pcp_size=1,
        dp_size=dp,
        ep_size=ep,
        tp_rank=0,
        pcp_rank=0,
        dp_rank=0,
        ep_rank=0,
        sp_size=1,
        use_ep=ep > 1,
        all2all_backend=deployment.get("all2all") or "allgather_reducescatter",
        enable_eplb=deployment.get("eplb", False),
    )
    return FusedMoEConfig(
        num_experts=128,
        experts_per_token=4,
        hidden_dim=2880,
        intermediate_size=2880,
        num_local_experts=128,
        num_logical_experts=128,
        activation=MoEActivation.SWIGLUOAI,
        device="cpu",
        routing_method=RoutingMethodType.RenormalizeNaive,
        moe_parallel_config=parallel,
        in_dtype=torch.bfloat16,
        router_logits_dtype=torch.bfloat16,
        moe_backend=moe_backend,
        has_bias=True,
        is_lora_enabled=deployment.get("lora", False),
    )


def main() -> int:
    import importlib.metadata

    version = importlib.metadata.version("vllm")
    if version != "0.26.0":
        raise SystemExit(f"this records vLLM 0.26.0; the python here imports vLLM {version}")
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    # map_mxfp4_backend's table: the names its refusal lists.
    try:
        oracle.map_mxfp4_backend("?")
    except ValueError as exc:
        listed = str(exc).split("Expected one of ", 1)[1].rstrip(".")
        names = ["auto", *json.loads(listed.replace("'", '"'))]
    entries = []
    for profile in BUILTIN_PROFILES:
        for dep_name, deployment in DEPLOYMENTS.items():
            for name in names:
                with as_profile(profile, deployment.get("activation")) as orc:
                    config = moe_config(deployment, name)
                    try:
                        backend, cls = orc.select_mxfp4_moe_backend(config)
                        result = {"backend": backend.value, "kernel_class": cls.__name__ if cls else None}
                    except (ValueError, NotImplementedError) as exc:
                        result = {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                entries.append({"profile": profile.name, "deployment": dep_name, "moe_backend": name, **result})
    record = {
        "what": "vLLM 0.26.0 select_mxfp4_moe_backend (GPT-OSS MXFP4), run on CPU with the platform stood in",
        "generator": "tools/golden/record_mxfp4_selection_v026.py",
        "vllm": version,
        "moe_backend_names": names,
        "deployments": DEPLOYMENTS,
        "entries": entries,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(entries)} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
