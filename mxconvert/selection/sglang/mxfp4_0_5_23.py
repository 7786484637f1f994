"""The GPT-OSS MXFP4 MoE backend choice of SGLang 0.5.23, mirrored (docs/sglang.md, "Selection").

SGLang has no priority list or kernel-class predicates: `--moe-runner-backend` (default "auto") is
resolved at start-up by the model's override (sglang/srt/arg_groups/model_overrides/gpt_oss.py
`_gpt_oss_overrides`, a chain of platform tests), and the quantization method then dispatches on
the resolved name and the device (sglang/srt/layers/quantization/mxfp4.py `Mxfp4MoEMethod.__init__`,
`create_weights`, `process_weights_after_loading`). This module walks the same chain in the same
order and records every branch it passes over with SGLang's reason (`Considered`), the chosen one
last, as vLLM's mirrors do.

SGLang's runner names map onto vLLM's backend enum by the bytes and activations the kernel uses:
`flashinfer_mxfp4` is FlashInfer's TRT-LLM-gen MoE with MXFP8 activations on SM10x
(FLASHINFER_TRTLLM_MXFP4_MXFP8), FlashInfer's CUTLASS MoE with MXFP8 activations on SM12x
(FLASHINFER_CUTLASS_MXFP4_MXFP8) and with 16-bit activations on SM90 (FLASHINFER_CUTLASS_MXFP4_BF16);
`triton_kernel` is triton_kernels' matmul_ogs (TRITON); `marlin` is MARLIN; the ROCm path with
SGLANG_USE_AITER is AITER_MXFP4_BF16; the XPU and Intel AMX paths are XPU and CPU. SGLang's
remaining path (`triton`, or `auto` where none of the above applies) dequantizes the experts to
bfloat16 at load (`upcast_from_mxfp`): it holds no MXFP4 bytes, so it is reported and refused.

Device facts read: platform and capability (`is_sm90` / `is_sm100` / `is_sm120` are capability
majors 9 / 10 / 12, `is_blackwell` majors 10-12; utils/common.py), gfx arch (Mxfp4Config accepts
gfx95x only), whether FlashInfer and triton_kernels are installed, and the NVIDIA driver
(`profile.extra["nvidia_driver"]`, a release such as "595.1"; unknown is taken as older than 595).
Environment read (`Deployment.env`): SGLANG_USE_AITER; on the AITER path also SGLANG_AITER_K3_OPT
(default off) and SGLANG_USE_AITER_MOE_GU_ITLV (default on), whose non-default values are refused
(`aiter_env_refusal`). Parallel facts: the expert-parallel size (`EP_BACKENDS`: the backends
mxconvert writes EP artifacts for) and `--dp`, which has no SGLang meaning (walk.py `parallel_refusal`).
"""

from __future__ import annotations

from enum import Enum

from mxconvert.core.errors import InputError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.predicates import where
from mxconvert.selection.report import Selection
from mxconvert.selection.sglang.walk import Walk, ep_refusal, parallel_refusal
from mxconvert.selection.sglang.walk import backend_rows as walk_backend_rows
from mxconvert.target.backends import CUTLASS_BACKENDS, MARLIN_BACKENDS, Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision

B = Mxfp4Backend

#: The style name revision rows give in their `selection` field.
STYLE_NAME = "sglang-0.5.23"
RUNTIME = "SGLang 0.5.23"

#: `--moe-runner-backend` names (sglang/srt/arg_groups/choices.py MOE_RUNNER_BACKEND_CHOICES) that
#: the GPT-OSS MXFP4 method acts on, with what each becomes; "auto" is resolved by `_select_auto`.
RUNNER_NAMES: tuple[str, ...] = ("auto", "flashinfer_mxfp4", "triton_kernel", "marlin", "aiter", "triton", "deep_gemm")

#: `--moe-runner-backend` choices of SGLang 0.5.23 that are not GPT-OSS MXFP4 paths.
OTHER_RUNNER_NAMES: tuple[str, ...] = (
    "flashinfer_trtllm", "experimental_sgl_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass",
    "flashinfer_cutedsl", "flashinfer_megamoe", "cutlass", "humming", "experimental_sgl_marlin", "lora_cutedsl",
    "lora_triton", "lora_marlin", "hpc_ops", "megamoe", "intel_xpu",
)  # fmt: skip


