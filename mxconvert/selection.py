"""MXFP4 MoE backend selection: a data-driven mirror of vLLM's GPT-OSS MXFP4 oracle.

Given a device profile, a runtime revision and a deployment, pick the backend (and the kernel class)
that vLLM would pick, and say why every backend ahead of it was passed over.

Everything that decides the outcome is data in this module:

* ``_KERNEL_CLASSES_*``: per backend, the kernel classes in the order vLLM tries them (monolithic
  first), each with its predicate functions (device, quant scheme, parallel config, routing, shape,
  activation format, LoRA). ``_is_supported`` walks those predicates in the order of vLLM 0.33.0's
  ``is_supported_config`` (spec mxfp4_transforms.md §6 step 5) and returns the first failing reason.
* ``SelectionStyle`` rows (one per ``RuntimeRevision.selection`` value): the priority list, the
  priority modifiers, the ``--moe-backend`` names, the kernel-class table and the env overrides.

Sources (read, not copied):
  * /work/shared/spec/mxfp4_transforms.md §6 (vLLM 0.33.0: priority list, modifiers, kernel-class
    predicate table, decision table, the older env-style selection).
  * /work/shared/spec/vllm_oracle_pages/001_b4abebc69c7d79f0.txt (vLLM 0.19-0.20 oracle:
    ``_get_priority_backends``, ``map_mxfp4_backend``, ``select_gpt_oss_mxfp4_moe_backend``).
  * /work/shared/spec/triton_kernels_3_6.md §1 (TRITON classes of 0.19/0.20 accept only
    9.0 <= capability < 11.0).
  * Public vLLM source, used only to resolve predicate details the spec leaves open (cited where
    used): ``fused_moe/experts/trtllm_mxfp4_moe.py``, ``experts/flashinfer_cutlass_moe.py``,
    ``experts/gpt_oss_triton_kernels_moe.py``, ``experts/aiter_mxfp4_w4a16_moe.py``,
    ``experts/aiter_mxfp4_w4a8_moe.py``, ``experts/aiter_mxfp4_w4a4_moe.py``,
    ``experts/fused_humming_moe.py``, ``oracle/mxfp4.py`` @ 001eda31, ``vllm/envs.py``
    (``maybe_convert_bool``), ``fused_moe/config.py`` (``use_fi_nvl_two_sided_kernels``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from .backends import MARLIN_BACKENDS, Mxfp4Backend
from .errors import InputError, UnsupportedError
from .profiles import DeviceProfile
from .revisions import RuntimeRevision

B = Mxfp4Backend

# --------------------------------------------------------------------------------------------------
# Deployment and results
# --------------------------------------------------------------------------------------------------

#: Activation dtypes a ``Deployment.activation`` may request (vLLM 0.33's
#: ``quantization_config.moe.activation``). "fp8"/"mxfp4" exist in vLLM 0.33 too, but mxconvert
#: has no layout for the backends they lead to (CUTLASS_MXFP4_MXFP4 has no converter branch,
#: spec §4.7 / §10 q5), so they are refused here.
ACTIVATIONS = ("bf16", "mxfp8")

#: FlashInfer NVLink two-sided all2all backends (vLLM ``use_fi_nvl_two_sided_kernels``).
_FI_NVL_TWO_SIDED = frozenset({"flashinfer_all2allv", "flashinfer_nvlink_two_sided"})

_MARLIN_INPUT_DTYPES = (None, "fp8", "int8")


@dataclass(frozen=True)
class Deployment:
    """The parallel setup and the runtime switches that change backend selection."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    #: all2all backend name (e.g. "deepep_high_throughput"); None = no all2all kernels. Taken as
    #: "all2all kernels in use" as the spec's modifiers do (vLLM itself only enables them with
    #: dp > 1 and expert parallelism).
    all2all: str | None = None
    eplb: bool = False
    #: ``moe_parallel_config.use_batched_activation_format``.
    batched: bool = False
    lora: bool = False
    #: None (bf16) or "mxfp8": vLLM 0.33's ``quantization_config.moe.activation`` override.
    activation: str | None = None
    #: Older-revision env overrides, e.g. {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}.
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: ``VLLM_MARLIN_INPUT_DTYPE``: None or "fp8" ("int8" is refused for MXFP4 when Marlin runs).
    marlin_input_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "dp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"deployment {name} must be an integer >= 1, got {value!r}")
        if self.all2all is not None:
            if not isinstance(self.all2all, str) or not self.all2all.strip():
                raise InputError(f"deployment all2all must be a backend name or None, got {self.all2all!r}")
            object.__setattr__(self, "all2all", self.all2all.strip().lower().replace("-", "_"))
        activation = self.activation
        if activation is not None:
            if not isinstance(activation, str):
                raise InputError(f"deployment activation must be a string or None, got {activation!r}")
            activation = activation.strip().lower()
            if activation not in ACTIVATIONS:
                raise InputError(
                    f"unsupported MoE activation {self.activation!r}: mxconvert knows "
                    + ", ".join(ACTIVATIONS) + " (None means bf16)"
                )
            object.__setattr__(self, "activation", None if activation == "bf16" else activation)
        if not isinstance(self.env, Mapping):
            raise InputError(f"deployment env must be a mapping of strings, got {type(self.env).__name__}")
        env = {}
        for key, value in self.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise InputError(f"deployment env entries must be strings, got {key!r}={value!r}")
            env[key.strip()] = value.strip()
        object.__setattr__(self, "env", MappingProxyType(env))
        mid = self.marlin_input_dtype
        if isinstance(mid, str):
            mid = mid.strip().lower() or None
            object.__setattr__(self, "marlin_input_dtype", mid)
        if mid not in _MARLIN_INPUT_DTYPES:
            raise InputError(
                f"VLLM_MARLIN_INPUT_DTYPE must be unset, 'fp8' or 'int8', got {self.marlin_input_dtype!r}"
            )

    @property
    def uses_all2all(self) -> bool:
        return self.all2all is not None

    @property
    def activation_format(self) -> str:
        return "batched" if self.batched else "standard"

    def to_json(self) -> dict:
        return {
            "tp": self.tp, "ep": self.ep, "dp": self.dp, "all2all": self.all2all, "eplb": self.eplb,
            "batched": self.batched, "lora": self.lora, "activation": self.activation,
            "env": dict(self.env), "marlin_input_dtype": self.marlin_input_dtype,
        }


