"""NVFP4 oracles of vLLM releases before 0.32.0, as 0.33.0's (nvfp4_0_33.py) with other data.

Each style below is held to its releases' selection records (tests/golden/selection/
vllm-X.Y.Z-nvfp4.json, made by running each release's own `select_nvfp4_moe_backend` on CPU:
tools/vllm_releases/record_selection.py); the control flow is 0.33.0's (`select`).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from mxconvert.selection.engine import Context, EnvOverride, Reason, always, any_parallel
from mxconvert.selection.nvfp4_common import FI_NVL
from mxconvert.selection.vllm import nvfp4_0_33 as v033
from mxconvert.target.backends import Nvfp4Backend

N = Nvfp4Backend


def _no_ep(ctx: Context) -> Reason:
    # CutlassExpertsFp4._supports_parallel_config (0.29.0-0.31.0 fused_moe/experts/cutlass_moe.py):
    # no expert map, so ep_size == 1.
    d = ctx.deployment
    return None if d.ep == 1 else f"kernel does not support expert parallelism (ep={d.ep})"


#: vLLM 0.29.0 (tests/golden/selection/vllm-0.29.0-nvfp4.json): 0.33.0's selection, except that
#: CutlassExpertsFp4 refuses expert parallelism, there is no flashinfer_moe_ep_cutedsl name, and
#: HUMMING keeps its place on SM90 (no `prioritize_humming`).
STYLE_0_29 = replace(
    v033.STYLE,
    name="oracle-0.29",
    runtime="vLLM 0.29.0 (NVFP4 oracle)",
    moves=(),  # `prioritize_humming` arrives in 0.32.0
    unsupported_names=MappingProxyType(
        {n: why for n, why in v033.STYLE.unsupported_names.items() if n != "flashinfer_moe_ep_cutedsl"}
    ),
    classes=MappingProxyType(
        {
            **v033.KERNEL_CLASSES,
            N.VLLM_CUTLASS: (replace(v033.KERNEL_CLASSES[N.VLLM_CUTLASS][0], parallel=_no_ep),),
        }
    ),
)


def marlin_no_fi_nvl(ctx: Context) -> Reason:
    # MarlinExpertsBase._supports_parallel_config (0.18.0-0.26.0): neither FlashInfer NVLink kind.
    d = ctx.deployment
    if d.all2all in FI_NVL:
        return f"kernel does not support FlashInfer NVLink all2all kernels (all2all={d.all2all})"
    return None


#: vLLM 0.25.0-0.26.0 (their records): 0.29.0's selection, except that there is no `b12x` name
#: (only flashinfer_b12x), Marlin refuses both FlashInfer NVLink all2all kinds, and
#: VLLM_TEST_FORCE_FP8_MARLIN=1 forces MARLIN for `auto` (after an explicit name, before the list).
STYLE_0_25 = replace(
    STYLE_0_29,
    name="oracle-0.25",
    runtime="vLLM 0.25.0-0.26.0 (NVFP4 oracle)",
    names=MappingProxyType({n: b for n, b in v033.STYLE.names.items() if n != "b12x"}),
    classes=MappingProxyType(
        {
            **STYLE_0_29.classes,
            N.MARLIN: (replace(v033.KERNEL_CLASSES[N.MARLIN][0], parallel=marlin_no_fi_nvl),),
        }
    ),
    env_overrides=(EnvOverride("VLLM_TEST_FORCE_FP8_MARLIN", force=((always, N.MARLIN),)),),
    env_removed=MappingProxyType(
        {k: v for k, v in v033.STYLE.env_removed.items() if k != "VLLM_TEST_FORCE_FP8_MARLIN"}
    ),
)

#: vLLM 0.27.0-0.28.0 (their records): 0.25.0's, except that Marlin refuses only the two-sided
#: FlashInfer NVLink all2all (0.33.0's MarlinExperts).
STYLE_0_27 = replace(
    STYLE_0_25,
    name="oracle-0.27",
    runtime="vLLM 0.27.0-0.28.0 (NVFP4 oracle)",
    classes=MappingProxyType({**STYLE_0_25.classes, N.MARLIN: v033.KERNEL_CLASSES[N.MARLIN]}),
)

#: vLLM 0.24.0 (tests/golden/selection/vllm-0.24.0-nvfp4.json): 0.25.0's, except that there is no
#: HUMMING (no name, not in the auto list), the emulation class takes LoRA and FlashInferB12xExperts
#: takes expert parallelism.
STYLE_0_24 = replace(
    STYLE_0_25,
    name="oracle-0.24",
    runtime="vLLM 0.24.0 (NVFP4 oracle)",
    priority=tuple(b for b in STYLE_0_25.priority if b != N.HUMMING),
    names=MappingProxyType({n: b for n, b in STYLE_0_25.names.items() if n != "humming"}),
    classes=MappingProxyType(
        {
            **STYLE_0_25.classes,
            N.EMULATION: (replace(STYLE_0_25.classes[N.EMULATION][0], lora=True),),
            N.FLASHINFER_B12X: (replace(STYLE_0_25.classes[N.FLASHINFER_B12X][0], parallel=any_parallel),),
        }
    ),
)

select = v033.select
SHAPE_RULES = v033.SHAPE_RULES