#: The backends whose SGLang 0.5.23 path runs with ep_size > 1 and whose EP artifacts mxconvert writes
#: (docs/sglang.md, "Expert parallelism"). Every one holds the rank's experts as the GPT-OSS loader
#: places them (models/gpt_oss.py:1009-1010: rank r, global experts r * E/ep .. (r + 1) * E/ep - 1, in
#: global order) and lays each expert out alone, so an EP rank's bytes are those experts' TP-1 bytes:
#: TRT-LLM (`_apply_sm100_trtllm_gen`, layers/quantization/mxfp4.py:1581: `local_expert_offset =
#: moe_ep_rank * num_local_experts`), both CUTLASS kernels (moe_runner/flashinfer_cutlass.py:601-602
#: hand FlashInfer `ep_size` / `ep_rank`), MARLIN (mxfp4_marlin_moe.py:28, the dispatcher's
#: `local_expert_mapping`, token_dispatcher/standard.py:231-242).
EP_BACKENDS: frozenset[Mxfp4Backend] = frozenset(
    {
        Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8,
        Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8,
        Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16,
        Mxfp4Backend.MARLIN,
    }
)

#: Why an EP artifact of each other backend is not written (its reason in the selection report).
_EP_REFUSED: dict[Mxfp4Backend | Nvfp4Backend, str] = {
    Mxfp4Backend.AITER_MXFP4_BF16: (
        "expert parallelism for AITER is not mirrored: SGLang 0.5.23's AITER runner takes the dispatcher's "
        "expert_mask (layers/quantization/mxfp4.py:1788) over global expert ids, a path mxconvert has not proven; "
        "serve AITER artifacts at --ep-size 1"
    ),
}


class _Walk(Walk):
    """A walk of the MXFP4 method's branches (walk.py)."""

    def choose(self, backend: Mxfp4Backend, kernel: str, activation: str, reason: str) -> Selection:
        return self.selection(backend, kernel, reason, activation)


def _major(p: DeviceProfile) -> int | None:
    return p.cap[0] if p.platform == "cuda" and p.capability is not None else None


def _driver_at_least_595(p: DeviceProfile) -> bool:
    text = str(p.extra.get("nvidia_driver", "")).strip()
    head = text.split(".", 1)[0]
    return head.isdigit() and int(head) >= 595


def _use_aiter(p: DeviceProfile, env: dict[str, str]) -> bool:
    """mxfp4.py `_use_aiter = get_bool_env_var("SGLANG_USE_AITER") and _is_hip`."""
    return p.platform == "rocm" and env.get("SGLANG_USE_AITER", "false").lower() in _GET_BOOL_TRUE


_TRTLLM = "Mxfp4MoEMethod[flashinfer_mxfp4: trtllm_fp4_block_scale_moe, sm100]"
_CUTLASS_SM120 = "Mxfp4MoEMethod[flashinfer_mxfp4: cutlass_fused_moe, sm120]"
_CUTLASS_SM90 = "Mxfp4MoEMethod[flashinfer_mxfp4: cutlass_fused_moe, sm90]"
_TRITON = "Mxfp4MoEMethod[triton_kernel: matmul_ogs]"
_MARLIN = "Mxfp4MoEMethod[marlin]"
_AITER = "Mxfp4MoEMethod[aiter fused_moe]"
_XPU = "Mxfp4MoEMethod[xpu grouped gemm]"
_CPU = "Mxfp4MoEMethod[intel amx]"
_UPCAST = "Mxfp4MoEMethod[bf16 upcast_from_mxfp]"
_UPCAST_WHY = "SGLang dequantizes the experts to bfloat16 at load (upcast_from_mxfp): no MXFP4 bytes to convert"


