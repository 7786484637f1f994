"""Issue 22's examples, end to end: `convert --runtime vllm==X.Y.Z` for releases that only the new rows
cover writes artifacts that `verify` accepts, for the MXFP4 and NVFP4 examples; an uncovered or
malformed release is refused naming the nearest covered ones; and a row claiming a release does not
make the vLLM plugin load into it (runtimes/vllm/dependency.py `PLUGIN_PROVEN`).

Which row covers which release, and that the row reproduces the release's own selection and bytes,
is held by tests/test_selection_records.py and tests/test_tensor_records.py; here only the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_nvfp4 import EXAMPLE_DIRS
from helpers import EXAMPLE, run_cli

from mxconvert.artifact.manifest import MANIFEST_NAME
from mxconvert.runtimes.vllm.adapters import serving_row
from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN, served_releases
from mxconvert.target.releases import row_for_release
from mxconvert.target.revisions import REVISIONS

NVFP4_EXAMPLE = EXAMPLE_DIRS["tiny-nvfp4-modelopt-qwen3"]


def _target(out: Path) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())["target"]


@pytest.mark.parametrize(
    "model, fmt, release, row",
    [
        (EXAMPLE, "mxfp4", "0.26.0", "vllm-0.26"),
        (EXAMPLE, "mxfp4", "0.30.0", "vllm-0.30"),
        (EXAMPLE, "mxfp4", "0.32.0", "vllm-0.32"),
        (NVFP4_EXAMPLE, "nvfp4", "0.26.0", "vllm-0.25-nvfp4"),
        (NVFP4_EXAMPLE, "nvfp4", "0.30.0", "vllm-0.29"),
        (NVFP4_EXAMPLE, "nvfp4", "0.32.0", "vllm-0.33"),
    ],
)
def test_a_release_of_a_new_row_converts_and_verifies(tmp_path, model, fmt, release, row):
    out = tmp_path / "out"
    result = run_cli("convert", model, "-p", "h100", "--runtime", f"vllm=={release}", "-o", out)
    assert result.exit_code == 0, result.output
    target = _target(out)
    assert (target["runtime_revision"], target["runtime_release"]) == (row, release)
    assert row_for_release(release, fmt) is REVISIONS[row]
    verified = run_cli("verify", out)
    assert verified.exit_code == 0, verified.output


def test_vllm_0_26_0_writes_trtllm_now_that_its_bytes_are_shown(tmp_path):
    """vLLM 0.26.0's tensor record equals the vllm-0.26 row's TRTLLM bytes (I padded to 256), so the
    B200 default of 0.26.0 is written and verifies; so is SM90 FlashInfer CUTLASS, whose FlashInfer 0.6.14
    interleave is the row's `sm90-interleave-0.6` layout (tests/test_cutlass_sm90_0_6.py)."""
    out = tmp_path / "out"
    result = run_cli("convert", EXAMPLE, "-p", "b200", "--runtime", "vllm==0.26.0", "-o", out)
    assert result.exit_code == 0, result.output
    target = _target(out)
    assert (target["runtime_revision"], target["backend"]) == ("vllm-0.26", "FLASHINFER_TRTLLM_MXFP4_BF16")
    assert target["intermediate_size_padded"] % 256 == 0
    assert run_cli("verify", out).exit_code == 0
    sm90_out = tmp_path / "sm90"
    sm90 = run_cli(
        "convert", EXAMPLE, "-p", "h100", "--runtime", "vllm==0.26.0", "--backend", "flashinfer_cutlass", "-o", sm90_out
    )
    assert sm90.exit_code == 0, sm90.output
    assert _target(sm90_out)["backend"] == "FLASHINFER_CUTLASS_MXFP4_BF16"
    assert run_cli("verify", sm90_out).exit_code == 0


