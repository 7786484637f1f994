"""The tree digest (issue 24 item 1, docs/artifact.md "The tree digest"): the integrity digest of
every file `convert` writes, hashed on all cores while the file is written and when it is checked
(verify, load_artifact, the vLLM plugin's check), checkable with standard tools; the whole-file
sha256 only with `--file-sha256`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import EXAMPLE, run_cli

import mxconvert
from mxconvert.artifact.checksums import check_files
from mxconvert.artifact.manifest import SCHEMA
from mxconvert.core.digest import (
    CHUNK_BYTES,
    CHUNKED_KEY,
    ChunkedSha256,
    ParallelChunkedSha256,
    file_digests,
    tree_digest_file,
)
from mxconvert.core.errors import MismatchError
from mxconvert.storage.files import sha256_file


def _reference(data: bytes, leaf: int) -> dict:
    """The definition, written out: sha256 over the concatenated sha256 of each leaf."""
    leaves = [data[i : i + leaf] for i in range(0, len(data), leaf)] or [b""]
    return {
        "chunk_bytes": leaf,
        "digest": hashlib.sha256(b"".join(hashlib.sha256(x).digest() for x in leaves)).hexdigest(),
    }


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096, 50_001])
def test_parallel_writer_digest_and_file_digest_are_the_definition(tmp_path, size):
    """However the stream is cut into updates (inside a leaf, on a boundary, across several leaves),
    the leaves hashed on a pool give the definition's digest, as does the file read back."""
    data = os.urandom(size)
    want = _reference(data, 4096)
    serial = ChunkedSha256(4096)
    serial.update(data)
    assert serial.result() == want
    path = tmp_path / "f"
    path.write_bytes(data)
    with ThreadPoolExecutor(3) as pool:
        for cuts in ([], [1], [4095, 4097], [100, 8192, 8193, 20_000], list(range(0, size, 1000))):
            hasher = ParallelChunkedSha256(pool, 4096, max_pending_bytes=8192)
            start = 0
            for cut in [*cuts, size]:
                cut = min(max(cut, start), size)
                hasher.update(data[start:cut])
                start = cut
            assert hasher.result() == want, cuts
        assert tree_digest_file(path, pool, 4096) == want
        assert file_digests(path, 4096, pool, whole=False) == (None, want)
    assert tree_digest_file(path, None, 4096) == want


def test_leaves_hash_on_the_pool_threads(tmp_path):
    """The leaves of a written file and of a checked file are hashed by the pool's threads, not
    by the writer's or the reader's (which only cuts and submits them)."""
    names: set[str] = set()
    import mxconvert.core.digest as digest

    real = digest.piece_digest

    def recording(data) -> bytes:
        names.add(threading.current_thread().name)
        return real(data)

    data = os.urandom(5 * 4096 + 7)
    path = tmp_path / "f"
    path.write_bytes(data)
    with ThreadPoolExecutor(2, thread_name_prefix="leafpool") as pool:
        try:
            digest.piece_digest = recording
            hasher = ParallelChunkedSha256(pool, 4096)
            hasher.update(data)
            hasher.result()
            tree_digest_file(path, pool, 4096)
        finally:
            digest.piece_digest = real
    assert names and all(name.startswith("leafpool") for name in names), names


def test_a_file_that_shrinks_while_read_is_an_error(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * 4096))
    real_fstat = os.fstat

    def larger(fd):
        st = real_fstat(fd)
        return os.stat_result((*st[:6], st.st_size + 4096, *st[7:]))

    monkeypatch.setattr(os, "fstat", larger)
    with ThreadPoolExecutor(2) as pool, pytest.raises(OSError, match="ended at byte"):
        tree_digest_file(path, pool, 4096)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    default, both = root / "default", root / "both"
    assert run_cli("convert", EXAMPLE, "-p", "h100", "-o", default).exit_code == 0
    assert run_cli("convert", EXAMPLE, "-p", "h100", "-o", both, "--file-sha256").exit_code == 0
    return default, both


def _manifest(art: Path) -> dict:
    return json.loads((art / "mxconvert.json").read_text())


def _written(manifest: dict) -> list[dict]:
    return [f for r in manifest["ranks"] for f in r["files"]] + manifest["shared"]["files"]


