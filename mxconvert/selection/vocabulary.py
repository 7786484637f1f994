"""The backend vocabulary: what a user may call a backend, and the `mxconvert backends` table.

A backend has two kinds of names: its enum value (`Mxfp4Backend`, `Nvfp4Backend`, what mxconvert
prints and records) and the vLLM `--moe-backend` names of the runtime revision's selection style
that can reach it. The functions here translate between them per weight format, with one row per
format (`FORMATS`) instead of branches on the format's name. The enums themselves are
`target/backends.py`; the styles are the oracles of `selection/`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from mxconvert.core.errors import InputError, MxconvertError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.engine import SelectionStyle
from mxconvert.selection.mxfp4 import SELECTION_STYLES, select_backend
from mxconvert.selection.nvfp4 import NVFP4_SELECTION_STYLES, select_nvfp4_backend
from mxconvert.selection.report import FORMAT_ENUMS, UNTAGGED_FORMAT, Selection
from mxconvert.selection.sglang import mxfp4_0_5_23 as sglang_mxfp4
from mxconvert.selection.sglang import nvfp4_0_5_23 as sglang_nvfp4
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import BUILTIN_PROFILES, DeviceProfile, close_matches, did_you_mean
from mxconvert.target.revisions import REVISIONS, RuntimeRevision
from mxconvert.target.sglang_revisions import SGLANG_REVISIONS, unproven_layout_reason


@dataclass(frozen=True)
class FormatVocabulary:
    """One weight format's backend names and selection styles."""

    #: The backend enum (its `parse` knows the format's aliases, e.g. MXFP4's old name CK).
    enum: type[Mxfp4Backend] | type[Nvfp4Backend]
    #: The selection styles of the format's oracles, by the revision row's `selection` name.
    styles: Mapping[str, SelectionStyle]
    #: The default selection the `backends` table reports: single GPU, "auto", on a model of the
    #: format's usual shape (GPT-OSS-120B; a Qwen3-30B-A3B-sized NVFP4 MoE).
    select_default: Callable[[DeviceProfile, RuntimeRevision], Selection]


#: Every weight format's vocabulary, in the order `mxconvert backends` lists them.
FORMATS: dict[str, FormatVocabulary] = {
    "mxfp4": FormatVocabulary(
        FORMAT_ENUMS["mxfp4"],
        SELECTION_STYLES,
        lambda profile, revision: select_backend(profile, revision, Deployment(), "auto", hidden_size=2880),
    ),
    "nvfp4": FormatVocabulary(
        FORMAT_ENUMS["nvfp4"],
        NVFP4_SELECTION_STYLES,
        lambda profile, revision: select_nvfp4_backend(
            profile, revision, Deployment(), "auto", hidden_size=2048, intermediate_size=768
        ),
    ),
}

#: Backends vLLM reaches only through another's --moe-backend name plus the batched format.
_BATCHED_OF = {"BATCHED_MARLIN": "MARLIN", "FLASHINFER_CUTEDSL_BATCHED": "FLASHINFER_CUTEDSL"}


def vocabulary_of(fmt: str) -> FormatVocabulary:
    """The vocabulary of weight format `fmt`; a name no format has reads as the untagged format's
    (MXFP4, as selection JSON without a "format" key does: report.py)."""
    return (FORMATS.get(fmt) if isinstance(fmt, str) else None) or FORMATS[UNTAGGED_FORMAT]


def styles_of(fmt: str) -> Mapping[str, SelectionStyle]:
    """The selection styles of weight format `fmt`, by name."""
    return vocabulary_of(fmt).styles


def enum_of(fmt: str) -> type[Mxfp4Backend] | type[Nvfp4Backend]:
    """The backend enum of weight format `fmt`."""
    return vocabulary_of(fmt).enum


def _style_names(fmt: str, selection_style: str) -> tuple[dict, dict]:
    """(--moe-backend name -> backends, unsupported names) of a format's selection style; for an SGLang
    row, its --moe-runner-backend names (the ones that reach a backend, and the rest it refuses)."""
    if fmt == "mxfp4" and selection_style == sglang_mxfp4.STYLE_NAME:
        reaching = {n: b for n, b in sglang_mxfp4.RUNNER_BACKENDS.items() if n != "auto"}
        others = (*(n for n in sglang_mxfp4.RUNNER_NAMES if n not in sglang_mxfp4.RUNNER_BACKENDS),)
        return reaching, dict.fromkeys((*others, *sglang_mxfp4.OTHER_RUNNER_NAMES), ())
    if fmt == "nvfp4" and selection_style == sglang_nvfp4.STYLE_NAME:
        reaching_nvfp4 = dict(sglang_nvfp4.RUNNER_BACKENDS)
        rest = (*(n for n in sglang_nvfp4.RUNNER_NAMES if n not in reaching_nvfp4 and n != "auto"),)
        return reaching_nvfp4, dict.fromkeys((*rest, *sglang_nvfp4.OTHER_RUNNER_NAMES), ())
    style = styles_of(fmt).get(selection_style)
    if style is None:
        return {}, {}
    return dict(style.names), dict(style.unsupported_names)