@dataclass(frozen=True)
class Considered:
    """One line of the "why not" report."""

    backend: Mxfp4Backend
    kernel_class: str | None
    chosen: bool
    reason: str

    def to_json(self) -> dict:
        return {"backend": self.backend.value, "kernel_class": self.kernel_class,
                "chosen": self.chosen, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping) -> "Considered":
        return cls(B(data["backend"]), data["kernel_class"], bool(data["chosen"]), data["reason"])


@dataclass(frozen=True)
class Selection:
    backend: Mxfp4Backend
    kernel_class: str
    #: "auto" or the --moe-backend name.
    requested: str
    revision: str
    profile: str
    #: Activation dtype of the chosen backend: "bf16" or "mxfp8".
    activation: str
    #: Every backend tried, in order, with the reason it was passed over; the chosen one last.
    considered: tuple[Considered, ...]
    #: VLLM_MARLIN_INPUT_DTYPE in effect ("fp8" or None) when a Marlin backend is chosen, else None.
    #: (An addition to the brief's API: the Marlin layout depends on it, spec §4.5 is_a_8bit.)
    marlin_input_dtype: str | None = None

    def to_json(self) -> dict:
        return {
            "backend": self.backend.value,
            "kernel_class": self.kernel_class,
            "requested": self.requested,
            "revision": self.revision,
            "profile": self.profile,
            "activation": self.activation,
            "marlin_input_dtype": self.marlin_input_dtype,
            "considered": [c.to_json() for c in self.considered],
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "Selection":
        return cls(
            backend=B(data["backend"]),
            kernel_class=data["kernel_class"],
            requested=data["requested"],
            revision=data["revision"],
            profile=data["profile"],
            activation=data["activation"],
            considered=tuple(Considered.from_json(c) for c in data["considered"]),
            marlin_input_dtype=data.get("marlin_input_dtype"),
        )


# --------------------------------------------------------------------------------------------------
# Predicates
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    """What a predicate may look at: the device, the deployment, the candidate's activation."""

    profile: DeviceProfile
    deployment: Deployment
    #: Activation of the candidate being checked ("bf16", "mxfp8", "fp8", "mxfp4").
    activation: str
    hidden_size: int | None


Reason = str | None
Check = Callable[[_Ctx], Reason]


def _where(p: DeviceProfile) -> str:
    """How a reason names the device: "profile h100 is 9.0", "... is ROCm gfx942", "... is XPU"."""
    if p.platform == "cuda":
        return f"profile {p.name} is {p.cap[0]}.{p.cap[1]}"
    if p.platform == "rocm":
        return f"profile {p.name} is ROCm {p.gfx}"
    return f"profile {p.name} is {p.platform.upper()}"


def _on_gfx9(p: DeviceProfile) -> bool:
    # vllm.platforms.rocm.on_gfx9(): gfx90a / gfx942 / gfx950 (spec §6 predicate table).
    return p.platform == "rocm" and p.gfx in ("gfx90a", "gfx942", "gfx950")


def _on_gfx1x(p: DeviceProfile) -> bool:
    # on_gfx1x(): gfx11xx (RDNA3/3.5) and gfx12xx (RDNA4, gfx1250) — gpt_oss_triton_kernels_moe.py.
    return p.platform == "rocm" and bool(p.gfx) and p.gfx.startswith(("gfx11", "gfx12"))


def _fmt_cap(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


def _require_cuda(ctx: _Ctx) -> Reason:
    p = ctx.profile
    return None if p.platform == "cuda" else f"kernel requires CUDA, {_where(p)}"


def _require_rocm(ctx: _Ctx) -> Reason:
    p = ctx.profile
    return None if p.platform == "rocm" else f"kernel requires ROCm, {_where(p)}"


def _cuda_family(major: int) -> Check:
    def check(ctx: _Ctx) -> Reason:
        p = ctx.profile
        if p.is_cuda_family(major):
            return None
        return f"kernel requires CUDA capability family {major}.x, {_where(p)}"
    return check


def _cuda_min(cap: tuple[int, int]) -> Check:
    def check(ctx: _Ctx) -> Reason:
        p = ctx.profile
        if p.platform == "cuda" and p.cap >= cap:
            return None
        return f"kernel requires CUDA capability >= {_fmt_cap(cap)}, {_where(p)}"
    return check


def _has(attr: str, what: str) -> Check:
    def check(ctx: _Ctx) -> Reason:
        p = ctx.profile
        return None if getattr(p, attr) else f"{what} not installed on profile {p.name}"
    return check


def _platform(name: str) -> Check:
    def check(ctx: _Ctx) -> Reason:
        p = ctx.profile
        return None if p.platform == name else f"kernel requires the {name.upper()} platform, {_where(p)}"
    return check


def _cutlass_device(ctx: _Ctx) -> Reason:
    # FlashInferExperts._supports_current_device: cap == 9.0, family 10.x or family 12.x; SM110 is
    # excluded (flashinfer-ai/flashinfer#3134) — spec §6 table, experts/flashinfer_cutlass_moe.py.
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] in (10, 12)):
        return None
    return f"kernel requires CUDA capability 9.0, family 10.x or family 12.x (SM110 excluded), {_where(p)}"


def _triton_device_033(ctx: _Ctx) -> Reason:
    # 0.33.0: CUDA 9.0 <= cap < 13.0, or ROCm on_gfx9() / on_gfx1x() (spec §6 table).
    p = ctx.profile
    if p.platform == "cuda":
        if (9, 0) <= p.cap < (13, 0):
            return None
        return f"kernel requires CUDA capability 9.0 <= cap < 13.0, {_where(p)}"
    if p.platform == "rocm":
        if _on_gfx9(p) or _on_gfx1x(p):
            return None
        return f"kernel requires a ROCm gfx90a/gfx942/gfx950 or gfx11/gfx12 GPU, {_where(p)}"
    return f"kernel requires CUDA or ROCm, {_where(p)}"


def _triton_device_020(ctx: _Ctx) -> Reason:
    # 0.19/0.20: every OAI Triton class accepts only (9,0) <= capability < (11,0) (triton_kernels_3_6.md
    # §1; the same test as the selector's triton_kernels_supported). ROCm gfx942/gfx950 report the
    # pseudo-capabilities 9.4 / 9.5, so they pass; SM110 and SM12x do not.
    p = ctx.profile
    if p.platform in ("cuda", "rocm") and p.capability is not None and (9, 0) <= p.cap < (11, 0):
        return None
    return f"kernel requires capability 9.0 <= cap < 11.0 (vLLM 0.19-0.20), {_where(p)}"


