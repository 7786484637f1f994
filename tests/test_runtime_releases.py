"""`--runtime vllm==X.Y.Z` and `auto` (issue 22, items 1 and 4, converter side): the revision rows
record the vLLM releases they cover per format, a covered release converts exactly as its row,
anything else is refused with the nearest covered releases named, and `mxconvert runtimes` lists
the rows from their fields."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest
from fixtures_nvfp4 import EXAMPLE_DIRS
from helpers import EXAMPLE, run_cli, run_cli_subprocess, tree_digest

from mxconvert.artifact.manifest import MANIFEST_NAME
from mxconvert.core.errors import InputError
from mxconvert.target import releases
from mxconvert.target.releases import (
    DIFFERING_FIELDS,
    KNOWN_RELEASES,
    RUNTIMES_JSON_SCHEMA,
    release_key,
    release_ranges,
    resolve_runtime,
)
from mxconvert.target.revisions import REVISIONS
from mxconvert.target.sglang_revisions import SGLANG_REVISIONS

QWEN_MO = EXAMPLE_DIRS["tiny-nvfp4-modelopt-qwen3"]


def _manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


def _dry_run_target(*args: str) -> dict:
    result = run_cli("convert", str(EXAMPLE), "-p", "h100", "-o", "unused-out", "--dry-run", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["target"]


@pytest.fixture
def installed(monkeypatch):
    """Pretend vLLM `version` is installed (None: not installed) for importlib.metadata.version."""
    real = importlib.metadata.version

    def pretend(version: str | None) -> None:
        def fake(name: str) -> str:
            if name != "vllm":
                return real(name)
            if version is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return version

        monkeypatch.setattr(importlib.metadata, "version", fake)

    return pretend


# ---- the rows' data ---------------------------------------------------------------------------------
def test_every_row_records_its_releases_per_format():
    seen: dict[tuple[str, str], str] = {}
    for row in REVISIONS.values():
        assert isinstance(row.releases, dict) and set(row.releases) == set(row.formats), row.name
        for fmt, covered in row.releases.items():
            assert isinstance(covered, tuple), (row.name, fmt)
            for release in covered:
                release_key(release)  # three numbers, or ValueError
                assert release in KNOWN_RELEASES, (row.name, release)
                assert (fmt, release) not in seen, f"{release} {fmt} in {row.name} and {seen[(fmt, release)]}"
                seen[(fmt, release)] = row.name
            # the first is the reference release; the rest follow in release order
            assert list(covered[1:]) == sorted(covered[1:], key=release_key), row.name


def test_the_rows_cover_what_was_shown_identical():
    """A row claims a release where it reproduces the release's selection record and tensor record
    (tests/test_selection_records.py, tests/test_tensor_records.py hold every claim)."""
    assert REVISIONS["vllm-0.33"].releases == {"mxfp4": ("0.33.0",), "nvfp4": ("0.33.0", "0.32.0")}
    assert REVISIONS["vllm-0.20"].releases == {"mxfp4": ("0.20.0", "0.20.1", "0.20.2")}
    assert REVISIONS["vllm-0.26"].releases == {"mxfp4": ("0.26.0",)}
    # 0.15.0's own records are the vllm-0.15 row's (tests/golden/selection/vllm-0.15.0-nvfp4.json)
    assert REVISIONS["vllm-0.15"].releases == {"nvfp4": ("0.15.0",)}
    # every recorded release is covered: MXFP4 from 0.19.0, NVFP4 from 0.15.0
    mx = [r for r in KNOWN_RELEASES if release_key(r) >= (0, 19, 0)]
    assert [r for r, _ in releases.covered("mxfp4")] == mx
    assert [r for r, _ in releases.covered("nvfp4")] == list(KNOWN_RELEASES)


def test_release_numbers_and_ranges():
    assert release_key("0.20.1") == (0, 20, 1) and release_key("0.9.2") < release_key("0.20.0")
    for bad in ("0.33", "abc", "0.33.0.1", "0.033.0", "0.33.0rc1", " 0.33.0", "v0.33.0", ""):
        with pytest.raises(ValueError):
            release_key(bad)
    assert release_ranges(("0.20.0", "0.20.1", "0.20.2")) == ["0.20.0-0.20.2"]
    assert release_ranges(("0.20.0", "0.20.2", "0.33.0")) == ["0.20.0", "0.20.2", "0.33.0"]
    assert release_ranges(("0.32.0", "0.33.0")) == ["0.32.0-0.33.0"]
    assert release_ranges(()) == []


# ---- vllm==X.Y.Z converts as its row ----------------------------------------------------------------
@pytest.mark.parametrize(
    "model, profile",
    [(EXAMPLE, "h100"), (EXAMPLE, "b200"), (QWEN_MO, "b200"), (QWEN_MO, "h100")],
    ids=["mxfp4-h100", "mxfp4-b200", "nvfp4-b200", "nvfp4-h100"],
)
def test_vllm_0_33_0_converts_verifies_and_equals_the_row(tmp_path, model, profile):
    by_release, by_row = tmp_path / "release", tmp_path / "row"
    result = run_cli("convert", model, "-p", profile, "--runtime", "vllm==0.33.0", "-o", by_release)
    assert result.exit_code == 0, result.output
    assert run_cli("convert", model, "-p", profile, "--runtime", "vllm-0.33", "-o", by_row).exit_code == 0
    verified = run_cli("verify", by_release, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["ok"], verified.stdout
    target = _manifest(by_release)["target"]
    assert (target["runtime_revision"], target["runtime_release"]) == ("vllm-0.33", "0.33.0")
    assert "runtime_release" not in _manifest(by_row)["target"]
    same = tree_digest(by_release)
    other = tree_digest(by_row)
    assert same.pop(MANIFEST_NAME) != other.pop(MANIFEST_NAME) and same == other


@pytest.mark.parametrize("profile", ["h100", "b200"])  # TRITON; TRTLLM (the 256 round-up of that row)
def test_vllm_0_20_1_converts_exactly_as_vllm_0_20(tmp_path, profile):
    for name, runtime in (("release", "vllm==0.20.1"), ("row", "vllm-0.20")):
        result = run_cli("convert", EXAMPLE, "-p", profile, "--runtime", runtime, "-o", tmp_path / name)
        assert result.exit_code == 0, result.output
    assert run_cli("verify", tmp_path / "release").exit_code == 0
    release, row = tree_digest(tmp_path / "release"), tree_digest(tmp_path / "row")
    release.pop(MANIFEST_NAME), row.pop(MANIFEST_NAME)
    assert release == row
    a, b = _manifest(tmp_path / "release"), _manifest(tmp_path / "row")
    assert a["target"].pop("runtime_release") == "0.20.1"
    assert a["target"] == b["target"] and a["ranks"] == b["ranks"] and a["selection"] == b["selection"]


def test_the_release_is_part_of_the_up_to_date_check(tmp_path):
    out = tmp_path / "out"
    assert run_cli("convert", EXAMPLE, "-p", "h100", "--runtime", "vllm==0.20.2", "-o", out).exit_code == 0
    again = run_cli("convert", EXAMPLE, "-p", "h100", "--runtime", "vllm==0.20.2", "-o", out, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["status"] == "up_to_date"
    other = run_cli("convert", EXAMPLE, "-p", "h100", "--runtime", "vllm==0.20.0", "-o", out, "--json")
    assert other.exit_code == 2, other.output  # a different target: OUT exists, refused without --force


def test_a_named_row_and_the_default_record_no_release():
    assert "runtime_release" not in _dry_run_target()
    assert "runtime_release" not in _dry_run_target("--runtime", "vllm-0.20")
    assert _dry_run_target("--runtime", "vllm==0.20.0")["runtime_release"] == "0.20.0"


# ---- refusals -----------------------------------------------------------------------------------------
MX_COVERED = "covered: 0.19.0-0.19.1 (vllm-0.19), 0.20.0-0.20.2 (vllm-0.20), 0.21.0 (vllm-0.21)"


@pytest.mark.parametrize(
    "model, runtime, message",
    [
        (EXAMPLE, "vllm==0.18.1", f"vLLM 0.18.1 is not covered for GPT-OSS MXFP4; {MX_COVERED}"),
        (EXAMPLE, "vllm==0.9.2", "vLLM 0.9.2 is not covered for GPT-OSS MXFP4; covered: 0.19.0-0.19.1 (vllm-0.19)"),
        (EXAMPLE, "vllm==0.9.2", "0.33.0 (vllm-0.33); the nearest is 0.19.0"),
        (EXAMPLE, "vllm==0.26.1", "the nearest are 0.26.0 and 0.27.0"),
        (EXAMPLE, "vllm==0.34.0", "the nearest is 0.33.0"),
        (EXAMPLE, "vllm==abc", "not a vLLM release (expected vllm==X.Y.Z, e.g. vllm==0.33.0); covered for GPT-OSS"),
        (EXAMPLE, "vllm==0.33", "--runtime 'vllm==0.33': not a vLLM release"),
        (EXAMPLE, "vllm==", "not a vLLM release"),
        (QWEN_MO, "vllm==0.14.1", "vLLM 0.14.1 is not covered for NVFP4; covered: 0.15.0 (vllm-0.15), 0.15.1"),
        (QWEN_MO, "vllm==0.14.1", "0.32.0-0.33.0 (vllm-0.33); the nearest is 0.15.0"),
    ],
)  # fmt: skip
def test_uncovered_and_malformed_releases_are_refused(tmp_path, model, runtime, message):
    out = tmp_path / "out"
    result = run_cli("convert", model, "-p", "h100", "--runtime", runtime, "-o", out)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert not out.exists()


def test_the_short_names_keep_working():
    for name, row in (("vllm-0.33", "vllm-0.33"), ("vllm-0.20", "vllm-0.20"), ("0.20", "vllm-0.20")):
        resolved = resolve_runtime(name, "mxfp4")
        assert (resolved.revision.name, resolved.release, resolved.source) == (row, None, "named")
    assert resolve_runtime("vllm-0.15", "nvfp4").revision.name == "vllm-0.15"
    for name in ("vllm-0.19", "0.19", "vllm-0.19.0"):  # 0.19.x has its own row (its selection records)
        assert resolve_runtime(name, "mxfp4").revision.name == "vllm-0.19"
    for unknown in ("vllm-0.14", "0.14"):
        with pytest.raises(InputError, match="unknown runtime revision"):
            resolve_runtime(unknown, "mxfp4")


# ---- auto ---------------------------------------------------------------------------------------------
def test_auto_without_vllm_is_the_newest_row(installed):
    installed(None)
    for spec in (None, "auto", "AUTO"):
        resolved = resolve_runtime(spec, "mxfp4")
        assert (resolved.revision.name, resolved.release, resolved.source) == ("vllm-0.33", None, "default")
    assert "runtime_release" not in _dry_run_target("--runtime", "auto")


def test_auto_takes_the_installed_release(installed):
    installed("0.20.2")
    resolved = resolve_runtime(None, "mxfp4")
    assert (resolved.revision.name, resolved.release, resolved.source) == ("vllm-0.20", "0.20.2", "installed")
    target = _dry_run_target()
    assert (target["runtime_revision"], target["runtime_release"]) == ("vllm-0.20", "0.20.2")
    installed("0.33.0+cu130")  # a local build label is the same release
    assert resolve_runtime("auto", "nvfp4").release == "0.33.0"
    # an explicit runtime wins over the installed one
    assert resolve_runtime("vllm==0.33.0", "mxfp4").revision.name == "vllm-0.33"


@pytest.mark.parametrize(
    "version, fmt, message",
    [
        ("0.18.0", "mxfp4", "the installed vLLM 0.18.0 is not covered for GPT-OSS MXFP4; covered: 0.19.0-0.19.1"),
        ("0.34.0", "nvfp4", "the installed vLLM 0.34.0 is not covered for NVFP4; covered: 0.15.0 (vllm-0.15)"),
        ("0.34.0.dev12+g1234", "mxfp4", "the installed vLLM '0.34.0.dev12+g1234' is not a release (X.Y.Z)"),
    ],
)
def test_auto_refuses_an_installed_release_that_is_not_covered(installed, version, fmt, message):
    installed(version)
    with pytest.raises(InputError) as err:
        resolve_runtime("auto", fmt)
    assert message in str(err.value) and "pass --runtime vllm==X.Y.Z or a revision name" in str(err.value)


def test_auto_reads_the_installed_metadata_without_importing_vllm(tmp_path):
    """A real installed distribution (a dist-info on the path, no vllm package to import)."""
    dist = tmp_path / "site" / "vllm-0.18.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.18.0\n")
    path = os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])
    refused = run_cli_subprocess("select", EXAMPLE, "-p", "h100", env={"PYTHONPATH": path})
    assert refused.returncode == 2, refused.stderr
    assert "--runtime auto: the installed vLLM 0.18.0 is not covered for GPT-OSS MXFP4" in refused.stderr
    assert "the nearest is 0.19.0" in refused.stderr
    chosen = run_cli_subprocess("select", EXAMPLE, "-p", "h100", "--runtime", "vllm-0.33", env={"PYTHONPATH": path})
    assert chosen.returncode == 0, chosen.stderr


# ---- mxconvert runtimes -------------------------------------------------------------------------------
def test_runtimes_json_is_read_from_the_rows(installed):
    installed(None)
    result = run_cli("runtimes", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == RUNTIMES_JSON_SCHEMA == "mxconvert.runtimes/1"
    assert doc["default"] == "vllm-0.33" and doc["installed_vllm"] is None
    every_row = {**REVISIONS, **SGLANG_REVISIONS}  # SGLang's rows after vLLM's (docs/sglang.md)
    assert [r["name"] for r in doc["rows"]] == [*REVISIONS, *SGLANG_REVISIONS]
    for entry in doc["rows"]:
        row = every_row[entry["name"]]
        assert entry["releases"] == {fmt: list(row.releases[fmt]) for fmt in row.formats}
        for name, fmt in DIFFERING_FIELDS.items():
            value = getattr(row, name)
            expected = (list(value) if isinstance(value, tuple) else value) if fmt in (None, *row.formats) else None
            assert entry["fields"][name] == expected, (row.name, name)
        assert set(entry["backends"]) == set(row.formats) and all(entry["backends"].values())
    rows = {r["name"]: r for r in doc["rows"]}
    assert rows["vllm-0.20"]["release_ranges"] == {"mxfp4": ["0.20.0-0.20.2"]}
    assert rows["vllm-0.33"]["fields"]["mxfp4_trtllm_round_up"] == {"intermediate_align": 128, "hidden_align": 256}
    assert rows["vllm-0.20"]["fields"]["mxfp4_trtllm_round_up"] == {"intermediate_align": 256, "hidden_align": 256}
    for name in ("triton_kernels", "nvfp4_fold_global_scales", "mxfp4_trtllm_round_up", "cutlass_sm90_layout"):
        assert name in doc["differing_fields"]
    assert "HUMMING" in rows["vllm-0.33"]["backends"]["mxfp4"]
    assert "HUMMING" not in rows["vllm-0.20"]["backends"]["mxfp4"]
    # vLLM 0.15.0 selects VLLM_CUTLASS (tests/golden/selection/vllm-0.15.0-nvfp4.json).
    assert "VLLM_CUTLASS" in rows["vllm-0.15"]["backends"]["nvfp4"]
    assert "0.18.1" in doc["uncovered"]["mxfp4"] and "0.26.0" not in doc["uncovered"]["mxfp4"]
    assert rows["vllm-0.26"]["unproven_layouts"] == dict(REVISIONS["vllm-0.26"].unproven_layouts)
    assert rows["vllm-0.26"]["unproven_layouts"] == {}  # every backend it selects is written
    assert set(rows["vllm-0.24"]["unproven_layouts"]) == {"FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL"}
    assert rows["vllm-0.33"]["unproven_layouts"] == {}
    assert doc["uncovered"]["nvfp4"] == []


def test_runtimes_text(installed):
    installed("0.20.1")
    result = run_cli("runtimes", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("vLLM releases by revision row", "0.20.0-0.20.2", "what differs between rows", "triton_kernels"):
        assert text in out, text
    assert "I 128 H 256" in out and "I 256 H 256" in out  # the TRTLLM round-up of each row
    assert "not covered for MXFP4: 0.15.0" in out and "--runtime auto: the installed vLLM 0.20.1" in out
    assert "vllm-0.24 selects but does not write (bytes not proven yet): FLASHINFER_TRTLLM, FLASHINFER_CUTEDSL" in out
    assert releases.installed_vllm() == "0.20.1"


# ---- a row whose layouts are not all proven ------------------------------------------------------------
def test_a_backend_whose_bytes_are_unproven_under_its_row_is_refused_and_nothing_written(tmp_path):
    """vllm-0.24 selects NVFP4 FLASHINFER_TRTLLM on B200 as vLLM 0.24.0 does, but 0.24.0 lays it out
    otherwise (tests/golden/tensors/vllm-0.24.0-nvfp4.json; the row's `unproven_layouts`): convert refuses it."""
    out = tmp_path / "out"
    nvfp4 = EXAMPLE.parent / "tiny-nvfp4-modelopt-qwen3"
    request = ("--profile", "b200", "--runtime", "vllm==0.24.0", "--backend", "flashinfer_trtllm")
    result = run_cli("convert", nvfp4, *request, "-o", out)
    assert result.exit_code == 2, result.output
    assert "FLASHINFER_TRTLLM under vllm-0.24: its bytes are not proven yet" in result.stderr
    assert not out.exists()
    select = run_cli("select", nvfp4, *request)
    assert select.exit_code == 2 and "not proven yet" in select.stderr  # select runs every check convert runs


def test_every_unproven_layout_names_a_backend_of_the_rows_formats():
    from mxconvert.selection.vocabulary import enum_of

    for row in REVISIONS.values():
        for backend, reason in row.unproven_layouts:
            assert reason and any(backend in {b.value for b in enum_of(fmt)} for fmt in row.formats), (
                row.name,
                backend,
            )
