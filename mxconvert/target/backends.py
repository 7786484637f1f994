"""MoE kernel backends, named exactly as vLLM's oracle enums name them.

Only names live here; what each backend needs (support predicates, round-up, layout) is data in
`selection/`, `revisions.py` and `layouts/`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Mxfp4Backend(str, Enum):
    """`Mxfp4MoeBackend` of vLLM 0.33.0 (values are the enum's string values)."""

    FLASHINFER_TRTLLM_MXFP4_BF16 = "FLASHINFER_TRTLLM_MXFP4_BF16"
    FLASHINFER_TRTLLM_MXFP4_MXFP8 = "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    FLASHINFER_CUTLASS_MXFP4_BF16 = "FLASHINFER_CUTLASS_MXFP4_BF16"
    FLASHINFER_CUTLASS_MXFP4_MXFP8 = "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    CUTLASS_MXFP4_MXFP4 = "CUTLASS_MXFP4_MXFP4"
    AITER_MXFP4_BF16 = "AITER_MXFP4_BF16"  # older trees: CK
    AITER_TRITON_MXFP4_BF16 = "AITER_TRITON_MXFP4_BF16"
    AITER_MXFP4_FP8 = "AITER_MXFP4_FP8"
    AITER_MXFP4_MXFP4 = "AITER_MXFP4_MXFP4"
    AITER_TRITON_MXFP4_MXFP4 = "AITER_TRITON_MXFP4_MXFP4"
    TRITON = "TRITON"
    TRITON_UNFUSED = "TRITON_UNFUSED"
    MARLIN = "MARLIN"
    BATCHED_MARLIN = "BATCHED_MARLIN"
    HUMMING = "HUMMING"
    XPU = "XPU"
    CPU = "CPU"
    EMULATION = "EMULATION"

    @classmethod
    def parse(cls, name: str) -> Mxfp4Backend:
        """Accept enum names in any case, and the old name CK."""
        key = name.strip().upper()
        if key == "CK" or key == "AITER":
            return cls.AITER_MXFP4_BF16
        return cls(key)


TRTLLM_BACKENDS = frozenset({Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_BF16, Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8})
CUTLASS_BACKENDS = frozenset({Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16, Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8})
TRITON_BACKENDS = frozenset({Mxfp4Backend.TRITON, Mxfp4Backend.TRITON_UNFUSED})
MARLIN_BACKENDS = frozenset({Mxfp4Backend.MARLIN, Mxfp4Backend.BATCHED_MARLIN})

#: Backends whose activations are MXFP8 (vLLM's `kMxfp8Dynamic` activation key).
MXFP8_ACTIVATION_BACKENDS = frozenset(
    {Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8, Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_MXFP8}
)


class Nvfp4Backend(str, Enum):
    """`NvFp4MoeBackend` of vLLM 0.33.0 (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py; values are
    the enum's values).

    The older revision (≈ vLLM 0.15) has only FLASHINFER_TRTLLM, FLASHINFER_CUTLASS,
    FLASHINFER_CUTEDSL, VLLM_CUTLASS and MARLIN. Its FLASHINFER_CUTEDSL is the masked (batched-format)
    kernel, i.e. what 0.33 calls FLASHINFER_CUTEDSL_BATCHED.

    Note: like `Mxfp4Backend` this is a `str` enum, so `Nvfp4Backend.MARLIN == Mxfp4Backend.MARLIN`
    (both equal "MARLIN"). Never mix the two in one set or dict key space.
    """

    B12X = "B12X"
    FLASHINFER_TRTLLM = "FLASHINFER_TRTLLM"
    FLASHINFER_CUTLASS = "FLASHINFER_CUTLASS"
    FLASHINFER_CUTEDSL = "FLASHINFER_CUTEDSL"
    FLASHINFER_CUTEDSL_BATCHED = "FLASHINFER_CUTEDSL_BATCHED"
    FLASHINFER_B12X = "FLASHINFER_B12X"
    VLLM_CUTLASS = "VLLM_CUTLASS"
    MARLIN = "MARLIN"
    HUMMING = "HUMMING"
    EMULATION = "EMULATION"
    FLASHINFER_MOE_EP_CUTEDSL = "FLASHINFER_MOE_EP_CUTEDSL"

    @classmethod
    def parse(cls, name: str) -> Nvfp4Backend:
        """Accept enum names in any case."""
        return cls(name.strip().upper())


#: vLLM 0.33.0 `FLASHINFER_NVFP4_MOE_BACKENDS`: the backends that quantize activations with
#: one global scale shared by all experts (`is_global_sf_supported_for_nvfp4_backend`). The one
#: statement of this set: selection's `use_global_sf`, the input-scale rows a ModelOpt checkpoint
#: loads, and the NVFP4 layouts' activation-scale reduction all read it (vLLM ~0.15's set is the same
#: minus the backends it does not have).
NVFP4_GLOBAL_SF_BACKENDS = frozenset(
    {
        Nvfp4Backend.FLASHINFER_TRTLLM,
        Nvfp4Backend.FLASHINFER_CUTLASS,
        Nvfp4Backend.FLASHINFER_CUTEDSL,
        Nvfp4Backend.FLASHINFER_CUTEDSL_BATCHED,
        Nvfp4Backend.FLASHINFER_B12X,
    }
)


# ---- one vocabulary ---------------------------------------------------------------------------------
#: Backends vLLM reaches only through another's --moe-backend name plus the batched format.
_BATCHED_OF = {"BATCHED_MARLIN": "MARLIN", "FLASHINFER_CUTEDSL_BATCHED": "FLASHINFER_CUTEDSL"}


def _style_names(fmt: str, selection_style: str) -> tuple[dict, dict]:
    """(--moe-backend name -> backends, unsupported names) of a format's selection style."""
    from mxconvert.selection import NVFP4_SELECTION_STYLES, SELECTION_STYLES

    styles = NVFP4_SELECTION_STYLES if fmt == "nvfp4" else SELECTION_STYLES
    style = styles.get(selection_style)
    if style is None:
        return {}, {}
    return dict(style.names), dict(style.unsupported_names)


def enum_of(fmt: str):
    return Nvfp4Backend if fmt == "nvfp4" else Mxfp4Backend


def resolve_backend_request(name: str, fmt: str, selection_style: str) -> tuple[str, str | None]:
    """Turn what a user passed as a backend into (--moe-backend name for the selection, backend the
    result must be). Accepted: "auto", vLLM's --moe-backend names, and the enum names mxconvert
    prints (any case; MXFP4's old name CK). An enum name selects through the --moe-backend name vLLM
    would need to reach it (or "auto" where the revision has none, e.g. env-only revisions), and the
    caller refuses the result if vLLM's choice is another backend."""
    from mxconvert.core.errors import InputError

    text = name.strip()
    names, unsupported = _style_names(fmt, selection_style)
    lower = text.lower().replace("-", "_")
    if lower == "auto" or lower in names or lower in unsupported:
        return lower, None
    enum = enum_of(fmt)
    try:
        wanted = enum.parse(text).value
    except ValueError:
        valid = ["auto", *names, *(b.value for b in enum)]
        raise InputError(f"unknown backend {name!r} for {fmt.upper()}; valid: {', '.join(valid)}") from None
    via = _BATCHED_OF.get(wanted, wanted)
    carriers = sorted((len(bs), n) for n, bs in names.items() if any(b.value == via for b in bs))
    return (carriers[0][1] if carriers else "auto"), wanted


def moe_backend_name_for(backend: str, fmt: str, selection_style: str) -> str | None:
    """The --moe-backend name that reaches `backend` (enum value) in this style, if any."""
    names, _ = _style_names(fmt, selection_style)
    via = _BATCHED_OF.get(backend, backend)
    carriers = sorted((len(bs), n) for n, bs in names.items() if any(b.value == via for b in bs))
    return carriers[0][1] if carriers else None


def backend_matches(actual: str, wanted: str, fmt: str = "mxfp4", selection_style: str | None = None) -> bool:
    """Whether an artifact's backend (enum value) is what `wanted` names: the enum name in any case,
    or a --moe-backend name of the artifact's runtime that can select it (`triton` -> TRITON)."""
    if not isinstance(wanted, str) or not isinstance(actual, str):
        return actual == wanted
    if wanted.strip().upper() == actual.upper() or (
        fmt == "mxfp4" and wanted.strip().upper() in ("CK", "AITER") and actual == "AITER_MXFP4_BF16"
    ):
        return True
    from mxconvert.selection import NVFP4_SELECTION_STYLES, SELECTION_STYLES

    styles = NVFP4_SELECTION_STYLES if fmt == "nvfp4" else SELECTION_STYLES
    keys = [selection_style] if selection_style else list(styles)
    lower = wanted.strip().lower().replace("-", "_")
    via = _BATCHED_OF.get(actual, actual)
    return any(b.value in (actual, via) for key in keys if key in styles for b in styles[key].names.get(lower, ()))


# ---- the list `mxconvert backends` prints ------------------------------------------------------------
#: Model shapes the "selected on" column assumes (GPT-OSS-120B; a Qwen3-30B-A3B-sized NVFP4 MoE).
_SHAPES: dict[str, dict[str, Any]] = {
    "mxfp4": {"hidden_size": 2880},
    "nvfp4": {"hidden_size": 2048, "intermediate_size": 768},
}


def backend_rows() -> list[dict]:
    """Every backend of every format and runtime revision: its --moe-backend name and the built-in
    profiles on which the revision selects it by
    default (single GPU, BF16 activations for MXFP4, NVFP4 activations for NVFP4)."""
    from mxconvert.core.errors import MxconvertError
    from mxconvert.selection import (
        NVFP4_SELECTION_STYLES,
        SELECTION_STYLES,
        Deployment,
        select_backend,
        select_nvfp4_backend,
    )
    from mxconvert.target.profiles import BUILTIN_PROFILES
    from mxconvert.target.revisions import REVISIONS

    rows = []
    for fmt in ("mxfp4", "nvfp4"):
        styles = NVFP4_SELECTION_STYLES if fmt == "nvfp4" else SELECTION_STYLES
        for rev in REVISIONS.values():
            if fmt not in rev.formats or rev.selection not in styles:
                continue
            chosen: dict[str, list[str]] = {}
            for prof in BUILTIN_PROFILES:
                try:
                    if fmt == "nvfp4":
                        sel = select_nvfp4_backend(prof, rev, Deployment(), "auto", **_SHAPES[fmt])
                    else:
                        sel = select_backend(prof, rev, Deployment(), "auto", **_SHAPES[fmt])
                except MxconvertError:
                    continue
                chosen.setdefault(sel.backend.value, []).append(prof.name)
            style = styles[rev.selection]
            order = list(
                dict.fromkeys(
                    [*style.priority, *(b for bs in style.names.values() for b in bs), *style.batched_variants.values()]
                )
            )
            for backend in order:
                rows.append(
                    {
                        "format": fmt,
                        "revision": rev.name,
                        "vllm": rev.versions,
                        "backend": backend.value,
                        "moe_backend": moe_backend_name_for(backend.value, fmt, rev.selection),
                        "selected_on": chosen.get(backend.value, []),
                    }
                )
    return rows


#: A backend of either format (selection reports and layout targets hold one or the other).
Backend = Mxfp4Backend | Nvfp4Backend