def _aiter_fused_moe_enabled(ctx: _Ctx) -> Reason:
    # rocm_aiter_ops.is_fused_moe_enabled(): VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE (default on).
    p = ctx.profile
    if p.rocm_use_aiter and p.rocm_use_aiter_moe:
        return None
    return (f"ROCm AITER fused MoE not enabled on profile {p.name} "
            "(needs VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_MOE=1)")


def _aiter_enabled(ctx: _Ctx) -> Reason:
    # rocm_aiter_ops.is_enabled(): VLLM_ROCM_USE_AITER=1.
    p = ctx.profile
    return None if p.rocm_use_aiter else f"ROCm AITER not enabled on profile {p.name} (needs VLLM_ROCM_USE_AITER=1)"


def _gfx_in(*archs: str) -> Check:
    def check(ctx: _Ctx) -> Reason:
        p = ctx.profile
        if p.platform == "rocm" and p.gfx in archs:
            return None
        return f"kernel requires {' / '.join(archs)}, {_where(p)}"
    return check


def _emulation_device(ctx: _Ctx) -> Reason:
    # OCP_MXQuantizationEmulationTritonExperts: CUDA-alike (CUDA, ROCm) or XPU (spec §6 table).
    p = ctx.profile
    if p.platform in ("cuda", "rocm", "xpu"):
        return None
    return f"emulation requires CUDA, ROCm or XPU, {_where(p)}"


# Quant-scheme predicates. The weight is always MXFP4 static; what varies is the activation.

def _schemes(*activations: str) -> Check:
    allowed = frozenset(activations)

    def check(ctx: _Ctx) -> Reason:
        if ctx.activation in allowed:
            return None
        return (f"kernel does not support MXFP4 weights with {ctx.activation} activations "
                f"(supports {', '.join(sorted(allowed))})")
    return check


def _any_scheme(ctx: _Ctx) -> Reason:
    return None


def _cutlass_scheme(ctx: _Ctx) -> Reason:
    # FlashInferExperts._supports_quant_scheme: (mxfp4, None) only on cap == 9.0; (mxfp4, mxfp8)
    # only on cap >= 10.0 (spec §6 table; experts/flashinfer_cutlass_moe.py).
    p = ctx.profile
    if ctx.activation == "bf16":
        if p.cap == (9, 0):
            return None
        return f"MXFP4 weights with bf16 activations need CUDA capability 9.0 (SM90 only), {_where(p)}"
    if ctx.activation == "mxfp8":
        if p.cap >= (10, 0):
            return None
        return f"MXFP4 weights with mxfp8 activations need CUDA capability >= 10.0, {_where(p)}"
    return f"kernel does not support MXFP4 weights with {ctx.activation} activations"


def _ck_scheme(ctx: _Ctx) -> Reason:
    # AiterMxfp4Experts: (mxfp4, None) and (mxfp4, mxfp4), and the scheme check requires
    # on_gfx950() and not on_gfx1250() (spec §6 table).
    p = ctx.profile
    if ctx.activation not in ("bf16", "mxfp4"):
        return f"kernel does not support MXFP4 weights with {ctx.activation} activations"
    if p.gfx == "gfx950":
        return None
    return f"AITER CK MXFP4 kernel requires gfx950 (not gfx1250), {_where(p)}"


# Parallel-config predicates.

def _monolithic_parallel(ctx: _Ctx) -> Reason:
    # Monolithic classes: no all2all kernels, no EPLB, dp <= 1 (spec §6 table).
    d = ctx.deployment
    if d.dp > 1:
        return f"monolithic kernel does not support dp > 1 (dp={d.dp})"
    if d.uses_all2all:
        return f"monolithic kernel does not support all2all kernels (all2all={d.all2all})"
    if d.eplb:
        return "monolithic kernel does not support EPLB"
    return None


def _any_parallel(ctx: _Ctx) -> Reason:
    return None


def _not_fi_nvl_two_sided(ctx: _Ctx) -> Reason:
    d = ctx.deployment
    if d.all2all in _FI_NVL_TWO_SIDED:
        return f"kernel does not support FlashInfer NVLink two-sided all2all (all2all={d.all2all})"
    return None


def _trtllm_lora_parallel(ctx: _Ctx) -> Reason:
    # _TrtLlmLoRAExpertsBase: (no all2all, or allgather_reducescatter) and no EPLB
    # (experts/trtllm_lora_moe.py; not in the spec table).
    d = ctx.deployment
    if d.uses_all2all and d.all2all != "allgather_reducescatter":
        return f"kernel does not support all2all kernels other than allgather_reducescatter (all2all={d.all2all})"
    if d.eplb:
        return "kernel does not support EPLB"
    return None


# Routing. GPT-OSS routes with softmax + renormalize, i.e. RoutingMethodType.RenormalizeNaive.
_GPT_OSS_ROUTING = "RenormalizeNaive"


# --------------------------------------------------------------------------------------------------
# Kernel classes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelClass:
    """One vLLM expert class and the predicates of its ``is_supported_config``."""

    name: str
    monolithic: bool
    #: ``_supports_current_device`` as a list of checks; the first failing one is the reason.
    device: tuple[Check, ...]
    #: ``_supports_quant_scheme`` for MXFP4 weights and the candidate's activation.
    quant: Check
    parallel: Check = _any_parallel
    #: Routing methods a monolithic class accepts (None: any).
    routing: frozenset[str] | None = None
    #: ``_supports_shape(hidden_dim)``; vLLM's default accepts every shape and no class on the
    #: GPT-OSS MXFP4 path overrides it (spec §6 step 5), so this stays None everywhere.
    shape: Check | None = None
    formats: frozenset[str] = frozenset({"standard"})
    lora: bool = False
    #: Only tried when the backend is requested explicitly (TrtLlmMxfp4LoRAExperts, spec §6).
    explicit_only: bool = False


