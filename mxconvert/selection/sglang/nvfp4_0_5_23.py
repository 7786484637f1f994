"""The NVFP4 MoE backend choice of SGLang 0.5.23, mirrored (docs/sglang.md, "NVFP4").

SGLang has no priority list: `--moe-runner-backend` (default "auto") is resolved at start-up by the
model's overrides, and the checkpoint's quantization method then dispatches on the resolved name and
the device. Two methods hold NVFP4 MoE weights:

* ModelOpt (`quant_method` "modelopt", SGLang's `modelopt_fp4`): `ModelOptNvFp4FusedMoEMethod`
  (sglang/srt/layers/quantization/modelopt_quant.py). `__init__` raises unless the device is Blackwell
  (capability majors 10-12) or Marlin runs (requested, or "auto" on a CUDA capability in [8.0, 10.0));
  `create_weights` and `process_weights_after_loading` prepare the bytes for the *global* runner name
  (`get_moe_runner_backend()`: TRT-LLM for `flashinfer_trtllm` / `flashinfer_trtllm_routed`, Marlin,
  CuTe DSL, otherwise FlashInfer CUTLASS's `swizzle_blockscale`), while `create_moe_runner` resolves a
  global "auto" to MARLIN on [8.0, 10.0) and to FLASHINFER_TRTLLM elsewhere. A global "auto" on
  Blackwell therefore prepares CUTLASS bytes for a TRT-LLM runner: only the model overrides that
  turn "auto" into `flashinfer_trtllm` first make it coherent (arg_groups/overrides.py
  `_deepseek_moe_quant_resolution`, arg_groups/model_overrides/qwen3_moe.py
  `_qwen3_moe_family_overrides`: SM100, `--moe-a2a-backend none`, quantization `modelopt_fp4`).
* compressed-tensors (`nvfp4-pack-quantized`): `CompressedTensorsMoEMethod.get_moe_method`
  (layers/quantization/compressed_tensors/compressed_tensors.py) takes `CompressedTensorsW4A4Nvfp4MoE`
  from capability 10.0 (FlashInfer TRT-LLM when the runner is `flashinfer_trtllm`, CUTLASS otherwise:
  the scheme reads no other name), and `CompressedTensorsW4A16Nvfp4MoE` (weight-only FP4 Marlin)
  below it and for NVFP4A16 checkpoints.

SGLang's paths map onto mxconvert's `Nvfp4Backend` by the bytes the kernel reads: TRT-LLM-gen
(`flashinfer.fused_moe.trtllm_fp4_block_scale_moe`) is FLASHINFER_TRTLLM, FlashInfer's
`cutlass_fused_moe` is FLASHINFER_CUTLASS, the CuTe DSL standard path (`CuteDslMoEWrapper`, a2a
none) is FLASHINFER_CUTEDSL, FP4 Marlin is MARLIN. Paths with no mxconvert layout (FlashInfer
MegaMoE, DeepGEMM, Triton) are reported and refused.

Device facts read: platform and capability (`is_blackwell` majors 10-12, `is_sm100` major 10),
whether FlashInfer is installed. Model facts: the checkpoint's producer ("modelopt" or
"compressed-tensors"), its `model_type` (which override family it is), and whether it is W4A16.
Parallel facts: the all2all backend (none mirrored), LoRA (refused), `--dp` (no SGLang meaning, walk.py
`parallel_refusal`) and the expert-parallel size (`EP_BACKENDS`: the backends mxconvert writes EP
artifacts for; docs/sglang.md, "Expert parallelism").
"""

from __future__ import annotations

from mxconvert.core.errors import InputError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.predicates import where
from mxconvert.selection.report import Selection, SelectionRefused
from mxconvert.selection.sglang.walk import Walk, ep_refusal, parallel_refusal
from mxconvert.selection.sglang.walk import backend_rows as walk_backend_rows
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision

B = Nvfp4Backend

