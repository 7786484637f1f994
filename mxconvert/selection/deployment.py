"""The deployment a selection is made for: parallel sizes and the runtime switches that change it.

The parallel sizes are vLLM's (`vllm serve --tensor-parallel-size T --data-parallel-size D
[--enable-expert-parallel]`); the sizes of the MoE layers follow from them as vLLM 0.33.0 (and 0.26.0)
derive them in fused_moe/config.py `FusedMoEParallelConfig.make`: without expert parallelism the MoE's
TP group is the flattened TP x DP ranks (TP size T*D, TP rank dp_rank*T + tp_rank); with it the EP group
is those ranks and the MoE's TP size is 1. `Deployment.moe_tp` / `moe_ep` are those sizes, the one place
mxconvert derives them (docs/artifact.md, "Parallel sizes").
"""

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
    """The parallel setup and the runtime switches that change backend selection.

    `tp` and `dp` are vLLM's `--tensor-parallel-size` and `--data-parallel-size`. `ep` is the expert-
    parallel group's size (1: no expert parallelism), which vLLM makes TP x DP ranks whenever
    `--enable-expert-parallel` is on; `expert_parallel` is that switch. Either may be given: after
    construction `ep` is TP x DP under expert parallelism (`--ep N` alone gives TP = N / DP, as it
    always did) and 1 without, and a contradiction (`--ep 4` with TP x DP = 2) is an `InputError`."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    #: vLLM's `--enable-expert-parallel` (on/off); normalised to `ep > 1` after construction.
    expert_parallel: bool = False
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
        self._normalise_parallel()
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

    def _normalise_parallel(self) -> None:
        """`tp`, `ep`, `expert_parallel` made consistent, as vLLM builds them from its options; a
        contradiction is refused, naming the options to pass instead."""
        if not isinstance(self.expert_parallel, bool):
            raise InputError(f"deployment expert_parallel must be True or False, got {self.expert_parallel!r}")
        tp, ep, dp = self.tp, self.ep, self.dp
        if ep > 1 and tp == 1:  # `--ep N [--dp D]`: the EP group is N = TP x DP ranks, so TP = N / D
            if ep % dp:
                raise InputError(
                    f"--ep {ep} with --dp {dp}: vLLM's expert-parallel group is TP x DP ranks, so --ep must be a "
                    f"multiple of --dp; for `vllm serve -tp T -dp {dp} --enable-expert-parallel` pass "
                    f"--tp T --dp {dp} --enable-expert-parallel (or --ep {dp}*T --dp {dp})"
                )
            tp = ep // dp
        elif ep > 1 and tp * dp != ep:
            raise InputError(
                f"--ep {ep} contradicts --tp {tp} --dp {dp}: vLLM's expert-parallel group is TP x DP = {tp * dp} "
                f"ranks; pass --tp {tp} --dp {dp} --enable-expert-parallel (EP size {tp * dp}), or --ep {ep} with "
                "a --tp and --dp whose product it is"
            )
        elif ep == 1 and self.expert_parallel:  # vLLM: EP only where TP x DP > 1
            ep = tp * dp
        object.__setattr__(self, "tp", tp)
        object.__setattr__(self, "ep", ep)
        object.__setattr__(self, "expert_parallel", ep > 1)

    @property
    def moe_tp(self) -> int:
        """The MoE layers' TP size (`FusedMoEParallelConfig.tp_size`): TP x DP without expert
        parallelism (vLLM flattens the DP ranks into it), 1 with it. The artifact's ranks slice the
        intermediate size by this size (target `tp_size`)."""
        return 1 if self.ep > 1 else self.tp * self.dp

    @property
    def moe_ep(self) -> int:
        """The MoE layers' EP size (`FusedMoEParallelConfig.ep_size`): TP x DP with expert
        parallelism, else 1 (target `ep_size`)."""
        return self.ep

    @property
    def ranks(self) -> int:
        """The number of ranks (GPUs) vLLM runs: TP x DP, each holding one rank of the artifact."""
        return self.tp * self.dp

    @property
    def attention_tp(self) -> int:
        """vLLM's tensor-parallel group size (its `get_tensor_model_parallel_world_size()`, the
        attention TP size): `tp`, whatever DP and EP do to the MoE's group. Layout choices that vLLM
        makes by the TP group size (the gfx950 CDNA4 scale swizzle) read this."""
        return self.tp

    @classmethod
    def from_target(cls, target: dict) -> Deployment:
        """The parallel sizes an artifact's target records: its `serve` field (vLLM's own sizes) where
        present, else those of a manifest made before it, whose `tp_size` / `ep_size` are the MoE's
        group (vLLM's TP size is that group over `dp_size`; the readers that use an artifact refuse such
        a manifest with DP > 1 all the same: artifact/manifest_schema.py `refuse_ambiguous_parallel`)."""
        serve = target.get("serve")
        if isinstance(serve, dict):
            return cls(
                tp=serve["tensor_parallel_size"],
                dp=serve["data_parallel_size"],
                expert_parallel=serve["enable_expert_parallel"],
            )
        dp = target.get("dp_size", 1)
        if target["ep_size"] > 1:
            return cls(ep=target["ep_size"], dp=dp)
        return cls(tp=max(1, target["tp_size"] // dp), dp=dp)

    def serve_parallel(self) -> dict:
        """vLLM's parallel options for this deployment, as the manifest's `target.serve` records them."""
        return {
            "tensor_parallel_size": self.tp,
            "data_parallel_size": self.dp,
            "enable_expert_parallel": self.expert_parallel,
        }

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
            "expert_parallel": self.expert_parallel,
            "all2all": self.all2all,
            "eplb": self.eplb,
            "batched": self.batched,
            "lora": self.lora,
            "activation": self.activation,
            "env": dict(self.env),
            "marlin_input_dtype": self.marlin_input_dtype,
        }


def moe_tp_origin(deployment: Deployment) -> str:
    """How the MoE TP size of `deployment` came about, for messages: `--tp 2 x --dp 2`."""
    if deployment.ep > 1:
        return f"expert parallelism over --tp {deployment.tp} x --dp {deployment.dp}"
    if deployment.dp > 1:
        return f"--tp {deployment.tp} x --dp {deployment.dp}: vLLM flattens the DP ranks into the MoE's TP group"
    return f"--tp {deployment.tp}"