def _is_supported(cls: KernelClass, ctx: _Ctx) -> Reason:
    """``is_supported_config`` in vLLM 0.33.0's order (spec §6 step 5); None when it passes.

    act_and_mul (GPT-OSS is gated), the activation function (SWIGLUOAI), hash routing, the
    decomposed-backend requirement, the router-logits dtype and batch invariance are accepted by
    every class on this path, so they are not modelled.
    """
    for check in cls.device:
        reason = check(ctx)
        if reason:
            return reason
    reason = cls.quant(ctx)
    if reason:
        return reason
    reason = cls.parallel(ctx)
    if reason:
        return reason
    if cls.routing is not None and _GPT_OSS_ROUTING not in cls.routing:
        return f"kernel does not support {_GPT_OSS_ROUTING} routing"
    if cls.shape is not None:
        reason = cls.shape(ctx)
        if reason:
            return reason
    fmt = ctx.deployment.activation_format
    if fmt not in cls.formats:
        (only,) = tuple(cls.formats)
        return f"kernel supports only the {only} activation format, deployment uses the {fmt} format"
    if ctx.deployment.lora and not cls.lora:
        return "kernel class does not support LoRA"
    return None


_MONO_ROUTING = frozenset({"Renormalize", "RenormalizeNaive"})

# TRTLLM (experts/trtllm_mxfp4_moe.py): CUDA family 10.x and has_flashinfer().
_TRTLLM_DEVICE = (_require_cuda, _cuda_family(10), _has("has_flashinfer", "flashinfer"))
_TRTLLM_MONO = KernelClass(
    "TrtLlmMxfp4ExpertsMonolithic", True, _TRTLLM_DEVICE, _schemes("bf16", "mxfp8"),
    _monolithic_parallel, routing=frozenset({"DeepSeekV3", "Renormalize", "RenormalizeNaive"}),
)
_TRTLLM_MODULAR = KernelClass("TrtLlmMxfp4ExpertsModular", False, _TRTLLM_DEVICE, _schemes("bf16", "mxfp8"))
# LoRA-capable TRTLLM class, reachable only with moe_backend=flashinfer_trtllm (spec §6 modifiers);
# BF16 only, per experts/trtllm_lora_moe.py.
_TRTLLM_LORA = KernelClass(
    "TrtLlmMxfp4LoRAExperts", False, _TRTLLM_DEVICE, _schemes("bf16"), _trtllm_lora_parallel,
    lora=True, explicit_only=True,
)