def resolve_backend_request(name: str, fmt: str, selection_style: str) -> tuple[str, str | None]:
    """Turn what a user passed as a backend into (--moe-backend name for the selection, backend the
    result must be). Accepted: "auto", vLLM's --moe-backend names, and the enum names mxconvert
    prints (any case; MXFP4's old name CK). An enum name selects through the --moe-backend name vLLM
    would need to reach it (or "auto" where the revision has none, e.g. env-only revisions), and the
    caller refuses the result if vLLM's choice is another backend."""
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
        # --moe-backend names (supported or not here) and enum names are compared, in any case
        known = [*valid, *unsupported]
        close = did_you_mean(close_matches(text, known, key=lambda n: n.lower().replace("-", "_")))
        raise InputError(f"unknown backend {name!r} for {fmt.upper()}{close}; valid: {', '.join(valid)}") from None
    via = _BATCHED_OF.get(wanted, wanted)
    carriers = sorted((len(bs), n) for n, bs in names.items() if any(b.value == via for b in bs))
    return (carriers[0][1] if carriers else "auto"), wanted


def moe_backend_name_for(backend: str, fmt: str, selection_style: str) -> str | None:
    """The --moe-backend name that reaches `backend` (enum value) in this style, if any."""
    names, _ = _style_names(fmt, selection_style)
    via = _BATCHED_OF.get(backend, backend)
    carriers = sorted((len(bs), n) for n, bs in names.items() if any(b.value == via for b in bs))
    return carriers[0][1] if carriers else None


def backend_matches(actual: str, wanted: str, fmt: str = UNTAGGED_FORMAT, selection_style: str | None = None) -> bool:
    """Whether an artifact's backend (enum value) is what `wanted` names: the enum name in any case
    (or an alias the format's enum parses, e.g. MXFP4's CK), or a --moe-backend name of the
    artifact's runtime that can select it (`triton` -> TRITON)."""
    if not isinstance(wanted, str) or not isinstance(actual, str):
        return actual == wanted
    if wanted.strip().upper() == actual.upper() or _parses_to(enum_of(fmt), wanted) == actual:
        return True
    styles = styles_of(fmt)
    keys = [selection_style] if selection_style else list(styles)
    lower = wanted.strip().lower().replace("-", "_")
    via = _BATCHED_OF.get(actual, actual)
    return any(b.value in (actual, via) for key in keys if key in styles for b in styles[key].names.get(lower, ()))


def _parses_to(enum: type[Mxfp4Backend] | type[Nvfp4Backend], name: str) -> str | None:
    """The enum value `name` parses to, or None when it names no backend of `enum`."""
    try:
        return enum.parse(name).value
    except ValueError:
        return None


# ---- the list `mxconvert backends` prints ------------------------------------------------------------
#: Why `convert` does not write a backend that has no layout at all (the `mxconvert backends` table).
NO_LAYOUT = "no layout in this version of mxconvert: select reports it, convert refuses it"


def backend_rows(laid_out: Callable[[str], Collection[str]] | None = None) -> list[dict]:
    """Every backend of every format and runtime revision: its --moe-backend name and the built-in
    profiles on which the revision selects it by
    default (single GPU, BF16 activations for MXFP4, NVFP4 activations for NVFP4).

    With `laid_out` (format name -> the backend names that have a layout; layouts/registry.py
    `supported_backends`, which this stage cannot import), each row also says whether `convert`
    writes the backend under that revision (`writable`) and, where not, why (`not_writable`: the
    revision row's `unproven_layouts` reason, or `NO_LAYOUT`); `select` reports every backend."""
    rows = []
    for fmt, vocabulary in FORMATS.items():
        styles = vocabulary.styles
        for rev in REVISIONS.values():
            if fmt not in rev.formats or rev.selection not in styles:
                continue
            chosen: dict[str, list[str]] = {}
            for prof in BUILTIN_PROFILES:
                try:
                    sel = vocabulary.select_default(prof, rev)
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
                        **({} if laid_out is None else _writable(backend.value, rev, laid_out(fmt), fmt)),
                    }
                )
    for sglang_row in SGLANG_REVISIONS.values():  # SGLang's rows last (docs/sglang.md)
        sglang_rows = sglang_mxfp4.backend_rows(sglang_row, BUILTIN_PROFILES)
        if sglang_nvfp4.FORMAT in sglang_row.formats:
            sglang_rows += sglang_nvfp4.backend_rows(sglang_row, BUILTIN_PROFILES)
        for row in sglang_rows:
            fmt = row["format"]
            writable = {} if laid_out is None else _writable(row["backend"], sglang_row, laid_out(fmt), fmt)
            rows.append({**row, **writable})
    return rows


def _writable(backend: str, revision: RuntimeRevision, laid_out: Collection[str], fmt: str = "mxfp4") -> dict:
    """`writable` and `not_writable` of a `backend_rows` row (the checks layouts/registry.py
    `build_layout` makes before it lays a backend out, in its order)."""
    reason = unproven_layout_reason(revision, fmt, backend)
    if reason is None and backend not in laid_out:
        reason = NO_LAYOUT
    elif reason is not None:
        reason = f"bytes not proven yet: {reason}"
    return {"writable": reason is None, "not_writable": reason}
