"""Layouts: canonical tensors → the bytes a backend's kernels read, keyed by (backend, revision).

`resolve_layout` is the single place that maps a selected backend on a target to its layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..backends import CUTLASS_BACKENDS, MARLIN_BACKENDS, TRITON_BACKENDS, TRTLLM_BACKENDS, Mxfp4Backend
from ..errors import UnsupportedError
from ..profiles import DeviceProfile
from ..revisions import RuntimeRevision
from .aiter import aiter_tensors
from .base import DerivedTensor, InverseError, TensorLayout
from .cutlass import cutlass_tensors
from .identity import IDENTITY_TENSORS
from .marlin import marlin_tensors
from .triton import triton_layout_choice, triton_tensors
from .trtllm import TRTLLM_TENSORS

__all__ = ["DerivedTensor", "ExpertLayout", "InverseError", "TensorLayout", "resolve_layout", "SUPPORTED_BACKENDS"]

SUPPORTED_BACKENDS = frozenset(
    TRTLLM_BACKENDS | TRITON_BACKENDS | CUTLASS_BACKENDS | MARLIN_BACKENDS
    | {Mxfp4Backend.AITER_MXFP4_BF16, Mxfp4Backend.AITER_TRITON_MXFP4_BF16, Mxfp4Backend.XPU, Mxfp4Backend.EMULATION}
)


@dataclass(frozen=True)
class ExpertLayout:
    """The layouts of the six expert tensors of one MoE layer for one target."""

    backend: Mxfp4Backend
    revision: str
    kind: str
    tensors: dict[str, TensorLayout]
    params: dict = field(default_factory=dict)
    #: Kernel tensors computed from several canonical tensors (NVFP4 scales); empty for MXFP4.
    derived: dict[str, DerivedTensor] = field(default_factory=dict)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return (*self.tensors, *self.derived)

    def forward(self, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: self.tensors[name].forward(t) for name, t in canonical.items()}

    def describe(self) -> dict:
        return {"backend": self.backend.value, "revision": self.revision, "kind": self.kind, **self.params}

    def describe_tensor(self, name: str, specs: dict) -> dict:
        if name in self.derived:
            return self.derived[name].describe(specs)
        dtype, shape = specs[name]
        return self.tensors[name].describe(shape, dtype)

    def buffer_spec(self, name: str, specs: dict) -> tuple[torch.dtype, tuple[int, ...]]:
        if name in self.derived:
            return self.derived[name].buffer_spec(specs)
        dtype, shape = specs[name]
        return self.tensors[name].buffer_spec(shape, dtype)


def resolve_layout(backend: Mxfp4Backend, revision: RuntimeRevision, profile: DeviceProfile,
                   tp: int = 1, marlin_input_dtype: str | None = None) -> ExpertLayout:
    """The expert layout vLLM (`revision`) produces for `backend` on `profile`."""
    if backend in CUTLASS_BACKENDS:
        variant = ("mxfp8-128x4" if backend == Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8
                   else revision.cutlass_sm90_layout)
        return ExpertLayout(backend, revision.name, "cutlass", {t.name: t for t in cutlass_tensors(variant)},
                            {"variant": variant, "flashinfer": revision.flashinfer})
    if backend in MARLIN_BACKENDS:
        fp8 = marlin_input_dtype == "fp8"
        return ExpertLayout(backend, revision.name, "marlin", {t.name: t for t in marlin_tensors(fp8)},
                            {"marlin_input_dtype": "fp8" if fp8 else None, "group_size": 32})
    if backend == Mxfp4Backend.AITER_MXFP4_BF16:
        return ExpertLayout(backend, revision.name, "aiter", {t.name: t for t in aiter_tensors()},
                            {"layout": "a16w4 (16, 16)"})
    if backend in TRTLLM_BACKENDS:
        return ExpertLayout(backend, revision.name, "trtllm", {t.name: t for t in TRTLLM_TENSORS},
                            {"epilogue_tile_m": 128, "flashinfer": revision.flashinfer})
    if backend in TRITON_BACKENDS or backend == Mxfp4Backend.AITER_TRITON_MXFP4_BF16:
        choice = triton_layout_choice(revision, profile, tp)
        return ExpertLayout(
            backend, revision.name, "triton", {t.name: t for t in triton_tensors(choice)},
            {"triton_kernels": choice.generation, "value_layout": choice.value,
             "scale_layout": choice.scale, "num_warps": choice.num_warps,
             "scale_groups_padded_to_4": choice.pad_scale_groups_to_4,
             "opt_flags": _triton_opt_flags(profile, revision)},
        )
    if backend in (Mxfp4Backend.XPU, Mxfp4Backend.EMULATION):
        return ExpertLayout(backend, revision.name, "identity", {t.name: t for t in IDENTITY_TENSORS})
    raise UnsupportedError(
        f"backend {backend.value} is not laid out by this version of mxconvert yet; "
        f"supported: {', '.join(sorted(b.value for b in SUPPORTED_BACKENDS))}"
    )


def _triton_opt_flags(profile: DeviceProfile, revision: RuntimeRevision) -> dict:
    """Process-wide opt-flag constraints vLLM sets for this target (no data change; a loader must set them)."""
    if profile.platform != "cuda":
        return {}
    if profile.cap == (9, 0):
        return {"split_k": 1}
    if profile.cap[0] == 10 or (profile.cap[0] == 12 and revision.triton_sm12x_opt_flags):
        return {"is_persistent": True, "epilogue_subtile": 1}
    return {}
