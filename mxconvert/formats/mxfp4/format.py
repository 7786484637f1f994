"""GPT-OSS MXFP4 behind the `Format` protocol (formats/base.py): E2M1 weights with E8M0 scales per
32 values, w13 rows gate/up interleaved, in the Hugging Face or OpenAI `original/` layout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.errors import InputError
from mxconvert.formats.base import Geometry, RankPlan, Specs
from mxconvert.formats.mxfp4 import canonical
from mxconvert.formats.mxfp4.checkpoint import Checkpoint, locate
from mxconvert.layouts import ExpertLayout, resolve_layout
from mxconvert.selection.deployment import Deployment, moe_tp_origin
from mxconvert.selection.mxfp4 import select_backend
from mxconvert.selection.report import Selection
from mxconvert.storage.source import SourceIdentity
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision
from mxconvert.target.sglang_revisions import runtime_row

if TYPE_CHECKING:
    import numpy as np
    import torch


class Mxfp4Format:
    """GPT-OSS MXFP4: E2M1 weights with E8M0 scales per 32 values, w13 rows gate/up interleaved."""

    name = "mxfp4"
    #: `load_bits` reads with numpy alone (the host path needs no torch: mxconvert/bits.py).
    loads_without_torch = True

    def recognizes(self, folder: Path) -> bool:
        """Any folder: GPT-OSS MXFP4 is the format of a folder no other format recognizes, and its
        reader says what such a folder lacks (formats/registry.py asks it last)."""
        return True

    def checkpoint_folder(self, folder: Path, layout: str | None) -> Path:
        return locate(folder, layout)[0]

    def open_checkpoint(self, folder: Path, identity: SourceIdentity, layout: str | None) -> Checkpoint:
        return Checkpoint(folder, identity, layout)

    def canonical_specs(self, geometry: Geometry, num_experts: int) -> Specs:
        return canonical.canonical_specs(num_experts, geometry.hidden, geometry.intermediate)

    def dequantize(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        from mxconvert.formats.mxfp4 import numbers

        return numbers.dequantize(packed, scales)

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
        moe_tp = deployment.moe_tp
        if ckpt.facts.intermediate_size % moe_tp:
            raise InputError(
                f"the MoE's tp {moe_tp} does not divide intermediate_size {ckpt.facts.intermediate_size} "
                f"({moe_tp_origin(deployment)}; vLLM asserts this)"
            )
        hp, ip = revision.round_up(
            selection.backend, profile.platform, ckpt.facts.hidden_size, ckpt.facts.intermediate_size // moe_tp
        )
        return Geometry(self.name, hp, ip, scale_pad_fill=revision.mxfp4_scale_pad_fill)

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
            runtime_row(target["runtime_revision"]),
            DeviceProfile.from_json(target["device"]),
            tp=Deployment.from_target(target).attention_tp,
            marlin_input_dtype=(target.get("layout") or {}).get("marlin_input_dtype"),
        )

    def plan_ranks(self, ckpt: Checkpoint, tp: int, ep: int) -> list[RankPlan]:
        return canonical.plan_ranks(ckpt.facts, tp, ep)

    def load(
        self,
        ckpt: Checkpoint,
        layer: int,
        plan: RankPlan,
        geometry: Geometry,
        experts: range | None,
        names: tuple[str, ...],
    ) -> dict[str, torch.Tensor]:
        return canonical.load_canonical(
            ckpt, layer, plan, geometry.hidden, geometry.intermediate, experts, names, geometry.scale_pad_fill
        )

    def load_bits(
        self,
        ckpt: Checkpoint,
        layer: int,
        plan: RankPlan,
        geometry: Geometry,
        experts: range | None,
        names: tuple[str, ...],
    ) -> dict[str, np.ndarray]:
        return canonical.load_canonical_bits(
            ckpt, layer, plan, geometry.hidden, geometry.intermediate, experts, names, geometry.scale_pad_fill
        )
