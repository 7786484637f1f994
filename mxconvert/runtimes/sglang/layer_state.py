"""What SGLang 0.5.23 decided for one GPT-OSS MXFP4 MoE layer, read from the layer and its quant
method after `create_weights` (duck-typed: no SGLang import, so the CPU tests read the same facts
from SGLang's own `create_weights` run outside SGLang's CUDA stack).

Read (sglang/srt/layers/quantization/mxfp4.py `Mxfp4MoEMethod`, layers/moe/fused_moe_triton/layer.py
`FusedMoE`): the method's `use_flashinfer`, `_fi_kernel`, `use_marlin`, `use_deep_gemm`,
`use_mega_moe`, `use_triton_kernels`, `_use_sm90_humming`, and the padded sizes `create_weights`
stores on it (`hidden_size`, `intermediate_size_per_partition`); the layer's `moe_tp_size`,
`moe_tp_rank`, `moe_ep_size`, `moe_ep_rank`, `num_local_experts`, `num_fused_shared_experts` and
`moe_runner_config.gate_up_interleaved`; the global id of the first local expert follows from
`moe_ep_rank` and `num_local_experts` (SGLang's contiguous placement, checks.SglangLayer.first_expert).
"""

from __future__ import annotations

from typing import Any

from mxconvert.runtimes.sglang.checks import NO_A2A, SglangLayer, method_backend


def sglang_layer(
    prefix: str,
    method: Any,
    module: Any,
    a2a_backend: str = NO_A2A,
    marlin_supported: bool = True,
    use_aiter: bool = False,
) -> SglangLayer:
    """The facts the checks compare, for the layer `prefix` (its checkpoint name, e.g.
    `model.layers.0.mlp.experts`); `marlin_supported` is what SGLang's own
    `check_moe_marlin_supports_layer` says of a marlin layer (loader.py asks it); `use_aiter` is
    mxfp4.py's module-level `_use_aiter` (loader.py reads it), which no method attribute holds."""
    backend = method_backend(
        use_flashinfer=bool(getattr(method, "use_flashinfer", False)),
        fi_kernel=getattr(method, "_fi_kernel", None),
        use_marlin=bool(getattr(method, "use_marlin", False)),
        use_deep_gemm=bool(getattr(method, "use_deep_gemm", False)),
        use_mega_moe=bool(getattr(method, "use_mega_moe", False)),
        use_triton_kernels=bool(getattr(method, "use_triton_kernels", False)),
        sm90_humming=bool(getattr(method, "_use_sm90_humming", False)),
        use_aiter=use_aiter,
    )
    ep_size = int(module.moe_ep_size)
    num_experts = int(module.num_local_experts)
    # SGLang's placement (checks.SglangLayer.first_expert): EP rank r holds global experts r * E_local onward
    first_expert = int(module.moe_ep_rank) * num_experts if ep_size > 1 else 0
    return SglangLayer(
        prefix=prefix,
        backend=backend,
        hidden_size_padded=int(method.hidden_size),
        intermediate_size_padded=int(method.intermediate_size_per_partition),
        tp_size=int(module.moe_tp_size),
        ep_size=ep_size,
        rank=int(module.moe_ep_rank if ep_size > 1 else module.moe_tp_rank),
        num_experts=num_experts,
        first_expert=first_expert,
        fused_shared_experts=int(getattr(module, "num_fused_shared_experts", 0) or 0),
        gate_up_interleaved=bool(getattr(module.moe_runner_config, "gate_up_interleaved", True)),
        a2a_backend=str(a2a_backend).lower(),
        marlin_supported=bool(marlin_supported),
    )
