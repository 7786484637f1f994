"""NVFP4 MoE checkpoints behind the `Format` protocol (formats/base.py): ModelOpt or
compressed-tensors, E2M1 weights with E4M3 scales per 16 values and float32 global and activation
scales, w13 rows [w1 (gate); w3 (up)]."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.bits import from_torch
from mxconvert.core.errors import InputError
from mxconvert.formats.base import Geometry, RankPlan, Specs
from mxconvert.formats.nvfp4.checkpoint import (
    Nvfp4Checkpoint,
    detect_nvfp4,
    nvfp4_canonical_specs,
    open_nvfp4,
    plan_nvfp4_ranks,
)
from mxconvert.layouts import ExpertLayout, nvfp4_layout
from mxconvert.selection.deployment import Deployment, moe_tp_origin
from mxconvert.selection.nvfp4 import select_nvfp4_backend
from mxconvert.selection.nvfp4_common import is_global_sf_supported_for_nvfp4_backend
from mxconvert.selection.report import Selection
from mxconvert.storage.source import SourceIdentity
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision, get_revision

if TYPE_CHECKING:
    import numpy as np
    import torch


class Nvfp4Format:
    """NVFP4 MoE checkpoints, ModelOpt or compressed-tensors: E2M1 weights with E4M3 scales per 16
    values and float32 global and activation scales, w13 rows [w1 (gate); w3 (up)]."""

    name = "nvfp4"
    loads_without_torch = False  # its loader computes with values (global scales, stacking)

    def recognizes(self, folder: Path) -> bool:
        """Its config (or ModelOpt's `hf_quant_config.json`) says NVFP4."""
        return folder.is_dir() and detect_nvfp4(folder) is not None

    def checkpoint_folder(self, folder: Path, layout: str | None) -> Path:
        return folder  # one layout: config and weights at the top

    def open_checkpoint(self, folder: Path, identity: SourceIdentity, layout: str | None) -> Nvfp4Checkpoint:
        ckpt = open_nvfp4(folder, identity)
        if ckpt is None:
            raise InputError(f"{folder}: not an NVFP4 checkpoint (no ModelOpt or compressed-tensors NVFP4 config)")
        return ckpt

    def canonical_specs(self, geometry: Geometry, num_experts: int) -> Specs:
        return nvfp4_canonical_specs(num_experts, geometry.hidden, geometry.intermediate, geometry.global_experts)

    def dequantize(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        from mxconvert.formats.nvfp4 import numbers

        return numbers.dequantize(packed, scales)

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
            producer=f.quant_format,
            model_type=f.model_type,
        )

    def geometry(
        self, ckpt, selection: Selection, revision: RuntimeRevision, profile: DeviceProfile, deployment: Deployment
    ) -> Geometry:
        f = ckpt.facts
        if f.intermediate_size % deployment.moe_tp:
            raise InputError(
                f"the MoE's tp {deployment.moe_tp} does not divide intermediate_size {f.intermediate_size} "
                f"({moe_tp_origin(deployment)}; vLLM asserts this)"
            )
        n = f.intermediate_size // deployment.moe_tp
        rows = None
        if ckpt.producer.input_scales_of_every_expert and is_global_sf_supported_for_nvfp4_backend(selection.backend):
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
        num_local = ckpt.facts.num_experts // deployment.moe_ep
        return self._build(selection.backend, revision, geometry, num_local)

    def _build(self, backend, revision: RuntimeRevision, geometry: Geometry, num_local: int) -> ExpertLayout:
        return nvfp4_layout(backend, revision, geometry.hidden, geometry.intermediate, num_local)

    def layout_from_target(self, target: dict) -> ExpertLayout:
        geometry = Geometry.from_target(target)
        return self._build(
            Nvfp4Backend(target["backend"]),
            get_revision(target["runtime_revision"], self.name),
            geometry,
            target["layout"]["num_local_experts"],
        )

    def plan_ranks(self, ckpt, tp: int, ep: int) -> list[RankPlan]:
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