_CUTLASS = KernelClass(
    "FlashInferExperts", False,
    (_require_cuda, _cutlass_device, _has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
    _cutlass_scheme,
)

# Device checks first, then the triton_kernels import (gpt_oss_triton_kernels_moe.py:
# `_triton_kernel_moe_supports_current_device() and has_triton_kernels()`).
_TRITON_DEVICE_033 = (_triton_device_033, _has("has_triton_kernels", "triton_kernels"))
_TRITON_DEVICE_020 = (_triton_device_020, _has("has_triton_kernels", "triton_kernels"))


def _triton_classes(device: tuple[Check, ...]) -> dict[B, tuple[KernelClass, ...]]:
    return {
        B.TRITON: (
            KernelClass("OAITritonMxfp4ExpertsMonolithic", True, device, _schemes("bf16"),
                        _monolithic_parallel, routing=_MONO_ROUTING),
            KernelClass("OAITritonExperts", False, device, _schemes("bf16")),
        ),
        B.TRITON_UNFUSED: (
            KernelClass("UnfusedOAITritonExperts", False, device, _schemes("bf16"), lora=True),
        ),
    }


_MARLIN_DEVICE = (_require_cuda, _cuda_min((7, 5)))
_MARLIN = KernelClass("MarlinExperts", False, _MARLIN_DEVICE, _any_scheme, _not_fi_nvl_two_sided, lora=True)
_BATCHED_MARLIN = KernelClass(
    "BatchedMarlinExperts", False, _MARLIN_DEVICE, _any_scheme, _not_fi_nvl_two_sided,
    formats=frozenset({"batched"}),
)

_CK_DEVICE = (_require_rocm, _aiter_fused_moe_enabled)

_HUMMING_DEVICE = (_has("has_humming", "humming"), _require_cuda, _cuda_min((7, 5)))

_EMULATION = KernelClass("OCP_MXQuantizationEmulationTritonExperts", False, (_emulation_device,), _any_scheme)

#: vLLM 0.33.0 kernel classes per backend, in the order vLLM tries them (monolithic first).
_KERNEL_CLASSES_033: dict[B, tuple[KernelClass, ...]] = {
    B.FLASHINFER_TRTLLM_MXFP4_BF16: (_TRTLLM_MONO, _TRTLLM_MODULAR, _TRTLLM_LORA),
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: (_TRTLLM_MONO, _TRTLLM_MODULAR, _TRTLLM_LORA),
    B.FLASHINFER_CUTLASS_MXFP4_BF16: (_CUTLASS,),
    B.FLASHINFER_CUTLASS_MXFP4_MXFP8: (_CUTLASS,),
    # No kernel class for it is known to mxconvert, and it has no converter branch (spec §10 q5).
    # It is only reachable with an "mxfp4" activation override, which Deployment refuses.
    B.CUTLASS_MXFP4_MXFP4: (),
    B.AITER_MXFP4_BF16: (
        KernelClass("AiterMxfp4Experts", False, _CK_DEVICE, _ck_scheme, _not_fi_nvl_two_sided),
    ),
    B.AITER_TRITON_MXFP4_BF16: (
        KernelClass("AiterW4A16ExpertsMonolithic", True,
                    (_require_rocm, _aiter_enabled, _gfx_in("gfx942", "gfx950", "gfx1250")),
                    _schemes("bf16"), _monolithic_parallel, routing=_MONO_ROUTING),
    ),
    # The next three are not in the spec's predicate table; their predicates come from the public
    # vLLM experts/aiter_mxfp4_w4a8_moe.py / aiter_mxfp4_w4a4_moe.py (possibly newer than 0.33.0).
    # They are reachable only through their explicit --moe-backend names.
    B.AITER_MXFP4_FP8: (
        KernelClass("AiterW4A8ExpertsMonolithic", True,
                    (_require_rocm, _aiter_enabled, _gfx_in("gfx950", "gfx1250")),
                    _schemes("fp8"), _monolithic_parallel, routing=_MONO_ROUTING),
    ),
    B.AITER_MXFP4_MXFP4: (
        KernelClass("AiterMxfp4Experts", False, _CK_DEVICE, _ck_scheme, _not_fi_nvl_two_sided),
    ),
    B.AITER_TRITON_MXFP4_MXFP4: (
        KernelClass("AiterW4A4ExpertsMonolithic", True,
                    (_require_rocm, _aiter_enabled, _gfx_in("gfx1250")),
                    _schemes("mxfp4"), _monolithic_parallel, routing=_MONO_ROUTING),
    ),
    **_triton_classes(_TRITON_DEVICE_033),
    B.MARLIN: (_MARLIN,),
    B.BATCHED_MARLIN: (_BATCHED_MARLIN,),
    # Class names from experts/fused_humming_moe.py; the order of the two standard-format classes
    # (which share every predicate) was not read, so the first listed one is reported.
    B.HUMMING: (
        KernelClass("HummingIndexedExperts", False, _HUMMING_DEVICE, _any_scheme),
        KernelClass("HummingGroupedExperts", False, _HUMMING_DEVICE, _any_scheme),
        KernelClass("BatchedHummingGroupedExperts", False, _HUMMING_DEVICE, _any_scheme,
                    formats=frozenset({"batched"})),
    ),
    B.XPU: (KernelClass("XPUExpertsMxFp4", False, (_platform("xpu"),), _schemes("bf16", "mxfp4")),),
    # CPUExpertsMxfp4 also checks the CPU ISA; profiles do not describe it, so it is assumed present.
    B.CPU: (KernelClass("CPUExpertsMxfp4", False, (_platform("cpu"),), _any_scheme),),
    B.EMULATION: (_EMULATION,),
}

#: vLLM 0.19-0.20 kernel classes. The per-class predicates of that tree were not re-read (spec §10
#: q6), so the 0.33.0 predicates are reused except for the documented differences:
#:  * TRITON / TRITON_UNFUSED accept only 9.0 <= capability < 11.0 (triton_kernels_3_6.md §1);
#:  * TRTLLM has no LoRA class (LoRA takes the separate branch of select_gpt_oss_mxfp4_moe_backend);
#:  * class names of that tree where known (AiterExperts, XPUExpertsMXFp4: oracle/mxfp4.py @ 001eda31).
_KERNEL_CLASSES_020: dict[B, tuple[KernelClass, ...]] = {
    **_KERNEL_CLASSES_033,
    B.FLASHINFER_TRTLLM_MXFP4_BF16: (_TRTLLM_MONO, _TRTLLM_MODULAR),
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: (_TRTLLM_MONO, _TRTLLM_MODULAR),
    B.AITER_MXFP4_BF16: (
        KernelClass("AiterExperts", False, _CK_DEVICE, _ck_scheme, _not_fi_nvl_two_sided),
    ),
    **_triton_classes(_TRITON_DEVICE_020),
    B.XPU: (KernelClass("XPUExpertsMXFp4", False, (_platform("xpu"),), _schemes("bf16", "mxfp4")),),
}

#: The activation each backend runs with (vLLM's ``_backend_activation_key``; "bf16" stands for its
#: None). EMULATION has key None like the BF16 backends, which is how spec §6 step 3's "activation
#: key None, plus EMULATION" comes out; with an mxfp8 request it is filtered out like them.
BACKEND_ACTIVATION: dict[B, str] = {
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


# --------------------------------------------------------------------------------------------------
# Selection styles (one per RuntimeRevision.selection)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PriorityMove:
    """A priority-list modifier: move `backend` right after `after` (or right before `before`)."""

    backend: B
    applies: Callable[[DeviceProfile], bool]
    why: str
    after: B | None = None
    before: B | None = None

    def apply(self, order: list[B]) -> list[B]:
        if self.backend not in order:
            return order
        out = [b for b in order if b != self.backend]
        anchor = self.after if self.after is not None else self.before
        if anchor not in out:
            return order
        idx = out.index(anchor) + (1 if self.after is not None else 0)
        out.insert(idx, self.backend)
        return out


@dataclass(frozen=True)
class EnvOverride:
    """One env-style override of the 0.19-0.20 oracle, in the order the oracle reads them.

    When set to a true value the first matching (condition, backend) of `force` is returned
    through `_return_or_raise` (no match: the override is refused with `no_match`); when set to
    false the `remove_when_false` backends leave the priority list.
    """

    var: str
    force: tuple[tuple[Callable[[DeviceProfile], bool], B], ...]
    remove_when_false: tuple[B, ...] = ()
    no_match: str = ""


def _always(p: DeviceProfile) -> bool:
    return True


@dataclass(frozen=True)
class SelectionStyle:
    name: str
    runtime: str
    priority: tuple[B, ...]
    moves: tuple[PriorityMove, ...]
    names: Mapping[str, tuple[B, ...]]
    #: Names vLLM of this revision accepts but mxconvert cannot lay out.
    unsupported_names: Mapping[str, str]
    classes: Mapping[B, tuple[KernelClass, ...]]
    env_overrides: tuple[EnvOverride, ...]
    #: Whether `Deployment.activation` (quantization_config.moe.activation) exists here.
    activation_override: bool


#: --moe-backend names of vLLM 0.33.0 (spec §6 step 2).
MOE_BACKEND_NAMES: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16, B.FLASHINFER_TRTLLM_MXFP4_MXFP8),
    "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16, B.FLASHINFER_CUTLASS_MXFP4_MXFP8),
    "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
    "triton": (B.TRITON,),
    "triton_unfused": (B.TRITON_UNFUSED,),
    "marlin": (B.MARLIN,),
    "humming": (B.HUMMING,),
    "aiter": (B.AITER_MXFP4_BF16, B.AITER_TRITON_MXFP4_BF16, B.AITER_MXFP4_FP8,
              B.AITER_MXFP4_MXFP4, B.AITER_TRITON_MXFP4_MXFP4),
    "aiter_triton_mxfp4_bf16": (B.AITER_TRITON_MXFP4_BF16,),
    "aiter_mxfp4_fp8": (B.AITER_MXFP4_FP8,),
    "aiter_triton_mxfp4_mxfp4": (B.AITER_TRITON_MXFP4_MXFP4,),
    "aiter_mxfp4_mxfp4": (B.AITER_MXFP4_MXFP4,),
    "xpu": (B.XPU,),
    "cpu": (B.CPU,),
    "emulation": (B.EMULATION,),
}

