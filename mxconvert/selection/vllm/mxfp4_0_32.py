"""The MXFP4 (GPT-OSS) oracle of vLLM 0.32.0: 0.33.0's (mxfp4_0_33.py) but for four differences.

Held to tests/golden/selection/vllm-0.32.0-mxfp4.json, made by running 0.32.0's own
`select_mxfp4_moe_backend` on CPU (tools/vllm_releases/record_selection.py). What 0.32.0 does
otherwise than 0.33.0 (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py and experts/ of each):

- no `aiter_triton_mxfp4_mxfp4` name (`map_mxfp4_backend`);
- no `TrtLlmMxfp4LoRAExperts`: an explicit `flashinfer_trtllm` request with LoRA is refused
  (0.33.0's `_requested_kernel_cls` adds that class);
- the CK AITER class is `AiterExperts` (0.33.0 splits out `AiterMxfp4Experts`), with the same
  predicates;
- `AiterW4A16ExpertsMonolithic._supports_parallel_config` also refuses expert parallelism.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from mxconvert.selection.engine import Context, KernelClass, Reason
from mxconvert.selection.predicates import has, where
from mxconvert.selection.vllm import mxfp4_0_33 as v033
from mxconvert.target.backends import Backend, Mxfp4Backend

B = Mxfp4Backend

_CK = replace(v033.KERNEL_CLASSES[B.AITER_MXFP4_BF16][0], name="AiterExperts")

KERNEL_CLASSES: dict[Backend, tuple[KernelClass, ...]] = {
    **v033.KERNEL_CLASSES,
    B.FLASHINFER_TRTLLM_MXFP4_BF16: (v033.TRTLLM_MONO, v033.TRTLLM_MODULAR),
    B.FLASHINFER_TRTLLM_MXFP4_MXFP8: (v033.TRTLLM_MONO, v033.TRTLLM_MODULAR),
    B.AITER_MXFP4_BF16: (_CK,),
    B.AITER_MXFP4_MXFP4: (_CK,),
    B.AITER_TRITON_MXFP4_BF16: (
        replace(v033.KERNEL_CLASSES[B.AITER_TRITON_MXFP4_BF16][0], parallel=v033.no_ep_monolithic_parallel),
    ),
}

MOE_BACKEND_NAMES: dict[str, tuple[Mxfp4Backend, ...]] = {
    name: backends for name, backends in v033.MOE_BACKEND_NAMES.items() if name != "aiter_triton_mxfp4_mxfp4"
}

STYLE = replace(
    v033.STYLE,
    name="oracle-0.32",
    runtime="vLLM 0.32.0",
    names=MappingProxyType(MOE_BACKEND_NAMES),
    classes=MappingProxyType(KERNEL_CLASSES),
)

#: 0.33.0's control flow (`select_mxfp4_moe_backend` is the same code in both releases' records).
select = v033.select


def _triton_device_031(ctx: Context) -> Reason:
    # gpt_oss_triton_kernels_moe.py `_triton_kernel_moe_supports_current_device` (0.29.0-0.31.0):
    # CUDA 9.0 <= cap < 11.0 (SM110 and SM12x excluded), ROCm gfx9 / gfx11 / gfx12.
    p = ctx.profile
    if p.platform == "cuda":
        if (9, 0) <= p.cap < (11, 0):
            return None
        return f"kernel requires CUDA capability 9.0 <= cap < 11.0, {where(p)}"
    if p.platform == "rocm":
        if p.gfx in ("gfx90a", "gfx942", "gfx950") or (p.gfx or "").startswith(("gfx11", "gfx12")):
            return None
        return f"kernel requires a ROCm gfx90a/gfx942/gfx950 or gfx11/gfx12 GPU, {where(p)}"
    return f"kernel requires CUDA or ROCm, {where(p)}"


#: vLLM 0.31.0 (tests/golden/selection/vllm-0.31.0-mxfp4.json): 0.32.0's selection, except that an
#: activation request drops the BF16 backends (no higher-precision fallback), the OAI Triton
#: classes stop before capability 11.0 (SM110 and SM12x take MARLIN), and there are no
#: flashinfer_moe_ep_* names.
STYLE_0_31 = replace(
    STYLE,
    name="oracle-0.31",
    runtime="vLLM 0.31.0",
    # `_get_priority_backends_for_gpt_oss` (0.30.0-0.31.0): no CUTLASS_MXFP4_MXFP4 or HUMMING, and
    # neither the SM12x TRITON demotion nor `prioritize_humming` (both arrive in 0.32.0).
    priority=(
        B.FLASHINFER_TRTLLM_MXFP4_BF16,
        B.FLASHINFER_TRTLLM_MXFP4_MXFP8,
        B.AITER_MXFP4_BF16,
        B.AITER_TRITON_MXFP4_BF16,
        B.AITER_MXFP4_FP8,
        B.AITER_MXFP4_MXFP4,
        B.TRITON,
        B.FLASHINFER_CUTLASS_MXFP4_BF16,
        B.FLASHINFER_CUTLASS_MXFP4_MXFP8,
        B.MARLIN,
        B.BATCHED_MARLIN,
        B.XPU,
        B.CPU,
        B.EMULATION,
    ),
    moves=(),
    names=MappingProxyType({n: b for n, b in MOE_BACKEND_NAMES.items() if not n.startswith("flashinfer_moe_ep_")}),
    unsupported_names=MappingProxyType(
        {n: why for n, why in v033.STYLE.unsupported_names.items() if not n.startswith("flashinfer_moe_ep_")}
    ),
    classes=MappingProxyType(
        {**KERNEL_CLASSES, **v033.triton_classes((_triton_device_031, has("has_triton_kernels", "triton_kernels")))}
    ),
    activation_bf16_fallback=False,
)

#: vLLM 0.30.0 (tests/golden/selection/vllm-0.30.0-mxfp4.json): 0.31.0's selection, except that the
#: AITER W4A16 and W4A8 monolithic classes take expert parallelism (no EP check yet).
STYLE_0_30 = replace(
    STYLE_0_31,
    name="oracle-0.30",
    runtime="vLLM 0.30.0",
    classes=MappingProxyType(
        {
            **STYLE_0_31.classes,
            B.AITER_TRITON_MXFP4_BF16: (
                replace(STYLE_0_31.classes[B.AITER_TRITON_MXFP4_BF16][0], parallel=v033.monolithic_parallel),
            ),
            B.AITER_MXFP4_FP8: (replace(STYLE_0_31.classes[B.AITER_MXFP4_FP8][0], parallel=v033.monolithic_parallel),),
        }
    ),
)

#: vLLM 0.29.0 (tests/golden/selection/vllm-0.29.0-mxfp4.json): 0.30.0's selection, except that
#: there is no AITER_TRITON_MXFP4_BF16 (no name, not in `aiter` or the auto list) and CPU, like
#: XPU, is forced after the list (`select_mxfp4_moe_backend`'s `current_platform.is_cpu()` branch).
STYLE_0_29 = replace(
    STYLE_0_30,
    name="oracle-0.29",
    runtime="vLLM 0.29.0",
    # 0.29.0 `_get_priority_backends_for_gpt_oss`: no AITER_TRITON_MXFP4_BF16 and no CPU (forced
    # after the list instead).
    priority=tuple(b for b in STYLE_0_30.priority if b not in (B.AITER_TRITON_MXFP4_BF16, B.CPU)),
    names=MappingProxyType(
        {
            n: tuple(b for b in backends if b != B.AITER_TRITON_MXFP4_BF16)
            for n, backends in STYLE_0_30.names.items()
            if n != "aiter_triton_mxfp4_bf16"
        }
    ),
    forced_after_list=("xpu", "cpu"),
)
