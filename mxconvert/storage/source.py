"""A safetensors checkpoint folder as both readers see it: where its files are, which shard holds
which tensor, and which tensors a format converts, passes through, or must refuse.

Every format reader (GPT-OSS MXFP4, NVFP4) stands on this one class, so the rules that keep a
conversion honest are written once:

- paths stay inside: index entries are relative paths without `..`, and what they resolve to
  (symlinks followed) lies inside the checkpoint folder, or inside the Hugging Face cache folder
  of the repo the model came from (the hub stores snapshot files as links into `blobs/`);
- only regular files are read: a FIFO, device or folder where a file should be is refused
  before anything opens it (opening a FIFO would wait forever);
- every tensor is accounted for: a format names the tensors it converts and a pattern for names
  that look like expert tensors; everything else is passed through unchanged, and a tensor that
  looks like an expert tensor but is not converted is refused by name, never dropped;
- a source that changes while it is read is noticed (size, mtime and inode of every file read).
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from mxconvert.core.digest import sha256_stream
from mxconvert.core.errors import InputError
from mxconvert.storage.safetensors_io import ShardReader, TensorInfo

if TYPE_CHECKING:
    import torch

    from mxconvert.storage.hub import HubSnapshot

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


# ---- paths and files ---------------------------------------------------------------------------
def hub_repo_folder(folder: Path) -> Path | None:
    """The repo folder of the Hugging Face cache (`.../models--org--name`) that `folder` (a
    snapshot, or a folder inside one) belongs to, or None when it is not in such a cache."""
    for parent in [folder, *folder.parents]:
        if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith(("models--", "datasets--")):
            return parent.parent.parent
    return None


def check_relative(rel: object, where: str) -> str:
    """`rel` must be a relative POSIX path that does not climb out (`..`) of its folder."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise InputError(f"{where}: file entry {rel!r} is not a relative path")
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
        raise InputError(f"{where}: file entry {rel!r} leaves its folder (absolute path or '..'); refused")
    return rel


def resolve_inside(root: Path, rel: str, where: str, allowed: tuple[Path, ...] = ()) -> Path:
    """`root / rel`, checked lexically and after following symlinks to stay inside `root` (or one
    of the `allowed` folders, e.g. the hub cache the model came from)."""
    check_relative(rel, where)
    path = root / rel
    real = path.resolve()
    for base in (root, *allowed):
        base_real = base.resolve()
        if real == base_real or base_real in real.parents:
            return path
    raise InputError(f"{path}: resolves to {real}, outside {root}; files that leave the folder are refused")


def require_regular(path: Path, what: str = "file") -> os.stat_result:
    """stat of `path`, which must be a regular file (symlinks followed). Anything else (FIFO,
    socket, device, folder) is refused before it is opened: reading a FIFO would block."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        )
        raise InputError(f"{path}: {what} is {kind}; only regular files are read")
    return st


def read_json(path: Path) -> dict:
    """A JSON object from a regular file; any problem is an InputError naming the file."""
    require_regular(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def read_folder_json(path: Path) -> dict:
    """A JSON file of a checkpoint folder, which must resolve inside that folder (or the hub
    cache it came from) and be a regular file."""
    repo = hub_repo_folder(path.parent)
    resolve_inside(path.parent, path.name, str(path.parent), (repo,) if repo else ())
    return read_json(path)


def sha256_file(path: Path) -> str:
    """sha256 hex of a regular file (read in 4 MiB blocks into one reused buffer)."""
    require_regular(path)
    try:
        return sha256_stream(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


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
    #: For a hub model: what was fetched, with the hub's sha256 of its LFS files (hub.py).
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
        from mxconvert.storage.hub import describe_checkpoint_files

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
