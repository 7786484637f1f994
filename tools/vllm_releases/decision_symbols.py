"""The vLLM symbols that decide MoE backend selection and weight processing, per format, as data.

A record (see release_records.py and docs/releases.md) holds one digest per symbol listed here, so
two vLLM releases whose digests agree select the same backends and lay out the same bytes on the
vLLM side (FlashInfer and the vendored triton_kernels are recorded separately, as pins).

Symbols are found BY NAME: vLLM moves files between releases (fused_moe/*.py went to
fused_moe/experts/ in 0.20.0, compressed_tensors_moe.py became a package in 0.20.0, ...), so each
entry names qualified-name patterns (``*`` matches any run of characters, dots included; nothing
else is special)
and the files to look in are globs over every location the symbol has had in 0.15.0 .. 0.33.0.
A symbol missing from a release is simply absent from its record; `diff.py` reports it as
added or removed.

The list started from the research on vLLM 0.15.0 .. 0.33.0 (the boundaries named in the `why`
texts below are the releases where that symbol's change moved a selection or a byte). It errs on
the side of too many symbols: an extra symbol can only split two releases that are in fact the same,
never merge two that differ.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """One row of a format's table: qualified-name patterns, where to look, and why they matter."""

    names: tuple[str, ...]
    files: tuple[str, ...]
    why: str


_L = "vllm/model_executor/layers/"
ORACLE_MXFP4 = (_L + "fused_moe/oracle/mxfp4.py",)
QUANT_MXFP4 = (_L + "quantization/mxfp4.py",)
ORACLE_NVFP4 = (_L + "fused_moe/oracle/nvfp4.py",)
MXFP4_UTILS = (_L + "quantization/utils/mxfp4_utils.py",)
MARLIN_FP4 = (_L + "quantization/utils/marlin_utils_fp4.py",)
FI_FP4_MOE = (_L + "quantization/utils/flashinfer_fp4_moe.py",)
FI_UTILS = (_L + "quantization/utils/flashinfer_utils.py",)
NVFP4_UTILS = (_L + "quantization/utils/nvfp4_utils.py", _L + "quantization/utils/nvfp4_moe_support.py")
HUMMING = (_L + "quantization/utils/humming_utils.py", _L + "quantization/utils/humming/*.py")
# Expert (kernel) classes: fused_moe/*.py up to 0.19, fused_moe/experts/*.py from 0.20.
EXPERTS = (_L + "fused_moe/*.py", _L + "fused_moe/experts/*.py")
MODELOPT = (_L + "quantization/modelopt.py",)
# compressed_tensors_moe.py up to 0.19; a package with one file per scheme from 0.20.
CT_MOE = (
    _L + "quantization/compressed_tensors/compressed_tensors_moe.py",
    _L + "quantization/compressed_tensors/compressed_tensors_moe/*.py",
)
GPT_OSS = ("vllm/model_executor/models/gpt_oss.py",)
IMPORT_UTILS = ("vllm/utils/import_utils.py",)
FLASHINFER_UTILS = ("vllm/utils/flashinfer.py",)
ENVS = ("vllm/envs.py",)
MOE_CONFIG = (_L + "fused_moe/config.py",)
PARALLEL_CONFIG = ("vllm/config/parallel.py",)

# The methods of an expert class that take part in selection (`is_supported_config` and the
# `_supports_*` predicates it combines) or in weight processing (the experts' own
# `process_weights_after_loading`, where e.g. the NVFP4 global-scale fold lives from 0.18.0).
_EXPERT_METHODS = ("_supports_*", "is_supported_config", "process_weights_after_loading")


def _methods(*classes: str) -> tuple[str, ...]:
    return tuple(f"{c}.{m}" for c in classes for m in _EXPERT_METHODS)