#: --moe-backend names of vLLM 0.19-0.20 (page 001 `map_mxfp4_backend`: one backend each, no
#: triton_unfused, humming, cpu or aiter_* names).
MOE_BACKEND_NAMES_0_20: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM_MXFP4_BF16,),
    "flashinfer_trtllm_afp8": (B.FLASHINFER_TRTLLM_MXFP4_MXFP8,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS_MXFP4_BF16,),
    "flashinfer_cutlass_afp8": (B.FLASHINFER_CUTLASS_MXFP4_MXFP8,),
    "triton": (B.TRITON,),
    "marlin": (B.MARLIN,),
    "aiter": (B.AITER_MXFP4_BF16,),
    "xpu": (B.XPU,),
    "emulation": (B.EMULATION,),
}

_STYLE_033 = SelectionStyle(
    name="oracle-0.33",
    runtime="vLLM 0.33.0",
    # _get_priority_backends_for_gpt_oss (spec §6 step 4); TRITON_UNFUSED is commented out there.
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16, B.FLASHINFER_TRTLLM_MXFP4_MXFP8,
        B.AITER_MXFP4_BF16, B.AITER_TRITON_MXFP4_BF16, B.AITER_MXFP4_FP8, B.AITER_MXFP4_MXFP4,
        B.TRITON,
        B.FLASHINFER_CUTLASS_MXFP4_BF16, B.FLASHINFER_CUTLASS_MXFP4_MXFP8, B.CUTLASS_MXFP4_MXFP4,
        B.MARLIN, B.BATCHED_MARLIN, B.HUMMING, B.XPU, B.CPU, B.EMULATION,
    ),
    moves=(
        PriorityMove(B.TRITON, lambda p: p.is_cuda_family(12),
                     "SM12x family: TRITON demoted after BATCHED_MARLIN", after=B.BATCHED_MARLIN),
        PriorityMove(B.HUMMING, lambda p: p.platform == "cuda" and p.cap == (9, 0),
                     "SM90: prioritize_humming puts HUMMING before MARLIN", before=B.MARLIN),
    ),
    names=MappingProxyType(MOE_BACKEND_NAMES),
    unsupported_names=MappingProxyType({
        "b12x": "B12X_* backends are not routed through the GPT-OSS MXFP4 weight converter (spec §4.7)",
        "deep_gemm": "DEEPGEMM_MXFP4 is not a GPT-OSS backend mxconvert lays out (spec §4.7)",
    }),
    classes=MappingProxyType(_KERNEL_CLASSES_033),
    env_overrides=(),
    activation_override=True,
)

_ENV_0_20 = (
    EnvOverride(
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
        # current_platform.is_device_capability(90) / is_device_capability_family(100).
        force=((lambda p: p.cap == (9, 0) and p.capability is not None, B.FLASHINFER_CUTLASS_MXFP4_BF16),
               (lambda p: p.is_cuda_family(10), B.FLASHINFER_TRTLLM_MXFP4_BF16)),
        remove_when_false=(B.FLASHINFER_TRTLLM_MXFP4_BF16, B.FLASHINFER_CUTLASS_MXFP4_BF16),
        no_match=("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 is set but the device capability is not "
                  "supported; only SM90 (CUTLASS) and SM100+ (TRTLLM) are supported"),
    ),
    EnvOverride("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8", force=((_always, B.FLASHINFER_TRTLLM_MXFP4_MXFP8),)),
    EnvOverride("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
                force=((_always, B.FLASHINFER_CUTLASS_MXFP4_MXFP8),)),
    # Not turned into BATCHED_MARLIN for the batched format (only the --moe-backend path does that).
    EnvOverride("VLLM_MXFP4_USE_MARLIN", force=((_always, B.MARLIN),)),
)

_STYLE_020 = SelectionStyle(
    name="env-0.20",
    runtime="vLLM 0.19-0.20",
    # Page 001 `_get_priority_backends` (AITER is the old CK, i.e. AITER_MXFP4_BF16).
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16, B.AITER_MXFP4_BF16, B.TRITON, B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.TRITON_UNFUSED, B.MARLIN, B.BATCHED_MARLIN, B.XPU, B.EMULATION,
    ),
    moves=(),
    names=MappingProxyType(MOE_BACKEND_NAMES_0_20),
    unsupported_names=MappingProxyType({}),
    classes=MappingProxyType(_KERNEL_CLASSES_020),
    env_overrides=_ENV_0_20,
    activation_override=False,
)

SELECTION_STYLES: dict[str, SelectionStyle] = {s.name: s for s in (_STYLE_033, _STYLE_020)}

#: --moe-backend names per selection style.
MOE_BACKEND_NAMES_BY_STYLE: dict[str, dict[str, tuple[Mxfp4Backend, ...]]] = {
    s.name: dict(s.names) for s in SELECTION_STYLES.values()
}


def _style(revision: RuntimeRevision) -> SelectionStyle:
    try:
        return SELECTION_STYLES[revision.selection]
    except KeyError:
        raise InputError(
            f"runtime revision {revision.name} uses selection style {revision.selection!r}, which "
            f"mxconvert does not know (known: {', '.join(SELECTION_STYLES)})"
        ) from None


def moe_backend_names(revision: RuntimeRevision) -> tuple[str, ...]:
    """The --moe-backend names valid for `revision`, "auto" first."""
    return ("auto", *_style(revision).names)


# --------------------------------------------------------------------------------------------------
# The algorithms
# --------------------------------------------------------------------------------------------------


