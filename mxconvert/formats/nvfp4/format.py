"""NVFP4 MoE checkpoints behind the `Format` protocol (formats/base.py): ModelOpt or
compressed-tensors, E2M1 weights with E4M3 scales per 16 values and float32 global and activation
scales, w13 rows [w1 (gate); w3 (up)]."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.bits import from_torch
from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.formats.base import Geometry, RankPlan, Specs
from mxconvert.formats.nvfp4.checkpoint import (
    Nvfp4Checkpoint,
    detect_nvfp4,
    nvfp4_canonical_specs,
    open_nvfp4,
    plan_nvfp4_ranks,
)
from mxconvert.layouts import ExpertLayout, nvfp4_layout
from mxconvert.layouts.cutlass import sglang_ct_w4a4_cutlass
from mxconvert.layouts.nvfp4_scales import CT_W4A4_CUTLASS_ACTIVATION_SCALE, CT_W4A4_TRTLLM_ACTIVATION_SCALE
from mxconvert.layouts.trtllm import sglang_ct_w4a4_trtllm
from mxconvert.selection.deployment import Deployment, moe_tp_origin
from mxconvert.selection.nvfp4 import select_nvfp4_backend
from mxconvert.selection.nvfp4_common import is_global_sf_supported_for_nvfp4_backend
from mxconvert.selection.report import Selection
from mxconvert.storage.source import SourceIdentity
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision
from mxconvert.target.sglang_revisions import compressed_tensors_nvfp4, runtime_row, unproven_layout_reason

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
        selection = select_nvfp4_backend(
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
        if (
            revision.runtime == "sglang"
            and unproven_layout_reason(revision, self.name, selection.backend.value) is None
        ):
            # a refused layout reports after the selection (pipeline/plan.py)
            _sglang_refusal(ckpt, selection, deployment)
        return selection

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
        f = ckpt.facts
        ct_w4a4 = f.quant_format == "compressed-tensors" and not f.w4a16
        return self._build(selection.backend, revision, geometry, num_local, ct_w4a4)

    def _build(
        self, backend, revision: RuntimeRevision, geometry: Geometry, num_local: int, ct_w4a4: bool = False
    ) -> ExpertLayout:
        """`ct_w4a4`: the source is a compressed-tensors W4A4 checkpoint, whose FlashInfer CUTLASS and
        TRT-LLM scalars an SGLang row takes from `CompressedTensorsW4A4Nvfp4MoE` (`sglang_ct_w4a4_cutlass`,
        `sglang_ct_w4a4_trtllm`)."""
        layout = nvfp4_layout(backend, revision, geometry.hidden, geometry.intermediate, num_local)
        if ct_w4a4 and revision.runtime == "sglang" and backend is Nvfp4Backend.FLASHINFER_CUTLASS:
            return sglang_ct_w4a4_cutlass(layout)
        if ct_w4a4 and revision.runtime == "sglang" and backend is Nvfp4Backend.FLASHINFER_TRTLLM:
            return sglang_ct_w4a4_trtllm(layout)
        return layout

    def layout_from_target(self, target: dict) -> ExpertLayout:
        """The recorded layout description names the compressed-tensors W4A4 CUTLASS and TRT-LLM variants
        by their `activation_scale` (no other layout records those values), so older manifests rebuild as before."""
        geometry = Geometry.from_target(target)
        return self._build(
            Nvfp4Backend(target["backend"]),
            runtime_row(target["runtime_revision"], self.name),
            geometry,
            target["layout"]["num_local_experts"],
            target["layout"].get("activation_scale")
            in (CT_W4A4_CUTLASS_ACTIVATION_SCALE, CT_W4A4_TRTLLM_ACTIVATION_SCALE),
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


def _sglang_refusal(ckpt, selection: Selection, deployment: Deployment) -> None:
    """What an SGLang row's NVFP4 bytes need of the checkpoint (docs/sglang.md, "NVFP4"), else
    `UnsupportedError`. SGLang 0.5.23 keeps w1's and w3's weight global scales apart (g1_alphas from
    w1's, g1_alphas_up and TRT-LLM's g1_scale_c from w3's) and loads one w13 input scale per expert
    (`FusedMoE._load_single_value`: the last of w1 / w3), where mxconvert's canonical tensors hold
    gate's global scale and the maximum over both input scales: the two agree only where gate's and
    up's scalars are equal, bit for bit (TRT-LLM, FlashInfer CUTLASS and CuTe DSL, whose layer also holds
    w3's `g1_alphas_up` and, for CuTe DSL, w13's raw [gate, up] global scales; SGLang's Marlin keeps gate's
    global scale and reads no input scale).
    compressed-tensors checkpoints: what the row's `CompressedTensorsNvfp4` says (`_sglang_ct_refusal`)."""
    f = ckpt.facts
    if f.quant_format != "modelopt":
        _sglang_ct_refusal(ckpt, selection, deployment)
        return
    if selection.backend not in (
        Nvfp4Backend.FLASHINFER_TRTLLM,
        Nvfp4Backend.FLASHINFER_CUTLASS,
        Nvfp4Backend.FLASHINFER_CUTEDSL,  # its w13 input scale is SGLang's per-expert last-loaded one
    ):
        return  # SGLang's Marlin reads gate's global scale for w13 (as mxconvert's canonical) and no input scale
    _, _, global_name, input_name = ckpt.producer.names
    for layer in f.moe_layers:
        for e in range(f.num_experts):
            for name in (global_name,) if f.w4a16 else (global_name, input_name):
                gate = ckpt.scalar_value(layer, e, "gate_proj", name)
                up = ckpt.scalar_value(layer, e, "up_proj", name)
                if gate != up:
                    raise UnsupportedError(
                        f"layer {layer} expert {e}: gate_proj.{name} {gate!r} and up_proj.{name} {up!r} differ; "
                        "SGLang 0.5.23 keeps the two apart (w1 / w3 alphas, the last-loaded input scale) where "
                        "mxconvert's NVFP4 tensors hold one, so its bytes are not mxconvert's: not written"
                    )