@pytest.mark.parametrize(
    "model, runtime, message",
    [
        (EXAMPLE, "vllm==0.9.2", "vLLM 0.9.2 is not covered for GPT-OSS MXFP4"),
        (EXAMPLE, "vllm==0.9.2", "; the nearest is 0.19.0"),
        (EXAMPLE, "vllm==0.18.1", "; the nearest is 0.19.0"),
        (EXAMPLE, "vllm==0.34.0", "; the nearest is 0.33.0"),
        (NVFP4_EXAMPLE, "vllm==0.9.2", "vLLM 0.9.2 is not covered for NVFP4"),
        (NVFP4_EXAMPLE, "vllm==0.9.2", "; the nearest is 0.15.0"),
        (EXAMPLE, "vllm==0.30", "--runtime 'vllm==0.30': not a vLLM release (expected vllm==X.Y.Z"),
        (EXAMPLE, "vllm==0.30", "covered for GPT-OSS MXFP4: 0.19.0-0.19.1 (vllm-0.19)"),
        (NVFP4_EXAMPLE, "vllm==0.30.x", "covered for NVFP4: 0.15.0 (vllm-0.15)"),
    ],
)
def test_uncovered_and_malformed_releases_are_refused_naming_the_covered_ones(tmp_path, model, runtime, message):
    out = tmp_path / "out"
    result = run_cli("convert", model, "-p", "h100", "--runtime", runtime, "-o", out)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert not out.exists()


def test_the_runtimes_command_lists_every_row_with_its_releases():
    result = run_cli("runtimes", "--json")
    assert result.exit_code == 0, result.output
    listed = {r["name"]: r["releases"] for r in json.loads(result.stdout)["rows"] if r["runtime"] == "vllm"}
    assert listed == {name: {f: list(v) for f, v in row.releases.items()} for name, row in REVISIONS.items()}
    assert listed["vllm-0.29"] == {"mxfp4": ["0.29.0"], "nvfp4": ["0.29.0", "0.30.0", "0.31.0"]}


def test_a_row_for_a_release_does_not_make_the_plugin_load_into_it():
    """vllm-0.17 covers NVFP4 0.17.1 for `convert`, and vllm-0.33 covers NVFP4 0.32.0, but the plugin loads
    into a release because it is proven there (path A = path B), in 0.19.0-0.33.0 for MXFP4 and in
    0.15.0-0.33.0 for NVFP4, not because a row covers it: it serves no other release (0.34.0), and
    0.15.0-0.18.x for NVFP4 only."""
    assert row_for_release("0.19.0", "mxfp4") is REVISIONS["vllm-0.19"]
    assert row_for_release("0.32.0", "nvfp4") is REVISIONS["vllm-0.33"]
    assert row_for_release("0.17.1", "nvfp4") is REVISIONS["vllm-0.17"]
    assert serving_row("0.19.1", "nvfp4") is REVISIONS["vllm-0.19-nvfp4"]
    assert serving_row("0.19.1") is REVISIONS["vllm-0.19"]
    assert serving_row("0.18.1", "mxfp4") is None
    assert serving_row("0.18.1") is REVISIONS["vllm-0.18"]
    assert serving_row("0.17.1") is REVISIONS["vllm-0.17"] and serving_row("0.17.1", "mxfp4") is None
    assert serving_row("0.15.0") is REVISIONS["vllm-0.15"] and serving_row("0.15.1") is REVISIONS["vllm-0.15.1"]
    for release in ("0.34.0", "0.14.1"):
        assert serving_row(release) is None, release
    assert serving_row("0.33.0+cpu") is REVISIONS["vllm-0.33"]
    assert serving_row("0.26.0") is REVISIONS["vllm-0.26"]
    assert serving_row("0.28.0") is REVISIONS["vllm-0.27"]
    assert served_releases() == "0.15.0-0.33.0"
    assert served_releases("mxfp4") == "0.19.0-0.33.0"
    # every proven release is one its row covers for that format (its artifacts are made for it)
    for name, by_format in PLUGIN_PROVEN.items():
        for fmt, proven in by_format.items():
            assert set(proven) <= set(REVISIONS[name].releases[fmt]), (name, fmt)


def test_the_plugin_refuses_an_unproven_release_naming_those_it_loads_into():
    from mxconvert.runtimes.vllm.checks import runtime_mismatches

    target = {"runtime_revision": "vllm-0.33", "format": "mxfp4", "platform": "cuda", "capability": [9, 0]}

    class Live:
        vllm_version = "0.34.0"
        platform = "cuda"
        capability = [9, 0]
        gfx = None

    mismatches = runtime_mismatches(target, Live())
    assert [(m.field, m.artifact) for m in mismatches] == [
        ("vllm_version", "0.15.0-0.33.0 (the vLLM this plugin installs into)")
    ]