class _Run:
    """Bookkeeping shared by both algorithms: the context, the considered lines, the errors."""

    def __init__(self, style: SelectionStyle, profile: DeviceProfile, revision: RuntimeRevision,
                 deployment: Deployment, requested: str, hidden_size: int | None):
        self.style = style
        self.profile = profile
        self.revision = revision
        self.deployment = deployment
        self.requested = requested
        self.hidden_size = hidden_size
        self.considered: list[Considered] = []

    def ctx(self, activation: str) -> _Ctx:
        return _Ctx(self.profile, self.deployment, activation, self.hidden_size)

    def note(self, backend: B, kernel_class: str | None, reason: str) -> None:
        self.considered.append(Considered(backend, kernel_class, False, reason))

    def try_backend(self, backend: B, activation: str, explicit: bool) -> tuple[KernelClass, str] | None:
        """Try the kernel classes of `backend` in order; record each failure; return the winner."""
        classes = [c for c in self.style.classes.get(backend, ()) if explicit or not c.explicit_only]
        if not classes:
            self.note(backend, None, "mxconvert knows no kernel class for this backend")
            return None
        ctx = self.ctx(activation)
        for cls in classes:
            reason = _is_supported(cls, ctx)
            if reason is None:
                return cls, activation
            self.note(backend, cls.name, reason)
        return None

    def choose(self, backend: B, cls: KernelClass | str, activation: str, reason: str) -> Selection:
        name = cls if isinstance(cls, str) else cls.name
        self.considered.append(Considered(backend, name, True, reason))
        mid = None
        if backend in MARLIN_BACKENDS:
            mid = _check_marlin_input_dtype(self.profile, self.deployment)
        return Selection(
            backend=backend,
            kernel_class=name,
            requested=self.requested,
            revision=self.revision.name,
            profile=self.profile.name,
            activation=activation,
            considered=tuple(self.considered),
            marlin_input_dtype=mid,
        )

    def where(self) -> str:
        return f"profile {self.profile.name} ({self.profile.summary()}) under {self.revision.name}"

    def refuse(self, head: str, since: int = 0) -> UnsupportedError:
        lines = [
            f"  - {c.backend.value}" + (f" [{c.kernel_class}]" if c.kernel_class else "") + f": {c.reason}"
            for c in self.considered[since:]
        ]
        err = UnsupportedError(head + (":\n" + "\n".join(lines) if lines else ""))
        err.considered = tuple(self.considered)  # type: ignore[attr-defined]
        return err


def _check_marlin_input_dtype(profile: DeviceProfile, deployment: Deployment) -> str | None:
    """VLLM_MARLIN_INPUT_DTYPE for a Marlin backend (spec §4.5 `get_marlin_input_dtype`)."""
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
            f"family, {_where(profile)}"
        )
    return None


def _global_gate(run: _Run) -> None:
    # Mxfp4Config.get_min_capability() = 80: GPT-OSS MXFP4 is refused on CUDA cap < 8.0 before any
    # backend is looked at (spec §6). The same config class gates 0.19-0.20.
    p = run.profile
    if p.platform == "cuda" and p.cap < (8, 0):
        raise UnsupportedError(
            f"GPT-OSS MXFP4 needs CUDA capability >= 8.0 (Mxfp4Config.get_min_capability() = 80), "
            f"{_where(p)}"
        )


def _normalise_name(name: str) -> str:
    if not isinstance(name, str):
        raise InputError(f"--moe-backend must be a string, got {name!r}")
    return name.strip().lower().replace("-", "_")


def _resolve_name(run: _Run, name: str) -> tuple[B, ...]:
    style = run.style
    if name in style.names:
        return style.names[name]
    if name in style.unsupported_names:
        raise UnsupportedError(
            f"--moe-backend {name!r} is a {style.runtime} name, but mxconvert cannot produce its "
            f"layout: {style.unsupported_names[name]}"
        )
    raise InputError(
        f"unknown --moe-backend {name!r} for {run.revision.name} ({style.runtime}); valid names: "
        + ", ".join(("auto", *style.names))
    )


def _filter_by_activation(backends: tuple[B, ...] | list[B], requested: str | None, explicit: bool
                          ) -> list[B]:
    """vLLM 0.33 ``_filter_by_activation``: the candidates that stay, in order.

    A requested activation keeps the backends whose activation key matches it. Without one, the
    BF16 backends (activation key None, EMULATION included) are kept; for an explicit name whose
    candidates have no BF16 variant the list stays as it is, so the `_afp8` names still land
    (spec §6 steps 2-3).
    """
    want = requested or "bf16"
    kept = [b for b in backends if BACKEND_ACTIVATION[b] == want]
    if requested is None and explicit and not kept:
        kept = list(backends)
    return kept


def _select_oracle_033(run: _Run) -> Selection:
    d = run.deployment
    if d.env:
        raise InputError(
            f"env overrides {', '.join(sorted(d.env))} do not exist in {run.style.runtime} "
            "(VLLM_USE_FLASHINFER_MOE_MXFP4_* and VLLM_MXFP4_USE_MARLIN were removed); use "
            "--moe-backend and the MoE activation override instead"
        )
    _global_gate(run)
    requested = d.activation  # _resolve_activation_key(None): only the user override sets it
    want = requested or "bf16"

    if run.requested != "auto":
        candidates = _resolve_name(run, run.requested)
        kept = _filter_by_activation(candidates, requested, explicit=True)
        for backend in candidates:
            if backend not in kept:
                run.note(backend, None, f"not tried: runs {BACKEND_ACTIVATION[backend]} activations, "
                                        f"{want} requested")
                continue
            if d.batched and backend == B.MARLIN:
                backend = B.BATCHED_MARLIN
            act = BACKEND_ACTIVATION[backend]
            hit = run.try_backend(backend, act, explicit=True)
            if hit:
                return run.choose(backend, hit[0], act, f"--moe-backend {run.requested}: all predicates pass")
        raise run.refuse(
            f"--moe-backend {run.requested!r} ({', '.join(b.value for b in candidates)}) cannot run on "
            f"{run.where()}"
        )

    order = list(run.style.priority)
    for move in run.style.moves:
        if move.applies(run.profile):
            order = move.apply(order)
    kept = _filter_by_activation(order, requested, explicit=False)
    for backend in order:
        if backend not in kept:
            run.note(backend, None, f"not tried: runs {BACKEND_ACTIVATION[backend]} activations, "
                                    f"{want} requested")
            continue
        act = BACKEND_ACTIVATION[backend]
        hit = run.try_backend(backend, act, explicit=False)
        if hit:
            return run.choose(backend, hit[0], act, "first backend in priority order whose predicates all pass")
    if run.profile.platform == "xpu":
        # vLLM forces XPU on the XPU platform (_return_or_raise: it raises with XPU's reason).
        since = len(run.considered)
        hit = run.try_backend(B.XPU, "bf16", explicit=True)
        if hit:
            return run.choose(B.XPU, hit[0], "bf16", "forced on the XPU platform")
        raise run.refuse(f"XPU is forced on the XPU platform but cannot run on {run.where()}", since)
    raise run.refuse(f"no MXFP4 MoE backend supports {run.where()} with this deployment")