def test_default_artifact_records_the_tree_digest_and_no_whole_file_sha256(built):
    default, both = built
    manifest = _manifest(default)
    assert manifest["schema"] == SCHEMA == "mxconvert.artifact/2"
    for entry in _written(manifest):
        assert "sha256" not in entry
        assert entry[CHUNKED_KEY] == _reference((default / entry["file"]).read_bytes(), CHUNK_BYTES)
    for entry in manifest["aux_files"]:  # copied files keep the sha256 their source has
        assert entry["sha256"] == sha256_file(default / entry["file"])
    with_sha = _manifest(both)
    for entry in _written(with_sha):  # --file-sha256: the same tree digest, plus the whole file's
        assert entry["sha256"] == sha256_file(both / entry["file"])
        assert entry[CHUNKED_KEY] == _reference((both / entry["file"]).read_bytes(), CHUNK_BYTES)


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("split", "sha256sum", "xxd", "bash")), reason="coreutils + xxd"
)
def test_the_documented_recipe_checks_the_digest_with_standard_tools(built, tmp_path):
    """docs/artifact.md's recipe, run as written: it prints the manifest's tree digest."""
    default, _ = built
    entry = _written(_manifest(default))[0]
    recipe = 'split -b 4194304 --filter=sha256sum "$1" | cut -c1-64 | xxd -r -p | sha256sum | cut -c1-64'
    docs = (Path(__file__).resolve().parents[1] / "docs" / "artifact.md").read_text()
    assert recipe.replace('"$1"', "$f") in docs
    got = subprocess.run(["bash", "-c", recipe, "recipe", default / entry["file"]], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == entry[CHUNKED_KEY]["digest"]
    big = tmp_path / "big"  # several leaves, the last one shorter
    big.write_bytes(os.urandom(2 * CHUNK_BYTES + 12345))
    got = subprocess.run(["bash", "-c", recipe, "recipe", big], capture_output=True, text=True)
    with ThreadPoolExecutor(2) as pool:
        assert got.stdout.strip() == tree_digest_file(big, pool)["digest"]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_hashes_tree_only_files_without_the_whole_file_stream(built, tmp_path, monkeypatch):
    """verify checks a default artifact's files by their tree digest alone (no whole-file sha256
    of a rank file is computed), and a flipped byte is a `file` problem naming it."""
    import mxconvert.pipeline.verify as verify

    art = tmp_path / "art"
    shutil.copytree(built[0], art)
    wholes: list[str] = []
    real = verify.file_digests

    def recording(path, *args, whole: bool = True, **kwargs):
        if whole:
            wholes.append(str(path))
        return real(path, *args, whole=whole, **kwargs)

    monkeypatch.setattr(verify, "file_digests", recording)
    assert verify.verify(art, jobs=2).ok
    assert wholes == []
    entry = _written(_manifest(art))[0]
    _flip(art / entry["file"], (art / entry["file"]).stat().st_size // 2)
    problems = [p for p in verify.verify(art, jobs=2).problems if p.kind == "file"]
    assert [p.message for p in problems] == [
        f"{entry['file']}: chunked sha256 differs from the manifest (load_artifact would refuse it)"
    ]


@pytest.mark.parametrize("which", ["default", "both"])
def test_load_artifact_and_the_plugin_check_refuse_a_flipped_byte(built, tmp_path, which):
    art = tmp_path / "art"
    shutil.copytree(built[0] if which == "default" else built[1], art)
    manifest = _manifest(art)
    entries = manifest["ranks"][0]["files"] + manifest["shared"]["files"]
    check_files(art, entries + manifest["aux_files"], jobs=2)  # the plugin's check (installer.py)
    assert mxconvert.load_artifact(art, 0).tensors
    entry = manifest["ranks"][0]["files"][0]
    _flip(art / entry["file"], 100)
    with pytest.raises(MismatchError, match=f"{entry['file']}: sha256 tree digest .* does not match the manifest"):
        check_files(art, entries, jobs=2)
    with pytest.raises(MismatchError, match="chunked sha256"):
        mxconvert.load_artifact(art, 0)


def test_file_sha256_is_part_of_the_up_to_date_check(built, tmp_path):
    """A re-run with --file-sha256 on an artifact without it is not up to date (it would lack the
    digest asked for), nor the other way round; the same request is."""
    art = tmp_path / "art"
    shutil.copytree(built[0], art)
    same = run_cli("convert", EXAMPLE, "-p", "h100", "-o", art, "--json")
    assert same.exit_code == 0 and json.loads(same.stdout)["status"] == "up_to_date"
    other = run_cli("convert", EXAMPLE, "-p", "h100", "-o", art, "--file-sha256")
    assert other.exit_code == 2 and "already exists" in other.output
    forced = run_cli("convert", EXAMPLE, "-p", "h100", "-o", art, "--file-sha256", "--force", "--json")
    assert forced.exit_code == 0 and json.loads(forced.stdout)["status"] == "written"
    assert all("sha256" in f for f in _written(_manifest(art)))
    back = run_cli("convert", EXAMPLE, "-p", "h100", "-o", art)
    assert back.exit_code == 2 and "already exists" in back.output


def test_tensor_bytes_do_not_depend_on_the_digest_option(built):
    """Only the manifest's digest fields differ between a default and a --file-sha256 artifact."""
    default, both = built
    a, b = _manifest(default), _manifest(both)
    for x, y in zip(_written(a), _written(b)):
        assert (default / x["file"]).read_bytes() == (both / y["file"]).read_bytes()
        assert x == {k: v for k, v in y.items() if k != "sha256"}