def _flashinfer_mxfp4(walk: _Walk, why: str) -> Selection:
    """`moe_runner_backend=flashinfer_mxfp4`: `Mxfp4MoEMethod.__init__` picks the entry point by device."""
    p, major = walk.profile, _major(walk.profile)
    if major in (9, 10, 12) and not p.has_flashinfer:  # the device is tested first, FlashInfer at use
        walk.note(B.FLASHINFER_TRTLLM_MXFP4_MXFP8, _TRTLLM, f"FlashInfer is not installed on profile {p.name}")
        raise walk.refuse(f"{why}, but FlashInfer is not installed")
    if major == 10:
        return walk.choose(B.FLASHINFER_TRTLLM_MXFP4_MXFP8, _TRTLLM, "mxfp8", f"{why}; SM100 -> trtllm_sm100")
    walk.note(B.FLASHINFER_TRTLLM_MXFP4_MXFP8, _TRTLLM, f"trtllm_sm100 needs capability major 10, {where(p)}")
    if major == 12:
        return walk.choose(B.FLASHINFER_CUTLASS_MXFP4_MXFP8, _CUTLASS_SM120, "mxfp8", f"{why}; SM120 -> cutlass_sm120")
    walk.note(B.FLASHINFER_CUTLASS_MXFP4_MXFP8, _CUTLASS_SM120, f"cutlass_sm120 needs capability major 12, {where(p)}")
    if major == 9:
        if not p.has_flashinfer_cutlass:
            walk.note(B.FLASHINFER_CUTLASS_MXFP4_BF16, _CUTLASS_SM90, f"FlashInfer CUTLASS is not on profile {p.name}")
            raise walk.refuse(f"{why}: SM90 needs FlashInfer's SM90 mixed-GEMM helpers")
        return walk.choose(B.FLASHINFER_CUTLASS_MXFP4_BF16, _CUTLASS_SM90, "bf16", f"{why}; SM90 -> cutlass_sm90")
    walk.note(B.FLASHINFER_CUTLASS_MXFP4_BF16, _CUTLASS_SM90, f"cutlass_sm90 needs capability major 9, {where(p)}")
    raise walk.refuse("moe_runner_backend=flashinfer_mxfp4 requires SM90, SM100, or SM120")


def _default_method(walk: _Walk, why: str) -> Selection:
    """`auto` left unresolved (or `triton`): `process_weights_after_loading`'s last branches."""
    p = walk.profile
    if p.platform == "xpu":
        return walk.choose(B.XPU, _XPU, "bf16", f"{why}; XPU keeps the checkpoint layout")
    walk.note(B.XPU, _XPU, f"the XPU branch needs an XPU, {where(p)}")
    if p.platform == "cpu":
        return walk.choose(B.CPU, _CPU, "bf16", f"{why}; CPU with Intel AMX packs the weights")
    walk.note(B.CPU, _CPU, f"the Intel AMX branch needs a CPU, {where(p)}")
    walk.note(B.EMULATION, _UPCAST, f"{why}; {_UPCAST_WHY}")
    raise walk.refuse(f"{RUNTIME} runs no MXFP4 kernel for GPT-OSS here ({_UPCAST_WHY})")


