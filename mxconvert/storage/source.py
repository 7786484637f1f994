"""A checkpoint's source: where it comes from (a local folder or a hub repo, `resolve_source`), and
its safetensors folder as every format reader sees it (`SafetensorsSource`): where its files are,
which shard holds which tensor, and which tensors a format converts, passes through, or must refuse.

Every format reader (GPT-OSS MXFP4, NVFP4) stands on this one class, so the rules that keep a
conversion honest are written once:

- paths stay inside and only regular files are read (storage/files.py);
- every tensor is accounted for: a format names the tensors it converts and a pattern for names
  that look like expert tensors; everything else is passed through unchanged, and a tensor that
  looks like an expert tensor but is not converted is refused by name, never dropped;
- a source that changes while it is read is noticed (size, mtime and inode of every file read).

Which format a folder holds is not decided here: formats/registry.py asks each format, and gives the
hub the format's choice of files to fetch (`choose_files`).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.errors import InputError
from mxconvert.storage.files import check_relative, hub_repo_folder, read_json, require_regular, resolve_inside
from mxconvert.storage.hub import ChooseFiles, HubSnapshot, describe_checkpoint_files, fetch, snapshot_identity
from mxconvert.storage.safetensors_header import TensorInfo
from mxconvert.storage.safetensors_io import ShardReader

if TYPE_CHECKING:
    import torch

INDEX_NAME = "model.safetensors.index.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class SourceIdentity:
    """Where the checkpoint came from: a local path, or a hub repo at a commit."""

    kind: str  # "local" or "hub"
    path: str
    repo_id: str | None = None
    revision: str | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


# ---- the checkpoint folder -------------------------------------------------------------------------
class SafetensorsSource:
    """The safetensors files of one checkpoint folder, validated before any work starts.

    Subclasses (one per format) set `config_path`/`config`, then call `_open_weights()`, and
    define `expert_names()` (what they convert) and `EXPERT_LIKE` (a regex for names that look
    like routed-expert tensors, which must therefore be converted or refused)."""

    format_name = "?"
    #: Names that look like routed-expert tensors of this format.
    EXPERT_LIKE: re.Pattern = re.compile(r"$^")
    #: Extra files (besides shards and config) that the artifact is derived from.
    EXTRA_SOURCE_FILES: tuple[str, ...] = ()
    #: For a hub model: what was fetched, with the hub's sha256 of its LFS files (hub.py; set by
    #: whoever opens the source, from `resolve_source`).
    hub_snapshot: HubSnapshot | None = None

    def __init__(self, root: Path, identity: SourceIdentity) -> None:
        self.root, self.identity = root, identity
        repo = hub_repo_folder(root)
        self.allowed_roots: tuple[Path, ...] = (repo,) if repo is not None else ()
        self._seen: dict[Path, tuple] = {}
        #: (signatures of the source files, their description) from the last `describe_files`.
        self._described: tuple[tuple, list[dict]] | None = None
        self.config_path = root / "config.json"

    def _open_weights(self) -> None:
        self.weight_map = self._read_weight_map()
        self.shards: dict[str, ShardReader] = {}
        for rel in sorted(set(self.weight_map.values())):
            path = self._member(rel, self.root / INDEX_NAME)
            self._remember(path)
            self.shards[rel] = ShardReader(path)
        for name, rel in self.weight_map.items():
            if name not in self.shards[rel].tensors:
                raise InputError(f"{self.root / rel}: index says it holds tensor {name!r}, but it does not")

    def _member(self, rel: str, where: Path) -> Path:
        path = resolve_inside(self.root, rel, str(where), self.allowed_roots)
        require_regular(path, "shard")
        return path

    def _remember(self, path: Path) -> None:
        self._seen[path] = _signature(require_regular(path))

    def _read_config(self) -> dict:
        path = resolve_inside(self.root, "config.json", str(self.root), self.allowed_roots)
        self._remember(path)
        return read_json(path)

    def _read_weight_map(self) -> dict[str, str]:
        index = self.root / INDEX_NAME
        if index.exists() or index.is_symlink():
            resolve_inside(self.root, INDEX_NAME, str(self.root), self.allowed_roots)
            self._remember(index)
            indexed = read_json(index).get("weight_map")
            if not isinstance(indexed, dict) or not indexed:
                raise InputError(f"{index}: no 'weight_map' object")
            for name, rel in indexed.items():
                check_relative(rel, f"{index}: tensor {name!r}")
            missing = sorted({f for f in indexed.values() if not (self.root / f).exists()})
            if missing:
                raise InputError(f"{index}: names shard(s) that do not exist: {', '.join(missing)}")
            return {str(k): str(v) for k, v in indexed.items()}
        files = sorted(p.name for p in self.root.glob("*.safetensors"))
        if not files:
            raise InputError(f"{self.root}: no *.safetensors files and no {INDEX_NAME}")
        weight_map: dict[str, str] = {}
        for rel in files:
            for name in ShardReader(self._member(rel, self.root)).tensors:
                if name in weight_map:
                    raise InputError(f"{self.root}: tensor {name!r} is in both {weight_map[name]} and {rel}")
                weight_map[name] = rel
        return weight_map

    # ---- accounting -------------------------------------------------------------------------------
    def expert_names(self) -> set[str]:  # pragma: no cover - defined by each format
        raise NotImplementedError

    def account(self) -> None:
        """Every tensor is converted or passed through; a tensor that looks like a routed-expert
        tensor but is not converted is refused (never silently dropped or mislabelled)."""
        converted = self.expert_names()
        missing = sorted(converted - set(self.weight_map))
        if missing:
            raise InputError(f"{self.root}: missing tensor {missing[0]!r} (not in any shard)")
        stray = [n for n in self.weight_map if n not in converted and self.EXPERT_LIKE.search(n)]
        if stray:
            more = f" and {len(stray) - 1} more" if len(stray) > 1 else ""
            raise InputError(
                f"{self.file_of(stray[0])}: tensor {stray[0]!r}{more} looks like a routed-expert tensor but is "
                f"not one this {self.format_name} checkpoint's config accounts for ({self._accounting_hint()}); "
                "refusing rather than dropping it: fix the config or remove the tensor"
            )

    def _accounting_hint(self) -> str:
        return f"see {self.config_path.name}"

    # ---- access -----------------------------------------------------------------------------------
    def info(self, name: str) -> TensorInfo:
        rel = self.weight_map.get(name)
        if rel is None:
            raise InputError(f"{self.root}: missing tensor {name!r} (not in any shard)")
        return self.shards[rel].tensors[name]

    def file_of(self, name: str) -> Path:
        return self.root / self.weight_map[name]

    def tensor(self, name: str) -> torch.Tensor:
        self.info(name)
        return self.shards[self.weight_map[name]].get(name)

    def slice(self, name: str):
        """A lazy safetensors slice, so a rank reads only its own rows / experts."""
        self.info(name)
        return self.shards[self.weight_map[name]].get_slice(name)

    def other_tensor_names(self) -> list[str]:
        """Every tensor that is not converted, in index order (passed through as is)."""
        experts = self.expert_names()
        return [n for n in self.weight_map if n not in experts]

    def aux_files(self) -> list[Path]:
        """Config, tokenizer and other small files copied unchanged into the artifact. Folders
        and weight files are skipped; anything else must be a regular file inside the folder."""
        skip = set(self.weight_map.values()) | {INDEX_NAME}
        out = []
        for path in sorted(self.root.iterdir()):
            if path.name in skip or path.name.startswith(".") or path.suffix in _WEIGHT_SUFFIXES:
                continue
            if path.is_dir():
                continue
            resolve_inside(self.root, path.name, str(self.root), self.allowed_roots)
            self._remember(path)
            out.append(path)
        return out

    def source_files(self) -> list[Path]:
        extra = [self.root / n for n in self.EXTRA_SOURCE_FILES if (self.root / n).is_file()]
        return [self.root / rel for rel in sorted(self.shards)] + [self.config_path] + extra

    def describe_files(self) -> list[dict]:
        """Size and sha256 of every file the artifact is derived from (hub sources: the hub's).

        Hashed once per version of the files: the targets of one `convert -p A -p B --tp 1 --tp 4`
        share the opened source, so it is read for hashing once, not once per target; a file whose
        size, mtime or inode changed since is hashed again (and `check_unchanged` refuses a source
        that changed while a target was being written)."""
        signature = tuple((path, _signature(require_regular(path))) for path in self.source_files())
        cached = self._described
        if cached is None or cached[0] != signature:
            cached = self._described = (signature, describe_checkpoint_files(self))
        return copy.deepcopy(cached[1])

    def check_unchanged(self) -> None:
        """Refuse a source that changed (size, mtime, inode) since it was opened: what was read
        may mix old and new bytes."""
        for path, before in self._seen.items():
            try:
                now = _signature(os.stat(path))
            except OSError:
                now = None
            if now != before:
                raise InputError(
                    f"{path}: the source changed while it was being read; nothing was written. "
                    "Run again once the checkpoint is no longer being modified"
                )


# ---- where a source is ---------------------------------------------------------------------------------
#: A Hugging Face repo id: exactly `org/name` (one `/`), each part of letters, digits, `_`, `.`, `-`,
#: the org starting with a letter or digit.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def path_reason(source: str) -> str | None:
    """Why a MODEL that names nothing on disk is a path, not a Hugging Face repo id; None when it may
    be a repo id. The rule (docs/usage.md, "MODEL"): it is a path when it starts with `/`, `./`,
    `../` or `~`, is `.` or `..`, holds a backslash or the OS separator other than exactly once
    (a repo id is exactly `org/name`), ends with a separator, or its first part names a folder that
    exists here (`models/gpt-oss` beside a `models/` folder)."""
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    if source in (".", "..") or source.startswith(("/", "./", "../", "~")) or source[:1] in seps:
        return "it is written as a path"
    if "\\" in source:
        return "it holds a backslash, which no repo id does"
    if source[-1:] in seps:
        return "it ends with a separator, which no repo id does"
    parts = source.split("/")
    if len(parts) > 2:
        return "it holds more than one '/', and a repo id is exactly org/name"
    if len(parts) == 2 and parts[0] and Path(parts[0]).expanduser().is_dir():
        return f"{parts[0]}{os.sep} is a folder here, so {source} names a path in it"
    return None


def _nearest_existing(path: Path) -> Path:
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _refuse_missing_path(source: str, path: Path) -> None:
    """Refuse a MODEL that looks like a path (`path_reason`) and names nothing: never a hub look-up."""
    reason = path_reason(source)
    if reason is None:
        return
    org = source.split("/")[0]
    todo = (
        f"Check the path, or run from a folder without {org}{os.sep} to fetch the hub repo {source}"
        if reason.startswith(f"{org}{os.sep} is a folder here")
        else "Check the path; a hub repo is given as exactly org/name"
    )
    raise InputError(
        f"{source}: no such folder ({path.absolute()}; the nearest existing folder is "
        f"{_nearest_existing(path)}). It is not looked up on the Hugging Face hub: {reason}. {todo}"
    )


@dataclass(frozen=True)
class ResolvedSource:
    """A source given on the command line, resolved to the folder a reader opens."""

    #: The local folder (resolved), or the hub snapshot folder holding the fetched files.
    folder: Path
    identity: SourceIdentity
    #: For a hub repo: what was fetched and the hub's hashes; None for a local folder.
    snapshot: HubSnapshot | None = None


def resolve_source(
    source: str,
    choose_files: ChooseFiles,
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> ResolvedSource:
    """Resolve a local folder, or a Hugging Face repo id through huggingface_hub's cache.

    A local folder that is a snapshot of a Hugging Face cache keeps its repo id and commit. A repo id
    is fetched with `choose_files` deciding which files (the format's choice: storage knows no
    format). The hub path honours `HF_HUB_OFFLINE`, `HF_HUB_CACHE`/`HF_HOME` and `--cache-dir`, so an
    already-downloaded model is used without any network access.
    """
    path = Path(source).expanduser()
    if path.exists():
        if revision is not None:
            raise InputError(
                f"--revision {revision}: {source} is a local folder, which has no revisions "
                "(give a hub repo id to pick a revision)"
            )
        hub = snapshot_identity(path)
        identity = (
            SourceIdentity("hub", str(path.absolute()), repo_id=hub[0], revision=hub[1])
            if hub
            else SourceIdentity("local", str(path.resolve()))
        )
        return ResolvedSource(path.resolve(), identity)
    _refuse_missing_path(source, path)
    if not _REPO_ID.match(source):
        raise InputError(f"{source}: no such folder, and not a Hugging Face repo id (org/name)")
    snap = fetch(source, choose_files, revision=revision, cache_dir=cache_dir)
    identity = SourceIdentity("hub", str(snap.folder), repo_id=source, revision=snap.commit)
    return ResolvedSource(snap.folder, identity, snap)