#: The weight format this mirror selects for (the row's `formats` names it).
FORMAT = "nvfp4"
#: The style name revision rows give in their `selection` field (the MXFP4 mirror's, same row).
STYLE_NAME = "sglang-0.5.23"
RUNTIME = "SGLang 0.5.23"

#: `--moe-runner-backend` names (sglang/srt/arg_groups/choices.py MOE_RUNNER_BACKEND_CHOICES) the NVFP4
#: MoE methods act on; "auto" is resolved by `_resolve_auto`.
RUNNER_NAMES: tuple[str, ...] = (
    "auto", "flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_cutedsl", "marlin",
)  # fmt: skip

#: The other `--moe-runner-backend` choices of SGLang 0.5.23, each with why mxconvert refuses it for NVFP4.
OTHER_RUNNER_NAMES: dict[str, str] = {
    "flashinfer_megamoe": "FlashInfer MegaMoE (DeepGEMM's transform_weights_for_mega_moe) has no mxconvert layout",
    "deep_gemm": "DeepGEMM is not an NVFP4 MoE path of ModelOptNvFp4FusedMoEMethod",
    "cutlass": "ModelOptNvFp4FusedMoEMethod.create_moe_runner raises: cutlass is not supported for NVFP4 MoE",
    "triton": "no NVFP4 Triton MoE path in ModelOptNvFp4FusedMoEMethod",
    "triton_kernel": "no NVFP4 triton_kernels path in ModelOptNvFp4FusedMoEMethod",
    "flashinfer_mxfp4": "an MXFP4 runner",
    "experimental_sgl_trtllm": "not an NVFP4 path of ModelOptNvFp4FusedMoEMethod",
    "experimental_sgl_marlin": "not an NVFP4 path of ModelOptNvFp4FusedMoEMethod",
    "humming": "Humming is not an NVFP4 path of ModelOptNvFp4FusedMoEMethod",
    "aiter": "ROCm AITER: ModelOptNvFp4FusedMoEMethod runs on Blackwell or with Marlin only",
    "hpc_ops": "not an NVFP4 path of ModelOptNvFp4FusedMoEMethod",
    "intel_xpu": "ModelOptNvFp4FusedMoEMethod runs on CUDA only",
    "lora_cutedsl": "LoRA is not mirrored (NVFP4 MoE LoRA needs lora_marlin)",
    "lora_triton": "LoRA is not mirrored (NVFP4 MoE LoRA needs lora_marlin)",
    "lora_marlin": "LoRA is not mirrored",
}

#: `model_type`s whose SGLang 0.5.23 override turns "auto" into `flashinfer_trtllm` on SM100 for
#: `modelopt_fp4` (the DeepSeek family of overrides.py `_DEEPSEEK_FAMILY_ARCHS`, the Qwen3-MoE family of
#: model_overrides/qwen3_moe.py), by the architectures' model types.
TRTLLM_AUTO_MODEL_TYPES: dict[str, str] = {
    "deepseek_v3": "_deepseek_moe_quant_resolution (DeepseekV3ForCausalLM)",
    "deepseek_v32": "_deepseek_moe_quant_resolution (DeepseekV32ForCausalLM)",
    "kimi_k25": "_deepseek_moe_quant_resolution (KimiK25ForConditionalGeneration)",
    "qwen3_moe": "_qwen3_moe_family_overrides (Qwen3MoeForCausalLM)",
    "qwen3_next": "_qwen3_moe_family_overrides (Qwen3NextForCausalLM)",
    "qwen3_vl_moe": "_qwen3_moe_family_overrides (Qwen3VLMoeForConditionalGeneration)",
    "qwen3_5_moe": "_qwen3_moe_family_overrides (Qwen3_5MoeForConditionalGeneration)",
}