def _select_auto(walk: _Walk, deployment: Deployment, env: dict[str, str]) -> Selection:
    """`_gpt_oss_overrides` with moe_runner_backend == "auto", in its order."""
    p, major = walk.profile, _major(walk.profile)
    if major == 10:
        return _flashinfer_mxfp4(walk, "auto: SM100 with an MXFP4 checkpoint -> flashinfer_mxfp4")
    walk.note(B.FLASHINFER_TRTLLM_MXFP4_MXFP8, _TRTLLM, f"auto picks flashinfer_mxfp4 on SM100 only, {where(p)}")
    if major == 12:
        return _flashinfer_mxfp4(walk, "auto: SM120 with an MXFP4 checkpoint -> flashinfer_mxfp4")
    walk.note(B.FLASHINFER_CUTLASS_MXFP4_MXFP8, _CUTLASS_SM120, f"auto picks cutlass_sm120 on SM120 only, {where(p)}")
    if _use_aiter(p, env):
        return _aiter(
            walk, env, "auto: ROCm with SGLANG_USE_AITER=1 keeps auto, and Mxfp4MoEMethod takes the AITER branch"
        )
    walk.note(B.AITER_MXFP4_BF16, _AITER, "needs ROCm with SGLANG_USE_AITER=1 (mxfp4.py _use_aiter)")
    if deployment.ep != 1:
        walk.note(B.TRITON, _TRITON, f"auto picks triton_kernel only with ep_size == 1, got ep {deployment.ep}")
    elif not p.has_triton_kernels:
        walk.note(B.TRITON, _TRITON, f"triton_kernels is not installed on profile {p.name}")
    elif p.platform == "cpu":
        walk.note(B.TRITON, _TRITON, "auto skips triton_kernel on a CPU with Intel AMX")
    elif major in (10, 11, 12) and _driver_at_least_595(p):
        walk.note(B.TRITON, _TRITON, "Blackwell with NVIDIA driver >= 595: auto picks triton (triton_kernels SIGSEGV)")
        walk.note(B.EMULATION, _UPCAST, f"moe_runner_backend=triton; {_UPCAST_WHY}")
        raise walk.refuse(f"{RUNTIME} picks the bf16 triton runner here ({_UPCAST_WHY})")
    else:
        return _triton_kernel(walk, deployment, "auto: ep_size == 1 and triton_kernels installed -> triton_kernel")
    return _default_method(walk, "auto stays unresolved")


def _triton_kernel(walk: _Walk, deployment: Deployment, why: str) -> Selection:
    p = walk.profile
    if deployment.ep != 1:  # model_hook.py asserts it for GptOssForCausalLM
        walk.note(B.TRITON, _TRITON, f"Triton kernel MoE is only supported when ep_size == 1, got ep {deployment.ep}")
        raise walk.refuse("moe_runner_backend=triton_kernel needs ep_size == 1")
    if _use_aiter(p, dict(deployment.env)):  # process_weights_after_loading tests _use_aiter first
        walk.note(B.TRITON, _TRITON, "with SGLANG_USE_AITER=1 Mxfp4MoEMethod prepares AITER bytes, not triton_kernels'")
        raise walk.refuse("moe_runner_backend=triton_kernel with SGLANG_USE_AITER=1 mixes two layouts")
    if not p.has_triton_kernels or p.platform not in ("cuda", "rocm"):
        walk.note(B.TRITON, _TRITON, f"triton_kernels runs on CUDA / ROCm with the package installed, {where(p)}")
        raise walk.refuse("moe_runner_backend=triton_kernel cannot run")
    return walk.choose(B.TRITON, _TRITON, "bf16", why)


#: The environment variables SGLang 0.5.23's AITER MXFP4 path reads, with the values whose bytes
#: mxconvert writes (docs/sglang.md, "AITER"): `SGLANG_AITER_K3_OPT` (mxfp4.py `_aiter_k3_opt`, read
#: only with SGLANG_USE_AITER) pads I to 128 instead of 256; `SGLANG_USE_AITER_MOE_GU_ITLV`
#: (environ.py, `EnvBool(True)`) off swaps `shuffle_weight_a16w4` / `shuffle_scale_a16w4` for aiter's
#: `shuffle_weight` / `shuffle_scale` (another byte layout). GPT-OSS's activation is not "situ", so the
#: AITER_SITUV2_* variables are never read for it.
AITER_ENV_DEFAULTS: tuple[tuple[str, bool], ...] = (
    ("SGLANG_AITER_K3_OPT", False),
    ("SGLANG_USE_AITER_MOE_GU_ITLV", True),
)


#: SGLang's two boolean parsers: utils/common.py `get_bool_env_var` (only "true" / "1" are on; any
#: other value is off, with a warning) and environ.py `EnvBool.parse` (on: true 1 yes y; off: false 0
#: no n; anything else raises ValueError at start-up).
_GET_BOOL_TRUE = ("true", "1")
_ENV_BOOL_TRUE = ("true", "1", "yes", "y")
_ENV_BOOL_FALSE = ("false", "0", "no", "n")


