"""Artifacts of schema `mxconvert.artifact/1` (every file entry with its whole-file sha256, most
with the chunked digest too) are still read as they were written (docs/artifact.md, "Schema /1"):
verify, load_artifact and the plugin's file check accept an intact one and refuse a damaged one;
a /2 entry without its tree digest, a /1 entry without its sha256 and any other schema are
refused naming the field; a /1 artifact is never up to date, and `--force` rewrites it as /2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import EXAMPLE, run_cli

import mxconvert
from mxconvert.artifact.checksums import check_files
from mxconvert.artifact.manifest import SCHEMA, SCHEMA_V1, read_manifest, seal, write_manifest
from mxconvert.core.digest import CHUNKED_KEY
from mxconvert.core.errors import InputError, MismatchError
from mxconvert.storage.files import sha256_file


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("v1") / "h100"
    assert run_cli("convert", EXAMPLE, "-p", "h100", "-o", out).exit_code == 0
    return out


def _entries(manifest: dict) -> list[dict]:
    return [f for r in manifest["ranks"] for f in r["files"]] + manifest["shared"]["files"]


def _as_v1(made: Path, dest: Path, chunked: bool) -> Path:
    """The artifact as mxconvert 1 wrote it: schema /1, every file's sha256 (and, `chunked`, the
    chunked digest that /1 writers recorded beside it), sealed."""
    shutil.copytree(made, dest)
    manifest = json.loads((dest / "mxconvert.json").read_text())
    manifest["schema"] = SCHEMA_V1
    for entry in _entries(manifest):
        entry["sha256"] = sha256_file(dest / entry["file"])
        if not chunked:
            del entry[CHUNKED_KEY]
    manifest.pop("fingerprint")
    write_manifest(dest, seal(manifest))
    return dest


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("chunked", [True, False])
def test_a_v1_artifact_is_read_verified_and_loaded(made, tmp_path, chunked):
    art = _as_v1(made, tmp_path / "art", chunked)
    assert read_manifest(art)["schema"] == SCHEMA_V1
    result = run_cli("verify", art, "--json")
    assert result.exit_code == 0, result.output
    reference = mxconvert.load_artifact(made, 0)
    loaded = mxconvert.load_artifact(art, 0)
    assert all(bool((loaded.tensors[k] == v).all()) for k, v in reference.tensors.items())
    manifest = json.loads((art / "mxconvert.json").read_text())
    check_files(art, _entries(manifest) + manifest["aux_files"], jobs=2)  # the plugin's check


@pytest.mark.parametrize("chunked", [True, False])
def test_a_damaged_v1_artifact_is_refused_by_every_reader(made, tmp_path, chunked):
    art = _as_v1(made, tmp_path / "art", chunked)
    manifest = json.loads((art / "mxconvert.json").read_text())
    entry = manifest["ranks"][0]["files"][0]
    _flip(art / entry["file"])
    report = json.loads(run_cli("verify", art, "--json").stdout)
    messages = [p["message"] for p in report["problems"] if p["kind"] == "file"]
    assert f"{entry['file']}: sha256 differs from the manifest" in messages
    with pytest.raises(MismatchError, match="sha256"):
        mxconvert.load_artifact(art, 0)
    with pytest.raises(MismatchError, match=f"{entry['file']}: sha256 .* does not match the manifest"):
        check_files(art, _entries(manifest), jobs=2)


def _resealed(made: Path, dest: Path, edit) -> Path:
    shutil.copytree(made, dest)
    manifest = json.loads((dest / "mxconvert.json").read_text())
    edit(manifest)
    manifest.pop("fingerprint")
    write_manifest(dest, seal(manifest))
    return dest


def test_a_v2_entry_without_its_tree_digest_is_refused(made, tmp_path):
    def drop(manifest):
        del manifest["shared"]["files"][0][CHUNKED_KEY]

    art = _resealed(made, tmp_path / "art", drop)
    with pytest.raises(InputError, match="shared: shared/.*: missing field 'sha256_chunked'"):
        read_manifest(art)
    assert run_cli("verify", art).exit_code == 2


def test_a_v1_entry_without_its_sha256_is_refused(made, tmp_path):
    def v1_without_sha256(manifest):
        manifest["schema"] = SCHEMA_V1  # /1 entries always held the sha256

    art = _resealed(made, tmp_path / "art", v1_without_sha256)
    with pytest.raises(InputError, match="missing field 'sha256'"):
        read_manifest(art)


def test_another_schema_is_refused_naming_what_is_read(made, tmp_path):
    def later(manifest):
        manifest["schema"] = "mxconvert.artifact/3"

    art = _resealed(made, tmp_path / "art", later)
    with pytest.raises(InputError) as err:
        read_manifest(art)
    assert "'mxconvert.artifact/3'" in str(err.value)
    assert f"expected {SCHEMA!r} (or {SCHEMA_V1!r}, still read)" in str(err.value)


def test_a_v1_artifact_is_never_up_to_date_and_force_rewrites_it_as_v2(made, tmp_path):
    art = _as_v1(made, tmp_path / "art", chunked=True)
    again = run_cli("convert", EXAMPLE, "-p", "h100", "-o", art)
    assert again.exit_code == 2 and "already exists; pass --force" in again.output
    forced = run_cli("convert", EXAMPLE, "-p", "h100", "-o", art, "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((art / "mxconvert.json").read_text()) == json.loads((made / "mxconvert.json").read_text())
