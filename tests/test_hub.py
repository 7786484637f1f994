"""Hub sources (issue 13): the layout is decided from the small files, only its files are fetched,
and the LFS files' sha256 come from the hub's metadata instead of being recomputed.

Two kinds of tests, neither touches the network:
- a cache in huggingface_hub's standard layout (blobs/, snapshots/, refs/, trees/) holding BOTH
  GPT-OSS layouts, used offline: the other layout's weights are never read;
- a mocked hub (the `_snapshot_download` seam) that materialises only the files asked for, so the
  test sees exactly which files would be fetched for each layout choice.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from fixtures_ckpt import make_checkpoint, make_hf_cache
from helpers import run_cli, run_cli_subprocess

from mxconvert.artifact.manifest import read_manifest
from mxconvert.core.errors import InputError
from mxconvert.formats.mxfp4.checkpoint import open_checkpoint
from mxconvert.formats.registry import open_model
from mxconvert.storage import hub

REPO = "openai/gpt-oss-tiny"
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


OFFLINE = {"HF_HUB_OFFLINE": "1"}  # huggingface_hub reads HF_HUB_CACHE once, at import: pass --cache-dir


def _both_layouts_cache(tmp_path: Path, **kw):
    src = make_checkpoint(tmp_path, name="src-both", layout="both", **kw)
    return make_hf_cache(tmp_path, REPO, src=src), src


def _spoil(cache, pattern: str) -> list[str]:
    """Overwrite the blobs of the snapshot files matching `pattern` with garbage of the same size:
    reading any of them would make the conversion fail or verify differ."""
    spoiled = []
    for link in sorted(cache.snapshot_dir.rglob("*")):
        rel = link.relative_to(cache.snapshot_dir).as_posix()
        if link.is_symlink() and fnmatch.fnmatch(rel, pattern):
            blob = link.resolve()
            blob.write_bytes(b"\xff" * blob.stat().st_size)
            spoiled.append(rel)
    assert spoiled, pattern
    return spoiled


# ---- a cache in the standard layout, both layouts present, offline ---------------------------------------
@pytest.mark.parametrize("layout,other", [(None, "original/*.safetensors"), ("original", "model-*.safetensors")])
def test_cache_with_both_layouts_reads_only_the_chosen_one(tmp_path, layout, other):
    cache, _ = _both_layouts_cache(tmp_path)
    spoiled = _spoil(cache, other)
    out = tmp_path / "art"
    args = ["convert", REPO, "-p", "h100", "-o", out, "--json", "--cache-dir", cache.cache_dir]
    result = run_cli(*args, *(["--layout", layout] if layout else []), env=OFFLINE)
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    recorded = {f["file"] for f in manifest["source"]["files"]}
    prefix = "original/" if layout == "original" else ""
    assert not recorded & {s.removeprefix(prefix) for s in spoiled}
    assert manifest["source"]["layout"] == (layout or "hf")
    assert manifest["source"]["identity"] == {"kind": "hub", "repo_id": REPO, "revision": cache.revision}
    verify = run_cli("verify", out, "--json", "--cache-dir", cache.cache_dir, env=OFFLINE)
    assert verify.exit_code == 0, verify.output


def test_hub_hashes_come_from_the_cached_listing_and_are_not_recomputed(tmp_path, monkeypatch):
    cache, _ = _both_layouts_cache(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hashed: list[str] = []
    real = hub.sha256_file
    monkeypatch.setattr(hub, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    ckpt = open_checkpoint(REPO, cache_dir=str(cache.cache_dir))
    files = ckpt.describe_files()
    by_name = {f["file"]: f for f in files}
    shards = [f for f in files if f["file"].endswith(".safetensors")]
    assert shards and all(f["sha256_origin"] == "hub-tree" for f in shards)
    for f in shards:  # the hub's value is the true sha256 of the bytes
        assert f["sha256"] == hashlib.sha256((ckpt.root / f["file"]).read_bytes()).hexdigest()
    assert by_name["config.json"]["sha256_origin"] == "computed"
    assert hashed == ["config.json"]  # only the small non-LFS file was hashed here


def test_hub_hashes_fall_back_to_blob_names_without_a_cached_listing(tmp_path, monkeypatch):
    src = make_checkpoint(tmp_path, name="src")
    cache = make_hf_cache(tmp_path, REPO, src=src, write_tree_cache=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ckpt = open_checkpoint(REPO, cache_dir=str(cache.cache_dir))
    shards = [f for f in ckpt.describe_files() if f["file"].endswith(".safetensors")]
    assert shards and all(f["sha256_origin"] == "hub-blob" for f in shards)
    for f in shards:
        assert f["sha256"] == hashlib.sha256((src / f["file"]).read_bytes()).hexdigest()


def test_a_cache_file_whose_size_differs_from_the_hub_listing_is_refused(tmp_path, monkeypatch):
    src = make_checkpoint(tmp_path, name="src")
    cache = make_hf_cache(tmp_path, REPO, src=src)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shard = sorted(cache.snapshot_dir.glob("*.safetensors"))[0]
    # a damaged download that safetensors still parses (8 more bytes of header padding; bytes after
    # the data it refuses): the hub's size no longer holds
    blob = shard.resolve()
    data = blob.read_bytes()
    n = int.from_bytes(data[:8], "little")
    blob.write_bytes((n + 8).to_bytes(8, "little") + data[8 : 8 + n] + b" " * 8 + data[8 + n :])
    ckpt = open_checkpoint(REPO, cache_dir=str(cache.cache_dir))
    with pytest.raises(InputError, match="the hub lists"):
        ckpt.describe_files()


def test_verify_source_still_checks_the_bytes_of_a_hub_source(tmp_path):
    cache, _ = _both_layouts_cache(tmp_path)
    out = tmp_path / "art"
    assert run_cli("convert", REPO, "-p", "h100", "-o", out, "--cache-dir", cache.cache_dir, env=OFFLINE).exit_code == 0
    link = sorted(cache.snapshot_dir.glob("model-*.safetensors"))[0]
    shard_rel, shard = link.name, link.resolve()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # one bit of a tensor's data: same size, the hub's sha256 no longer matches
    shard.write_bytes(bytes(data))
    result = run_cli("verify", out, "--source", REPO, "--json", "--cache-dir", cache.cache_dir, env=OFFLINE)
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert [p["file"] for p in problems if p["kind"] == "source"] == [shard_rel]


# ---- hub-aware verify/inspect (issue 12 item 2) ------------------------------------------------------------
def _two_revisions(tmp_path: Path):
    """main -> COMMIT_A and v2 -> COMMIT_B, with different weights."""
    a = make_hf_cache(tmp_path / "a", REPO, COMMIT_A, ref="main", seed=1)
    b = make_hf_cache(tmp_path / "b", REPO, COMMIT_B, ref="v2", seed=2)
    shutil.copytree(b.repo_dir, a.repo_dir, dirs_exist_ok=True, symlinks=True)
    return a


def test_verify_defaults_to_the_revision_recorded_in_the_manifest(tmp_path):
    cache = _two_revisions(tmp_path)
    out = tmp_path / "art"
    cd = ["--cache-dir", cache.cache_dir]
    result = run_cli("convert", REPO, "--revision", "v2", "-p", "h100", "-o", out, *cd, env=OFFLINE)
    assert result.exit_code == 0, result.output
    assert read_manifest(out)["source"]["identity"]["revision"] == COMMIT_B
    ok = run_cli("verify", out, "--source", REPO, "--json", *cd, env=OFFLINE)
    assert ok.exit_code == 0, ok.output
    wrong = run_cli("verify", out, "--source", REPO, "--revision", "main", "--json", *cd, env=OFFLINE)
    assert wrong.exit_code == 1
    assert any(p["kind"] == "source" for p in json.loads(wrong.stdout)["problems"])
    by_commit = run_cli(
        "verify",
        out,
        "--source",
        REPO,
        "--revision",
        COMMIT_B,
        "--cache-dir",
        cache.cache_dir,
        "--json",
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert by_commit.exit_code == 0, by_commit.output


def test_inspect_takes_a_hub_revision(tmp_path):
    cache = _two_revisions(tmp_path)
    cd = ["--cache-dir", cache.cache_dir]
    a = run_cli("inspect", REPO, "--json", *cd, env=OFFLINE)
    b = run_cli("inspect", REPO, "--revision", "v2", "--json", *cd, env=OFFLINE)
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert json.loads(a.stdout)["source"]["revision"] == COMMIT_A
    assert json.loads(b.stdout)["source"]["revision"] == COMMIT_B


def test_a_snapshot_folder_given_as_a_path_keeps_its_repo_id_and_commit(tmp_path):
    cache = make_hf_cache(tmp_path, REPO)
    ckpt = open_checkpoint(str(cache.snapshot_dir))
    assert (ckpt.identity.kind, ckpt.identity.repo_id, ckpt.identity.revision) == ("hub", REPO, cache.revision)


def test_revision_on_a_local_folder_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path)
    result = run_cli_subprocess("select", folder, "-p", "h100", "--revision", "v2")
    assert result.returncode == 2
    assert "local folder" in result.stderr and "Traceback" not in result.stderr


# ---- a mocked hub: which files are fetched for each layout choice ----------------------------------------
class MockHub:
    """Stands in for huggingface_hub.snapshot_download online: lists the whole repo in
    trees/<commit>.json (as huggingface_hub >= 2 does) and materialises only the files matching
    allow_patterns, recording them."""

    def __init__(self, tmp_path: Path, src: Path, commit: str = COMMIT_A) -> None:
        self.src, self.commit = src, commit
        self.repo_dir = tmp_path / "mockhub" / ("models--" + REPO.replace("/", "--"))
        self.snapshot = self.repo_dir / "snapshots" / commit
        self.fetched: list[str] = []
        self.files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())

    def listing(self) -> dict:
        out = {}
        for rel in self.files:
            data = (self.src / rel).read_bytes()
            entry = {"size": len(data), "blob_id": hashlib.sha1(data).hexdigest()}
            if rel.endswith(".safetensors"):
                entry |= {"lfs_sha256": hashlib.sha256(data).hexdigest(), "lfs_size": len(data)}
            out[rel] = entry
        return out

    def __call__(self, repo_id, *, revision=None, cache_dir=None, local_files_only=False, allow_patterns=None):
        assert repo_id == REPO and not local_files_only
        (self.repo_dir / "trees").mkdir(parents=True, exist_ok=True)
        (self.repo_dir / "trees" / f"{self.commit}.json").write_text(
            json.dumps({"format_version": 1, "files": self.listing()})
        )
        for rel in self.files:
            if any(fnmatch.fnmatch(rel, p) for p in allow_patterns):
                dst = self.snapshot / rel
                if not dst.exists():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(self.src / rel, dst)
                    self.fetched.append(rel)
        return str(self.snapshot)

    def size(self, files) -> int:
        return sum((self.src / f).stat().st_size for f in files)


@pytest.fixture
def online(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.mark.parametrize("layout", [None, "hf", "original"])
def test_mocked_hub_fetches_only_the_chosen_layout(tmp_path, monkeypatch, online, layout):
    src = make_checkpoint(tmp_path, name="repo", layout="both")
    mock = MockHub(tmp_path, src)
    monkeypatch.setattr(hub, "_snapshot_download", mock)
    ckpt = open_model(REPO, layout=layout)
    fetched = set(mock.fetched)
    hf_weights = {f for f in mock.files if f.endswith(".safetensors") and "/" not in f}
    orig_weights = {f for f in mock.files if f.startswith("original/") and f.endswith(".safetensors")}
    assert hf_weights and orig_weights
    if layout == "original":
        assert ckpt.layout == "original" and orig_weights <= fetched and not hf_weights & fetched
        assert {"original/config.json"} <= fetched and "tokenizer.json" not in fetched
    else:
        assert ckpt.layout == "hf" and hf_weights <= fetched and not orig_weights & fetched
        assert {"config.json", "model.safetensors.index.json", "tokenizer.json"} <= fetched
    assert not any(f.endswith("README.md") for f in fetched)  # never copied, never fetched
    # the decision files came first, alone
    first = mock.fetched[: len([f for f in hub.DECISION_FILES if f in mock.files])]
    assert set(first) <= set(hub.DECISION_FILES)
    # hashes recorded from the hub listing
    shards = [f for f in ckpt.describe_files() if f["file"].endswith(".safetensors")]
    assert shards and all(f["sha256_origin"] == "hub-tree" for f in shards)
    # what the earlier allow_patterns would have fetched: both layouts' weights
    legacy = set(hub.legacy_files(mock.files))
    assert hf_weights | orig_weights <= legacy
    assert mock.size(fetched) < mock.size(legacy)


def test_mocked_hub_fetches_only_the_shards_an_nvfp4_index_names(tmp_path, monkeypatch, online):
    src = tmp_path / "repo"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "tiny-nvfp4-modelopt-qwen3", src)
    stray = src / "consolidated.safetensors"  # a second copy some repos ship; not in the index
    stray.write_bytes(b"\0" * 1024)
    mock = MockHub(tmp_path, src)
    monkeypatch.setattr(hub, "_snapshot_download", mock)
    ckpt = open_model(REPO)
    assert ckpt.format_name == "nvfp4"
    index = json.loads((src / "model.safetensors.index.json").read_text())
    assert {f for f in mock.fetched if f.endswith(".safetensors")} == set(index["weight_map"].values())
    assert "consolidated.safetensors" in hub.legacy_files(mock.files)
