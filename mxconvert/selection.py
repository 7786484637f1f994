"""MoE backend selection: a data-driven mirror of vLLM's MXFP4 (GPT-OSS) and NVFP4 MoE oracles.

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

NVFP4 (``select_nvfp4_backend``) runs on the same machinery: the same ``KernelClass`` /
``_is_supported`` predicates, ``SelectionStyle`` rows, ``PriorityMove``s, ``EnvOverride``s, ``_Run``
bookkeeping and ``Selection`` report; only the tables and the two oracle control flows are its own.
Sources (read, not copied):
  * /work/shared/spec/nvfp4_transforms.md §3 (enum, ``is_global_sf_supported_for_nvfp4_backend``),
    §5 (which preparations refuse which shapes), §6 (0.33.0 algorithm, per-class predicates, auto
    choices, legacy env vars), §10 (the older revision).
  * /work/shared/spec/vllm_oracle_pages/002_80c7f2cbfa8b46f0.txt (≈ vLLM 0.15 ``oracle/nvfp4.py``).
  * Public vLLM source, only where the spec leaves a detail open (cited where used):
    ``oracle/nvfp4.py`` @ 01362014 (HUMMING class order, clamp set, explicit-name handling,
    ``_use_a16``), ``compressed_tensors_moe_w4a4_nvfp4.py`` (FLASHINFER_MOE_EP_CUTEDSL is handled
    by the quant method, not the oracle), ``experts/nvfp4_emulation_moe.py``, and for the ≈0.15 tree
    ``quantization/utils/flashinfer_fp4_moe.py`` (``is_supported_config_trtllm``),
    ``fused_moe/flashinfer_cutlass_moe.py`` @ 01f004eb, ``fused_moe/flashinfer_cutedsl_moe.py`` @
    04f87a28 and ``fused_moe/fused_marlin_moe.py`` @ 00a130a0 (trees of the same era as page 002,
    not necessarily its exact commit).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Callable, Mapping

from .backends import MARLIN_BACKENDS, NVFP4_GLOBAL_SF_BACKENDS, Mxfp4Backend, Nvfp4Backend
from .errors import InputError, UnsupportedError
from .profiles import DeviceProfile
from .revisions import RuntimeRevision, get_revision

B = Mxfp4Backend
N = Nvfp4Backend

#: Backend enum per weight format (recorded as "format" in NVFP4 selection JSON; MXFP4 JSON has no
#: "format" key, for compatibility with manifests written before NVFP4 existed).
FORMAT_ENUMS: dict[str, type[Enum]] = {"mxfp4": Mxfp4Backend, "nvfp4": Nvfp4Backend}

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
    #: Env overrides, e.g. {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"} (MXFP4, vLLM 0.19-0.20),
    #: {"VLLM_USE_FLASHINFER_MOE_FP4": "1"} (NVFP4, ≈0.15), {"VLLM_BATCH_INVARIANT": "1"} (NVFP4, 0.33).
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

    backend: Mxfp4Backend | Nvfp4Backend
    kernel_class: str | None
    chosen: bool
    reason: str

    def to_json(self) -> dict:
        return {"backend": self.backend.value, "kernel_class": self.kernel_class,
                "chosen": self.chosen, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping, fmt: str = "mxfp4") -> "Considered":
        enum = _format_enum(fmt)
        return cls(enum(data["backend"]), data["kernel_class"], bool(data["chosen"]), data["reason"])


def _format_enum(fmt: str) -> type[Enum]:
    try:
        return FORMAT_ENUMS[fmt]
    except (KeyError, TypeError):
        raise InputError(f"unknown selection format {fmt!r}; known: {', '.join(FORMAT_ENUMS)}") from None


@dataclass(frozen=True)
class Selection:
    backend: Mxfp4Backend | Nvfp4Backend
    kernel_class: str
    #: "auto" or the --moe-backend name.
    requested: str
    revision: str
    profile: str
    #: Activations the chosen kernel computes with: "bf16" or "mxfp8" (MXFP4); "nvfp4" or "bf16"
    #: (NVFP4: "bf16" for W4A16 / forced-A16 runs and for the weight-only MARLIN).
    activation: str
    #: Every backend tried, in order, with the reason it was passed over; the chosen one last.
    considered: tuple[Considered, ...]
    #: VLLM_MARLIN_INPUT_DTYPE in effect ("fp8" or None) when a Marlin backend is chosen, else None.
    #: (An addition to the brief's API: the Marlin layout depends on it, spec §4.5 is_a_8bit.)
    marlin_input_dtype: str | None = None
    #: "mxfp4" (``backend`` is an Mxfp4Backend) or "nvfp4" (an Nvfp4Backend).
    format: str = "mxfp4"
    #: NVFP4 only (None for MXFP4): ``is_global_sf_supported_for_nvfp4_backend(backend)``, i.e. the
    #: activation input scales are reduced to one scalar over all experts (global ones under EP).
    use_global_sf: bool | None = None
    #: NVFP4 only: the kernel runs with 16-bit activations (W4A16 checkpoint, or B12X with
    #: VLLM_B12X_MOE_FP4_FORCE_A16=1): vLLM's ``_use_a16``.
    use_a16: bool | None = None
    #: NVFP4 only: the MoE activation function the selection was made for (MoEActivation value).
    activation_fn: str | None = None

    def to_json(self) -> dict:
        data = {
            "backend": self.backend.value,
            "kernel_class": self.kernel_class,
            "requested": self.requested,
            "revision": self.revision,
            "profile": self.profile,
            "activation": self.activation,
            "marlin_input_dtype": self.marlin_input_dtype,
            "considered": [c.to_json() for c in self.considered],
        }
        if self.format != "mxfp4":
            data.update(format=self.format, use_global_sf=self.use_global_sf, use_a16=self.use_a16,
                        activation_fn=self.activation_fn)
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> "Selection":
        fmt = data.get("format", "mxfp4")
        enum = _format_enum(fmt)
        return cls(
            backend=enum(data["backend"]),
            kernel_class=data["kernel_class"],
            requested=data["requested"],
            revision=data["revision"],
            profile=data["profile"],
            activation=data["activation"],
            considered=tuple(Considered.from_json(c, fmt) for c in data["considered"]),
            marlin_input_dtype=data.get("marlin_input_dtype"),
            format=fmt,
            use_global_sf=data.get("use_global_sf"),
            use_a16=data.get("use_a16"),
            activation_fn=data.get("activation_fn"),
        )


# --------------------------------------------------------------------------------------------------
# Predicates
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    """What a predicate may look at: the device, the deployment, the candidate's activation."""

    profile: DeviceProfile
    deployment: Deployment
    #: Activation quant key of the candidate being checked: "bf16" (vLLM's None), "mxfp8", "fp8",
    #: "mxfp4" for MXFP4 weights; "nvfp4" (kNvfp4Dynamic) or "bf16" for NVFP4 weights.
    activation: str
    hidden_size: int | None
    #: Weight format as reasons name it.
    weight: str = "MXFP4"
    #: The model's routing method (a RoutingMethodType name); None: not known, assumed supported.
    routing: str | None = "RenormalizeNaive"
    #: MoE activation function (MoEActivation value); None: not modelled (the GPT-OSS MXFP4 path).
    activation_fn: str | None = None
    #: VLLM_BATCH_INVARIANT=1 (NVFP4 0.33 only).
    batch_invariant: bool = False

    @property
    def is_act_and_mul(self) -> bool:
        # MoEActivation.is_gated: every activation but the *_no_mul ones.
        return self.activation_fn is None or not self.activation_fn.endswith("_no_mul")


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
        return (f"kernel does not support {ctx.weight} weights with {ctx.activation} activations "
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


def _activations(*names: str, situ_flag: str | None = None) -> Callable[[_Ctx], Reason]:
    """``_supports_activation``: the MoEActivation values a class accepts. With `situ_flag`, SITU is
    accepted only when the profile says FlashInfer exposes it (TRTLLM NVFP4, spec §6.2)."""
    allowed = frozenset(names)

    def check(ctx: _Ctx) -> Reason:
        act = ctx.activation_fn
        if act is None or act in allowed:
            return None
        if act == "situ" and situ_flag and _extra_flag(ctx.profile, situ_flag, False):
            return None
        return f"kernel does not support {act} activation"
    return check


def _extra_flag(p: DeviceProfile, key: str, default: bool) -> bool:
    """A library-availability flag the DeviceProfile has no field for, read from ``profile.extra``.

    Keys used: has_flashinfer_trtllm, has_flashinfer_cutedsl, has_flashinfer_b12x (default: the
    profile's has_flashinfer), has_b12x, flashinfer_situ (default False).
    """
    value = p.extra.get(key, default) if isinstance(p.extra, Mapping) else default
    return bool(value)


def _has_extra(key: str, what: str, default: Callable[[DeviceProfile], bool]) -> Check:
    def check(ctx: _Ctx) -> Reason:
        p = ctx.profile
        return None if _extra_flag(p, key, default(p)) else f"{what} not installed on profile {p.name}"
    return check


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
    #: ``_supports_no_act_and_mul`` (non-gated MoE, activations ending in "_no_mul").
    no_act_and_mul: bool = True
    #: ``_supports_activation``; None: not modelled (every class on the GPT-OSS MXFP4 path takes it).
    activation: Check | None = None
    #: ``_supports_batch_invariance`` (checked only with VLLM_BATCH_INVARIANT=1).
    batch_invariant: bool = False


def _is_supported(cls: KernelClass, ctx: _Ctx) -> Reason:
    """``is_supported_config`` in vLLM 0.33.0's order (mxfp4 spec §6 step 5, nvfp4 spec §6.1);
    None when it passes.

    Order: device, act_and_mul, activation, quant scheme, parallel config, routing method, shape,
    activation format, batch invariance, LoRA. Hash routing, the decomposed-backend requirement and
    the router-logits dtype are accepted by every class mxconvert lays out, so they are not modelled.
    On the GPT-OSS MXFP4 path act_and_mul (gated), the activation (SWIGLUOAI) and batch invariance
    never refuse either: its contexts carry activation_fn=None and batch_invariant=False.
    """
    for check in cls.device:
        reason = check(ctx)
        if reason:
            return reason
    if not (ctx.is_act_and_mul or cls.no_act_and_mul):
        return "kernel does not support no act_and_mul MLP layer"
    if cls.activation is not None:
        reason = cls.activation(ctx)
        if reason:
            return reason
    reason = cls.quant(ctx)
    if reason:
        return reason
    reason = cls.parallel(ctx)
    if reason:
        return reason
    if cls.routing is not None and ctx.routing is not None and ctx.routing not in cls.routing:
        return f"kernel does not support {ctx.routing} routing"
    if cls.shape is not None:
        reason = cls.shape(ctx)
        if reason:
            return reason
    fmt = ctx.deployment.activation_format
    if fmt not in cls.formats:
        (only,) = tuple(cls.formats)
        return f"kernel supports only the {only} activation format, deployment uses the {fmt} format"
    if ctx.batch_invariant and not cls.batch_invariant:
        return "kernel does not support batch invariance (VLLM_BATCH_INVARIANT=1)"
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
    """One env-style override of an older oracle, in the order the oracle reads them.

    When set to a true value the first matching (condition, backend) of `force` is returned
    through `_return_or_raise` (no match: the override is refused with `no_match`); when set to
    false the `remove_when_false` backends leave the priority list. `when_true`, if given, replaces
    `force` with a function of the run (an override whose true branch reads other variables, like
    the NVFP4 ``VLLM_USE_FLASHINFER_MOE_FP4`` + ``VLLM_FLASHINFER_MOE_BACKEND`` pair).
    """

    var: str
    force: tuple[tuple[Callable[[DeviceProfile], bool], Enum], ...] = ()
    remove_when_false: tuple[Enum, ...] = ()
    no_match: str = ""
    when_true: Callable[["_Run"], "Selection"] | None = None


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
    #: Weight format of the oracle ("mxfp4" or "nvfp4"); names the enum of every backend above.
    fmt: str = "mxfp4"
    #: The activation key a backend runs with; None: the MXFP4 `BACKEND_ACTIVATION` table.
    activation_of: Callable[["_Run", Enum], str] | None = None
    #: Backends that apply the SwiGLU clamp (NVFP4 ``NVFP4_BACKENDS_WITH_CLAMP``); None: no filter.
    clamp: frozenset | None = None
    #: Explicit-name backend -> its variant for the batched activation format.
    batched_variants: Mapping[Enum, Enum] = field(default_factory=dict)
    #: String-valued env variables and their allowed values (``env_with_choices``).
    env_choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Boolean env variables that predicates read (not overrides), e.g. VLLM_BATCH_INVARIANT.
    env_flags: tuple[str, ...] = ()
    #: Env variables of older trees that this one no longer reads -> what replaces them.
    env_removed: Mapping[str, str] = field(default_factory=dict)


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


@dataclass(frozen=True)
class _Model:
    """Model-side inputs of a selection. The GPT-OSS MXFP4 path fixes them (the defaults)."""

    routing: str | None = _GPT_OSS_ROUTING
    activation_fn: str | None = None
    #: W4A16 checkpoint (NVFP4 without input scales: vLLM passes activation_key=None).
    w4a16: bool = False
    swiglu_limit: float | None = None
    #: The checkpoint's (unsharded) MoE intermediate size, for the shape refusals.
    intermediate_size: int | None = None


class _Run:
    """Bookkeeping shared by all algorithms: the context, the considered lines, the errors."""

    def __init__(self, style: SelectionStyle, profile: DeviceProfile, revision: RuntimeRevision,
                 deployment: Deployment, requested: str, hidden_size: int | None,
                 model: _Model = _Model()):
        self.style = style
        self.profile = profile
        self.revision = revision
        self.deployment = deployment
        self.requested = requested
        self.hidden_size = hidden_size
        self.model = model
        self.considered: list[Considered] = []
        #: Parsed env overrides (bools, or strings for `style.env_choices`); set by `_parse_env`.
        self.env: dict[str, bool | str] = {}

    def ctx(self, activation: str) -> _Ctx:
        return _Ctx(self.profile, self.deployment, activation, self.hidden_size,
                    weight=self.style.fmt.upper(), routing=self.model.routing,
                    activation_fn=self.model.activation_fn,
                    batch_invariant=bool(self.env.get("VLLM_BATCH_INVARIANT", False)))

    def activation_for(self, backend: Enum) -> str:
        if self.style.activation_of is not None:
            return self.style.activation_of(self, backend)
        return BACKEND_ACTIVATION[backend]

    def note(self, backend: Enum, kernel_class: str | None, reason: str) -> None:
        self.considered.append(Considered(backend, kernel_class, False, reason))

    def try_backend(self, backend: Enum, activation: str, explicit: bool) -> tuple[KernelClass, str] | None:
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

    def choose(self, backend: Enum, cls: KernelClass | str, activation: str, reason: str) -> Selection:
        name = cls if isinstance(cls, str) else cls.name
        if self.style.fmt == "nvfp4":
            return _choose_nvfp4(self, backend, name, activation, reason)
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

    order = _moved_priority(run)
    kept = _filter_by_activation(order, requested, explicit=False)
    skipped = {b: f"not tried: runs {BACKEND_ACTIVATION[b]} activations, {want} requested"
               for b in order if b not in kept}
    chosen = _first_passing(run, order, skipped)
    if chosen is not None:
        return chosen
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


def _parse_env(run: _Run) -> dict[str, bool | str]:
    """Check `deployment.env` against the style's variables and parse it into `run.env`."""
    style = run.style
    known = [o.var for o in style.env_overrides] + list(style.env_choices) + list(style.env_flags)
    unknown = sorted(set(run.deployment.env) - set(known))
    gone = [k for k in unknown if k in style.env_removed]
    if gone:
        raise InputError(
            f"env override(s) {', '.join(gone)} do not exist in {style.runtime}: "
            + "; ".join(f"{k}: {style.env_removed[k]}" for k in gone)
        )
    if unknown:
        raise InputError(
            f"unknown env override(s) {', '.join(unknown)} for {run.revision.name}; known: "
            + ", ".join(known)
        )
    env: dict[str, bool | str] = {}
    for key, value in run.deployment.env.items():
        if key in style.env_choices:
            choices = style.env_choices[key]
            if value.lower() not in choices:
                raise InputError(f"{key}={value!r}: vLLM accepts only {', '.join(choices)}")
            env[key] = value.lower()
        else:
            env[key] = _parse_env_bool(key, value)
    run.env = env
    return env


def _moved_priority(run: _Run) -> list:
    """The style's priority list after its modifiers (`PriorityMove`s) for this profile."""
    order = list(run.style.priority)
    for move in run.style.moves:
        if move.applies(run.profile):
            order = move.apply(order)
    return order


def _first_passing(run: _Run, order, skipped: Mapping) -> Selection | None:
    """Walk `order`; note the `skipped` backends with their reason; choose the first that passes."""
    for backend in order:
        if backend in skipped:
            run.note(backend, None, skipped[backend])
            continue
        act = run.activation_for(backend)
        hit = run.try_backend(backend, act, explicit=False)
        if hit:
            return run.choose(backend, hit[0], act, "first backend in priority order whose predicates all pass")
    return None


def _force(run: _Run, backend: Enum, why: str, refusal: str) -> Selection:
    """vLLM's ``_return_or_raise``: the backend's first passing class, or a refusal."""
    act = run.activation_for(backend)
    hit = run.try_backend(backend, act, explicit=True)
    if hit:
        return run.choose(backend, hit[0], act, why)
    raise run.refuse(refusal)


def _apply_env_overrides(run: _Run) -> tuple[Selection | None, dict]:
    """Run the style's `EnvOverride`s in order over `run.env`.

    Returns (a forced selection or None, {backend removed from the priority list: why}).
    """
    removed: dict = {}
    p = run.profile
    for override in run.style.env_overrides:
        if override.var not in run.env:
            continue
        if not run.env[override.var]:
            for b in override.remove_when_false:
                removed.setdefault(b, f"removed by {override.var}=0")
            continue
        if override.when_true is not None:
            return override.when_true(run), removed
        for applies, backend in override.force:
            if applies(p):
                return _force(run, backend, f"forced by {override.var}=1",
                              f"{override.var}=1 forces {backend.value}, which cannot run on {run.where()}"
                              ), removed
        raise UnsupportedError(f"{override.no_match}; {_where(p)}")
    return None, removed


def _select_env_020(run: _Run) -> Selection:
    d = run.deployment
    env = _parse_env(run)
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

    forced, removed = _apply_env_overrides(run)
    if forced is not None:
        return forced
    chosen = _first_passing(run, run.style.priority, removed)
    if chosen is not None:
        return chosen
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


# ==================================================================================================
# NVFP4: the same machinery, with vLLM's NVFP4 oracle tables (nvfp4_transforms.md §3, §5, §6, §10)
# ==================================================================================================

#: ``MoEActivation`` values (``fused_moe/activation.py``). All of them form the "apply set" of spec
#: §6.2 (``_APPLY_MOE_ACTIVATIONS``); names ending in "_no_mul" are non-gated (``is_gated``).
NVFP4_ACTIVATION_FNS = (
    "silu", "gelu", "gelu_tanh", "situ", "swigluoai", "swigluoai_uninterleave", "swiglustep",
    "silu_no_mul", "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul",
)

#: ``RoutingMethodType`` names a ``routing_method`` may give (the spec §6.2 TRTLLM list plus the
#: generic ones of vLLM's/FlashInfer's enum).
ROUTING_METHODS = (
    "Default", "Renormalize", "DeepSeekV3", "Llama4", "RenormalizeNaive", "TopK", "SigmoidRenorm",
    "Sigmoid", "MiniMax2", "Custom", "Unspecified",
)

_APPLY_SET = _activations(*NVFP4_ACTIVATION_FNS)

#: FlashInfer all2all backends: NVLink two-sided (incl. the older name) and one-sided.
_FI_NVL = _FI_NVL_TWO_SIDED | {"flashinfer_nvlink_one_sided"}


def _fi_default(p: DeviceProfile) -> bool:
    return p.has_flashinfer


def _uses_all2all_kernels(d: Deployment) -> str | None:
    """``moe_parallel_config.use_all2all_kernels`` (dp > 1 with EP), or an explicit all2all backend."""
    if d.uses_all2all:
        return f"all2all={d.all2all}"
    if d.dp > 1 and d.ep > 1:
        return f"dp={d.dp} with ep={d.ep}"
    return None


def _nvfp4_monolithic_parallel(ctx: _Ctx) -> Reason:
    # TRTLLM Monolithic: not use_all2all_kernels and not EPLB (spec §6.2).
    d = ctx.deployment
    why = _uses_all2all_kernels(d)
    if why:
        return f"monolithic kernel does not support all2all kernels ({why})"
    if d.eplb:
        return "monolithic kernel does not support EPLB"
    return None


def _not_all2all(*names: str) -> Check:
    banned = frozenset(names)

    def check(ctx: _Ctx) -> Reason:
        a2a = ctx.deployment.all2all
        return f"kernel does not support the {a2a} all2all backend" if a2a in banned else None
    return check


def _no_ep(ctx: _Ctx) -> Reason:
    # FLASHINFER_B12X: not use_ep (spec §6.2).
    d = ctx.deployment
    return f"kernel does not support expert parallelism (ep={d.ep})" if d.ep > 1 else None


def _b12x_parallel(ctx: _Ctx) -> Reason:
    # B12X: no EP, ep_size 1, no all2all, no EPLB (spec §6.2).
    d = ctx.deployment
    if d.ep > 1:
        return f"kernel does not support expert parallelism (ep={d.ep})"
    if d.uses_all2all:
        return f"kernel does not support all2all kernels (all2all={d.all2all})"
    if d.eplb:
        return "kernel does not support EPLB"
    return None


def _vllm_cutlass_device(ctx: _Ctx) -> Reason:
    # CutlassExpertsFp4: fam100, fam110, fam120 (spec §6.2).
    p = ctx.profile
    if p.platform == "cuda" and p.cap[0] in (10, 11, 12):
        return None
    return f"kernel requires CUDA capability family 10.x, 11.x or 12.x, {_where(p)}"


def _nvfp4_fi_cutlass_scheme(ctx: _Ctx) -> Reason:
    # FlashInferExperts: (S, Dyn), and the NVFP4 scheme needs cc >= 100 (spec §6.2).
    if ctx.activation != "nvfp4":
        return f"kernel does not support NVFP4 weights with {ctx.activation} activations (supports nvfp4)"
    p = ctx.profile
    if p.cap >= (10, 0):
        return None
    return f"NVFP4 weights with nvfp4 activations need CUDA capability >= 10.0, {_where(p)}"


def _fi_cutlass_device_015(ctx: _Ctx) -> Reason:
    # ≈0.15 FlashInferExperts._supports_current_device: cap == 9.0 or family 10.x, and the
    # flashinfer CUTLASS fused MoE (fused_moe/flashinfer_cutlass_moe.py @ 01f004eb). No SM12x yet.
    p = ctx.profile
    if p.platform == "cuda" and (p.cap == (9, 0) or p.cap[0] == 10):
        return None
    return f"kernel requires CUDA capability 9.0 or family 10.x, {_where(p)}"


def _nvfp4_fi_cutlass_scheme_015(ctx: _Ctx) -> Reason:
    # ≈0.15: (kNvfp4Static, kNvfp4Dynamic) only on family 10.x (same file).
    if ctx.activation != "nvfp4":
        return f"kernel does not support NVFP4 weights with {ctx.activation} activations (supports nvfp4)"
    p = ctx.profile
    if p.is_cuda_family(10):
        return None
    return f"NVFP4 weights with nvfp4 activations need CUDA capability family 10.x, {_where(p)}"


def _fi_cutlass_parallel_015(ctx: _Ctx) -> Reason:
    # ≈0.15: dp_size == 1 or dp_size == ep_size (its own prepare/finalize; same file).
    d = ctx.deployment
    if d.dp == 1 or d.dp == d.ep:
        return None
    return f"kernel supports only dp == 1 or dp == ep (dp={d.dp}, ep={d.ep})"


_NV_TRTLLM_DEVICE = (
    _require_cuda, _cuda_family(10),
    _has_extra("has_flashinfer_trtllm", "flashinfer TRT-LLM fused MoE (trtllm_fp4_block_scale_moe)", _fi_default),
)
_NV_TRTLLM_ACTS = _activations("silu", "relu2_no_mul", "gelu", "gelu_tanh", "swigluoai_uninterleave",
                               situ_flag="flashinfer_situ")
_NV_CUTEDSL_DEVICE = (
    _require_cuda, _cuda_family(10),
    _has_extra("has_flashinfer_cutedsl", "flashinfer CuteDSL NVFP4 MoE", _fi_default),
)
_NV_HUMMING_ARGS = dict(device=_HUMMING_DEVICE, quant=_schemes("bf16", "nvfp4"), activation=_APPLY_SET,
                        batch_invariant=True)

#: vLLM 0.33.0 NVFP4 kernel classes per backend, in the order ``backend_to_kernel_cls`` returns them
#: (spec §6.2 predicates; HUMMING's order from oracle/nvfp4.py @ 01362014).
_NVFP4_CLASSES_033: dict[N, tuple[KernelClass, ...]] = {
    N.FLASHINFER_TRTLLM: (
        KernelClass("TrtLlmNvFp4ExpertsMonolithic", True, _NV_TRTLLM_DEVICE, _schemes("nvfp4"),
                    _nvfp4_monolithic_parallel, activation=_NV_TRTLLM_ACTS,
                    routing=frozenset({"DeepSeekV3", "Renormalize", "RenormalizeNaive", "Llama4",
                                       "SigmoidRenorm", "Sigmoid", "MiniMax2"})),
        KernelClass("TrtLlmNvFp4ExpertsModular", False, _NV_TRTLLM_DEVICE, _schemes("nvfp4"),
                    activation=_NV_TRTLLM_ACTS),
    ),
    N.FLASHINFER_CUTEDSL: (
        KernelClass("FlashInferCuteDSLExperts", False, _NV_CUTEDSL_DEVICE, _schemes("nvfp4"),
                    activation=_activations("silu", "swigluoai", "swigluoai_uninterleave",
                                            "relu2_no_mul", "situ")),
    ),
    N.FLASHINFER_CUTEDSL_BATCHED: (
        KernelClass("FlashInferCuteDSLBatchedExperts", False, _NV_CUTEDSL_DEVICE, _schemes("nvfp4"),
                    formats=frozenset({"batched"}), no_act_and_mul=False, activation=_activations("silu")),
    ),
    N.FLASHINFER_CUTLASS: (
        KernelClass("FlashInferExperts", False,
                    (_require_cuda, _cutlass_device, _has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
                    _nvfp4_fi_cutlass_scheme,
                    activation=_activations("silu", "gelu_tanh", "relu2_no_mul", "swigluoai",
                                            "swigluoai_uninterleave")),
    ),
    N.VLLM_CUTLASS: (
        KernelClass("CutlassExpertsFp4", False, (_require_cuda, _vllm_cutlass_device), _schemes("nvfp4"),
                    _not_all2all("flashinfer_nvlink_two_sided", "flashinfer_all2allv",
                                 "deepep_high_throughput", "flashinfer_nvlink_one_sided"),
                    activation=_APPLY_SET, batch_invariant=True),
    ),
    # MarlinExperts only (spec §6.2): W == kNvfp4Static, the activation key is ignored.
    N.MARLIN: (
        KernelClass("MarlinExperts", False, _MARLIN_DEVICE, _any_scheme, _not_fi_nvl_two_sided,
                    lora=True, activation=_APPLY_SET),
    ),
    N.HUMMING: (
        KernelClass("BatchedHummingGroupedExperts", False, formats=frozenset({"batched"}), **_NV_HUMMING_ARGS),
        KernelClass("HummingGroupedExperts", False, **_NV_HUMMING_ARGS),
        KernelClass("HummingIndexedExperts", False, **_NV_HUMMING_ARGS),
    ),
    # experts/nvfp4_emulation_moe.py: TritonExperts' device (CUDA-alike or XPU), (S, Dyn) only, no LoRA.
    N.EMULATION: (
        KernelClass("Nvfp4QuantizationEmulationTritonExperts", False, (_emulation_device,), _schemes("nvfp4"),
                    _not_all2all(*sorted(_FI_NVL)), activation=_APPLY_SET),
    ),
    N.FLASHINFER_B12X: (
        KernelClass("FlashInferB12xExperts", False,
                    (_require_cuda, _cuda_family(12),
                     _has_extra("has_flashinfer_b12x", "flashinfer b12x fused MoE (b12x_fused_moe)", _fi_default)),
                    _schemes("nvfp4", "bf16"), _no_ep,
                    activation=_activations("silu", "gelu_tanh", "relu2_no_mul")),
    ),
    N.B12X: (
        KernelClass("B12xExperts", False,
                    (_require_cuda, _cuda_family(12), _has_extra("has_b12x", "the b12x package", lambda p: False)),
                    _schemes("nvfp4", "bf16", "mxfp8"), _b12x_parallel,
                    activation=_activations("silu", "situ", "swigluoai_uninterleave", "relu2_no_mul")),
    ),
}

#: ≈ vLLM 0.15 NVFP4 kernel classes (page 002 ``backend_2_kernel_cls`` plus the class files of that
#: era cited above). FLASHINFER_TRTLLM has no expert class there (``k_cls = None``; the layer calls
#: FlashInfer itself): its row is ``is_supported_config_trtllm`` (quantization/utils/
#: flashinfer_fp4_moe.py), which is also what the report names as its "kernel class". VLLM_CUTLASS
#: is commented out of the page's priority list and no env variable reaches it, so it has no row.
_NVFP4_CLASSES_015: dict[N, tuple[KernelClass, ...]] = {
    N.FLASHINFER_TRTLLM: (
        # No flashinfer availability check in this era's _supports_current_device.
        KernelClass("is_supported_config_trtllm", True, (_require_cuda, _cuda_family(10)), _schemes("nvfp4"),
                    routing=frozenset({"DeepSeekV3", "Renormalize", "RenormalizeNaive", "Llama4"}),
                    no_act_and_mul=False, activation=_activations("silu")),
    ),
    # The masked-GEMM CuteDSL kernel: batched activation format only (flashinfer_cutedsl_moe.py @ 04f87a28).
    N.FLASHINFER_CUTEDSL: (
        KernelClass("FlashInferCuteDSLExperts", False, (_require_cuda, _cuda_family(10)), _schemes("nvfp4"),
                    formats=frozenset({"batched"}), no_act_and_mul=False, activation=_activations("silu")),
    ),
    N.FLASHINFER_CUTLASS: (
        KernelClass("FlashInferExperts", False,
                    (_require_cuda, _fi_cutlass_device_015,
                     _has("has_flashinfer_cutlass", "flashinfer CUTLASS fused MoE")),
                    _nvfp4_fi_cutlass_scheme_015, _fi_cutlass_parallel_015,
                    activation=_activations("silu", "relu2_no_mul")),
    ),
    # fused_marlin_moe.py @ 00a130a0: CUDA >= 8.0, gated only, silu / swigluoai, any activation key.
    N.MARLIN: (
        KernelClass("MarlinExperts", False, (_require_cuda, _cuda_min((8, 0))), _any_scheme,
                    no_act_and_mul=False, activation=_activations("silu", "swigluoai")),
    ),
}


def _nvfp4_activation_of(run: "_Run", backend: Enum) -> str:
    # vLLM passes activation_key=None for W4A16 checkpoints, and for B12X when
    # VLLM_B12X_MOE_FP4_FORCE_A16=1 (``_use_a16``, oracle/nvfp4.py @ 01362014); else kNvfp4Dynamic.
    if run.model.w4a16 or (backend == N.B12X and run.env.get("VLLM_B12X_MOE_FP4_FORCE_A16")):
        return "bf16"
    return "nvfp4"


#: --moe-backend names of vLLM 0.33.0 for NVFP4 (``map_nvfp4_backend``, spec §6.1 step 5).
NVFP4_MOE_BACKEND_NAMES: dict[str, tuple[Nvfp4Backend, ...]] = {
    "b12x": (N.B12X,),
    "cutlass": (N.VLLM_CUTLASS,),
    "flashinfer_trtllm": (N.FLASHINFER_TRTLLM,),
    "flashinfer_cutlass": (N.FLASHINFER_CUTLASS,),
    "flashinfer_cutedsl": (N.FLASHINFER_CUTEDSL,),
    "flashinfer_b12x": (N.FLASHINFER_B12X,),
    "marlin": (N.MARLIN,),
    "humming": (N.HUMMING,),
    "emulation": (N.EMULATION,),
}

#: ``NVFP4_BACKENDS_WITH_CLAMP`` (oracle/nvfp4.py @ 01362014; spec §6.1 step 3: all but
#: FLASHINFER_CUTEDSL_BATCHED and FLASHINFER_B12X).
NVFP4_CLAMP_BACKENDS = frozenset({
    N.B12X, N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTLASS, N.FLASHINFER_CUTEDSL, N.VLLM_CUTLASS, N.MARLIN,
    N.EMULATION, N.HUMMING,
})

_NVFP4_STYLE_033 = SelectionStyle(
    name="oracle-0.33",
    runtime="vLLM 0.33.0 (NVFP4 oracle)",
    # AVAILABLE_BACKENDS (spec §6.1 step 1); B12X, FLASHINFER_B12X are explicit-only.
    priority=(
        N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTEDSL, N.FLASHINFER_CUTEDSL_BATCHED, N.FLASHINFER_CUTLASS,
        N.VLLM_CUTLASS, N.MARLIN, N.HUMMING, N.EMULATION,
    ),
    moves=(
        # quantization/utils/humming/priority.py: capability int exactly 90 (spec §6.1 step 2).
        PriorityMove(N.HUMMING, lambda p: p.capability is not None and p.cap == (9, 0),
                     "capability 90: prioritize_humming puts HUMMING before MARLIN", before=N.MARLIN),
    ),
    names=MappingProxyType(NVFP4_MOE_BACKEND_NAMES),
    unsupported_names=MappingProxyType({
        "flashinfer_moe_ep_cutedsl": (
            "FLASHINFER_MOE_EP_CUTEDSL is taken by the quant method before the oracle runs, and its "
            "megakernel transforms the checkpoint tensors itself at init (spec §3), so there is no "
            "pre-laid-out format to write; serve the checkpoint as it is (vLLM also limits this backend "
            "to MistralLarge3 on SM100 with DP4/EP4, compressed_tensors_moe_w4a4_nvfp4.py)"
        ),
    }),
    classes=MappingProxyType(_NVFP4_CLASSES_033),
    env_overrides=(),
    activation_override=False,
    fmt="nvfp4",
    activation_of=_nvfp4_activation_of,
    clamp=NVFP4_CLAMP_BACKENDS,
    batched_variants=MappingProxyType({N.FLASHINFER_CUTEDSL: N.FLASHINFER_CUTEDSL_BATCHED}),
    env_flags=("VLLM_BATCH_INVARIANT", "VLLM_B12X_MOE_FP4_FORCE_A16"),
    env_removed=MappingProxyType({
        "VLLM_USE_FLASHINFER_MOE_FP4": "removed in v0.33.0 (spec §6.4); use --moe-backend",
        "VLLM_FLASHINFER_MOE_BACKEND": "removed in v0.33.0 (spec §6.4); use --moe-backend "
                                       "flashinfer_cutlass / flashinfer_trtllm / flashinfer_cutedsl",
        "VLLM_TEST_FORCE_FP8_MARLIN": "removed in v0.33.0 (spec §6.4); use --moe-backend marlin",
    }),
)

#: ``VLLM_FLASHINFER_MOE_BACKEND`` -> backend (``get_flashinfer_moe_backend`` + ``fi_2_vllm_backend_map``,
#: spec §6.4).
FLASHINFER_MOE_BACKEND_ENV_0_15: dict[str, Nvfp4Backend] = {
    "throughput": N.FLASHINFER_CUTLASS,
    "latency": N.FLASHINFER_TRTLLM,
    "masked_gemm": N.FLASHINFER_CUTEDSL,
}

#: Page 002 ``FLASHINFER_NVFP4_MOE_BACKENDS``, in its order.
_FI_NVFP4_BACKENDS_0_15 = (N.FLASHINFER_CUTLASS, N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTEDSL)


def _fi_fp4_on_015(run: "_Run") -> Selection:
    """Page 002, ``VLLM_USE_FLASHINFER_MOE_FP4=1``."""
    fi = run.env.get("VLLM_FLASHINFER_MOE_BACKEND")
    if fi is not None:
        backend = FLASHINFER_MOE_BACKEND_ENV_0_15[fi]
        return _force(run, backend,
                      f"forced by VLLM_USE_FLASHINFER_MOE_FP4=1 and VLLM_FLASHINFER_MOE_BACKEND={fi}",
                      f"VLLM_USE_FLASHINFER_MOE_FP4=1 with VLLM_FLASHINFER_MOE_BACKEND={fi} forces "
                      f"{backend.value}, which cannot run on {run.where()}")
    # "If the user is not explicit about the backend, try each": the loop tests
    # `if k_cls.is_supported_config(...)`, a (supported, reason) tuple, which is always true, so the
    # page returns the first of FLASHINFER_NVFP4_MOE_BACKENDS (FLASHINFER_CUTLASS) without checking
    # it. mxconvert mirrors that choice, but refuses when that class cannot run on the profile
    # (a layout for it would be useless there).
    backend = _FI_NVFP4_BACKENDS_0_15[0]
    why = ("VLLM_USE_FLASHINFER_MOE_FP4=1 without VLLM_FLASHINFER_MOE_BACKEND: the oracle returns the "
           "first of FLASHINFER_NVFP4_MOE_BACKENDS (FLASHINFER_CUTLASS) unchecked, because it tests the "
           "(supported, reason) tuple of is_supported_config, which is always true")
    act = run.activation_for(backend)
    hit = run.try_backend(backend, act, explicit=True)
    if hit:
        return run.choose(backend, hit[0], act, why)
    raise run.refuse(f"{why}; FLASHINFER_CUTLASS cannot run on {run.where()}, so mxconvert refuses "
                     "rather than lay out for a kernel that would fail at load")


_NVFP4_STYLE_015 = SelectionStyle(
    name="env-0.15",
    runtime="vLLM ~0.15 (NVFP4 oracle page 002)",
    # Page 002 AVAILABLE_BACKENDS (VLLM_CUTLASS is commented out there).
    priority=(N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTEDSL, N.FLASHINFER_CUTLASS, N.MARLIN),
    moves=(),
    names=MappingProxyType({}),
    unsupported_names=MappingProxyType({}),
    classes=MappingProxyType(_NVFP4_CLASSES_015),
    env_overrides=(
        EnvOverride("VLLM_USE_FLASHINFER_MOE_FP4", remove_when_false=_FI_NVFP4_BACKENDS_0_15,
                    when_true=_fi_fp4_on_015),
        EnvOverride("VLLM_TEST_FORCE_FP8_MARLIN", force=((_always, N.MARLIN),)),
    ),
    activation_override=False,
    fmt="nvfp4",
    activation_of=_nvfp4_activation_of,
    env_choices=MappingProxyType({"VLLM_FLASHINFER_MOE_BACKEND": tuple(FLASHINFER_MOE_BACKEND_ENV_0_15)}),
)

NVFP4_SELECTION_STYLES: dict[str, SelectionStyle] = {s.name: s for s in (_NVFP4_STYLE_033, _NVFP4_STYLE_015)}


def is_global_sf_supported_for_nvfp4_backend(backend: Nvfp4Backend | str) -> bool:
    """vLLM's ``is_global_sf_supported_for_nvfp4_backend`` (spec §3; page 002 for ≈0.15).

    True for the FlashInfer backends: their activation input scales are reduced to one scalar over
    all experts, and ModelOpt loads the input scales of all *global* experts on every EP rank. The
    set is the same in both revisions (≈0.15 lacks CUTEDSL_BATCHED and FLASHINFER_B12X altogether).
    Backend selection itself does not depend on it in either revision; it shapes the layout.
    """
    if isinstance(backend, Mxfp4Backend):
        raise InputError(f"{backend.value} is an MXFP4 backend; global scale factors are an NVFP4 notion")
    if not isinstance(backend, Nvfp4Backend):
        try:
            backend = Nvfp4Backend.parse(str(backend))
        except ValueError:
            raise InputError(
                f"unknown NVFP4 backend {backend!r}; known: {', '.join(b.value for b in Nvfp4Backend)}"
            ) from None
    return backend in NVFP4_GLOBAL_SF_BACKENDS


# Shape refusals. vLLM 0.33.0 accepts every shape in selection (``_supports_shape`` is True for all
# NVFP4 classes, spec §6.1); the refusals happen in the weight preparation (spec §5.2 C4, §5.8 M0,
# §5.10, §10). `nvfp4_shape_refusal` exposes them; `select_nvfp4_backend` applies it to the backend
# vLLM picks (when the sizes are given), since vLLM would pick that backend and then fail at load.

def _needs_2n_multiple_of_128(where: str) -> Callable[[int | None, int | None, bool], str | None]:
    def rule(k: int | None, n: int | None, gated: bool) -> str | None:
        if n is None or not gated or (2 * n) % 128 == 0:
            return None
        return (f"gated w13 has 2N = {2 * n} rows (N = {n} per partition), not a multiple of 128, and "
                f"{where}")
    return rule


def _marlin_k_rule(k: int | None, n: int | None, gated: bool) -> str | None:
    # prepare_nvfp4_moe_layer_for_marlin: N' = ceil_64(N) if K % 128 == 0, else it requires K % 64 == 0.
    if k is None or k % 64 == 0:
        return None
    return f"prepare_nvfp4_moe_layer_for_marlin requires hidden size % 64 == 0, got {k} (spec §5.8 M0)"


_NVFP4_SHAPE_RULES: dict[str, tuple[tuple[frozenset, Callable[[int | None, int | None, bool], str | None]], ...]] = {
    "oracle-0.33": (
        (frozenset({N.FLASHINFER_CUTLASS, N.VLLM_CUTLASS, N.FLASHINFER_CUTEDSL_BATCHED, N.FLASHINFER_B12X}),
         _needs_2n_multiple_of_128("prepare_nvfp4_moe_layer_for_fi_or_cutlass raises NotImplementedError "
                                   "for gated padding (spec §5.2 C4, §5.10)")),
        (frozenset({N.MARLIN}), _marlin_k_rule),
    ),
    "env-0.15": (
        (frozenset({N.FLASHINFER_TRTLLM, N.FLASHINFER_CUTLASS, N.FLASHINFER_CUTEDSL, N.VLLM_CUTLASS}),
         _needs_2n_multiple_of_128("this revision pads nothing: the shape is refused (spec §10)")),
    ),
}


def nvfp4_shape_refusal(backend: Nvfp4Backend, revision: RuntimeRevision, hidden_size: int | None,
                        intermediate_size_per_partition: int | None, *, gated: bool = True) -> str | None:
    """Why `revision`'s weight preparation for `backend` refuses this shape, or None.

    `hidden_size` is K, `intermediate_size_per_partition` is N of one rank (after TP), `gated` is
    is_act_and_mul. Every backend needs K and N to be multiples of the NVFP4 block (16). Padding
    that vLLM does itself (TRTLLM/CUTEDSL N to 64 and K to 256, MARLIN N to 64/128, B12X N to 64 in
    0.33) is a layout matter, not a refusal.
    """
    k, n = hidden_size, intermediate_size_per_partition
    if k is not None and k % 16:
        return f"hidden size {k} is not a multiple of the NVFP4 block size 16"
    if n is not None and n % 16:
        return (f"intermediate size per partition {n} is not a multiple of 16 (the w2 block-scale "
                "columns cannot be sliced, spec §2.4)")
    style = _nvfp4_style(revision)
    for backends, rule in _NVFP4_SHAPE_RULES.get(style.name, ()):
        if backend in backends:
            reason = rule(k, n, gated)
            if reason:
                return reason
    return None


def _nvfp4_style(revision: RuntimeRevision) -> SelectionStyle:
    if "nvfp4" not in revision.formats:
        get_revision(revision.name, fmt="nvfp4")  # raises the standard "defines no NVFP4 layouts"
        raise InputError(f"runtime revision {revision.name} defines no NVFP4 layouts")  # pragma: no cover
    try:
        return NVFP4_SELECTION_STYLES[revision.selection]
    except KeyError:
        raise InputError(
            f"runtime revision {revision.name} uses selection style {revision.selection!r}, which "
            f"mxconvert's NVFP4 oracle does not know (known: {', '.join(NVFP4_SELECTION_STYLES)})"
        ) from None


def nvfp4_moe_backend_names(revision: RuntimeRevision) -> tuple[str, ...]:
    """The NVFP4 --moe-backend names valid for `revision`, "auto" first."""
    return ("auto", *_nvfp4_style(revision).names)


def _choose_nvfp4(run: _Run, backend: Enum, name: str, activation: str, reason: str) -> Selection:
    d = run.deployment
    global_sf = is_global_sf_supported_for_nvfp4_backend(backend)
    if global_sf and d.ep > 1:
        reason += ("; EP with a global scale factor: the input scales of all global experts are "
                   "reduced to one scalar")
    run.considered.append(Considered(backend, name, True, reason))
    if backend == N.MARLIN and d.marlin_input_dtype is not None:
        err = UnsupportedError(
            f"VLLM_MARLIN_INPUT_DTYPE={d.marlin_input_dtype} is refused for NVFP4 Marlin: "
            "prepare_nvfp4_moe_layer_for_marlin accepts only 16-bit activations (spec §5.8); "
            f"profile {run.profile.name} selected MARLIN under {run.revision.name}"
        )
        err.considered = tuple(run.considered)  # type: ignore[attr-defined]
        raise err
    use_a16 = activation == "bf16"
    return Selection(
        backend=backend,
        kernel_class=name,
        requested=run.requested,
        revision=run.revision.name,
        profile=run.profile.name,
        # What the kernel computes with: MARLIN is weight-only (nvfp4_w4a16 quant config, a13 = a2 = None).
        activation="bf16" if use_a16 or backend == N.MARLIN else "nvfp4",
        considered=tuple(run.considered),
        format="nvfp4",
        use_global_sf=global_sf,
        use_a16=use_a16,
        activation_fn=run.model.activation_fn,
    )


def _nvfp4_common(run: _Run) -> None:
    d = run.deployment
    if d.activation is not None:
        raise InputError(
            f"the MoE activation override ({d.activation}) is an MXFP4 setting; NVFP4 selection takes "
            "w4a16= for weight-only checkpoints (ModelOpt's nvfp4_per_token override is not modelled)"
        )
    # ModelOptNvFp4Config.get_min_capability() = 75 (modelopt.py).
    p = run.profile
    if p.platform == "cuda" and p.cap < (7, 5):
        raise UnsupportedError(
            f"NVFP4 needs CUDA capability >= 7.5 (ModelOptNvFp4Config.get_min_capability() = 75), {_where(p)}"
        )


def _select_nvfp4_oracle_033(run: _Run) -> Selection:
    """``select_nvfp4_moe_backend`` of vLLM 0.33.0 (spec §6.1)."""
    _parse_env(run)
    _nvfp4_common(run)
    style, d, limit = run.style, run.deployment, run.model.swiglu_limit
    if run.requested != "auto":
        (backend,) = _resolve_name(run, run.requested)
        if d.batched and backend in style.batched_variants:
            backend = style.batched_variants[backend]
        if limit is not None and backend not in style.clamp:
            able = [n for n, (b,) in style.names.items() if b in style.clamp]
            raise UnsupportedError(
                f"the model sets swiglu_limit={limit}, but the explicitly requested moe_backend="
                f"{run.requested!r} ({backend.value}) does not apply the SwiGLU clamp; use one of "
                + ", ".join(able)
            )
        return _force(run, backend, f"--moe-backend {run.requested}: all predicates pass",
                      f"--moe-backend {run.requested!r} ({backend.value}) cannot run on {run.where()}")
    order = _moved_priority(run)
    skipped = {}
    if limit is not None:
        skipped = {b: f"dropped: does not apply the SwiGLU clamp (swiglu_limit={limit})"
                   for b in order if b not in style.clamp}
    chosen = _first_passing(run, order, skipped)
    if chosen is not None:
        return chosen
    raise run.refuse(f"no NVFP4 MoE backend supports {run.where()} with this deployment "
                     "(vLLM raises NotImplementedError)")


def _select_nvfp4_env_015(run: _Run) -> Selection:
    """Page 002 ``select_nvfp4_moe_backend`` (≈ vLLM 0.15)."""
    if run.requested != "auto":
        raise InputError(
            f"--moe-backend {run.requested!r}: the NVFP4 oracle of {run.revision.name} (page 002) reads no "
            "--moe-backend; valid names: auto. Use its env overrides instead: "
            "VLLM_USE_FLASHINFER_MOE_FP4=1 with VLLM_FLASHINFER_MOE_BACKEND=throughput (FLASHINFER_CUTLASS), "
            "latency (FLASHINFER_TRTLLM) or masked_gemm (FLASHINFER_CUTEDSL); "
            "VLLM_USE_FLASHINFER_MOE_FP4=0 (no FlashInfer); VLLM_TEST_FORCE_FP8_MARLIN=1 (MARLIN)"
        )
    _parse_env(run)
    _nvfp4_common(run)
    if run.model.swiglu_limit is not None:
        raise UnsupportedError(
            f"swiglu_limit with NVFP4 is not modelled for {run.revision.name}: page 002 has no SwiGLU "
            "clamp filter, and whether its kernels apply the limit was not checked"
        )
    if run.deployment.lora:
        raise UnsupportedError(f"LoRA with NVFP4 MoE is not modelled for {run.revision.name}")
    forced, removed = _apply_env_overrides(run)
    if forced is not None:
        return forced
    chosen = _first_passing(run, run.style.priority, removed)
    if chosen is not None:
        return chosen
    raise run.refuse(f"no NVFP4 MoE backend supports {run.where()} with this deployment "
                     "(vLLM raises NotImplementedError)")


_NVFP4_ALGORITHMS: dict[str, Callable[[_Run], Selection]] = {
    "oracle-0.33": _select_nvfp4_oracle_033,
    "env-0.15": _select_nvfp4_env_015,
}


def _positive_int(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise InputError(f"{name} must be a positive integer, got {value!r}")


def select_nvfp4_backend(
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment = Deployment(),
    moe_backend: str = "auto",
    *,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    w4a16: bool = False,
    swiglu_limit: float | None = None,
    activation_fn: str = "silu",
    routing_method: str | None = None,
) -> Selection:
    """Pick the NVFP4 MoE backend and kernel class vLLM `revision` would pick on `profile`.

    `moe_backend` is "auto" or a vLLM --moe-backend name (0.33.0 only; ≈0.15 reads env overrides
    from `deployment.env` instead). `hidden_size` (K) and `intermediate_size` (the checkpoint's,
    unsharded; the per-rank N is intermediate_size / tp, or the whole when ep > 1) only feed the
    shape refusals of the weight preparation (`nvfp4_shape_refusal`). `w4a16`: the checkpoint has
    no input scales (ModelOpt W4A16_NVFP4, CT NVFP4A16). `swiglu_limit`: the model's SwiGLU clamp.
    `activation_fn`: a MoEActivation value ("silu", "swigluoai", "relu2_no_mul", ...).
    `routing_method`: a RoutingMethodType name; None assumes one the monolithic kernels support.
    Raises InputError for bad input and UnsupportedError when the request cannot run; the message
    lists the per-backend reasons.
    """
    if not isinstance(deployment, Deployment):
        raise InputError(f"deployment must be a Deployment, got {type(deployment).__name__}")
    _positive_int("hidden_size", hidden_size)
    _positive_int("intermediate_size", intermediate_size)
    if not isinstance(w4a16, bool):
        raise InputError(f"w4a16 must be True or False, got {w4a16!r}")
    if swiglu_limit is not None and (isinstance(swiglu_limit, bool) or not isinstance(swiglu_limit, (int, float))):
        raise InputError(f"swiglu_limit must be a number or None, got {swiglu_limit!r}")
    act = activation_fn.strip().lower() if isinstance(activation_fn, str) else activation_fn
    if act not in NVFP4_ACTIVATION_FNS:
        raise InputError(f"unknown MoE activation {activation_fn!r}; known: {', '.join(NVFP4_ACTIVATION_FNS)}")
    routing = None
    if routing_method is not None:
        by_lower = {r.lower(): r for r in ROUTING_METHODS}
        key = routing_method.strip().lower() if isinstance(routing_method, str) else None
        if key not in by_lower:
            raise InputError(f"unknown routing method {routing_method!r}; known: {', '.join(ROUTING_METHODS)}")
        routing = by_lower[key]
    style = _nvfp4_style(revision)
    n_part = None
    if intermediate_size is not None:
        moe_tp = deployment.tp if deployment.ep == 1 else 1
        if intermediate_size % moe_tp:
            raise InputError(f"tp {moe_tp} does not divide intermediate_size {intermediate_size}")
        n_part = intermediate_size // moe_tp
    model = _Model(routing=routing, activation_fn=act, w4a16=w4a16,
                   swiglu_limit=None if swiglu_limit is None else float(swiglu_limit),
                   intermediate_size=intermediate_size)
    run = _Run(style, profile, revision, deployment, _normalise_name(moe_backend), hidden_size, model)
    selection = _NVFP4_ALGORITHMS[style.name](run)
    reason = nvfp4_shape_refusal(selection.backend, revision, hidden_size, n_part,
                                 gated=not act.endswith("_no_mul"))
    if reason:
        err = UnsupportedError(
            f"{style.runtime} selects {selection.backend.value} ({selection.kernel_class}) on "
            f"{run.where()}, but its weight preparation refuses this shape: {reason}"
        )
        err.considered = selection.considered  # type: ignore[attr-defined]
        raise err
    return selection
