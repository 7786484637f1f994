"""Selection records (tests/golden/selection/vllm-X.Y.Z-FORMAT.json, made by record_selection.py)
against mxconvert's revision rows: which entries a row's selection mirror reproduces.

An entry is (profile, deployment, --moe-backend request) -> what the release's own selection did:
a backend and kernel class, or a refusal. Where the release returns no kernel class (NVFP4
FlashInfer TRTLLM and the VLLM_USE_FLASHINFER_MOE_FP4 branch before 0.24) only the backend is
compared. A row reproduces an entry when mxconvert's selection for the row returns the same
backend and class, or refuses (`UnsupportedError`) where vLLM refused or picked a backend mxconvert
has no enum member for; refusing a name the row knows but cannot lay out (`unsupported_names`) is
always right. A row reproduces a record when it accepts the same request names (its
`--moe-backend` names and the names it knows but refuses) and reproduces every entry (but those
the release could not evaluate: `not_evaluated`). Used by
tests/test_selection_records.py and selection_table.py; needs no vLLM.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.selection import Deployment, select_backend, select_nvfp4_backend
from mxconvert.selection.mxfp4 import style_for
from mxconvert.selection.nvfp4 import nvfp4_style_for
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile, get_profile
from mxconvert.target.revisions import REVISIONS, RuntimeRevision

REPO = Path(__file__).resolve().parents[2]
RECORDS_DIR = REPO / "tests" / "golden" / "selection"
FORMATS = ("mxfp4", "nvfp4")
_VALUES: dict[str, frozenset[str]] = {
    "mxfp4": frozenset(m.value for m in Mxfp4Backend),
    "nvfp4": frozenset(m.value for m in Nvfp4Backend),
}
REFUSED = "refused"

#: Backend values older releases use for what mxconvert (and vLLM 0.33.0) call otherwise: the
#: AITER CK MXFP4 backend is `CK` in 0.19 and `AITER` in 0.20-0.21 (`Mxfp4MoeBackend`).
BACKEND_ALIASES: dict[str, dict[str, str]] = {"mxfp4": {"CK": "AITER_MXFP4_BF16", "AITER": "AITER_MXFP4_BF16"}}


#: Selection styles that no row uses yet, each with the row a row for it would be copied from (a
#: row's selection reads only its `selection` field; the bytes fields are the new row's business).
UNUSED_STYLES: dict[str, dict[str, str]] = {"mxfp4": {}, "nvfp4": {}}


def mirrors(fmt: str) -> dict[str, RuntimeRevision]:
    """Label -> row, for every row of `fmt` ("vllm-0.26") and every style in UNUSED_STYLES
    ("vllm-0.26+oracle-0.27": a copy of the row with that selection)."""
    out = {row.name: row for row in REVISIONS.values() if fmt in row.formats}
    for style, base in UNUSED_STYLES[fmt].items():
        out[f"{base}+{style}"] = replace(REVISIONS[base], selection=style)
    return out


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def record_files() -> list[Path]:
    """Every committed record, by format then release."""
    files = [p for p in RECORDS_DIR.glob("vllm-*-*.json") if p.stem.rsplit("-", 1)[1] in FORMATS]
    return sorted(files, key=lambda p: (p.stem.rsplit("-", 1)[1], release_key(p.stem.split("-")[1])))


@functools.cache
def load(path: Path) -> dict:
    return json.loads(path.read_text())


def entries(record: dict) -> list[list]:
    """The record's entries as [profile, deployment, request, backend, kernel class], with
    backend None and the refusal text in place of the class where the release refused (cached)."""
    key = id(record)
    if key not in _ENTRIES:
        names, outcomes = record["moe_backend_names"], record["outcomes"]
        rows = [
            [profile, deployment, names[i], *outcomes[o]]
            for profile, by_deployment in record["table"].items()
            for deployment, row in by_deployment.items()
            for i, o in enumerate(row)
        ]
        _ENTRIES[key] = (record, rows)  # the record is kept, so its id is not reused
    return _ENTRIES[key][1]


_ENTRIES: dict[int, tuple[dict, list[list]]] = {}


def not_evaluated(record: dict, entry: list) -> bool:
    """An entry the release could not evaluate in the recording environment: its backend module
    imports a library that is not installed there (humming in 0.22-0.24), so vLLM raised
    ImportError. It says nothing about a profile that has the library and is not compared."""
    return entry[3] is None and entry[4].startswith(("ImportError", "ModuleNotFoundError"))


def expected(record: dict, entry: list) -> tuple[str, str] | str:
    """What mxconvert must answer for `entry`: (backend, kernel class), or REFUSED where vLLM
    refused or chose a backend mxconvert has no member for (it cannot lay it out)."""
    backend, kernel = entry[3], entry[4]
    backend = BACKEND_ALIASES.get(record["format"], {}).get(backend, backend)
    if backend is None or backend not in _VALUES[record["format"]]:
        return REFUSED
    return backend, kernel


def profile_of(record: dict, name: str) -> DeviceProfile:
    """A built-in profile, or one of the record's `profile_variants` (a built-in profile with
    library flags changed)."""
    if name in record.get("profile_variants", {}):
        base, fields = record["profile_variants"][name]
        return replace(get_profile(base), name=name, **fields)
    return get_profile(name)


@functools.cache
def _outcome(
    revision: RuntimeRevision, fmt: str, profile: DeviceProfile, deployment: str, request: str, model: str
) -> tuple[str, str] | str:
    dep = Deployment(**json.loads(deployment))
    try:
        if fmt == "mxfp4":
            s = select_backend(profile, revision, dep, request)
        else:
            s = select_nvfp4_backend(profile, revision, dep, request, **json.loads(model))
    except UnsupportedError:
        return REFUSED
    except InputError as err:
        return f"input error: {err}"
    return s.backend.value, s.kernel_class


def outcome(row: RuntimeRevision, record: dict, entry: list) -> tuple[str, str] | str:
    """mxconvert's answer for `entry` under `row` (cached: records share profiles and deployments)."""
    deployment = json.dumps(record["deployments"][entry[1]], sort_keys=True)
    model = json.dumps(record.get("model_args", {}), sort_keys=True)
    return _outcome(row, record["format"], profile_of(record, entry[0]), deployment, entry[2], model)


