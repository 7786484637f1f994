"""Hugging Face hub sources: fetch only what will be read, and take file hashes from the hub.

A GPT-OSS repo ships its weights twice (the Hugging Face layout at the root and OpenAI's
`original/` layout), so asking for every `*.safetensors` downloads two copies of which one is read.
Here the layout is decided first from the small files (config, index, `original/config.json`,
`hf_quant_config.json`), honouring `--layout`, and then only that layout's weight files (the
shards its index names) and the small files the artifact copies are fetched. The decision is the
format's (`fetch`'s `choose_files`, supplied by formats/registry.py): the hub knows no format.

The hub records the sha256 of every LFS file (the weights). huggingface_hub keeps the repo's file
listing of a commit in its cache (`trees/<commit>.json`, with `lfs_sha256`), and stores each LFS
blob under that sha256 (`blobs/<sha256>`), so the source hashes of a hub model are known without
reading 65 GB again. Each source file's record says where its hash came from (`sha256_origin`):

- `hub-tree`: the cached file listing of the commit, as the hub API returned it;
- `hub-blob`: the name of the cache blob (the LFS sha256 huggingface_hub stored it under);
- `computed`: hashed here (local folders, and small non-LFS files such as config.json).

`verify --source` re-hashes the source bytes, so a cache file that does not hold what the hub
says is still caught there.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mxconvert.core import jsonio
from mxconvert.core.errors import InputError, MxconvertError
from mxconvert.storage.files import read_folder_json, sha256_file

#: Small files that decide the checkpoint's format and layout; fetched first.
DECISION_FILES = (
    "config.json",
    "hf_quant_config.json",
    "model.safetensors.index.json",
    "original/config.json",
    "original/model.safetensors.index.json",
)
#: Suffixes of the small files a checkpoint folder's artifact copies (config, tokenizer, template).
AUX_SUFFIXES = (".json", ".txt", ".model", ".jinja")
#: What mxconvert asked for before the layout was decided first (kept to report the saving).
LEGACY_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.txt",
    "*.model",
    "*.jinja",
    "original/*.json",
    "original/*.safetensors",
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class HubSnapshot:
    """A hub repo at one commit, with the files fetched for one checkpoint layout."""

    folder: Path
    repo_id: str
    commit: str
    fetched: list[str] = field(default_factory=list)  # repo paths asked for, in order
    listing: dict[str, dict] | None = None  # repo path -> {"size", "lfs_sha256"?} (cached tree)

    def known_hashes(self) -> dict[str, dict]:
        """sha256 and size of each LFS file of the snapshot, by repo path, with their origin."""
        out: dict[str, dict] = {}
        for rel in self.fetched:
            entry = (self.listing or {}).get(rel) or {}
            if entry.get("lfs_sha256"):
                out[rel] = {
                    "sha256": entry["lfs_sha256"],
                    "size": entry.get("lfs_size", entry.get("size")),
                    "sha256_origin": "hub-tree",
                }
                continue
            blob = _blob_name(self.folder / rel)
            if blob and _SHA256.match(blob):
                out[rel] = {"sha256": blob, "size": None, "sha256_origin": "hub-blob"}
        return out


# ---- seams to huggingface_hub (replaced by a mocked hub in tests) -----------------------------------
def _snapshot_download(repo_id: str, **kwargs) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, **kwargs)


def _cached_listing(folder: Path, commit: str) -> dict[str, dict] | None:
    """The repo's file listing at `commit` that huggingface_hub cached next to the snapshots
    (`<repo folder>/trees/<commit>.json`, format_version 1), or None where there is none."""
    path = folder.parent.parent / "trees" / f"{commit}.json"
    try:
        data = jsonio.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format_version") != 1 or not isinstance(data.get("files"), dict):
        return None
    return {str(k): v for k, v in data["files"].items() if isinstance(v, dict)}


def _blob_name(path: Path) -> str | None:
    """The cache blob a snapshot entry links to (its etag: the sha256 for LFS files)."""
    try:
        if not path.is_symlink():
            return None
        return Path(os.readlink(path)).name
    except OSError:
        return None


# ---- which files one layout needs --------------------------------------------------------------------
#: A format's choice of files: (snapshot folder holding the decision files, every repo path) -> the
#: repo paths to fetch (formats/registry.py supplies it; `folder_files` does the format-neutral part).
ChooseFiles = Callable[[Path, list[str]], list[str]]


def folder_files(snapshot: Path, root: Path, repo_files: list[str]) -> list[str]:
    """Repo paths to fetch for the checkpoint whose weights lie in `root` (the snapshot folder or a
    folder inside it, e.g. `original/`): the weight files of that folder (the shards its index
    names, else its `*.safetensors`) and its small files (config, tokenizer, template)."""
    prefix = "" if root == snapshot else root.relative_to(snapshot).as_posix() + "/"
    in_root = [f for f in repo_files if f.startswith(prefix) and "/" not in f[len(prefix) :]]
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_folder_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index}: no 'weight_map' object")
        weights = sorted({prefix + str(v) for v in weight_map.values()})
    else:
        weights = [f for f in in_root if f.endswith(".safetensors")]
    small = [f for f in in_root if f.endswith(AUX_SUFFIXES)]
    return sorted(set(small) | set(weights))


def legacy_files(repo_files: list[str]) -> list[str]:
    """What the earlier `snapshot_download(allow_patterns=LEGACY_PATTERNS)` fetched (fnmatch: `*`
    crosses `/`), to report what deciding the layout first saves."""
    from fnmatch import fnmatch

    return sorted(f for f in repo_files if any(fnmatch(f, p) for p in LEGACY_PATTERNS))


def _exact(paths) -> list[str]:
    return [glob.escape(p) for p in paths]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _cache_folder(repo_id: str, cache_dir: str | None) -> Path:
    """The folder of `repo_id` in the Hugging Face cache huggingface_hub looks in: `cache_dir`
    (--cache-dir) or its HF_HUB_CACHE / HF_HOME default, then `models--ORG--NAME`."""
    if cache_dir is None:
        try:
            from huggingface_hub import constants

            cache_dir = constants.HF_HUB_CACHE
        except ImportError:  # pragma: no cover - dependency of the package
            cache_dir = "~/.cache/huggingface/hub"
    return Path(cache_dir).expanduser().absolute() / ("models--" + repo_id.replace("/", "--"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hub_cause(exc: BaseException, offline: bool) -> tuple[str, str, str]:
    """(cause, what happened, what to do) for an exception of huggingface_hub's `snapshot_download`.
    Causes: offline (HF_HUB_OFFLINE and not cached), not found (repo or revision), access (gated or
    private), invalid request (a repo id or revision huggingface_hub refuses), cache (the cache
    folder could not be read or written), network (the hub could not be reached or failed, and the
    cache does not hold it). docs/usage.md, "Models", lists them."""
    from huggingface_hub import errors

    if isinstance(exc, errors.RevisionNotFoundError):
        return "not found", "the repo has no such revision", "give a branch, tag or commit the repo has (--revision)"
    if isinstance(exc, errors.GatedRepoError):
        return (
            "access",
            "the repo is gated",
            "accept its terms on the hub and log in (`hf auth login`, or set HF_TOKEN)",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (
            "not found",
            "the hub has no such repo (or it is private and no token with access was given)",
            "check the repo id, or log in (`hf auth login`, or set HF_TOKEN) for a private repo",
        )
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, errors.HfHubHTTPError) and status in (401, 403):
        return "access", f"the hub refused access (HTTP {status})", "log in (`hf auth login`, or set HF_TOKEN)"
    if isinstance(exc, ValueError) and not isinstance(exc, OSError):
        return (
            "invalid request",
            f"huggingface_hub refused the request ({_first_line(exc)})",
            "check the repo id and --revision",
        )
    hub_kinds = (errors.HfHubHTTPError, errors.EntryNotFoundError)
    if isinstance(exc, OSError) and not isinstance(exc, hub_kinds) and exc.errno is not None:
        return (
            "cache",
            f"the cache could not be read or written ({exc.strerror or exc}: {exc.filename})",
            "check the cache folder's permissions and free space, or pass another --cache-dir",
        )
    incomplete = type(exc).__name__ == "IncompleteSnapshotError"
    if offline:
        what = (
            "the cached snapshot lacks files this checkpoint needs"
            if incomplete
            else "not in the local Hugging Face cache"
        )
        return (
            "offline",
            f"{what}, and HF_HUB_OFFLINE is set so the hub was not asked",
            "download it once with network access (without HF_HUB_OFFLINE), or point --cache-dir "
            "(or HF_HUB_CACHE) at the cache that holds it",
        )
    reason = _first_line(exc.__cause__ or exc) if isinstance(exc, errors.LocalEntryNotFoundError) else _first_line(exc)
    return (
        "network",
        f"the hub could not be reached or failed ({reason}), and the local cache does not hold "
        + ("every file this checkpoint needs" if incomplete else "it"),
        "check the network connection, proxy and HF_ENDPOINT, then run again; or use a cache that holds "
        "it with HF_HUB_OFFLINE=1",
    )


def hub_error(repo_id: str, revision: str | None, cache_dir: str | None, exc: BaseException, offline: bool) -> str:
    """The message for a hub source that could not be fetched: the repo, the revision asked for,
    the cache folder looked in, the cause, and what to do."""
    cause, what, todo = _hub_cause(exc, offline)
    asked = revision if revision is not None else "main (the default)"
    return (
        f"{repo_id} at revision {asked}: {what} (cause: {cause}); Hugging Face cache folder looked in: "
        f"{_cache_folder(repo_id, cache_dir)}. To fix: {todo}"
    )


def _download(
    repo_id: str, revision: str | None, cache_dir: str | None, paths, offline: bool, asked: str | None = None
) -> Path:
    """huggingface_hub's `snapshot_download` of `paths`; its errors become an InputError naming the
    repo, the revision asked for (`asked`: what the user gave, where `revision` is the commit it
    resolved to), the cache folder and the cause (`hub_error`)."""
    try:
        import huggingface_hub.errors  # noqa: F401 - the exceptions `hub_error` reads
    except ImportError:  # pragma: no cover - dependency of the package
        raise InputError("huggingface_hub is not installed") from None
    try:
        return Path(
            _snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, local_files_only=offline, allow_patterns=_exact(paths)
            )
        )
    except MxconvertError:
        raise
    except (OSError, ValueError) as exc:  # huggingface_hub's errors are OSErrors (HfHubHTTPError, LocalEntry...)
        raise InputError(
            hub_error(repo_id, asked if asked is not None else revision, cache_dir, exc, offline)
        ) from None
    except Exception as exc:  # IncompleteSnapshotError (huggingface_hub >= 2), httpx's transport errors
        if type(exc).__name__ == "IncompleteSnapshotError" or type(exc).__module__.split(".")[0] in (
            "httpx",
            "httpx2",
            "requests",
        ):
            raise InputError(
                hub_error(repo_id, asked if asked is not None else revision, cache_dir, exc, offline)
            ) from None
        raise


def fetch(
    repo_id: str, choose_files: ChooseFiles, *, revision: str | None = None, cache_dir: str | None = None
) -> HubSnapshot:
    """Resolve `repo_id` at `revision` to a commit, fetch the decision files, let `choose_files`
    decide what the checkpoint needs, then fetch those files only. Offline (HF_HUB_OFFLINE) the
    cache is used as is."""
    offline = _offline()
    folder = _download(repo_id, revision, cache_dir, DECISION_FILES, offline)
    commit = folder.name if _COMMIT.match(folder.name) else (revision or "")
    listing = _cached_listing(folder, commit)
    if listing is not None:
        repo_files = sorted(listing)
    else:  # no cached listing (older huggingface_hub): what the snapshot holds is all there is
        repo_files = sorted(
            p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()
        )
    present = [f for f in DECISION_FILES if f in repo_files]
    wanted = choose_files(folder, repo_files)
    folder = _download(repo_id, commit or revision, cache_dir, wanted, offline, asked=revision or "main (the default)")
    return HubSnapshot(
        folder=folder, repo_id=repo_id, commit=commit, fetched=sorted(set(present) | set(wanted)), listing=listing
    )


# ---- source file records ------------------------------------------------------------------------------
def describe_source_files(
    root: Path, files: list[Path], known: dict[str, dict] | None = None, snapshot: Path | None = None
) -> list[dict]:
    """Size, sha256 and the hash's origin of each source file. `known`: hub hashes by repo path
    (relative to `snapshot`); a file whose size disagrees with the hub's is refused, since it is
    not the file the hub holds."""
    out, to_hash = [], []
    for path in files:
        size = path.stat().st_size
        rel_repo = path.relative_to(snapshot).as_posix() if snapshot else None
        hub = (known or {}).get(rel_repo) if rel_repo else None
        if hub is not None and hub.get("size") not in (None, size):
            raise InputError(
                f"{path}: {size} bytes in the Hugging Face cache, the hub lists {hub['size']}; "
                "the download is incomplete or damaged (delete it from the cache and fetch again)"
            )
        entry = {"file": path.relative_to(root).as_posix(), "size": size}
        if hub is not None:
            entry |= {"sha256": hub["sha256"], "sha256_origin": hub["sha256_origin"]}
        else:
            to_hash.append((entry, path))
        out.append(entry)
    # files in parallel (each sha256 is one ~1 GB/s stream on one core; hashlib releases the GIL)
    with ThreadPoolExecutor(max(1, min(HASH_THREADS, len(to_hash))), thread_name_prefix="mxconvert-sha256") as pool:
        for (entry, _), digest in zip(to_hash, pool.map(sha256_file, [path for _, path in to_hash])):
            entry |= {"sha256": digest, "sha256_origin": "computed"}
    return out


#: Source files hashed at once by `describe_source_files`.
HASH_THREADS = 4


def describe_checkpoint_files(ckpt) -> list[dict]:
    """`describe_source_files` for an opened checkpoint (hub hashes where it came from the hub)."""
    snap: HubSnapshot | None = getattr(ckpt, "hub_snapshot", None)
    if snap is None:
        return describe_source_files(ckpt.root, ckpt.source_files())
    return describe_source_files(ckpt.root, ckpt.source_files(), snap.known_hashes(), snap.folder)


_SNAPSHOT_PATH = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


def snapshot_identity(path: Path) -> tuple[str, str] | None:
    """(repo id, commit) when `path` is a snapshot folder of a Hugging Face cache
    (`.../models--ORG--NAME/snapshots/<40-hex commit>`), so a model given by its cache path
    keeps the identity it has on the hub."""
    path = Path(path).absolute()
    if not _COMMIT.match(path.name) or path.parent.name != "snapshots":
        return None
    found = _SNAPSHOT_PATH.match(path.parent.parent.name)
    if not found:
        return None
    return f"{found['org']}/{found['name']}", path.name
