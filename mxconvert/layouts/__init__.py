"""Layouts: canonical tensors -> the bytes a backend's kernels read, keyed by (format, backend).

Importing this package registers every backend file's layouts (see `registry.py`);
`resolve_layout` (MXFP4) and `nvfp4_layout` (NVFP4) are the two ways in. docs/architecture.md,
"Layouts", explains the pieces.
"""

from __future__ import annotations

from enum import Enum

from mxconvert.layouts import aiter, cutedsl, cutlass, identity, marlin, triton, trtllm  # noqa: F401  (register their layouts)
from mxconvert.layouts.base import TensorLayout
from mxconvert.layouts.derived import DerivedTensor
from mxconvert.layouts.errors import InverseError
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, build_layout, supported_backends
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision

__all__ = [
    "DerivedTensor",
    "ExpertLayout",
    "InverseError",
    "LayoutTarget",
    "TensorLayout",
    "build_layout",
    "nvfp4_layout",
    "resolve_layout",
    "supported_backends",
    "SUPPORTED_BACKENDS",
]

#: MXFP4 backends that have a layout.
SUPPORTED_BACKENDS = supported_backends("mxfp4")


def resolve_layout(
    backend: Enum,
    revision: RuntimeRevision,
    profile: DeviceProfile | None,
    tp: int = 1,
    marlin_input_dtype: str | None = None,
) -> ExpertLayout:
    """The MXFP4 expert layout vLLM (`revision`) produces for `backend` on `profile`."""
    return build_layout("mxfp4", LayoutTarget(backend, revision, profile, tp=tp, marlin_input_dtype=marlin_input_dtype))


def nvfp4_layout(
    backend: Enum, revision: RuntimeRevision, hidden: int, intermediate: int, num_local_experts: int, gated: bool = True
) -> ExpertLayout:
    """The NVFP4 expert layout vLLM (`revision`) produces for `backend`, for canonical sizes K
    (`hidden`) and N (`intermediate`, one rank's) and `num_local_experts` experts on the rank."""
    return build_layout(
        "nvfp4",
        LayoutTarget(
            backend,
            revision,
            hidden=hidden,
            intermediate=intermediate,
            num_local_experts=num_local_experts,
            gated=gated,
        ),
    )
