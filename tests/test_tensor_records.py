"""mxconvert's layouts against the bytes each recorded vLLM release's own weight processing produced.

tests/golden/tensors/vllm-X.Y.Z-<format>.json holds, per (backend, device family, shape), the digests
of what that release's converter laid out on CPU (tools/vllm_releases/record_tensors.py; docs/releases.md
"Tensor records"). For a release that `--runtime vllm==X.Y.Z` resolves to a row, that row must
reproduce every recorded tensor; for every release, tests/golden/tensors/expected_rows.json says which
rows' bytes each backend equals, and this test holds mxconvert to it (a layout change that moves any
row's bytes for any recorded release fails here). No download, no vLLM: mxconvert and the records only.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mxconvert.target.releases import row_for_release
from mxconvert.target.revisions import REVISIONS

TOOL = Path(__file__).resolve().parents[1] / "tools" / "vllm_releases" / "tensor_table.py"
_spec = importlib.util.spec_from_file_location("vllm_releases_tensor_table", TOOL)
assert _spec is not None and _spec.loader is not None
T = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = T
_spec.loader.exec_module(T)

RECORDS = T.records()
EXPECTED = json.loads(T.EXPECTED.read_text())


def _doc(path: Path) -> dict:
    return T.load(path)


def test_there_are_records_for_both_formats_oldest_and_newest():
    names = {p.stem for p in RECORDS}
    assert {"vllm-0.19.0-mxfp4", "vllm-0.33.0-mxfp4", "vllm-0.33.0-nvfp4"} <= names


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_record_is_complete(path):
    """Every case ran: no recording errors, every case holds tensors or says why not."""
    doc = _doc(path)
    assert doc["release"] == path.stem.split("-")[1] and doc["format"] == path.stem.split("-")[2]
    errors = [
        f"{c['backend']} {c.get('target_key', '')} {c['shape']}: {c['error']}" for c in doc["cases"] if "error" in c
    ]
    assert not errors, errors
    for case in doc["cases"]:
        assert "tensors" in case or T.case_status(case) or "raises" in case, case


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_record_inputs_are_the_canonical_inputs_mxconvert_builds(path):
    doc = _doc(path)
    fmt = doc["format"]
    seen: set[str] = set()
    for case in doc["cases"]:
        key = case.get("inputs")
        if key is None or key in seen:
            continue
        seen.add(key)
        assert T.input_digests(fmt, case) == doc["inputs"][key], f"{path.name}: inputs {key} differ"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_covered_release_is_reproduced_by_its_row(path):
    """`--runtime vllm==X.Y.Z` -> row R: R's layouts give exactly the release's recorded bytes, for
    every recorded case of every backend R writes (backends R lists as unproven are refused)."""
    doc = _doc(path)
    fmt = doc["format"]
    row = row_for_release(doc["release"], fmt)
    if row is None:
        pytest.skip(f"vLLM {doc['release']} is not covered by a row for {fmt} (expected_rows.json tells its bytes)")
    unproven = dict(row.unproven_layouts)
    checked = 0
    for case in doc["cases"]:
        if "tensors" not in case and "raises" not in case:
            continue  # absent from the release, or a CUDA result never recorded
        kind, what = T.compare(fmt, case, row.name)
        label = f"vLLM {doc['release']} {case['backend']} {case.get('target_key', '')} {case['shape']}"
        if case["backend"] in unproven:
            # a case the release itself refuses compares "equal" exactly when mxconvert refuses it too
            refused = kind == "refused" or ("raises" in case and kind == "equal")
            assert refused, f"{label}: {row.name} lists it as unproven but writes it"
            continue
        assert (kind, what) == ("equal", []), f"{label}: {row.name} gives other bytes ({kind}: {what})"
        checked += 1
    assert checked


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_rows_equal_to_each_release_are_as_committed(path):
    """Per backend, the rows whose bytes equal the release's: tools/vllm_releases/tensor_table.py
    --write recomputes tests/golden/tensors/expected_rows.json when a record or a layout changes."""
    doc = _doc(path)
    fmt = doc["format"]
    assert T.expected_entry(fmt, doc) == EXPECTED[fmt][doc["release"]]


def test_expected_rows_names_only_records_and_rows():
    for fmt in ("mxfp4", "nvfp4"):
        recorded = {_doc(p)["release"] for p in T.records(fmt)}
        assert set(EXPECTED.get(fmt, {})) == recorded
        for entry in EXPECTED.get(fmt, {}).values():
            for rows in [entry["rows"], *[r for r in entry["backends"].values() if r is not None]]:
                assert set(rows) <= {r.name for r in REVISIONS.values() if fmt in r.formats}


def test_a_changed_digest_or_padding_is_a_difference():
    """compare() is not vacuous: one altered digest, or other padded sizes, make a case differ."""
    doc = _doc(T.TENSORS / "vllm-0.33.0-mxfp4.json")
    case = next(c for c in doc["cases"] if c["backend"] == "TRITON" and "tensors" in c)
    assert T.compare("mxfp4", case, "vllm-0.33") == ("equal", [])
    broken = json.loads(json.dumps(case))
    broken["tensors"]["w2_bias"]["sha256"] = "0" * 64
    assert T.compare("mxfp4", broken, "vllm-0.33") == ("differs", ["w2_bias"])
    repadded = dict(case, Ip=case["Ip"] + 64)
    assert T.compare("mxfp4", repadded, "vllm-0.33") == ("differs", ["padding"])