_TRUE = ("1", "true", "yes", "on")
_TRTLLM = "ModelOptNvFp4FusedMoEMethod[flashinfer_trtllm: trtllm_fp4_block_scale_moe]"
_TRTLLM_ROUTED = "ModelOptNvFp4FusedMoEMethod[flashinfer_trtllm_routed: trtllm_fp4_block_scale_routed_moe]"
_CUTLASS = "ModelOptNvFp4FusedMoEMethod[flashinfer_cutlass: cutlass_fused_moe]"
_CUTEDSL = "ModelOptNvFp4FusedMoEMethod[flashinfer_cutedsl: CuteDslMoEWrapper]"
_MARLIN = "ModelOptNvFp4FusedMoEMethod[marlin: fused_marlin_moe]"
_CT_TRTLLM = "CompressedTensorsW4A4Nvfp4MoE[flashinfer_trtllm]"
_CT_CUTLASS = "CompressedTensorsW4A4Nvfp4MoE[flashinfer_cutlass]"
_CT_MARLIN = "CompressedTensorsW4A16Nvfp4MoE[marlin]"

#: The backends whose activation scale is one scalar for all experts (the ModelOpt method takes
#: `w13_input_scale.max()` for TRT-LLM, CUTLASS and CuTe DSL; compressed-tensors' TRT-LLM branch the
#: `.min()` of the global scales). Marlin reads none; CT's CUTLASS keeps one per expert.
_GLOBAL_SF = {_TRTLLM, _TRTLLM_ROUTED, _CUTLASS, _CUTEDSL, _CT_TRTLLM}


#: The backends whose SGLang 0.5.23 NVFP4 path runs with ep_size > 1 (MoE TP 1) and whose EP artifacts
#: mxconvert writes (docs/sglang.md, "Expert parallelism"). FusedMoE allocates the rank's E / ep local
#: experts (layers/moe/fused_moe_triton/layer.py:561-563) and its weight loader maps global expert ids to
#: local ones (layer.py:1153-1161, 1191-1195: rank r holds r * E/ep .. (r + 1) * E/ep - 1, in order), except for
#: parameters marked `_sglang_require_global_experts`: ModelOpt's `w13_input_scale` / `w2_input_scale`
#: (modelopt_quant.py:2634-2648) hold every global expert's, and its TRT-LLM and CUTLASS branches reduce
#: them to one maximum over ALL global experts (modelopt_quant.py:2768-2770), which the artifact's
#: canonical input scales hold for these backends (formats/nvfp4/format.py `geometry`: every global
#: expert's rows). compressed-tensors' `w13/w2_input_global_scale` are local (the scheme's
#: `create_weights(num_experts=num_local_experts)`), so its TRT-LLM minimum is over the rank's experts,
#: as the artifact's. The kernels take the rank's place: TRT-LLM (and its routed variant, which shares the
#: preparation and runner, modelopt_quant.py:3236-3241) `local_expert_offset = moe_ep_rank *
#: num_local_experts` (modelopt_quant.py:3263-3266; compressed_tensors_w4a4_nvfp4_moe.py:340-342),
#: FlashInfer CUTLASS `ep_size` / `ep_rank` (moe_runner/flashinfer_cutlass.py:384-385), FP4 Marlin the
#: dispatcher's `local_expert_mapping` (modelopt_quant.py:3161-3168; compressed_tensors_w4a16_nvfp4_moe.py:
#: 239-242). Marlin and compressed-tensors' CUTLASS keep per-expert scalars (no cross-expert reduction).
EP_BACKENDS: frozenset[Nvfp4Backend] = frozenset({B.FLASHINFER_TRTLLM, B.FLASHINFER_CUTLASS, B.MARLIN})

#: Why an EP artifact of each other backend is not written (its reason in the selection report).
_EP_REFUSED: dict[Mxfp4Backend | Nvfp4Backend, str] = {
    B.FLASHINFER_CUTEDSL: (
        "expert parallelism for the CuTe DSL standard path is not mirrored: SGLang 0.5.23 takes w13's input "
        "scale as one maximum over every global expert but slices w2's per-expert input scales to the rank "
        "(modelopt_quant.py:2784-2803), and mxconvert's canonical input scales hold one expert range for both; "
        "serve CuTe DSL artifacts at --ep-size 1"
    ),
}