def _env_bool(env: dict[str, str], name: str, default: bool) -> bool | None:
    """The value SGLang reads for `name` (SGLANG_AITER_K3_OPT by `get_bool_env_var`,
    SGLANG_USE_AITER_MOE_GU_ITLV by `EnvBool`), or None where SGLang refuses the value."""
    if name not in env:
        return default
    value = env[name].lower()
    if name == "SGLANG_AITER_K3_OPT":
        return value in _GET_BOOL_TRUE
    if value in _ENV_BOOL_TRUE or value in _ENV_BOOL_FALSE:
        return value in _ENV_BOOL_TRUE
    return None


def aiter_env_refusal(env: dict[str, str]) -> str | None:
    """Why mxconvert does not write SGLang 0.5.23's AITER bytes under `env`, or None (the defaults)."""
    for name, default in AITER_ENV_DEFAULTS:
        value = _env_bool(env, name, default)
        if value is None:
            return f"{name}={env[name]} is not a boolean SGLang 0.5.23 accepts (environ.py EnvBool raises)"
        if value != default:
            return (
                f"{name}={env[name]} changes SGLang 0.5.23's AITER MXFP4 bytes (layers/quantization/mxfp4.py: "
                + (
                    "I padded to 128 instead of 256"
                    if name == "SGLANG_AITER_K3_OPT"
                    else "aiter shuffle_weight / shuffle_scale instead of shuffle_weight_a16w4 / shuffle_scale_a16w4"
                )
                + f"), which mxconvert does not write; serve with {name} {'on' if default else 'unset'}"
            )
    return None


def _aiter(walk: _Walk, env: dict[str, str], why: str) -> Selection:
    p = walk.profile
    if p.platform != "rocm" or not (p.gfx or "").startswith("gfx95"):
        walk.note(B.AITER_MXFP4_BF16, _AITER, f"Mxfp4Config supports ROCm gfx95x only, {where(p)}")
        raise walk.refuse("the AITER MXFP4 path cannot run")
    refusal = aiter_env_refusal(env)
    if refusal is not None:
        walk.note(B.AITER_MXFP4_BF16, _AITER, refusal)
        raise walk.refuse("the AITER MXFP4 bytes of this environment are not written")
    defaults = ", ".join(f"{n}={'1' if d else '0'}" for n, d in AITER_ENV_DEFAULTS)
    return walk.choose(B.AITER_MXFP4_BF16, _AITER, "bf16", f"{why} ({defaults}: shuffle_weight_a16w4 bytes)")


def select(
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment,
    moe_backend: str = "auto",
    hidden_size: int | None = None,
) -> Selection:
    """SGLang 0.5.23's MoE runner for a GPT-OSS MXFP4 checkpoint on `profile`.

    `moe_backend` is SGLang's `--moe-runner-backend` value ("auto" by default). Raises InputError
    for a name SGLang does not know and SelectionRefused (with every branch's reason) when SGLang
    would run no MXFP4 kernel. `hidden_size` is accepted for the common signature; no branch reads it.
    Under expert parallelism the chosen backend must be one of `EP_BACKENDS` (else SelectionRefused,
    the reason in the report); `--dp` is an InputError (walk.py `parallel_refusal`).
    """
    name = moe_backend.strip().lower().replace("-", "_")
    env = dict(deployment.env)
    walk = _Walk(profile, revision, name)
    refused = parallel_refusal(deployment, RUNTIME)
    if refused is not None:
        raise refused
    chosen = _select(walk, name, moe_backend, profile, deployment, env)
    return ep_refusal(walk, chosen, deployment.ep, EP_BACKENDS, _EP_REFUSED, RUNTIME)


