"""mxconvert selects what each vLLM release itself selects, for every entry of its selection record.

tests/golden/selection/vllm-X.Y.Z-FORMAT.json was made by RUNNING release X.Y.Z's own oracle on
CPU with the device stood in per profile (tools/vllm_releases/record_selection.py): every built-in
profile x `--moe-backend` request ("auto" and every name the release accepts) x deployment (TP, EP,
DP, EPLB, LoRA, an activation request, the all2all kinds, batched included, and the release's VLLM_*
overrides set to 1 and 0). No vLLM is needed here.

A release covered by a row (`--runtime vllm==X.Y.Z`) must be reproduced by that row, entry for
entry. For a release no row covers yet, `SELECTION_MIRRORS` names the row whose selection mirror
reproduces its record ("vllm-0.26+oracle-0.27": a copy of vllm-0.26 with the selection style no
row uses yet; tools/vllm_releases/selection_records.py `mirrors`). The bytes decide whether a row
may cover the release (docs/releases.md). `NOT_MIRRORED` lists the releases no row's mirror
reproduces, with what differs. Both lists are checked, so neither can go stale.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from mxconvert.selection import Deployment, select_backend
from mxconvert.target.profiles import BUILTIN_PROFILES, get_profile
from mxconvert.target.releases import resolve_runtime, row_for_release
from mxconvert.target.revisions import get_revision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "vllm_releases"))

import selection_records as sr  # noqa: E402

FILES = sr.record_files()
RECORDS = {(sr.load(p)["format"], sr.load(p)["vllm"]): sr.load(p) for p in FILES}

#: (format, release) -> the row whose selection mirror reproduces the release's record, for
#: releases no row covers (a covered release is checked against its own row).
SELECTION_MIRRORS: dict[tuple[str, str], str] = {}

#: (format, release) -> why no row's selection mirror reproduces the release's record.
NOT_MIRRORED: dict[tuple[str, str], str] = {}


def _ids(keys):
    return [f"{fmt}-{release}" for fmt, release in keys]


def test_there_are_records():
    assert ("mxfp4", "0.26.0") in RECORDS and ("mxfp4", "0.33.0") in RECORDS


@pytest.mark.parametrize("key", sorted(RECORDS), ids=_ids(sorted(RECORDS)))
def test_record_is_complete(key):
    """One entry per profile x deployment x request, for every built-in profile."""
    record = RECORDS[key]
    assert (record["format"], record["vllm"]) == key
    assert record["generator"] == "tools/vllm_releases/record_selection.py"
    assert record["schema"] == "mxconvert.selection-record/2"
    entries = sr.entries(record)
    keys = Counter((e[0], e[1], e[2]) for e in entries)
    assert set(keys.values()) == {1}
    assert {k[0] for k in keys} == {p.name for p in BUILTIN_PROFILES} | set(record.get("profile_variants", {}))
    assert {k[1] for k in keys} == set(record["deployments"])
    assert {k[2] for k in keys} == set(record["moe_backend_names"])
    profiles = len(BUILTIN_PROFILES) + len(record.get("profile_variants", {}))
    assert len(entries) == profiles * len(record["deployments"]) * len(record["moe_backend_names"])
    for by_deployment in record["table"].values():
        assert all(len(row) == len(record["moe_backend_names"]) for row in by_deployment.values())
    for backend, kernel_or_refusal in record["outcomes"]:
        assert isinstance(kernel_or_refusal, str) or (backend is not None and kernel_or_refusal is None)


@pytest.mark.parametrize("key", sorted(RECORDS), ids=_ids(sorted(RECORDS)))
def test_mxconvert_reproduces_the_release(key):
    """The covered release's row (`--runtime vllm==X.Y.Z`), or the row named in SELECTION_MIRRORS,
    answers every entry as the release did; a release in neither is in NOT_MIRRORED."""
    fmt, release = key
    if row_for_release(release, fmt) is not None:
        row = resolve_runtime(f"vllm=={release}", fmt).revision
    elif key in SELECTION_MIRRORS:
        row = sr.mirrors(fmt)[SELECTION_MIRRORS[key]]
    else:
        assert key in NOT_MIRRORED, f"{fmt} {release}: no row covers or mirrors it; add it to NOT_MIRRORED"
        return
    assert key not in NOT_MIRRORED
    diffs = list(sr.differences(row, RECORDS[key], limit=20))
    assert not diffs, f"{row.name} does not reproduce vLLM {release} ({fmt}):\n" + "\n".join(diffs)


@pytest.mark.parametrize("key", sorted(NOT_MIRRORED), ids=_ids(sorted(NOT_MIRRORED)))
def test_not_mirrored_releases_are_reproduced_by_no_row(key):
    record = RECORDS[key]
    assert not [label for label, row in sr.mirrors(key[0]).items() if sr.reproduces(row, record)]


def test_the_lists_name_records_and_rows():
    for key, label in SELECTION_MIRRORS.items():
        assert key in RECORDS and label in sr.mirrors(key[0]) and row_for_release(key[1], key[0]) is None
    assert set(NOT_MIRRORED) <= set(RECORDS)
    assert not set(NOT_MIRRORED) & set(SELECTION_MIRRORS)


def test_a_differing_row_is_caught():
    """The comparison can fail: vLLM 0.26.0's record is not 0.33.0's selection."""
    diffs = list(sr.differences(get_revision("vllm-0.33"), RECORDS[("mxfp4", "0.26.0")], limit=3))
    assert diffs


# ---- vLLM 0.26.0 (moved from tests/test_selection_v026_record.py) ----------------------------------
V026_RECORD = RECORDS[("mxfp4", "0.26.0")]
V026 = get_revision("vllm-0.26")


def test_record_spans_choices_and_refusals():
    """The record is not one answer repeated: it holds the backends 0.26.0 picks across profiles."""
    picked = {e[3] for e in sr.entries(V026_RECORD) if e[3] is not None}
    assert {
        "TRITON",
        "MARLIN",
        "BATCHED_MARLIN",
        "FLASHINFER_TRTLLM_MXFP4_BF16",
        "FLASHINFER_TRTLLM_MXFP4_MXFP8",
        "FLASHINFER_CUTLASS_MXFP4_BF16",
        "AITER_MXFP4_BF16",
        "XPU",
        "CPU",
        "EMULATION",
    } <= picked
    assert any(e[3] is None for e in sr.entries(V026_RECORD))


def test_sm90_flashinfer_cutlass_under_vllm_0_26_is_flashinfer_0_6s_interleave():
    """0.26.0 pins FlashInfer 0.6.14, whose SM90 weight interleave is the row's `sm90-interleave-0.6`
    layout (its bytes: tests/test_tensor_records.py, tests/test_cutlass_sm90_0_6.py): the row selects
    the backend as vLLM does and writes it, through another layout than the 0.33 row's."""
    from mxconvert.layouts import resolve_layout
    from mxconvert.target.backends import Mxfp4Backend

    s = select_backend(get_profile("h100"), V026, Deployment(), "flashinfer_cutlass")
    assert s.backend == Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16
    assert V026.cutlass_sm90_layout == "sm90-interleave-0.6" != get_revision("vllm-0.33").cutlass_sm90_layout
    assert resolve_layout(s.backend, V026, get_profile("h100"), tp=1).tensors
    assert resolve_layout(s.backend, get_revision("vllm-0.33"), get_profile("h100"), tp=1).tensors