# Shared by both formats: the symbols that decide selection inputs common to every MoE format.
_SHARED: tuple[Decision, ...] = (
    Decision(
        ("All2AllBackend",),
        PARALLEL_CONFIG,
        "the --all2all-backend names vLLM accepts (a revision row's `all2all_backends`)",
    ),
    Decision(
        ("FusedMoEParallelConfig.use_*",),
        MOE_CONFIG,
        "which all2all / EP settings make a layer batched or modular: a selection input of every oracle",
    ),
    Decision(
        ("has_flashinfer", "has_flashinfer_*moe*", "has_flashinfer_cutedsl*"),
        FLASHINFER_UTILS,
        "availability checks the FlashInfer backends' predicates call",
    ),
    Decision(
        (
            "convert_to_humming_moe_kernel_format",
            "prioritize_humming",
            "prefers_humming",
            "_HUMMING_PREFERRED_CAPABILITIES",
        ),
        HUMMING,
        "HUMMING conversion (0.21+ MXFP4, 0.25+ NVFP4) and `prioritize_humming` (HUMMING before MARLIN, 0.32+)",
    ),
    Decision(
        _methods("MarlinExpertsBase", "MarlinExperts", "BatchedMarlinExperts")
        + _methods(
            "HummingExpertsBase", "HummingGroupedExperts", "HummingIndexedExperts", "BatchedHummingGroupedExperts"
        )
        + _methods("FlashInferExperts", "FlashInferB12xExperts", "FlashInferMoeEpExperts"),
        EXPERTS,
        "predicates of the kernel classes both formats can pick (MARLIN, HUMMING, FlashInfer CUTLASS, B12X, MoE-EP)",
    ),
)

MXFP4: tuple[Decision, ...] = (
    Decision(
        ("Mxfp4Backend", "Mxfp4MoeBackend"),
        QUANT_MXFP4 + ORACLE_MXFP4,
        "the backend enum: which backends exist and their --moe-backend names",
    ),
    Decision(
        ("get_mxfp4_backend", "get_mxfp4_backend_with_lora"),
        QUANT_MXFP4,
        "the 0.15-0.18 selector (env overrides, capability windows, LoRA)",
    ),
    Decision(
        ("*_BACKENDS",),
        ORACLE_MXFP4,
        "backend families (TRTLLM, TRITON, B12X, ...) the round-up and conversion branch on",
    ),
    Decision(
        (
            "backend_to_kernel_cls",
            "map_mxfp4_backend",
            "_get_priority_backends",
            "_get_priority_backends_for_gpt_oss",
            "_backend_activation_key",
            "_filter_by_activation",
            "_resolve_activation_key",
            "_user_moe_activation_override",
            "_get_requested_backends",
            "_requested_kernel_cls",
            "_return_or_raise",
            "select_mxfp4_moe_backend",
            "select_gpt_oss_mxfp4_moe_backend",
        ),
        ORACLE_MXFP4,
        "the oracle (0.19+): priority list, --moe-backend mapping, activation filter, kernel-class choice",
    ),
    Decision(
        ("mxfp4_round_up_hidden_size_and_intermediate_size", "*Mxfp4MoEMethod.maybe_roundup_sizes"),
        ORACLE_MXFP4 + QUANT_MXFP4,
        "padded hidden / intermediate sizes per backend (TRTLLM I 256 -> 128 in 0.27.0, EMULATION 32/32 in 0.26.0)",
    ),
    Decision(
        (
            "convert_to_mxfp4_moe_kernel_format",
            "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format",
            "_interleave_gate_up_rows",
            "_swizzle_cutlass_mxfp4_scales",
            "_humming_input_schema",
            "_mx_scale_kwargs",
            "triton_kernels_version",
        ),
        ORACLE_MXFP4,
        "weight conversion per backend (SM90 FLASHINFER_CUTLASS interleave changes in 0.22.0)",
    ),
    Decision(
        tuple(
            f"{cls}.{m}"
            for cls in ("Mxfp4MoEMethod", "GptOssMxfp4MoEMethod")
            for m in ("__init__", "create_weights", "process_weights_after_loading", "_setup_kernel")
        )
        + ("Mxfp4Config.get_quant_method", "Mxfp4Config._make_moe_method", "GptOssMxfp4Config.*"),
        QUANT_MXFP4,
        "the MoE method GPT-OSS gets and its weight creation / processing (0.15-0.18 process the weights here)",
    ),
    Decision(
        (
            "_swizzle_mxfp4",
            "should_use_cdna4_mx_scale_swizzle",
            "should_use_gfx1250_mx_scale_swizzle",
            "get_aiter_mx_scale_swizzle",
            "weight_mx_scale",
            "mx_scale_kwargs",
            "CK_MXFP4_MOE_DIM_ALIGNMENT",
            "get_padding_alignment",
            "_can_support_mxfp4",
        ),
        MXFP4_UTILS,
        "the Triton swizzle (SM90 scale pad to 4 in 0.26.0) and the CDNA4 scale-swizzle gate (TP<=2 in 0.24.0)",
    ),
    Decision(
        (
            "prepare_moe_mxfp4_layer_for_marlin",
            "prepare_moe_fp4_layer_for_marlin",
            "mxfp4_marlin_process_scales",
            "_repack_marlin_experts",
            "is_fp4_marlin_supported",
        ),
        MARLIN_FP4,
        "MARLIN weight and scale repacking for MXFP4",
    ),
    Decision(
        ("_triton_kernel_moe_supports_current_device",)
        + _methods(
            "BaseOAITritonExperts", "OAITritonExperts", "OAITritonMxfp4ExpertsMonolithic", "UnfusedOAITritonExperts"
        )
        + _methods("TrtLlmMxfp4ExpertsBase", "TrtLlmMxfp4ExpertsModular", "TrtLlmMxfp4ExpertsMonolithic")
        + _methods("TrtLlmGenExperts", "_TrtLlmLoRAExpertsBase", "TrtLlmMxfp4LoRAExperts")
        + _methods("AiterW4A16ExpertsMonolithic", "AiterW4A8ExpertsMonolithic", "AiterW4A4ExpertsMonolithic")
        + _methods("AiterMxfp4Experts", "CutlassExpertsMxfp4", "OCP_MXQuantizationEmulationTritonExperts")
        + _methods("XPUExpertsMXFp4", "XPUExpertsMxFp4", "CPUExpertsMxfp4"),
        EXPERTS,
        "predicates of the MXFP4 kernel classes (TRITON device window < (13,0) from 0.32.0, ...)",
    ),
    Decision(
        ("has_triton_kernels", "get_triton_kernels_version"),
        IMPORT_UTILS,
        "whether TRITON is available and which triton_kernels API generation vLLM drives",
    ),
    Decision(
        (
            "GptOssModel._load_weights_mxfp4",
            "GptOssModel.load_weights",
            "MLPBlock.__init__",
            "GptOssRoutedExperts.*",
            "_get_weight_loader",
        ),
        GPT_OSS,
        "how GPT-OSS slices the MXFP4 checkpoint per TP/EP rank and builds its MoE layer",
    ),
    Decision(
        (
            "environment_variables[VLLM_USE_FLASHINFER_MOE_MXFP4*]",
            "environment_variables[VLLM_MXFP4_USE_MARLIN]",
            "environment_variables[VLLM_USE_FLASHINFER_MOE_FP4]",
        ),
        ENVS,
        "defaults of the env overrides the MXFP4 selector reads (removed in 0.24.0)",
    ),
) + _SHARED

