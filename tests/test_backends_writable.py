"""`mxconvert backends` marks, for each format and runtime row, which backends `convert` writes and
which `select` only reports (issue 23, item 7): a backend with no layout, or one the row lists in
`unproven_layouts`, is select only, with the reason."""

from __future__ import annotations

import json

from helpers import ROOT, run_cli

from mxconvert.layouts import supported_backends
from mxconvert.selection.vocabulary import NO_LAYOUT
from mxconvert.target.revisions import REVISIONS
from mxconvert.target.sglang_revisions import SGLANG_REVISIONS, unproven_layout_reason

NVFP4_EXAMPLE = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"


def rows() -> list[dict]:
    done = run_cli("backends", "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)["backends"]


def test_every_row_says_whether_convert_writes_it():
    for row in rows():
        revision = {**REVISIONS, **SGLANG_REVISIONS}[row["revision"]]
        unproven = unproven_layout_reason(revision, row["format"], row["backend"])
        laid_out = row["backend"] in {b.value for b in supported_backends(row["format"])}
        assert row["writable"] is (laid_out and unproven is None), row
        if row["writable"]:
            assert row["not_writable"] is None
        elif unproven is not None:
            assert row["not_writable"] == f"bytes not proven yet: {unproven}"
        else:
            assert row["not_writable"] == NO_LAYOUT


def test_both_kinds_of_select_only_backend_are_marked():
    by_key = {(r["format"], r["revision"], r["backend"]): r for r in rows()}
    assert by_key[("mxfp4", "vllm-0.33", "TRITON")]["writable"] is True
    assert by_key[("mxfp4", "vllm-0.33", "HUMMING")]["not_writable"] == NO_LAYOUT  # no layout
    # vllm-0.24's unproven_layouts: vLLM 0.24.0 lays NVFP4 FLASHINFER_TRTLLM out otherwise
    # (tests/golden/tensors/vllm-0.24.0-nvfp4.json); vllm-0.26 writes every MXFP4 backend it selects
    # now that FlashInfer 0.6.x's SM90 interleave is a layout (sm90-interleave-0.6)
    unproven = by_key[("nvfp4", "vllm-0.24", "FLASHINFER_TRTLLM")]
    assert unproven["writable"] is False and unproven["not_writable"].startswith("bytes not proven yet: ")
    assert by_key[("mxfp4", "vllm-0.26", "FLASHINFER_CUTLASS_MXFP4_BF16")]["writable"] is True
    assert by_key[("mxfp4", "vllm-0.33", "FLASHINFER_TRTLLM_MXFP4_BF16")]["writable"] is True
    assert any(r["format"] == "nvfp4" and r["writable"] for r in by_key.values())


def test_the_mark_is_what_convert_does(tmp_path):
    """A backend marked select only is refused by `convert` (exit 2, nothing written); one marked
    writable is written, for the same model and profile."""
    by_key = {(r["format"], r["revision"], r["backend"]): r for r in rows()}
    assert by_key[("nvfp4", "vllm-0.24", "FLASHINFER_TRTLLM")]["writable"] is False
    assert by_key[("nvfp4", "vllm-0.33", "FLASHINFER_TRTLLM")]["writable"] is True
    request = ("-p", "b200", "--backend", "flashinfer_trtllm")
    refused = run_cli("convert", NVFP4_EXAMPLE, *request, "--runtime", "vllm-0.24", "-o", tmp_path / "a")
    assert refused.exit_code == 2, refused.output
    assert "not proven yet" in refused.output and not (tmp_path / "a").exists()
    written = run_cli("convert", NVFP4_EXAMPLE, *request, "--runtime", "vllm-0.33", "-o", tmp_path / "b")
    assert written.exit_code == 0, written.output


def test_text_table_marks_and_explains():
    shown = run_cli("backends", env={"COLUMNS": "200"}).stdout
    assert "convert writes" in shown and "no (select only)" in shown
    assert f"HUMMING: {NO_LAYOUT}" in shown
    assert "FLASHINFER_TRTLLM: bytes not proven yet:" in shown
