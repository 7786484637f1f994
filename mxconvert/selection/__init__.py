"""MoE backend selection: a data-driven mirror of vLLM's MXFP4 (GPT-OSS) and NVFP4 MoE oracles.

Given a device profile, a runtime revision and a deployment, pick the backend (and the kernel class)
that vLLM would pick, and say why every backend ahead of it was passed over.

Modules: `engine` (kernel classes, predicates walked in vLLM's order, priority lists, env overrides,
the bookkeeping of a run), `report` (`Selection`, `Considered`), `deployment`, `predicates` (checks
shared by several oracles), and one module per upstream oracle, each diffable against the vLLM file
it mirrors: `vllm/mxfp4_0_33`, `vllm/mxfp4_0_20`, `vllm/nvfp4_0_33`, `vllm/nvfp4_0_15`.
`mxfp4` and `nvfp4` are the entry points; the revision row's `selection` field names the oracle.
`vocabulary` translates what a user calls a backend (and lists the `mxconvert backends` table);
`environment` reads the runtime's `VLLM_*` variables. See docs/architecture.md, "Selection".

This package re-exports the names callers outside it use; modules inside it import the concrete
modules they need, never the package, so the re-exports close no import cycle.
"""

from __future__ import annotations

from mxconvert.selection.deployment import ACTIVATIONS, Deployment
from mxconvert.selection.engine import KernelClass, SelectionStyle
from mxconvert.selection.mxfp4 import MOE_BACKEND_NAMES_BY_STYLE, SELECTION_STYLES, moe_backend_names, select_backend
from mxconvert.selection.mxfp4_common import BACKEND_ACTIVATION
from mxconvert.selection.nvfp4 import (
    NVFP4_SELECTION_STYLES,
    nvfp4_moe_backend_names,
    nvfp4_shape_refusal,
    select_nvfp4_backend,
)
from mxconvert.selection.nvfp4_common import (
    NVFP4_ACTIVATION_FNS,
    ROUTING_METHODS,
    is_global_sf_supported_for_nvfp4_backend,
)
from mxconvert.selection.report import FORMAT_ENUMS, Considered, Selection, SelectionRefused
from mxconvert.selection.vllm.mxfp4_0_20 import MOE_BACKEND_NAMES_0_20
from mxconvert.selection.vllm.mxfp4_0_33 import MOE_BACKEND_NAMES
from mxconvert.selection.vllm.nvfp4_0_15 import FLASHINFER_MOE_BACKEND_ENV_0_15
from mxconvert.selection.vllm.nvfp4_0_33 import NVFP4_CLAMP_BACKENDS, NVFP4_MOE_BACKEND_NAMES

__all__ = [
    "ACTIVATIONS",
    "BACKEND_ACTIVATION",
    "FLASHINFER_MOE_BACKEND_ENV_0_15",
    "FORMAT_ENUMS",
    "MOE_BACKEND_NAMES",
    "MOE_BACKEND_NAMES_0_20",
    "MOE_BACKEND_NAMES_BY_STYLE",
    "NVFP4_ACTIVATION_FNS",
    "NVFP4_CLAMP_BACKENDS",
    "NVFP4_MOE_BACKEND_NAMES",
    "NVFP4_SELECTION_STYLES",
    "ROUTING_METHODS",
    "SELECTION_STYLES",
    "Considered",
    "Deployment",
    "KernelClass",
    "Selection",
    "SelectionRefused",
    "SelectionStyle",
    "is_global_sf_supported_for_nvfp4_backend",
    "moe_backend_names",
    "nvfp4_moe_backend_names",
    "nvfp4_shape_refusal",
    "select_backend",
    "select_nvfp4_backend",
]