def _parse_env_bool(var: str, value: str) -> bool:
    # vLLM envs: bool(int(value)) (maybe_convert_bool for VLLM_MXFP4_USE_MARLIN; bool(int(...)) for
    # the VLLM_USE_FLASHINFER_MOE_MXFP4_* switches), so only integers are accepted.
    try:
        return bool(int(value))
    except ValueError:
        raise InputError(f"{var}={value!r}: vLLM parses it with int(); use 0 or 1") from None


def _select_env_020(run: _Run) -> Selection:
    d = run.deployment
    known = {o.var for o in run.style.env_overrides}
    unknown = sorted(set(d.env) - known)
    if unknown:
        raise InputError(
            f"unknown env override(s) {', '.join(unknown)} for {run.revision.name}; known: "
            + ", ".join(o.var for o in run.style.env_overrides)
        )
    env = {k: _parse_env_bool(k, v) for k, v in d.env.items()}
    if d.activation is not None:
        raise InputError(
            f"the MoE activation override does not exist in {run.style.runtime}; use "
            "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (TRTLLM) or VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1, "
            "or --moe-backend flashinfer_trtllm_afp8 / flashinfer_cutlass_afp8"
        )
    _global_gate(run)
    p = run.profile

    if d.lora:
        # Page 001: the LoRA branch runs first and ignores --moe-backend; it returns a class without
        # checking its predicates. `envs.VLLM_MXFP4_USE_MARLIN is False` is true only when the
        # variable is set to 0 (maybe_convert_bool gives None when unset).
        if p.platform != "cuda":
            raise UnsupportedError(
                f"Mxfp4 LoRA is only supported on CUDA in {run.style.runtime}; {_where(p)}"
            )
        ignored = "" if run.requested == "auto" else f"; --moe-backend {run.requested} is ignored by this branch"
        triton_ok = p.has_triton_kernels and (9, 0) <= p.cap < (11, 0)
        marlin_off = env.get("VLLM_MXFP4_USE_MARLIN") is False
        if marlin_off and triton_ok:
            return run.choose(B.TRITON_UNFUSED, "UnfusedOAITritonExperts", "bf16",
                              "LoRA branch: VLLM_MXFP4_USE_MARLIN=0 and triton_kernels with "
                              f"9.0 <= cap < 11.0{ignored}")
        if not marlin_off:
            why = "VLLM_MXFP4_USE_MARLIN is not set to 0 (vLLM tests `is False`)"
        elif not p.has_triton_kernels:
            why = f"triton_kernels not installed on profile {p.name}"
        else:
            why = f"TRITON_UNFUSED needs 9.0 <= cap < 11.0, {_where(p)}"
        run.note(B.TRITON_UNFUSED, "UnfusedOAITritonExperts", f"LoRA branch: {why}")
        return run.choose(B.MARLIN, "MarlinExperts", "bf16", f"LoRA branch: Marlin fallback{ignored}")

    if run.requested != "auto":
        (backend,) = _resolve_name(run, run.requested)
        if d.batched and backend == B.MARLIN:
            backend = B.BATCHED_MARLIN
        act = BACKEND_ACTIVATION[backend]
        hit = run.try_backend(backend, act, explicit=True)
        if hit:
            return run.choose(backend, hit[0], act, f"--moe-backend {run.requested}: all predicates pass")
        raise run.refuse(f"--moe-backend {run.requested!r} ({backend.value}) cannot run on {run.where()}")

    available = list(run.style.priority)
    removed: dict[B, str] = {}
    for override in run.style.env_overrides:
        if override.var not in env:
            continue
        if not env[override.var]:
            for b in override.remove_when_false:
                if b in available:
                    available.remove(b)
                    removed[b] = f"removed by {override.var}=0"
            continue
        for applies, backend in override.force:
            if applies(p):
                act = BACKEND_ACTIVATION[backend]
                hit = run.try_backend(backend, act, explicit=True)
                if hit:
                    return run.choose(backend, hit[0], act, f"forced by {override.var}=1")
                raise run.refuse(f"{override.var}=1 forces {backend.value}, which cannot run on {run.where()}")
        raise UnsupportedError(f"{override.no_match}; {_where(p)}")

    for backend in run.style.priority:
        if backend in removed:
            run.note(backend, None, removed[backend])
            continue
        act = BACKEND_ACTIVATION[backend]
        hit = run.try_backend(backend, act, explicit=False)
        if hit:
            return run.choose(backend, hit[0], act, "first backend in priority order whose predicates all pass")
    if p.platform == "xpu":
        since = len(run.considered)
        hit = run.try_backend(B.XPU, "bf16", explicit=True)
        if hit:
            return run.choose(B.XPU, hit[0], "bf16", "forced on the XPU platform")
        raise run.refuse(f"XPU is forced on the XPU platform but cannot run on {run.where()}", since)
    if p.platform in ("cuda", "rocm"):
        raise run.refuse(f"no MXFP4 MoE backend supports {run.where()} with this deployment")
    # The 0.19-0.20 oracle returns Mxfp4MoeBackend.NONE here (no MXFP4 MoE kernel at all).
    raise run.refuse(f"{run.style.runtime} has no MXFP4 MoE backend for {run.where()} (the oracle returns NONE)")


_ALGORITHMS: dict[str, Callable[[_Run], Selection]] = {
    "oracle-0.33": _select_oracle_033,
    "env-0.20": _select_env_020,
}


def select_backend(
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment = Deployment(),
    moe_backend: str = "auto",
    hidden_size: int | None = None,
) -> Selection:
    """Pick the MXFP4 MoE backend and kernel class vLLM `revision` would pick on `profile`.

    `moe_backend` is "auto" or a vLLM --moe-backend name. `hidden_size` is the unpadded hidden size
    (vLLM checks `_supports_shape` before padding); no class on this path constrains it today.
    Raises InputError for bad input (unknown names, malformed overrides) and UnsupportedError when
    the requested or every backend is refused; the message lists the per-backend reasons.
    """
    if not isinstance(deployment, Deployment):
        raise InputError(f"deployment must be a Deployment, got {type(deployment).__name__}")
    if hidden_size is not None and (isinstance(hidden_size, bool) or not isinstance(hidden_size, int)
                                    or hidden_size <= 0):
        raise InputError(f"hidden_size must be a positive integer, got {hidden_size!r}")
    style = _style(revision)
    run = _Run(style, profile, revision, deployment, _normalise_name(moe_backend), hidden_size)
    return _ALGORITHMS[style.name](run)