#: What the row's FlashInfer TRT-LLM layout pads I / tp to (`nvfp4_fi_padding`'s second value, sglang-0.5.23):
#: an intermediate shard that is a multiple of it is left unpadded, as `CompressedTensorsW4A4Nvfp4MoE` leaves it.
TRTLLM_CT_SHARD_MULTIPLE = 64


def _sglang_ct_refusal(ckpt, selection: Selection, deployment: Deployment) -> None:
    """What SGLang's compressed-tensors NVFP4 path needs of the checkpoint (the row's
    `CompressedTensorsNvfp4`, target/sglang_revisions.py; docs/sglang.md, "NVFP4"), else
    `UnsupportedError`. MARLIN is `CompressedTensorsW4A16Nvfp4MoE.process_weights_after_loading`
    (sglang 0.5.23, layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py),
    which raises on differing gate / up weight global scales, a hidden size that is not a multiple of
    128 and a TP shard of the intermediate size that is not a multiple of 64; what it leaves on the layer
    is then the row's NVFP4 Marlin layout of mxconvert's canonical tensors (gate's decoded global scale)."""
    f = ckpt.facts
    rule = compressed_tensors_nvfp4(selection.revision)
    backend = selection.backend.value
    if rule is None or backend not in rule.written:
        reason = rule.unwritten_reason if rule is not None else "no compressed-tensors NVFP4 preparation is compared"
        raise UnsupportedError(f"{backend} under {selection.revision}: {reason}")
    if selection.backend is not Nvfp4Backend.MARLIN:
        # CompressedTensorsW4A4Nvfp4MoE's CUTLASS branch raises on nothing the layout does not refuse
        # (2I not a multiple of 128); it keeps gate's and up's input scales apart per expert (their stored
        # minimum, layouts/nvfp4_scales.py ct_w4a4_cutlass_scales) and takes gate's weight global scale
        # with a warning, as the canonical tensors do.
        if f.w4a16:
            raise UnsupportedError(
                f"{backend} under {selection.revision}: an NVFP4A16 checkpoint has no input scales; SGLang "
                "serves it with CompressedTensorsW4A16Nvfp4MoE (MARLIN) only: not written"
            )
        shard = f.intermediate_size // deployment.moe_tp
        if selection.backend is Nvfp4Backend.FLASHINFER_TRTLLM:
            # the TRT-LLM branch runs prepare_static_weights_for_trtllm_fp4_moe on the unpadded weights;
            # the row's TRT-LLM layout pads I to 64 (ModelOpt's create_weights does), which it would not be
            if shard % TRTLLM_CT_SHARD_MULTIPLE:
                raise UnsupportedError(
                    f"{backend} under {selection.revision}: SGLang's compressed-tensors NVFP4 MoE scheme "
                    f"(CompressedTensorsW4A4Nvfp4MoE, flashinfer_trtllm) shuffles the unpadded weights of "
                    f"{f.intermediate_size} / tp {deployment.moe_tp} = {shard} intermediate rows, where the row's "
                    f"FlashInfer TRT-LLM layout pads them to a multiple of {TRTLLM_CT_SHARD_MULTIPLE} (ModelOpt's "
                    f"create_weights does): not written"
                )
            return
        rows = 2 * shard
        if rows % 128:
            raise UnsupportedError(
                f"{backend} under {selection.revision}: SGLang's compressed-tensors NVFP4 MoE scheme "
                f"(CompressedTensorsW4A4Nvfp4MoE) swizzles w13's 2 x {f.intermediate_size} / tp {deployment.moe_tp} "
                f"= {rows} rows of block scales into rows padded to 128, which the row's FlashInfer CUTLASS layout "
                "does not write (it needs 2I / tp a multiple of 128): not written"
            )
        return
    shard = f.intermediate_size // deployment.moe_tp
    if f.hidden_size % rule.marlin_hidden_multiple or shard % rule.marlin_shard_multiple:
        raise UnsupportedError(
            f"{backend} under {selection.revision}: SGLang's compressed-tensors NVFP4 MoE scheme "
            f"(CompressedTensorsW4A16Nvfp4MoE) needs hidden_size % "
            f"{rule.marlin_hidden_multiple} == 0 and intermediate_size_per_partition % {rule.marlin_shard_multiple} "
            f"== 0 (it raises otherwise), and this checkpoint has hidden_size {f.hidden_size} and "
            f"{f.intermediate_size} / tp {deployment.moe_tp} = {shard}: not written"
        )
    if not rule.marlin_shared_w13_global:
        return
    _, _, global_name, _ = ckpt.producer.names
    for layer in f.moe_layers:
        for e in range(f.num_experts):
            gate = ckpt.scalar_value(layer, e, "gate_proj", global_name)
            up = ckpt.scalar_value(layer, e, "up_proj", global_name)
            if gate != up:
                raise UnsupportedError(
                    f"layer {layer} expert {e}: gate_proj.{global_name} {gate!r} and up_proj.{global_name} {up!r} "
                    "differ; SGLang's CompressedTensorsW4A16Nvfp4MoE requires one shared weight global scale per "
                    "expert (it raises: re-export the checkpoint with fused global scales): not written"
                )
