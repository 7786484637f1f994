"""The formats registry (issue 21): storage knows no format, the hub fetches what the formats'
chooser picks, the registry detects the format of a folder and opens it with that format's reader,
and every per-format table names every format."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from fixtures_ckpt import make_checkpoint
from fixtures_nvfp4 import EXAMPLE_DIRS

import mxconvert.storage.source as source_mod
from mxconvert.core.errors import InputError
from mxconvert.formats import registry
from mxconvert.formats.mxfp4.checkpoint import Checkpoint
from mxconvert.formats.nvfp4.checkpoint import PRODUCERS, Nvfp4Checkpoint
from mxconvert.selection import vocabulary
from mxconvert.selection.report import FORMAT_ENUMS, UNTAGGED_FORMAT, Selection
from mxconvert.storage import hub

PACKAGE = Path(__file__).resolve().parents[1] / "mxconvert"
REPO = "openai/gpt-oss-tiny"
COMMIT = "c" * 40
QWEN_MO = EXAMPLE_DIRS["tiny-nvfp4-modelopt-qwen3"]


def _repo_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


class _Hub:
    """`hub._snapshot_download` without a network: lists the whole repo in the cache's
    `trees/<commit>.json` (as huggingface_hub does) and copies the files `allow_patterns` names
    (exact paths, as `fetch` asks) from `src` into the snapshot folder, recording each request."""

    def __init__(self, tmp_path: Path, src: Path) -> None:
        self.src = src
        self.repo_dir = tmp_path / "cache" / "models--openai--gpt-oss-tiny"
        self.snapshot = self.repo_dir / "snapshots" / COMMIT
        self.requests: list[list[str]] = []

    def __call__(self, repo_id, *, revision=None, cache_dir=None, local_files_only=False, allow_patterns=()):
        listing = {rel: {"size": (self.src / rel).stat().st_size} for rel in _repo_files(self.src)}
        (self.repo_dir / "trees").mkdir(parents=True, exist_ok=True)
        (self.repo_dir / "trees" / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
        asked = list(allow_patterns)
        assert not [p for p in asked if any(c in p for c in "*?[")]  # exact names only
        self.requests.append(sorted(asked))
        for rel in asked:
            if (self.src / rel).is_file():
                (self.snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.src / rel, self.snapshot / rel)
        return str(self.snapshot)


def _storage_imports() -> set[str]:
    found = set()
    for path in (PACKAGE / "storage").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return found


# ---- storage knows no format -------------------------------------------------------------------------------
def test_storage_imports_no_formats_module():
    imported = _storage_imports()
    assert any(name.startswith("mxconvert.storage") for name in imported)  # the walk saw the package's imports
    assert not [name for name in imported if name.startswith("mxconvert.formats")]


def test_fetch_downloads_the_decision_files_then_exactly_what_the_chooser_picks(tmp_path, monkeypatch):
    src = make_checkpoint(tmp_path, name="repo", layout="both")
    mock = _Hub(tmp_path, src)
    monkeypatch.setattr(hub, "_snapshot_download", mock)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    asked: list[tuple[Path, list[str]]] = []
    picked = ["original/config.json", "tokenizer.json"]

    def choose(snapshot: Path, repo_files: list[str]) -> list[str]:
        asked.append((snapshot, list(repo_files)))
        return picked

    snap = hub.fetch(REPO, choose)
    assert len(asked) == 1 and asked[0][0] == mock.snapshot
    assert set(asked[0][1]) >= {f for f in hub.DECISION_FILES if (src / f).is_file()}
    assert mock.requests[0] == sorted(hub.DECISION_FILES)
    assert mock.requests[1] == sorted(picked)  # the second download is the chooser's pick, nothing more
    assert set(picked) <= set(snap.fetched)


@pytest.mark.parametrize("layout, prefix", [(None, ""), ("original", "original/")])
def test_open_model_fetches_through_the_registry_chooser(tmp_path, monkeypatch, layout, prefix):
    src = make_checkpoint(tmp_path, name="repo", layout="both")
    mock = _Hub(tmp_path, src)
    monkeypatch.setattr(hub, "_snapshot_download", mock)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    choosers = []
    real_fetch = source_mod.fetch

    def spy(repo_id, choose_files, **kw):
        choosers.append(choose_files)
        return real_fetch(repo_id, choose_files, **kw)

    monkeypatch.setattr(source_mod, "fetch", spy)
    ckpt = registry.open_model(REPO, layout=layout)
    assert len(choosers) == 1
    expected = registry.hub_file_chooser(layout)(src, _repo_files(src))
    assert mock.requests[1] == expected
    weights = [f for f in expected if f.endswith(".safetensors")]
    assert weights and all(f.startswith(prefix) and "/" not in f[len(prefix) :] for f in weights)
    assert isinstance(ckpt, Checkpoint) and ckpt.layout == (layout or "hf")
    assert ckpt.hub_snapshot is not None and ckpt.identity.kind == "hub"


# ---- detection ---------------------------------------------------------------------------------------------
def test_detection_order_names_every_format_once():
    assert sorted(registry.DETECTION_ORDER) == sorted(registry.FORMATS)


@pytest.mark.parametrize("example", sorted(EXAMPLE_DIRS))
def test_an_nvfp4_folder_is_detected_and_opened_by_the_nvfp4_reader(example):
    folder = EXAMPLE_DIRS[example]
    assert registry.detect_format(folder).name == "nvfp4"
    ckpt = registry.open_model(str(folder))
    assert isinstance(ckpt, Nvfp4Checkpoint) and ckpt.hub_snapshot is None
    assert ckpt.producer is PRODUCERS[ckpt.facts.quant_format]
    files = _repo_files(folder)
    index = folder / "model.safetensors.index.json"
    weights = (
        set(json.loads(index.read_text())["weight_map"].values())
        if index.is_file()
        else {f for f in files if f.endswith(".safetensors")}
    )
    small = {f for f in files if "/" not in f and f.endswith(hub.AUX_SUFFIXES)}
    assert registry.hub_file_chooser(None)(folder, files) == sorted(weights | small)


def test_any_other_folder_goes_to_gpt_oss_whose_reader_says_what_it_lacks(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert registry.detect_format(empty).name == "mxfp4"
    with pytest.raises(InputError, match="no config.json"):
        registry.open_model(str(empty))


def test_the_nvfp4_reader_refuses_a_folder_that_is_not_nvfp4(tmp_path):
    gpt_oss = make_checkpoint(tmp_path)
    identity = source_mod.SourceIdentity("local", str(gpt_oss))
    with pytest.raises(InputError, match="not an NVFP4 checkpoint"):
        registry.FORMATS["nvfp4"].open_checkpoint(gpt_oss, identity, None)


# ---- per-format tables name every format -------------------------------------------------------------------
def test_every_format_has_a_backend_vocabulary_and_a_selection_record():
    assert list(vocabulary.FORMATS) == list(registry.FORMATS)
    assert set(FORMAT_ENUMS) == set(registry.FORMATS) and UNTAGGED_FORMAT in registry.FORMATS
    for name, row in vocabulary.FORMATS.items():
        assert row.enum is FORMAT_ENUMS[name]


def test_only_the_untagged_format_writes_selection_json_without_a_format_key():
    for name, enum in FORMAT_ENUMS.items():
        backend = next(iter(enum))
        data = Selection(backend, "K", "auto", "vllm-0.33", "h100", "bf16", (), format=name).to_json()
        assert ("format" in data) == (name != UNTAGGED_FORMAT)
        assert Selection.from_json(data).format == name


def test_the_mxfp4_alias_ck_is_the_mxfp4_enums_and_not_nvfp4s():
    assert vocabulary.backend_matches("AITER_MXFP4_BF16", "ck", "mxfp4")
    assert not vocabulary.backend_matches("AITER_MXFP4_BF16", "ck", "nvfp4")
    assert vocabulary.backend_matches("MARLIN", "marlin", "nvfp4")