def _style(row: RuntimeRevision, fmt: str):
    return style_for(row) if fmt == "mxfp4" else nvfp4_style_for(row)


def row_names(row: RuntimeRevision, fmt: str) -> set[str]:
    """The request names `row` accepts or knows and refuses ("auto" included)."""
    style = _style(row, fmt)
    return {"auto", *style.names, *style.unsupported_names}


def differences(row: RuntimeRevision, record: dict, limit: int | None = None) -> Iterator[str]:
    """Every way `row` does not reproduce `record` (nothing when it does)."""
    fmt = record["format"]
    if fmt not in row.formats:
        yield f"row {row.name} has no {fmt} selection"
        return
    names, known = set(record["moe_backend_names"]), row_names(row, fmt)
    if names != known:
        yield f"request names: vLLM only {sorted(names - known)}, mxconvert only {sorted(known - names)}"
    count = 0
    refused_names = frozenset(_style(row, fmt).unsupported_names)
    for entry in entries(record):
        if not_evaluated(record, entry):
            continue
        want, got = expected(record, entry), outcome(row, record, entry)
        if got == REFUSED and entry[2] in refused_names:
            continue  # a name the row knows but cannot lay out: refusing it is always right
        if isinstance(want, tuple) and want[1] is None and isinstance(got, tuple):
            got = (got[0], None)  # the release returned no kernel class (0.15-0.23 NVFP4 FlashInfer)
        if want != got:
            count += 1
            if limit is None or count <= limit:
                yield f"{entry[0]} {entry[1]} {entry[2]}: vLLM {want}, mxconvert {got}"
    if limit is not None and count > limit:
        yield f"... {count - limit} more entries differ"


def reproduces(row: RuntimeRevision, record: dict) -> bool:
    return next(differences(row, record), None) is None
