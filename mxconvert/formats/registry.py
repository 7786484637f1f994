"""One pipeline, several checkpoint formats.

A `Format` gathers what differs between GPT-OSS MXFP4 and NVFP4 checkpoints — how a backend is
selected, which canonical tensors a rank holds (`Geometry`), how they are read, which layout a
backend uses, how a block of weights dequantizes — behind the `Format` protocol, so convert,
verify, inspect and the loader are written once. docs/architecture.md, "Formats", lists the hooks
and what a new format costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mxconvert.core.bits import from_torch
from mxconvert.core.dtypes import DType
from mxconvert.core.errors import InputError
from mxconvert.formats.mxfp4 import canonical as mx_canonical
from mxconvert.formats.mxfp4.checkpoint import Checkpoint, open_checkpoint
from mxconvert.layouts import ExpertLayout, nvfp4_layout, resolve_layout
from mxconvert.selection import (
    Deployment,
    Selection,
    is_global_sf_supported_for_nvfp4_backend,
    select_backend,
    select_nvfp4_backend,
)
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision, get_revision

if TYPE_CHECKING:
    import numpy as np
    import torch

#: dtype (by name, mxconvert/dtypes.py) and shape of each canonical tensor of a rank.
Specs = dict[str, tuple[DType, tuple[int, ...]]]
#: An opened checkpoint of the format (`checkpoint.Checkpoint`, `nvfp4_checkpoint.Nvfp4Checkpoint`).
Ckpt = Any
#: One rank's share of the experts and the intermediate size (`canonical.RankPlan` and its NVFP4 twin).
Plan = Any


@dataclass(frozen=True)
class Geometry:
    """The canonical sizes of a rank's experts for one target.

    MXFP4: the loader already pads to the backend's rounded sizes, so `hidden`/`intermediate` are
    Hp/Ip. NVFP4: the canonical tensors are unpadded (K, N); the layouts pad.
    `global_experts`: rows of the input scales where the runtime holds them for every expert.
    """

    fmt: str
    hidden: int
    intermediate: int
    global_experts: int | None = None

    def specs(self, num_experts: int) -> Specs:
        """dtype and shape of each canonical tensor of a rank holding `num_experts` experts."""
        return format_named(self.fmt).canonical_specs(self, num_experts)

    def to_target(self) -> dict:
        out = {"hidden_size_padded": self.hidden, "intermediate_size_padded": self.intermediate}
        if self.global_experts is not None:
            out["input_scale_rows"] = self.global_experts
        return out

    @classmethod
    def from_target(cls, target: dict) -> Geometry:
        return cls(
            target.get("format", "mxfp4"),
            target["hidden_size_padded"],
            target["intermediate_size_padded"],
            target.get("input_scale_rows"),
        )


class Format(Protocol):
    """The hooks convert, verify, inspect and the loader call; one implementation per checkpoint
    format. Nothing outside a format's class branches on its name."""

    #: Recorded as the target's "format" in every manifest.
    name: str

    def select(
        self, ckpt: Ckpt, profile: DeviceProfile, revision: RuntimeRevision, deployment: Deployment, backend: str
    ) -> Selection:
        """The backend vLLM would pick, with the why-not report."""
        ...

    def geometry(
        self,
        ckpt: Ckpt,
        selection: Selection,
        revision: RuntimeRevision,
        profile: DeviceProfile,
        deployment: Deployment,
    ) -> Geometry:
        """The canonical sizes of one rank for the selected backend."""
        ...

    def canonical_specs(self, geometry: Geometry, num_experts: int) -> Specs:
        """dtype and shape of each canonical tensor of a rank."""
        ...

    def layout_for(
        self,
        ckpt: Ckpt,
        selection: Selection,
        revision: RuntimeRevision,
        geometry: Geometry,
        deployment: Deployment,
        profile: DeviceProfile | None = None,
    ) -> ExpertLayout:
        """The layout of the selected backend."""
        ...

    def layout_from_target(self, target: dict) -> ExpertLayout:
        """The layout a manifest's target names (verify, inspect and the loader rebuild it)."""
        ...

    def plan_ranks(self, ckpt: Ckpt, tp: int, ep: int) -> list[Plan]:
        """Which experts and intermediate rows each rank holds."""
        ...

    def load(
        self, ckpt: Ckpt, layer: int, plan: Plan, geometry: Geometry, experts: range | None, names: tuple[str, ...]
    ) -> dict[str, torch.Tensor]:
        """Canonical tensors of one layer for one rank (all its experts, or `experts`)."""
        ...

    #: Whether `load_bits` reads with numpy alone (otherwise torch is imported).
    loads_without_torch: bool

    def load_bits(
        self, ckpt: Ckpt, layer: int, plan: Plan, geometry: Geometry, experts: range | None, names: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        """`load` as numpy arrays of the tensors' bits (mxconvert/bits.py): the host data path."""
        ...

    def dequantize(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """float32 values of packed weights and their block scales (verify's sampled comparison)."""
        ...


class Mxfp4Format:
    """GPT-OSS MXFP4: E2M1 weights with E8M0 scales per 32 values, w13 rows gate/up interleaved."""

    name = "mxfp4"
    #: `load_bits` reads with numpy alone (the host path needs no torch: mxconvert/bits.py).
    loads_without_torch = True

    def canonical_specs(self, geometry: Geometry, num_experts: int) -> Specs:
        return mx_canonical.canonical_specs(num_experts, geometry.hidden, geometry.intermediate)

    def dequantize(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        from mxconvert.formats.mxfp4 import numbers as mxfp4

        return mxfp4.dequantize(packed, scales)

    def select(
        self, ckpt: Checkpoint, profile: DeviceProfile, revision: RuntimeRevision, deployment: Deployment, backend: str
    ) -> Selection:
        return select_backend(profile, revision, deployment, backend, hidden_size=ckpt.facts.hidden_size)

    def geometry(
        self,
        ckpt: Checkpoint,
        selection: Selection,
        revision: RuntimeRevision,
        profile: DeviceProfile,
        deployment: Deployment,
    ) -> Geometry:
        moe_tp = deployment.tp if deployment.ep == 1 else 1
        if ckpt.facts.intermediate_size % moe_tp:
            raise InputError(f"--tp {moe_tp} does not divide intermediate_size {ckpt.facts.intermediate_size}")
        hp, ip = revision.round_up(
            selection.backend, profile.platform, ckpt.facts.hidden_size, ckpt.facts.intermediate_size // moe_tp
        )
        return Geometry(self.name, hp, ip)

    def layout_for(
        self,
        ckpt,
        selection: Selection,
        revision: RuntimeRevision,
        geometry: Geometry,
        deployment: Deployment,
        profile: DeviceProfile | None = None,
    ) -> ExpertLayout:
        return resolve_layout(
            selection.backend,
            revision,
            profile,
            tp=deployment.attention_tp,
            marlin_input_dtype=selection.marlin_input_dtype,
        )

    def layout_from_target(self, target: dict) -> ExpertLayout:
        return resolve_layout(
            Mxfp4Backend(target["backend"]),
            get_revision(target["runtime_revision"]),
            DeviceProfile.from_json(target["device"]),
            tp=Deployment(tp=target["tp_size"], ep=target["ep_size"], dp=target.get("dp_size", 1)).attention_tp,
            marlin_input_dtype=(target.get("layout") or {}).get("marlin_input_dtype"),
        )

    def plan_ranks(self, ckpt: Checkpoint, tp: int, ep: int) -> list[mx_canonical.RankPlan]:
        return mx_canonical.plan_ranks(ckpt.facts, tp, ep)

    def load(
        self,
        ckpt: Checkpoint,
        layer: int,
        plan: mx_canonical.RankPlan,
        geometry: Geometry,
        experts: range | None,
        names: tuple[str, ...],
    ) -> dict[str, torch.Tensor]:
        return mx_canonical.load_canonical(ckpt, layer, plan, geometry.hidden, geometry.intermediate, experts, names)

    def load_bits(
        self,
        ckpt: Checkpoint,
        layer: int,
        plan: mx_canonical.RankPlan,
        geometry: Geometry,
        experts: range | None,
        names: tuple[str, ...],
    ) -> dict[str, np.ndarray]:
        return mx_canonical.load_canonical_bits(
            ckpt, layer, plan, geometry.hidden, geometry.intermediate, experts, names
        )


class Nvfp4Format:
    """NVFP4 MoE checkpoints, ModelOpt or compressed-tensors: E2M1 weights with E4M3 scales per 16
    values and float32 global and activation scales, w13 rows [w1 (gate); w3 (up)]."""

    name = "nvfp4"
    loads_without_torch = False  # its loader computes with values (global scales, stacking)

    def canonical_specs(self, geometry: Geometry, num_experts: int) -> Specs:
        from mxconvert.formats.nvfp4.checkpoint import nvfp4_canonical_specs

        return nvfp4_canonical_specs(num_experts, geometry.hidden, geometry.intermediate, geometry.global_experts)

    def dequantize(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        from mxconvert.formats.nvfp4 import numbers as nvfp4

        return nvfp4.dequantize(packed, scales)

    def select(
        self, ckpt, profile: DeviceProfile, revision: RuntimeRevision, deployment: Deployment, backend: str
    ) -> Selection:
        f = ckpt.facts
        return select_nvfp4_backend(
            profile,
            revision,
            deployment,
            backend,
            hidden_size=f.hidden_size,
            intermediate_size=f.intermediate_size,
            w4a16=f.w4a16,
            swiglu_limit=f.swiglu_limit,
        )

    def geometry(
        self, ckpt, selection: Selection, revision: RuntimeRevision, profile: DeviceProfile, deployment: Deployment
    ) -> Geometry:
        f = ckpt.facts
        n = f.intermediate_size if deployment.ep > 1 else f.intermediate_size // deployment.tp
        rows = None
        if f.quant_format == "modelopt" and is_global_sf_supported_for_nvfp4_backend(selection.backend):
            rows = f.num_experts  # ModelOpt holds every global expert's input scale for these backends
        return Geometry(self.name, f.hidden_size, n, rows)

    def layout_for(
        self,
        ckpt,
        selection: Selection,
        revision: RuntimeRevision,
        geometry: Geometry,
        deployment: Deployment,
        profile: DeviceProfile | None = None,
    ) -> ExpertLayout:
        num_local = ckpt.facts.num_experts // max(1, deployment.ep)
        return self._build(selection.backend, revision, geometry, num_local)

    def _build(self, backend, revision: RuntimeRevision, geometry: Geometry, num_local: int) -> ExpertLayout:
        return nvfp4_layout(backend, revision, geometry.hidden, geometry.intermediate, num_local)

    def layout_from_target(self, target: dict) -> ExpertLayout:
        geometry = Geometry.from_target(target)
        return self._build(
            Nvfp4Backend(target["backend"]),
            get_revision(target["runtime_revision"], "nvfp4"),
            geometry,
            target["layout"]["num_local_experts"],
        )

    def plan_ranks(self, ckpt, tp: int, ep: int):
        from mxconvert.formats.nvfp4.checkpoint import plan_nvfp4_ranks

        return plan_nvfp4_ranks(ckpt.facts, tp, ep)

    def load(
        self, ckpt, layer: int, plan, geometry: Geometry, experts: range | None, names: tuple[str, ...]
    ) -> dict[str, torch.Tensor]:
        return ckpt.load_canonical(layer, plan, experts, names, input_rows=geometry.global_experts)

    def load_bits(
        self, ckpt, layer: int, plan, geometry: Geometry, experts: range | None, names: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        """Through torch (the NVFP4 loader computes with values: global-scale checks, stacking)."""
        return {name: from_torch(t) for name, t in self.load(ckpt, layer, plan, geometry, experts, names).items()}


FORMATS: dict[str, Format] = {f.name: f for f in (Mxfp4Format(), Nvfp4Format())}


def format_of(ckpt: Ckpt) -> Format:
    """The format of an opened checkpoint (each checkpoint class declares its `format_name`)."""
    return format_named(ckpt.format_name)


def format_named(name: str) -> Format:
    """The format a manifest's target names."""
    if name not in FORMATS:
        raise InputError(f"unknown checkpoint format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]


def open_model(source: str, *, revision: str | None = None, cache_dir: str | None = None, layout: str | None = None):
    """Open a checkpoint of any supported format (local folder or hub repo id): an NVFP4 MoE
    checkpoint (ModelOpt or compressed-tensors) if its config says so, else GPT-OSS MXFP4."""
    from mxconvert.formats.nvfp4.checkpoint import open_nvfp4

    return open_checkpoint(source, revision=revision, cache_dir=cache_dir, layout=layout, probe=open_nvfp4)
