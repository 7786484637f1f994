"""The deployment a selection is made for: parallel sizes and the runtime switches that change it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mxconvert.core.errors import InputError

#: Activation dtypes a ``Deployment.activation`` may request (vLLM 0.33's
#: ``quantization_config.moe.activation``). "fp8"/"mxfp4" exist in vLLM 0.33 too, but mxconvert
#: has no layout for the backends they lead to (CUTLASS_MXFP4_MXFP4 has no converter
#: branch in vLLM 0.33.0), so they are refused here.
ACTIVATIONS = ("bf16", "mxfp8")

#: FlashInfer NVLink two-sided all2all backends (vLLM ``use_fi_nvl_two_sided_kernels``).
FI_NVL_TWO_SIDED = frozenset({"flashinfer_all2allv", "flashinfer_nvlink_two_sided"})

_MARLIN_INPUT_DTYPES = (None, "fp8", "int8")


@dataclass(frozen=True)
class Deployment:
    """The parallel setup and the runtime switches that change backend selection."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    #: all2all backend name (e.g. "deepep_high_throughput"); None = no all2all kernels. Taken as
    #: "all2all kernels in use" as vLLM 0.33.0's priority modifiers do (vLLM itself only enables them with
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
                    + ", ".join(ACTIVATIONS)
                    + " (None means bf16)"
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
            raise InputError(f"VLLM_MARLIN_INPUT_DTYPE must be unset, 'fp8' or 'int8', got {self.marlin_input_dtype!r}")

    @property
    def attention_tp(self) -> int:
        """vLLM's tensor-parallel group size for this deployment (its
        `get_tensor_model_parallel_world_size()`, the attention TP size), which is not `tp` when DP
        or EP is on: vLLM 0.33.0 flattens TP x DP into the MoE's group (fused_moe/config.py
        `FusedMoEParallelConfig.make`), so `--ep N --dp D` and `--tp N --dp D` run attention at
        TP N / D (docs/artifact.md). Layout choices that vLLM makes by the TP group size (the gfx950
        CDNA4 scale swizzle) read this."""
        return max(1, (self.ep if self.ep > 1 else self.tp) // self.dp)

    @property
    def uses_all2all(self) -> bool:
        return self.all2all is not None

    @property
    def activation_format(self) -> str:
        return "batched" if self.batched else "standard"

    def to_json(self) -> dict:
        return {
            "tp": self.tp,
            "ep": self.ep,
            "dp": self.dp,
            "all2all": self.all2all,
            "eplb": self.eplb,
            "batched": self.batched,
            "lora": self.lora,
            "activation": self.activation,
            "env": dict(self.env),
            "marlin_input_dtype": self.marlin_input_dtype,
        }