class _Walk(Walk):
    """A walk of the NVFP4 methods' branches (walk.py)."""

    def choose(self, backend: Nvfp4Backend, kernel: str, reason: str) -> Selection:
        a16 = backend is B.MARLIN
        return self.selection(
            backend,
            kernel,
            reason,
            "bf16" if a16 else "nvfp4",
            format="nvfp4",
            use_global_sf=kernel in _GLOBAL_SF,
            use_a16=a16,
            activation_fn="silu",
        )


def _cap(p: DeviceProfile) -> tuple[int, int] | None:
    return p.cap if p.platform == "cuda" and p.capability is not None else None


def _blackwell(p: DeviceProfile) -> bool:
    cap = _cap(p)
    return cap is not None and cap[0] in (10, 11, 12)


def _marlin_auto(p: DeviceProfile) -> bool:
    """`(8, 0) <= get_device_capability() < (10, 0)` on CUDA (`__init__`, `create_moe_runner`)."""
    cap = _cap(p)
    return cap is not None and (8, 0) <= cap < (10, 0)


def _marlin(walk: _Walk, kernel: str, why: str) -> Selection:
    cap = _cap(walk.profile)
    if cap is None or cap < (8, 0):  # FP4 Marlin (fused_marlin_moe) is built for SM80 and newer
        walk.note(B.MARLIN, kernel, f"FP4 Marlin needs CUDA capability 8.0 or newer, {where(walk.profile)}")
        raise walk.refuse("the FP4 Marlin MoE cannot run")
    return walk.choose(B.MARLIN, kernel, why)


def _flashinfer(walk: _Walk, backend: Nvfp4Backend, kernel: str, why: str, *, sm100: bool) -> Selection:
    """A FlashInfer NVFP4 MoE of the ModelOpt method: Blackwell (`__init__`), FlashInfer installed;
    the TRT-LLM-gen kernels are built for SM100 only (capability major 10)."""
    p = walk.profile
    if not _blackwell(p):
        walk.note(backend, kernel, f"ModelOptNvFp4FusedMoEMethod needs Blackwell (majors 10-12) here, {where(p)}")
        raise walk.refuse("Current platform does not support NVFP4 quantization with the selected MoE backend")
    if sm100 and p.cap[0] != 10:
        walk.note(backend, kernel, f"FlashInfer's trtllm-gen MoE kernels need capability major 10, {where(p)}")
        raise walk.refuse(f"{walk.requested} cannot run")
    if not p.has_flashinfer:
        walk.note(backend, kernel, f"FlashInfer is not installed on profile {p.name}")
        raise walk.refuse(f"{walk.requested} needs FlashInfer")
    return walk.choose(backend, kernel, why)


def _resolve_auto(walk: _Walk, model_type: str, deployment: Deployment) -> str:
    """The model overrides' answer for "auto" under `modelopt_fp4` (still "auto" where none applies)."""
    p = walk.profile
    family = TRTLLM_AUTO_MODEL_TYPES.get(model_type)
    if family is None:
        walk.note(B.FLASHINFER_TRTLLM, _TRTLLM, f"no SGLang override resolves auto for model type {model_type!r}")
    elif _cap(p) is None or p.cap[0] != 10:
        walk.note(B.FLASHINFER_TRTLLM, _TRTLLM, f"{family} resolves auto on SM100 only, {where(p)}")
    elif deployment.all2all is not None:
        walk.note(B.FLASHINFER_TRTLLM, _TRTLLM, f"{family} resolves auto with --moe-a2a-backend none only")
    else:
        return "flashinfer_trtllm"
    return "auto"


