"""The vLLM releases behind the runtime revision rows: `--runtime` resolved to a row.

A revision row (mxconvert/target/revisions.py) is one set of backend selections and weight
preparations; its `releases` field names, per model format, the vLLM releases that run exactly
that code (the first is the reference release its mirrors and goldens come from). This module
is the only place that reads release numbers: it parses them, orders them, finds the row that
covers one, and names the nearest covered ones when none does. Everything else asks the row.

`--runtime` grammar (docs/selection.md, "Runtime revisions and vLLM releases"):

    auto            the installed vLLM's release when vLLM is installed (read from its package
                    metadata, vLLM is never imported), otherwise the newest row (DEFAULT_REVISION)
    vllm==X.Y.Z     that vLLM release; refused unless a row covers it for the model's format
    vllm-0.33 ...   a row by name or alias (`get_revision`), as before
    sglang==X.Y.Z   that SGLang release (target/sglang_revisions.py, docs/sglang.md)
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from dataclasses import dataclass

from mxconvert.core.errors import InputError
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.revisions import DEFAULT_REVISION, REVISIONS, RuntimeRevision, get_revision
from mxconvert.target.sglang_revisions import (
    SGLANG_REVISIONS,
    get_sglang_revision,
    sglang_coverage,
    sglang_row_for_release,
)

#: Every vLLM release from 0.15.0 to 0.33.0 on the package index, oldest first (the research
#: record the rows were checked against lists the same 28). Only used to print the releases a row
#: covers as ranges and to list the ones nothing covers; whether a release is covered is the rows'.
KNOWN_RELEASES: tuple[str, ...] = (
    "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1",
    "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
    "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
    "0.33.0",
)  # fmt: skip

#: How a refusal names a model format.
FORMAT_LABELS = {"mxfp4": "GPT-OSS MXFP4", "nvfp4": "NVFP4"}

_RELEASE = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
_PIN = "vllm=="
_SGLANG_PIN = "sglang=="


@dataclass(frozen=True)
class ResolvedRuntime:
    """What `--runtime` resolved to: the row, and the vLLM release asked for (None when a row was
    named, or `auto` found no vLLM installed); `source` says how ("named", "release", "installed",
    "default")."""

    revision: RuntimeRevision
    release: str | None
    source: str


def release_key(release: str) -> tuple[int, int, int]:
    """`"0.20.1"` -> (0, 20, 1): the order of releases. Raises ValueError for anything that is
    not three dot-separated numbers without leading zeros."""
    match = _RELEASE.fullmatch(release)
    if match is None:
        raise ValueError(f"not a release number X.Y.Z: {release!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def covered(fmt: str) -> list[tuple[str, RuntimeRevision]]:
    """Every (release, row) covered for `fmt`, oldest release first."""
    pairs = [(release, row) for row in REVISIONS.values() for release in row.releases.get(fmt, ())]
    return sorted(pairs, key=lambda pair: release_key(pair[0]))


def row_for_release(release: str, fmt: str) -> RuntimeRevision | None:
    """The row that covers `release` for `fmt`, or None."""
    for known, row in covered(fmt):
        if known == release:
            return row
    return None


def release_ranges(releases: tuple[str, ...] | list[str]) -> list[str]:
    """Releases as runs of consecutive known releases: ("0.20.0", "0.20.1", "0.20.2") ->
    ["0.20.0-0.20.2"]; a release outside KNOWN_RELEASES stands alone."""
    ordered = sorted(releases, key=release_key)
    runs: list[list[str]] = []
    for release in ordered:
        previous = runs[-1][-1] if runs else None
        if (
            previous in KNOWN_RELEASES
            and release in KNOWN_RELEASES
            and KNOWN_RELEASES.index(release) == KNOWN_RELEASES.index(previous) + 1
        ):
            runs[-1].append(release)
        else:
            runs.append([release])
    return [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]


def coverage_text(fmt: str) -> str:
    """`0.20.0-0.20.2 (vllm-0.20), 0.33.0 (vllm-0.33)`: what is covered for `fmt`, by row."""
    parts: list[str] = []
    for row in sorted(
        (r for r in REVISIONS.values() if r.releases.get(fmt)), key=lambda r: release_key(r.releases[fmt][0])
    ):
        parts.extend(f"{text} ({row.name})" for text in release_ranges(row.releases[fmt]))
    return ", ".join(parts) or "none"


def nearest(release: str, fmt: str) -> list[str]:
    """The newest covered release before `release` and the oldest after it (either may be missing)."""
    key = release_key(release)
    releases = [r for r, _ in covered(fmt)]
    below = [r for r in releases if release_key(r) < key]
    above = [r for r in releases if release_key(r) > key]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _not_covered(what: str, release: str, fmt: str, hint: str = "") -> InputError:
    near = nearest(release, fmt)
    named = f"; the nearest {'are ' + ' and '.join(near) if len(near) == 2 else 'is ' + near[0]}" if near else ""
    return InputError(
        f"{what} {release} is not covered for {FORMAT_LABELS.get(fmt, fmt)}; covered: {coverage_text(fmt)}{named}{hint}"
    )


def installed_vllm() -> str | None:
    """The installed vLLM's version from its package metadata, or None when it is not installed.
    vLLM itself is never imported (it is slow to import and may need a GPU)."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed_release(fmt: str) -> ResolvedRuntime:
    version = installed_vllm()
    if version is None:
        return ResolvedRuntime(get_revision(DEFAULT_REVISION, fmt), None, "default")
    hint = "; pass --runtime vllm==X.Y.Z or a revision name to convert for another release"
    public = version.split("+", 1)[0]  # a local build label (`0.33.0+cu130`) is the same release
    try:
        release_key(public)
    except ValueError:
        raise InputError(
            f"--runtime auto: the installed vLLM {version!r} is not a release (X.Y.Z); covered for "
            f"{FORMAT_LABELS.get(fmt, fmt)}: {coverage_text(fmt)}{hint}"
        ) from None
    row = row_for_release(public, fmt)
    if row is None:
        raise _not_covered("--runtime auto: the installed vLLM", public, fmt, hint)
    return ResolvedRuntime(row, public, "installed")