def test_an_nvfp4_artifact_for_0_26_0_loads_into_vllm_0_26_0_under_its_nvfp4_row():
    """The plugin is proven in 0.26.0 for MXFP4 under vllm-0.26 and for NVFP4 under vllm-0.25-nvfp4 (the
    row `vllm==0.26.0` writes for NVFP4; tests_vllm/test_release_0_26_nvfp4.py): an NVFP4 `vllm==0.26.0`
    artifact fits vLLM 0.26.0 as that row, not as the MXFP4 row; so does one in 0.25.1, which the row also
    covers (tests_vllm/test_release_rows_nvfp4.py); an NVFP4 artifact of row vllm-0.17 loads into 0.17.1
    under that row, and is refused in 0.34.0, which the plugin does not serve."""
    from mxconvert.runtimes.vllm.checks import artifact_fits_release, runtime_mismatches

    nvfp4 = {"runtime_revision": "vllm-0.25-nvfp4", "format": "nvfp4"}
    assert serving_row("0.26.0", "nvfp4") is REVISIONS["vllm-0.25-nvfp4"]
    assert serving_row("0.26.0", "mxfp4") is serving_row("0.26.0") is REVISIONS["vllm-0.26"]
    assert artifact_fits_release(nvfp4, "vllm-0.25-nvfp4", "0.26.0")
    assert not artifact_fits_release(nvfp4, "vllm-0.26", "0.26.0")
    assert artifact_fits_release({"runtime_revision": "vllm-0.26", "format": "mxfp4"}, "vllm-0.26", "0.26.0+cu130")
    # NVFP4 vllm==0.32.0 (row vllm-0.33) loads into vLLM 0.33.0, the row's proven release
    assert artifact_fits_release({"runtime_revision": "vllm-0.33", "format": "nvfp4"}, "vllm-0.33", "0.33.0")

    class Live:
        vllm_version = "0.26.0"
        platform = "cuda"
        capability = [9, 0]
        gfx = None

    worker = {"platform": "cuda", "capability": [9, 0]}
    assert runtime_mismatches({**nvfp4, **worker}, Live()) == []
    Live.vllm_version = "0.25.1"
    assert serving_row("0.25.1", "nvfp4") is REVISIONS["vllm-0.25-nvfp4"]
    assert runtime_mismatches({**nvfp4, **worker}, Live()) == []
    Live.vllm_version = "0.17.1"
    assert serving_row("0.17.1", "nvfp4") is REVISIONS["vllm-0.17"]
    older = {"runtime_revision": "vllm-0.17", "format": "nvfp4"}
    assert runtime_mismatches({**older, **worker}, Live()) == []
    Live.vllm_version = "0.34.0"
    assert [m.field for m in runtime_mismatches({**older, **worker}, Live())] == ["vllm_version"]


def test_an_nvfp4_artifact_in_a_release_served_for_mxfp4_only_names_the_nvfp4_releases(monkeypatch):
    """Where the plugin serves a release for MXFP4 but not NVFP4 (vLLM 0.24.0 with its NVFP4 entry
    taken out), an NVFP4 artifact is refused by `vllm_version`, naming the releases that take NVFP4,
    not by a row that could only confuse (the MXFP4 row)."""
    from mxconvert.runtimes.vllm.checks import runtime_mismatches
    from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN

    monkeypatch.setitem(PLUGIN_PROVEN, "vllm-0.24", {"mxfp4": ("0.24.0",)})

    class Live:
        vllm_version = "0.24.0"
        platform = "cuda"
        capability = [9, 0]
        gfx = None

    target = {"runtime_revision": "vllm-0.24", "format": "nvfp4", "platform": "cuda", "capability": [9, 0]}
    refused = runtime_mismatches(target, Live())
    assert [m.field for m in refused] == ["vllm_version"]
    assert "installs NVFP4 artifacts into" in str(refused[0].artifact) and "0.24.0" not in str(refused[0].artifact)
    assert runtime_mismatches({**target, "format": "mxfp4"}, Live()) == []
