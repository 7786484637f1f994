"""What the MXFP4 (GPT-OSS) oracles of every revision share: the activation each backend runs
with, the capability gate, VLLM_MARLIN_INPUT_DTYPE, and the `Selection` a chosen backend gives."""

from __future__ import annotations

from mxconvert.core.errors import UnsupportedError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.engine import Run
from mxconvert.selection.predicates import where
from mxconvert.selection.report import Considered, Selection
from mxconvert.target.backends import MARLIN_BACKENDS, Backend, Mxfp4Backend
from mxconvert.target.profiles import DeviceProfile

B = Mxfp4Backend

#: The activation each backend runs with (vLLM's ``_backend_activation_key``; "bf16" stands for its
#: None). EMULATION has key None like the BF16 backends, which is how vLLM 0.33.0's "activation
#: key None, plus EMULATION" comes out; with an mxfp8 request it is filtered out like them.
BACKEND_ACTIVATION: dict[Backend, str] = {
    B.FLASHINFER_TRTLLM_MXFP4_BF16: "bf16",
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: "mxfp8",
    B.FLASHINFER_CUTLASS_MXFP4_BF16: "bf16",
    B.FLASHINFER_CUTLASS_MXFP4_MXFP8: "mxfp8",
    B.CUTLASS_MXFP4_MXFP4: "mxfp4",
    B.AITER_MXFP4_BF16: "bf16",
    B.AITER_TRITON_MXFP4_BF16: "bf16",
    B.AITER_MXFP4_FP8: "fp8",
    B.AITER_MXFP4_MXFP4: "mxfp4",
    B.AITER_TRITON_MXFP4_MXFP4: "mxfp4",
    B.TRITON: "bf16",
    B.TRITON_UNFUSED: "bf16",
    B.MARLIN: "bf16",
    B.BATCHED_MARLIN: "bf16",
    B.HUMMING: "bf16",
    B.XPU: "bf16",
    B.CPU: "bf16",
    B.EMULATION: "bf16",
}


def check_marlin_input_dtype(profile: DeviceProfile, deployment: Deployment) -> str | None:
    """VLLM_MARLIN_INPUT_DTYPE for a Marlin backend."""
    mid = deployment.marlin_input_dtype
    if mid == "int8":
        raise UnsupportedError(
            f"VLLM_MARLIN_INPUT_DTYPE=int8 is refused for MXFP4 Marlin (vLLM raises RuntimeError); "
            f"profile {profile.name} selected a Marlin backend"
        )
    if mid == "fp8":
        if profile.platform == "cuda" and (profile.cap == (8, 9) or profile.cap[0] == 12):
            return "fp8"
        raise UnsupportedError(
            f"VLLM_MARLIN_INPUT_DTYPE=fp8 (W4A8-FP8 Marlin) is only allowed on SM89 or the SM12x "
            f"family, {where(profile)}"
        )
    return None


def global_gate(run: Run) -> None:
    # Mxfp4Config.get_min_capability() = 80: GPT-OSS MXFP4 is refused on CUDA cap < 8.0 before any
    # backend is looked at. The same config class gates 0.19-0.20.
    p = run.profile
    if p.platform == "cuda" and p.cap < (8, 0):
        raise UnsupportedError(
            f"GPT-OSS MXFP4 needs CUDA capability >= 8.0 (Mxfp4Config.get_min_capability() = 80), {where(p)}"
        )


def activation_of(run: Run, backend: Backend) -> str:
    return BACKEND_ACTIVATION[backend]


def choose(run: Run, backend: Backend, name: str, activation: str, reason: str) -> Selection:
    """Record `backend` as chosen; Marlin backends also take VLLM_MARLIN_INPUT_DTYPE."""
    run.considered.append(Considered(backend, name, True, reason))
    mid = check_marlin_input_dtype(run.profile, run.deployment) if backend in MARLIN_BACKENDS else None
    return run.selection(backend, name, activation, marlin_input_dtype=mid)


def try_requested(run: Run, backend: Backend) -> Selection | None:
    """An explicitly requested backend, if one of its kernel classes passes."""
    act = BACKEND_ACTIVATION[backend]
    hit = run.try_backend(backend, act, explicit=True)
    return run.choose(backend, hit[0], act, f"--moe-backend {run.requested}: all predicates pass") if hit else None


def force_xpu(run: Run) -> Selection:
    """vLLM forces XPU on the XPU platform (`_return_or_raise`: it raises with XPU's reason)."""
    return force_platform(run, B.XPU)


def force_platform(run: Run, backend: Backend) -> Selection:
    """vLLM forces `backend` (XPU, CPU) on its platform after the priority list found nothing
    (`_return_or_raise` with activation key None: it raises with the backend's reason)."""
    since = len(run.considered)
    where_ = backend.value
    hit = run.try_backend(backend, "bf16", explicit=True)
    if hit:
        return run.choose(backend, hit[0], "bf16", f"forced on the {where_} platform")
    raise run.refuse(f"{where_} is forced on the {where_} platform but cannot run on {run.where()}", since)