def resolve_runtime(spec: str | None, fmt: str) -> ResolvedRuntime:
    """`--runtime` for a model of format `fmt` (`"mxfp4"` or `"nvfp4"`).

    Args:
        spec (`str`, *optional*):
            `None` or `"auto"`, `"vllm==X.Y.Z"`, or a row name or alias (`"vllm-0.33"`, `"0.20"`).
        fmt (`str`):
            The model's weight format; a release must be covered for it.

    Returns:
        `ResolvedRuntime`: the row, the release asked for (None for a row name, and for `auto`
        without vLLM installed) and how it was resolved.

    Raises:
        `InputError`: a malformed release, a release no row covers for `fmt` (the message names
            the covered releases and the nearest ones), an installed vLLM that is not covered, or
            what `get_revision` refuses.
    """
    text = (spec or "auto").strip()
    if text.lower() == "auto":
        return _installed_release(fmt)
    if text.lower().startswith(_PIN):
        release = text[len(_PIN) :].strip()
        try:
            release_key(release)
        except ValueError:
            raise InputError(
                f"--runtime {spec!r}: not a vLLM release (expected vllm==X.Y.Z, e.g. vllm==0.33.0); "
                f"covered for {FORMAT_LABELS.get(fmt, fmt)}: {coverage_text(fmt)}"
            ) from None
        row = row_for_release(release, fmt)
        if row is None:
            raise _not_covered("vLLM", release, fmt)
        return ResolvedRuntime(row, release, "release")
    if text.lower().startswith(_SGLANG_PIN):
        return _sglang_release(spec, text[len(_SGLANG_PIN) :].strip(), fmt)
    if text.lower().startswith("sglang-"):
        return ResolvedRuntime(get_sglang_revision(text, fmt), None, "named")
    return ResolvedRuntime(get_revision(text, fmt), None, "named")