NVFP4: tuple[Decision, ...] = (
    Decision(
        ("NvFp4MoeBackend", "*BACKENDS*", "fi_2_vllm_backend_map"),
        ORACLE_NVFP4,
        "the backend enum, the FlashInfer / clamp backend sets (NVFP4_BACKENDS_WITH_CLAMP from 0.22.0)",
    ),
    Decision(
        (
            "is_global_sf_supported_for_nvfp4_backend",
            "backend_to_kernel_cls",
            "map_nvfp4_backend",
            "_use_a16",
            "select_nvfp4_moe_backend",
            "convert_to_nvfp4_moe_kernel_format",
            "make_nvfp4_moe_quant_config",
        ),
        ORACLE_NVFP4,
        "the oracle: priority list, --moe-backend mapping, kernel-class choice, conversion, scale config",
    ),
    Decision(
        ("detect_nvfp4_moe_support", "NvFp4Support", "swizzle_blockscale", "cutlass_fp4_supported"),
        NVFP4_UTILS,
        "the 0.15.0 support probe and the 128x4 block-scale swizzle",
    ),
    Decision(
        (
            "_supports_*",
            "is_supported_config_trtllm",
            "is_flashinfer_fp4_cutlass_moe_available",
            "is_flashinfer_fp4_cutedsl_moe_available",
            "reorder_w1w3_to_w3w1",
            "interleave_linear_and_gate",
            "reorder_w13_to_w31_for_flashinfer_cutedsl",
            "prepare_nvfp4_moe_layer_for_*",
            "nvfp4_swizzled_scale_to_cutedsl_mma_view",
            "prepare_static_weights_for_trtllm_fp4_moe",
        ),
        FI_FP4_MOE,
        "TRTLLM predicates (0.15-0.19) and the FlashInfer / CUTLASS / CuteDSL weight preparations "
        "(TRTLLM I alignment 16 -> 64 in 0.26.0, CuteDSL interleave from 0.20.0)",
    ),
    Decision(
        (
            "align_fp4_moe_weights_for_fi",
            "align_trtllm_fp4_moe_hidden_dim_for_fi",
            "align_fp4_moe_hidden_dim_for_fi",
            "trtllm_nvfp4_hidden_alignment",
            "is_flashinfer_supporting_global_sf",
            "get_flashinfer_moe_backend",
            "FlashinferMoeBackend",
        ),
        FI_UTILS,
        "FlashInfer padding (gate/up halves padded separately from 0.29.0) and the env-chosen FI backend",
    ),
    Decision(
        (
            "prepare_nvfp4_moe_layer_for_marlin",
            "_nvfp4_compute_scale_factor",
            "nvfp4_marlin_process_scales",
            "nvfp4_marlin_process_global_scale",
            "prepare_moe_fp4_layer_for_marlin",
            "_repack_marlin_experts",
            "is_fp4_marlin_supported",
        ),
        MARLIN_FP4,
        "MARLIN repacking and its scale handling ('rescaled' scales from 0.19.0)",
    ),
    Decision(
        tuple(
            f"ModelOptNvFp4FusedMoE.{m}"
            for m in (
                "__init__",
                "create_weights",
                "process_weights_after_loading",
                "uses_weight_scale_2_pattern",
                "_build_moe_kernel",
                "_restore_padded_moe_dims",
                "supports_pre_processed_weights",
            )
        ),
        MODELOPT,
        "ModelOpt NVFP4 MoE: the weights it creates and how it processes them before the kernel",
    ),
    Decision(
        tuple(
            f"CompressedTensorsW4A4Nvfp4MoEMethod.{m}"
            for m in ("__init__", "create_weights", "process_weights_after_loading")
        ),
        CT_MOE,
        "compressed-tensors NVFP4 MoE: the weights it creates and how it processes them before the kernel",
    ),
    Decision(
        _methods("TrtLlmNvFp4ExpertsBase", "TrtLlmNvFp4ExpertsModular", "TrtLlmNvFp4ExpertsMonolithic")
        + _methods("FlashInferCuteDSLExperts", "FlashInferCuteDSLBatchedExperts", "CutlassExpertsFp4")
        + _methods("Nvfp4QuantizationEmulationTritonExperts"),
        EXPERTS,
        "predicates and the global-scale fold (0.18.0) of the NVFP4 kernel classes",
    ),
    Decision(
        (
            "environment_variables[VLLM_USE_FLASHINFER_MOE_FP4]",
            "environment_variables[VLLM_FLASHINFER_MOE_BACKEND]",
            "environment_variables[VLLM_TEST_FORCE_FP8_MARLIN]",
            "environment_variables[VLLM_B12X_MOE_FP4_FORCE_A16]",
        ),
        ENVS,
        "defaults of the env overrides the NVFP4 selector reads",
    ),
) + _SHARED

TABLES: dict[str, tuple[Decision, ...]] = {"mxfp4": MXFP4, "nvfp4": NVFP4}

#: Pins (wheel METADATA Requires-Dist) every record keeps.
RECORDED_PINS = ("torch", "triton", "flashinfer-python", "flashinfer-cubin", "humming-kernels", "nvidia-cutlass-dsl")

#: What, besides the format's symbol digest, must agree for two releases to share a revision row:
#: FlashInfer does the TRTLLM / CUTLASS / CuteDSL shuffles and interleaves (not vendored, so only
#: its pin says which code runs); MXFP4's TRITON layout is the vendored triton_kernels' code.
GROUP_KEYS: dict[str, tuple[str, ...]] = {
    "mxfp4": ("pin:flashinfer-python", "triton_kernels:generation", "triton_kernels:sha256"),
    "nvfp4": ("pin:flashinfer-python",),
}