def _select(
    walk: _Walk, name: str, moe_backend: str, profile: DeviceProfile, deployment: Deployment, env: dict[str, str]
) -> Selection:
    """`select`'s walk, before the expert-parallel check."""
    if name not in RUNNER_NAMES:
        if name in OTHER_RUNNER_NAMES:
            raise walk.refuse(f"--moe-runner-backend {name} is not a GPT-OSS MXFP4 path of {RUNTIME}")
        raise InputError(
            f"unknown SGLang --moe-runner-backend {moe_backend!r}; valid for GPT-OSS MXFP4: {', '.join(RUNNER_NAMES)}"
        )
    if deployment.lora or deployment.all2all is not None:
        raise InputError(f"LoRA and all2all backends are not mirrored for {RUNTIME} yet (docs/sglang.md)")
    if name == "auto":
        return _select_auto(walk, deployment, env)
    if name == "flashinfer_mxfp4":
        return _flashinfer_mxfp4(walk, "--moe-runner-backend flashinfer_mxfp4")
    if name == "triton_kernel":
        return _triton_kernel(walk, deployment, "--moe-runner-backend triton_kernel")
    if name == "marlin":
        if _major(profile) not in (9, 10, 12):
            walk.note(B.MARLIN, _MARLIN, f"MXFP4 Marlin requires SM90+ (SM90, SM100 or SM120), {where(profile)}")
            raise walk.refuse("moe_runner_backend=marlin cannot run")
        return walk.choose(B.MARLIN, _MARLIN, "bf16", "--moe-runner-backend marlin")
    if name == "aiter":
        if not _use_aiter(profile, env):
            walk.note(B.AITER_MXFP4_BF16, _AITER, "Mxfp4MoEMethod takes the AITER branch only with SGLANG_USE_AITER=1")
            raise walk.refuse("the AITER MXFP4 path needs SGLANG_USE_AITER=1 on ROCm")
        return _aiter(walk, env, "--moe-runner-backend aiter with SGLANG_USE_AITER=1")
    if name == "deep_gemm":
        walk.note(
            B.EMULATION,
            "Mxfp4MoEMethod[deep_gemm fp8_fp4]",
            "DeepGEMM's fp8 x fp4 grouped GEMM has no mxconvert layout",
        )
        raise walk.refuse("moe_runner_backend=deep_gemm is not a backend mxconvert lays out")
    return _default_method(walk, "--moe-runner-backend triton")