def _sglang_release(spec: str | None, release: str, fmt: str) -> ResolvedRuntime:
    """`--runtime sglang==X.Y.Z`: the SGLang row covering that release (docs/sglang.md)."""
    try:
        release_key(release)
    except ValueError:
        raise InputError(
            f"--runtime {spec!r}: not an SGLang release (expected sglang==X.Y.Z, e.g. sglang==0.5.23); "
            f"covered for {FORMAT_LABELS.get(fmt, fmt)}: {sglang_coverage(fmt)}"
        ) from None
    row = sglang_row_for_release(release, fmt)
    if row is None:
        raise InputError(
            f"SGLang {release} is not covered for {FORMAT_LABELS.get(fmt, fmt)}; covered: {sglang_coverage(fmt)}"
        )
    return ResolvedRuntime(row, release, "release")


#: Version of the JSON `mxconvert runtimes --json` prints.
RUNTIMES_JSON_SCHEMA = "mxconvert.runtimes/1"

#: The row fields `mxconvert runtimes` compares between rows (those that change bytes or choices),
#: each with the format it belongs to (None: both); a row without that format shows None for it.
DIFFERING_FIELDS: dict[str, str | None] = {
    "triton_kernels": None,
    "flashinfer": None,
    "selection": None,
    "sm90_triton_scale_pad4": "mxfp4",
    "cdna4_scale_max_tp": "mxfp4",
    "hopper_scale_overread": "mxfp4",
    "cutlass_sm90_layout": "mxfp4",
    "triton_sm12x_opt_flags": "mxfp4",
    "nvfp4_fold_global_scales": "nvfp4",
    "nvfp4_fi_padding": "nvfp4",
    "nvfp4_cutedsl_prepare": "nvfp4",
    "nvfp4_marlin_scales": "nvfp4",
}


def _json_value(value):
    return list(value) if isinstance(value, tuple) else value


def trtllm_round_up(row: RuntimeRevision) -> dict | None:
    """The MXFP4 round-up rule of FLASHINFER_TRTLLM on CUDA in `row` (its intermediate and hidden
    alignment), or None when the row defines no MXFP4 layouts."""
    if "mxfp4" not in row.formats:
        return None
    for rule in row.mxfp4_round_up:
        if rule.matches(Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_BF16, "cuda"):
            return {"intermediate_align": rule.intermediate_align, "hidden_align": rule.hidden_align}
    return None  # pragma: no cover - the last rule of every row matches everything


def runtimes_document(backends: Mapping[str, Mapping[str, list[str]]]) -> dict:
    """What `mxconvert runtimes --json` prints: every row with the releases it covers per format,
    the fields that change bytes or choices, its MXFP4 TRTLLM round-up and its backends
    (`backends[row name][format]`, from the selection the row names: the caller lists them, as
    target/ does not import selection/), which of those differ between rows, and per format the
    known releases that no row covers."""
    rows: list[dict] = []
    for row in (*REVISIONS.values(), *SGLANG_REVISIONS.values()):  # SGLang's rows last (docs/sglang.md)
        fmts = sorted(row.formats)
        rows.append(
            {
                "name": row.name,
                "runtime": row.runtime,
                "versions": row.versions,
                "formats": fmts,
                "releases": {fmt: list(row.releases.get(fmt, ())) for fmt in fmts},
                "release_ranges": {fmt: release_ranges(row.releases.get(fmt, ())) for fmt in fmts},
                "fields": {
                    **{
                        name: _json_value(getattr(row, name)) if fmt is None or fmt in row.formats else None
                        for name, fmt in DIFFERING_FIELDS.items()
                    },
                    "mxfp4_trtllm_round_up": trtllm_round_up(row),
                },
                "backends": {fmt: list(backends.get(row.name, {}).get(fmt, [])) for fmt in fmts},
                # backends the row selects but convert does not write yet, with the reason
                "unproven_layouts": dict(row.unproven_layouts),
                "notes": row.notes,
            }
        )
    names = [*DIFFERING_FIELDS, "mxfp4_trtllm_round_up"]
    differing = [name for name in names if len({repr(r["fields"][name]) for r in rows}) > 1]
    uncovered = {fmt: [r for r in KNOWN_RELEASES if row_for_release(r, fmt) is None] for fmt in sorted(FORMAT_LABELS)}
    return {
        "schema": RUNTIMES_JSON_SCHEMA,
        "default": DEFAULT_REVISION,
        "installed_vllm": installed_vllm(),
        "rows": rows,
        "differing_fields": differing,
        "uncovered": uncovered,
    }