def _modelopt(walk: _Walk, name: str, model_type: str, w4a16: bool, deployment: Deployment) -> Selection:
    """`ModelOptNvFp4FusedMoEMethod` (modelopt_quant.py) for the runner name `name`."""
    p = walk.profile
    why = f"--moe-runner-backend {name}"
    if name == "auto":
        name = _resolve_auto(walk, model_type, deployment)
        why = "auto -> flashinfer_trtllm (model override)" if name != "auto" else "auto (no override)"
    if w4a16 and name not in ("auto", "marlin"):
        walk.note(B.FLASHINFER_TRTLLM, _TRTLLM, "a W4A16_NVFP4 checkpoint's MoE runs Marlin (qwen3_moe.py raises)")
        raise walk.refuse(f"--moe-runner-backend {name} does not run W4A16_NVFP4 MoE layers")
    if name == "auto":
        if _marlin_auto(p):
            return _marlin(walk, _MARLIN, f"{why}: CUDA capability in [8.0, 10.0) -> marlin (create_moe_runner)")
        walk.note(B.MARLIN, _MARLIN, f"auto picks Marlin on CUDA capability [8.0, 10.0) only, {where(p)}")
        if _blackwell(p):
            walk.note(
                B.FLASHINFER_TRTLLM,
                _TRTLLM,
                "a global auto prepares FlashInfer CUTLASS bytes (create_weights and process_weights_after_loading "
                "read the global runner name) for the FLASHINFER_TRTLLM runner create_moe_runner makes of it",
            )
            raise walk.refuse(
                f"{RUNTIME}'s auto is not coherent for NVFP4 here; pass --moe-runner-backend "
                "(flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl or marlin) to both SGLang and mxconvert"
            )
        raise walk.refuse("Current platform does not support NVFP4 quantization with the selected MoE backend")
    if name == "flashinfer_trtllm":
        return _flashinfer(walk, B.FLASHINFER_TRTLLM, _TRTLLM, why, sm100=True)
    if name == "flashinfer_trtllm_routed":
        return _flashinfer(walk, B.FLASHINFER_TRTLLM, _TRTLLM_ROUTED, why, sm100=True)
    if name == "flashinfer_cutlass":
        return _flashinfer(walk, B.FLASHINFER_CUTLASS, _CUTLASS, why, sm100=False)
    if name == "flashinfer_cutedsl":
        return _flashinfer(walk, B.FLASHINFER_CUTEDSL, _CUTEDSL, f"{why} (v2 standard path: a2a none)", sm100=False)
    return _marlin(walk, _MARLIN, why)  # "marlin"


def _compressed_tensors(walk: _Walk, name: str, w4a16: bool) -> Selection:
    """`CompressedTensorsMoEMethod.get_moe_method` for an NVFP4 MoE (compressed_tensors.py)."""
    p = walk.profile
    if w4a16:
        if name not in ("auto", "marlin"):
            walk.note(B.MARLIN, _CT_MARLIN, f"the NVFP4A16 scheme runs FP4 Marlin whatever --moe-runner-backend {name}")
            raise walk.refuse(f"--moe-runner-backend {name} is not the path of an NVFP4A16 MoE")
        return _marlin(walk, _CT_MARLIN, "NVFP4A16 checkpoint -> CompressedTensorsW4A16Nvfp4MoE")
    cap = _cap(p)
    if cap is None or cap < (10, 0):
        walk.note(
            B.FLASHINFER_CUTLASS, _CT_CUTLASS, f"CompressedTensorsW4A4Nvfp4MoE needs capability >= 10.0, {where(p)}"
        )
        if name not in ("auto", "marlin"):
            raise walk.refuse(f"--moe-runner-backend {name}: below SM100 SGLang serves CT NVFP4 MoE with Marlin only")
        return _marlin(walk, _CT_MARLIN, "below capability 10.0 -> CompressedTensorsW4A16Nvfp4MoE (weight-only)")
    if not p.has_flashinfer:
        walk.note(B.FLASHINFER_CUTLASS, _CT_CUTLASS, f"FlashInfer is not installed on profile {p.name}")
        raise walk.refuse("CompressedTensorsW4A4Nvfp4MoE needs FlashInfer")
    if name == "flashinfer_trtllm":
        if cap[0] != 10:
            walk.note(B.FLASHINFER_TRTLLM, _CT_TRTLLM, f"trtllm-gen MoE kernels need capability major 10, {where(p)}")
            raise walk.refuse("--moe-runner-backend flashinfer_trtllm cannot run")
        return walk.choose(B.FLASHINFER_TRTLLM, _CT_TRTLLM, "--moe-runner-backend flashinfer_trtllm")
    walk.note(
        B.FLASHINFER_TRTLLM, _CT_TRTLLM, "the scheme takes TRT-LLM for --moe-runner-backend flashinfer_trtllm only"
    )
    if name not in ("auto", "flashinfer_cutlass"):
        walk.note(B.FLASHINFER_CUTLASS, _CT_CUTLASS, f"the scheme ignores --moe-runner-backend {name}")
        raise walk.refuse(f"CompressedTensorsW4A4Nvfp4MoE runs TRT-LLM or CUTLASS only, not {name}")
    return walk.choose(B.FLASHINFER_CUTLASS, _CT_CUTLASS, f"--moe-runner-backend {name} -> FlashInfer CUTLASS")


