"""What every checkpoint format shares: the `Format` protocol the pipeline calls, the canonical sizes
of a rank (`Geometry`), one rank's share of the experts (`RankPlan`) and the expert-parallel plan.

A `Format` gathers what differs between GPT-OSS MXFP4 and NVFP4 checkpoints — which folder is one of
its checkpoints and how it is opened, how a backend is selected, which canonical tensors a rank
holds, how they are read, which layout a backend uses, how a block of weights dequantizes — so
convert, verify, inspect and the loader are written once. Each format implements it in its own
folder (`formats/<format>/format.py`); formats/registry.py lists them. docs/architecture.md,
"Formats", lists the hooks and what a new format costs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mxconvert.core.dtypes import DType
from mxconvert.core.errors import InputError
from mxconvert.layouts import ExpertLayout
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.report import Selection
from mxconvert.storage.source import SourceIdentity
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision

if TYPE_CHECKING:
    import numpy as np
    import torch

#: dtype (by name, mxconvert/dtypes.py) and shape of each canonical tensor of a rank.
Specs = dict[str, tuple[DType, tuple[int, ...]]]
#: An opened checkpoint of the format (`mxfp4.checkpoint.Checkpoint`, `nvfp4.checkpoint.Nvfp4Checkpoint`).
Ckpt = Any
#: One rank's share of the experts and the intermediate size (`RankPlan`).
Plan = Any


#: What mxconvert reads: the end of every format's refusal of a checkpoint that is none of it (an
#: unquantized or FP8 checkpoint is told this, not what one format expected).
FORMATS_READ = (
    "mxconvert reads GPT-OSS MXFP4 checkpoints (quant_method mxfp4 or gpt_oss_mxfp4) and NVFP4 MoE "
    "checkpoints (ModelOpt, compressed-tensors)"
)


@dataclass(frozen=True)
class RankPlan:
    """What one rank holds: its experts and its slice `[i_start, i_end)` of the intermediate size."""

    rank: int
    tp_size: int
    tp_rank: int
    ep_size: int
    ep_rank: int
    expert_start: int
    expert_end: int
    i_start: int
    i_end: int

    @property
    def num_experts(self) -> int:
        return self.expert_end - self.expert_start

    @property
    def zero_down_bias(self) -> bool:
        """vLLM zeroes `down_proj_bias` on TP ranks other than 0 (the bias is added once)."""
        return self.tp_rank != 0

    def to_json(self) -> dict:
        return asdict(self)


def expert_parallel_plans(num_experts: int, intermediate: int, ep: int) -> list[RankPlan]:
    """One `RankPlan` per rank of an expert-parallel group of `ep` ranks (every format alike): rank r
    holds the r-th equal share of the experts, each whole (with EP vLLM does not TP-slice them)."""
    if num_experts % ep:
        raise InputError(f"--ep {ep} does not divide the {num_experts} experts")
    per = num_experts // ep
    return [RankPlan(r, 1, 0, ep, r, r * per, (r + 1) * per, 0, intermediate) for r in range(ep)]


@dataclass(frozen=True)
class Geometry:
    """The canonical sizes of a rank's experts for one target.

    MXFP4: the loader already pads to the backend's rounded sizes, so `hidden`/`intermediate` are
    Hp/Ip. NVFP4: the canonical tensors are unpadded (K, N); the layouts pad.
    `global_experts`: rows of the input scales where the runtime holds them for every expert.
    `scale_pad_fill`: MXFP4, the byte the canonical scales hold where they are padded (the
    revision row's `mxfp4_scale_pad_fill`: 0 for vLLM, 0x7F for SGLang). Recorded in the target
    only where it is not 0, so verify and the loader re-read the same canonical tensors and
    vLLM manifests stay as they were.
    """

    fmt: str
    hidden: int
    intermediate: int
    global_experts: int | None = None
    scale_pad_fill: int = 0

    def specs(self, num_experts: int) -> Specs:
        """dtype and shape of each canonical tensor of a rank holding `num_experts` experts."""
        return format_named(self.fmt).canonical_specs(self, num_experts)

    def to_target(self) -> dict:
        out = {"hidden_size_padded": self.hidden, "intermediate_size_padded": self.intermediate}
        if self.global_experts is not None:
            out["input_scale_rows"] = self.global_experts
        if self.scale_pad_fill:
            out["scale_pad_fill"] = self.scale_pad_fill
        return out

    @classmethod
    def from_target(cls, target: dict) -> Geometry:
        return cls(
            target.get("format", "mxfp4"),
            target["hidden_size_padded"],
            target["intermediate_size_padded"],
            target.get("input_scale_rows"),
            _scale_pad_fill(target.get("scale_pad_fill", 0)),
        )


def _scale_pad_fill(value: object) -> int:
    """A manifest's `scale_pad_fill`: one byte, or the manifest is refused (exit 2)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise InputError(f"target: scale_pad_fill {value!r} is not a byte (0-255)")
    return value


class Format(Protocol):
    """The hooks convert, verify, inspect and the loader call; one implementation per checkpoint
    format. Nothing outside a format's class branches on its name."""

    #: Recorded as the target's "format" in every manifest.
    name: str

    def recognizes(self, folder: Path) -> bool:
        """Whether `folder` (a checkpoint folder, or a hub snapshot holding the decision files) holds
        a checkpoint of this format. formats/registry.py asks the formats in its detection order."""
        ...

    def checkpoint_folder(self, folder: Path, layout: str | None) -> Path:
        """The folder inside `folder` that holds the checkpoint's config and weights (what a hub
        fetch downloads); `layout` is the user's `--layout`, if the format has layouts."""
        ...

    def open_checkpoint(self, folder: Path, identity: SourceIdentity, layout: str | None) -> Ckpt:
        """The checkpoint in `folder`, validated by the format's reader."""
        ...

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

    def plan_ranks(self, ckpt: Ckpt, tp: int, ep: int) -> list[RankPlan]:
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


#: Every format by name. formats/registry.py lists the formats and fills this table (base.py is
#: imported by every format, so it cannot import them); `format_named` and `Geometry.specs` read it.
FORMATS: dict[str, Format] = {}


def format_named(name: str) -> Format:
    """The format a manifest's target names."""
    if name not in FORMATS:
        raise InputError(f"unknown checkpoint format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]
