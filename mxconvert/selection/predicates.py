"""Predicates shared by several oracles: device, library, quant-scheme, parallel and activation
checks. Each returns None when the kernel class accepts the context, else the reason it does not
(the text of the "why not" report)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mxconvert.selection.deployment import FI_NVL_TWO_SIDED
from mxconvert.selection.engine import Check, Context, Reason, where
from mxconvert.target.profiles import DeviceProfile


def fmt_cap(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


def require_cuda(ctx: Context) -> Reason:
    p = ctx.profile
    return None if p.platform == "cuda" else f"kernel requires CUDA, {where(p)}"


def require_rocm(ctx: Context) -> Reason:
    p = ctx.profile
    return None if p.platform == "rocm" else f"kernel requires ROCm, {where(p)}"


def cuda_family(major: int) -> Check:
    def check(ctx: Context) -> Reason:
        p = ctx.profile
        if p.is_cuda_family(major):
            return None
        return f"kernel requires CUDA capability family {major}.x, {where(p)}"

    return check


def cuda_min(cap: tuple[int, int]) -> Check:
    def check(ctx: Context) -> Reason:
        p = ctx.profile
        if p.platform == "cuda" and p.cap >= cap:
            return None
        return f"kernel requires CUDA capability >= {fmt_cap(cap)}, {where(p)}"

    return check


def has(attr: str, what: str) -> Check:
    def check(ctx: Context) -> Reason:
        p = ctx.profile
        return None if getattr(p, attr) else f"{what} not installed on profile {p.name}"

    return check


def platform(name: str) -> Check:
    def check(ctx: Context) -> Reason:
        p = ctx.profile
        return None if p.platform == name else f"kernel requires the {name.upper()} platform, {where(p)}"

    return check


def cutlass_device(ctx: Context) -> Reason:
    # FlashInferExperts._supports_current_device: cap == 9.0, family 10.x or family 12.x; SM110 is
    # excluded (flashinfer-ai/flashinfer#3134) (experts/flashinfer_cutlass_moe.py).
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] in (10, 12)):
        return None
    return f"kernel requires CUDA capability 9.0, family 10.x or family 12.x (SM110 excluded), {where(p)}"


def gfx_in(*archs: str) -> Check:
    def check(ctx: Context) -> Reason:
        p = ctx.profile
        if p.platform == "rocm" and p.gfx in archs:
            return None
        return f"kernel requires {' / '.join(archs)}, {where(p)}"

    return check


def emulation_device(ctx: Context) -> Reason:
    # OCP_MXQuantizationEmulationTritonExperts: CUDA-alike (CUDA, ROCm) or XPU.
    p = ctx.profile
    if p.platform in ("cuda", "rocm", "xpu"):
        return None
    return f"emulation requires CUDA, ROCm or XPU, {where(p)}"


# Quant-scheme predicates. The weight is always MXFP4 static; what varies is the activation.


def schemes(*activations: str) -> Check:
    allowed = frozenset(activations)

    def check(ctx: Context) -> Reason:
        if ctx.activation in allowed:
            return None
        return (
            f"kernel does not support {ctx.weight} weights with {ctx.activation} activations "
            f"(supports {', '.join(sorted(allowed))})"
        )

    return check


def any_scheme(ctx: Context) -> Reason:
    return None


def not_fi_nvl_two_sided(ctx: Context) -> Reason:
    d = ctx.deployment
    if d.all2all in FI_NVL_TWO_SIDED:
        return f"kernel does not support FlashInfer NVLink two-sided all2all (all2all={d.all2all})"
    return None


def activations(*names: str, situ_flag: str | None = None) -> Callable[[Context], Reason]:
    """``_supports_activation``: the MoEActivation values a class accepts. With `situ_flag`, SITU is
    accepted only when the profile says FlashInfer exposes it (TRTLLM NVFP4)."""
    allowed = frozenset(names)

    def check(ctx: Context) -> Reason:
        act = ctx.activation_fn
        if act is None or act in allowed:
            return None
        if act == "situ" and situ_flag and extra_flag(ctx.profile, situ_flag, False):
            return None
        return f"kernel does not support {act} activation"

    return check


def extra_flag(p: DeviceProfile, key: str, default: bool) -> bool:
    """A library-availability flag the DeviceProfile has no field for, read from ``profile.extra``.

    Keys used: has_flashinfer_trtllm, has_flashinfer_cutedsl, has_flashinfer_b12x (default: the
    profile's has_flashinfer), has_b12x, flashinfer_situ (default False).
    """
    value = p.extra.get(key, default) if isinstance(p.extra, Mapping) else default
    return bool(value)


def has_extra(key: str, what: str, default: Callable[[DeviceProfile], bool]) -> Check:
    def check(ctx: Context) -> Reason:
        p = ctx.profile
        return None if extra_flag(p, key, default(p)) else f"{what} not installed on profile {p.name}"

    return check


MARLIN_DEVICE = (require_cuda, cuda_min((7, 5)))

HUMMING_DEVICE = (has("has_humming", "humming"), require_cuda, cuda_min((7, 5)))