def select(
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment,
    moe_backend: str = "auto",
    *,
    producer: str | None = None,
    model_type: str | None = None,
    w4a16: bool = False,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    swiglu_limit: float | None = None,
) -> Selection:
    """SGLang 0.5.23's MoE runner for an NVFP4 checkpoint on `profile`.

    `moe_backend` is SGLang's `--moe-runner-backend` value; `producer` the checkpoint's quantization
    ("modelopt" or "compressed-tensors"; None is ModelOpt's, the method the runner names act on);
    `model_type` the config's (which SGLang override resolves "auto"; None resolves none). Raises
    InputError for a name SGLang does not know and SelectionRefused (with every branch's reason)
    when SGLang would run no NVFP4 kernel mxconvert can name. `hidden_size` feeds TRT-LLM's shape
    refusal and `intermediate_size` (the checkpoint's, unsharded) its TP-slicing one; a
    `swiglu_limit` (SGLang's gemm1 clamp parameters) is not mirrored; expert parallelism is, for
    `EP_BACKENDS` (MoE TP 1: SGLang's `--tp-size E --ep-size E`).
    """
    name = moe_backend.strip().lower().replace("-", "_")
    walk = _Walk(profile, revision, name)
    if name not in RUNNER_NAMES:
        if name in OTHER_RUNNER_NAMES:
            walk.note(B.EMULATION, f"--moe-runner-backend {name}", OTHER_RUNNER_NAMES[name])
            raise walk.refuse(f"--moe-runner-backend {name} is not an NVFP4 MoE path mxconvert lays out")
        raise InputError(
            f"unknown SGLang --moe-runner-backend {moe_backend!r}; valid for NVFP4: {', '.join(RUNNER_NAMES)}"
        )
    if deployment.lora or deployment.all2all is not None:
        raise InputError(f"LoRA and all2all backends are not mirrored for {RUNTIME} NVFP4 yet (docs/sglang.md)")
    if producer not in (None, "modelopt", "compressed-tensors"):
        raise InputError(f"unknown NVFP4 producer {producer!r}; known: modelopt, compressed-tensors")
    env = dict(deployment.env)
    if env.get("SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION", "").strip().lower() in _TRUE:
        raise InputError(
            f"SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION (per-token activation scales) is not mirrored for {RUNTIME}"
        )
    refused = parallel_refusal(deployment, RUNTIME)  # --dp: no SGLang meaning (as for MXFP4)
    if refused is not None:
        raise refused
    if swiglu_limit is not None:
        raise InputError(
            f"{RUNTIME}'s NVFP4 SwiGLU clamp (gemm1_clamp_limit, block-scale rescaling of untied w1 / w3 alphas) "
            "is not mirrored"
        )
    if producer == "compressed-tensors":
        picked = _compressed_tensors(walk, name, w4a16)
    else:
        picked = _modelopt(walk, name, model_type or "", w4a16, deployment)
    picked = ep_refusal(walk, picked, deployment.ep, EP_BACKENDS, _EP_REFUSED, RUNTIME, "NVFP4 ")
    if picked.backend is B.FLASHINFER_TRTLLM and hidden_size is not None and hidden_size % 128:
        raise SelectionRefused(
            f"{RUNTIME} selects FLASHINFER_TRTLLM ({picked.kernel_class}), but its preparation cannot run hidden size "
            f"{hidden_size}: prepare_static_weights_for_trtllm_fp4_moe (layers/quantization/utils.py) keeps each "
            "expert's interleaved scales at the unpadded size, and FlashInfer's 128x4 interleave pads the w2 scale "
            "rows (the hidden size; SGLang pads it for per-token non-gated layers only) to 128",
            picked.considered,
        )
    tp = deployment.moe_tp
    if (
        picked.backend is B.FLASHINFER_TRTLLM
        and intermediate_size is not None
        and tp > 1
        and (intermediate_size // tp) % 64
    ):
        raise SelectionRefused(
            f"{RUNTIME} selects FLASHINFER_TRTLLM ({picked.kernel_class}), but at TP {tp} SGLang slices the "
            f"intermediate size {intermediate_size} by its padded shard (round_up({intermediate_size // tp}, 64) rows "
            "per rank: FusedMoE's padded loading, narrow_padded_param_and_loaded_weight), not evenly as mxconvert "
            "does; use a TP whose shard is a multiple of 64",
            picked.considered,
        )
    if picked.backend is B.FLASHINFER_CUTEDSL:
        _cutedsl_refusal(picked, env, intermediate_size, tp)
    return picked


def _cutedsl_refusal(picked: Selection, env: dict, intermediate_size: int | None, tp: int) -> None:
    """What SGLang's CuTe DSL v2 preparation (`ModelOptNvFp4FusedMoEMethod.process_weights_after_loading`)
    does that mxconvert's bytes do not: `interleave_w13_halves(group_size=64)` raises on a TP shard of the
    intermediate size that is not a multiple of 64 (mxconvert's layout would pad it), and
    `SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16` keeps activations in BF16 with input scales of one."""
    w4a16 = env.get("SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16")  # EnvBool(False): SGLang raises on unknown values
    if w4a16 is not None and w4a16.strip().lower() not in ("false", "0", "no", "n"):
        raise InputError(
            f"SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16 (CuTe DSL W4A16: input scales of one) is not mirrored for {RUNTIME}"
        )
    if intermediate_size is not None and (intermediate_size // tp) % 64:
        raise SelectionRefused(
            f"{RUNTIME} selects FLASHINFER_CUTEDSL ({picked.kernel_class}), but its preparation raises on the TP "
            f"shard {intermediate_size} / {tp} = {intermediate_size // tp} of the intermediate size: "
            "interleave_w13_halves (layers/moe/moe_runner/flashinfer_cutedsl.py) needs it a multiple of 64",
            picked.considered,
        )


#: The backends each `--moe-runner-backend` name reaches (the `mxconvert backends` rows of the row).
RUNNER_BACKENDS: dict[str, tuple[Nvfp4Backend, ...]] = {
    "flashinfer_trtllm": (B.FLASHINFER_TRTLLM,),
    "flashinfer_cutlass": (B.FLASHINFER_CUTLASS,),
    "flashinfer_cutedsl": (B.FLASHINFER_CUTEDSL,),
    "marlin": (B.MARLIN,),
}


def backend_rows(revision: RuntimeRevision, profiles: tuple[DeviceProfile, ...]) -> list[dict]:
    """`mxconvert backends` rows of an SGLang row for NVFP4 (walk.backend_rows; "auto" on a ModelOpt
    Qwen3-MoE checkpoint, the format's usual model)."""
    return walk_backend_rows(
        "nvfp4",
        revision,
        profiles,
        RUNNER_BACKENDS,
        lambda profile: select(profile, revision, Deployment(), "auto", producer="modelopt", model_type="qwen3_moe"),
    )