def marlin_layer_refusal(hidden_size: int, intermediate_size: int, moe_tp: int) -> str | None:
    """Why SGLang 0.5.23 raises for a GPT-OSS MoE layer of these unpadded sizes under MARLIN, or None.

    `Mxfp4MoEMethod.process_weights_after_loading` (layers/quantization/mxfp4.py, marlin branch)
    raises "Current MXFP4 MoE layer is not supported by Marlin." unless
    `check_moe_marlin_supports_layer(layer, 32, allow_tile_padding=True)` (marlin_utils.py) holds:
    `layer.hidden_size % 64 == 0` and `layer.intermediate_size_per_partition % 32 == 0`, both
    `FusedMoE`'s unpadded sizes (the latter `intermediate_size // moe_tp_size`). GPT-OSS
    (I = 2880) passes at TP 1 and 2 and fails at TP 4 (720 % 32 = 16) and 8 (360 % 32 = 8). The
    activation (silu for GPT-OSS) and the router-weight test always pass for GPT-OSS.
    """
    per_rank = intermediate_size // moe_tp
    if hidden_size % 64 == 0 and per_rank % 32 == 0:
        return None
    fits = [t for t in range(1, 9) if intermediate_size % t == 0 and (intermediate_size // t) % 32 == 0]
    if hidden_size % 64:
        fix = "no TP size helps (the hidden size is the model's); choose another --backend"
    else:
        sizes = ", ".join(str(t) for t in fits) or "none up to 8"
        fix = f"use a --tp at which intermediate_size / tp is a multiple of 32 (here {sizes}) or another --backend"
    return (
        f"{RUNTIME} cannot run MARLIN for this model at MoE TP {moe_tp}: its "
        f"check_moe_marlin_supports_layer(layer, 32, allow_tile_padding=True) (layers/quantization/marlin_utils.py) "
        f"needs hidden_size % 64 == 0 (here {hidden_size} % 64 = {hidden_size % 64}) and the rank's "
        f"intermediate_size // tp % 32 == 0 (here {intermediate_size} // {moe_tp} = {per_rank}, % 32 = "
        f'{per_rank % 32}), else Mxfp4MoEMethod.process_weights_after_loading raises "Current MXFP4 MoE layer is '
        f'not supported by Marlin."; {fix}'
    )


def cutlass_layer_refusal(intermediate_size: int, moe_tp: int) -> str | None:
    """Why SGLang 0.5.23 cannot load a GPT-OSS MoE layer of this intermediate size at MoE TP `moe_tp`
    under FLASHINFER_CUTLASS (SM90 / SM120), or None.

    For the CUTLASS kernels `Mxfp4MoEMethod.create_weights` (layers/quantization/mxfp4.py) makes the
    parameters at the rank's unpadded `intermediate_size // tp` rows (it re-pads only after loading),
    while the GPT-OSS loader (models/gpt_oss.py `_load_mxfp4_experts_weights`) slices the checkpoint
    in whole MXFP4 blocks, `ceil((I / 32) / tp) * 32` rows per rank, and copies them in: where that
    is more than `I // tp` the copy raises. GPT-OSS (I = 2880, 90 blocks) loads at TP 1 and 2 and
    not at TP 4 (736 > 720) or 8 (384 > 360).
    """
    per_rank = intermediate_size // moe_tp
    sliced = -(-(intermediate_size // 32) // moe_tp) * 32
    if sliced == per_rank:
        return None
    fits = ", ".join(str(t) for t in range(1, 9) if (intermediate_size // 32) % t == 0) or "none up to 8"
    return (
        f"{RUNTIME} cannot load this model's experts for FLASHINFER_CUTLASS at MoE TP {moe_tp}: the GPT-OSS "
        f"loader (models/gpt_oss.py _load_mxfp4_experts_weights) copies ceil(({intermediate_size} / 32) / "
        f"{moe_tp}) * 32 = {sliced} intermediate rows per rank into the {per_rank}-row parameters "
        f"Mxfp4MoEMethod.create_weights makes for the CUTLASS kernels (intermediate_size // tp, padded only "
        f"after loading), and the copy raises; use a --tp that divides the {intermediate_size // 32} MXFP4 "
        f"blocks (here {fits}), expert parallelism (--ep), or another --backend"
    )


def layer_refusal(backend: Enum, hidden_size: int, intermediate_size: int, moe_tp: int) -> str | None:
    """Why SGLang 0.5.23 raises at load for a GPT-OSS MoE layer of these unpadded sizes under
    `backend`, or None: MARLIN's `marlin_layer_refusal`, FLASHINFER_CUTLASS's `cutlass_layer_refusal`."""
    if backend in MARLIN_BACKENDS:
        return marlin_layer_refusal(hidden_size, intermediate_size, moe_tp)
    if backend in CUTLASS_BACKENDS:
        return cutlass_layer_refusal(intermediate_size, moe_tp)
    return None


#: The backends each `--moe-runner-backend` name reaches, by device (docs/sglang.md, "Selection");
#: XPU and CPU are reached by "auto" alone. The `mxconvert backends` rows of an SGLang row.
RUNNER_BACKENDS: dict[str, tuple[Mxfp4Backend, ...]] = {
    "flashinfer_mxfp4": (
        B.FLASHINFER_TRTLLM_MXFP4_MXFP8,
        B.FLASHINFER_CUTLASS_MXFP4_MXFP8,
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
    ),
    "triton_kernel": (B.TRITON,),
    "marlin": (B.MARLIN,),
    "aiter": (B.AITER_MXFP4_BF16,),
    "auto": (B.XPU, B.CPU),
}


def backend_rows(revision: RuntimeRevision, profiles: tuple[DeviceProfile, ...]) -> list[dict]:
    """`mxconvert backends` rows of an SGLang row for GPT-OSS MXFP4 (walk.backend_rows; "auto" on
    GPT-OSS-120B's hidden size)."""
    return walk_backend_rows(
        "mxfp4",
        revision,
        profiles,
        RUNNER_BACKENDS,
        lambda profile: select(profile, revision, Deployment(), "auto", hidden_size=2880),
    )
