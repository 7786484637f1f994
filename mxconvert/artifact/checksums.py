"""The artifact's file digests, checked by the readers (`load_artifact`, the vLLM plugin): each
listed file inside the artifact, a regular file of its recorded size, whose bytes hash to the
manifest's digest (docs/artifact.md, "The tree digest").

A file with a tree digest (`sha256_chunked`: every file a schema /2 convert writes, and the
files of /1 artifacts that recorded one) is checked by it, its leaves read and hashed on all
cores; a file with only a whole-file sha256 (copied files, older /1 files) by that. Where an
entry holds both (`convert --file-sha256`, /1), the tree digest covers every byte just as well
and is the one checked; `verify` checks both.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file
from mxconvert.core.digest import CHUNK_BYTES, CHUNKED_KEY, WHOLE_KEY, chunked_digest, piece_digest, tree_digest_file
from mxconvert.core.errors import InputError, MismatchError
from mxconvert.core.parallel import default_jobs
from mxconvert.storage.files import sha256_file

if TYPE_CHECKING:
    import torch
else:  # imported where a tensor is loaded (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch

#: Files with only a whole-file sha256 (copied files: small) hashed at once beside the tree digests.
WHOLE_THREADS = 4


def checked_path(artifact: Path, entry: dict) -> Path:
    """The listed file, inside the artifact and a regular file, of the recorded size."""
    path = artifact / entry["file"]
    if not (path.exists() or path.is_symlink()):
        raise MismatchError(f"{path}: missing (listed in {MANIFEST_NAME})")
    path = artifact_file(artifact, entry["file"])
    size = path.stat().st_size
    if size != entry["size"]:
        raise MismatchError(f"{path}: size {size} bytes, manifest says {entry['size']}")
    return path


def check_files(artifact: Path, entries: list[dict], jobs: int | None = None) -> None:
    """Size and digest of each listed file, against the manifest (files inside the artifact,
    regular files only): the tree digest where recorded, its leaves hashed on `jobs` threads (all
    cores by default), else the whole-file sha256, a few files at once. Every size and path is
    checked before any byte is hashed; the first file that differs, in the listed order, raises."""
    paths = [checked_path(artifact, entry) for entry in entries]
    if not entries:
        return
    with (
        ThreadPoolExecutor(jobs or default_jobs(), thread_name_prefix="mxconvert-leaf") as leaves,
        ThreadPoolExecutor(WHOLE_THREADS, thread_name_prefix="mxconvert-sha256") as streams,
    ):
        whole = {
            i: streams.submit(_read_or_refuse, sha256_file, path)
            for i, (entry, path) in enumerate(zip(entries, paths))
            if not isinstance(entry.get(CHUNKED_KEY), dict)
        }
        for i, (entry, path) in enumerate(zip(entries, paths)):
            if i in whole:
                got = whole[i].result()
                if got != entry[WHOLE_KEY]:
                    raise MismatchError(f"{path}: sha256 {got} does not match the manifest ({entry[WHOLE_KEY]})")
                continue
            recorded = entry[CHUNKED_KEY]
            tree = _read_or_refuse(tree_digest_file, path, leaves, int(recorded["chunk_bytes"]))
            if tree != recorded:
                raise MismatchError(
                    f"{path}: sha256 tree digest {tree['digest']} does not match the manifest "
                    f"({recorded.get('digest')}, field {CHUNKED_KEY})"
                )


def _read_or_refuse(digest: Callable, path: Path, *args):
    try:
        return digest(path, *args)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def map_checked(artifact: Path, entry: dict, verify: bool, pool: Executor) -> tuple[torch.Tensor, Callable[[], None]]:
    """The file's bytes (a private read-only-in-practice mapping: no copy, no zeroed pages) and a
    `check()` that raises unless they match the manifest. With `verify`, the digest is computed on
    `pool` while the caller copies tensors out: the tree digest where the manifest has one
    (leaves hashed in parallel, core/digest.py), else the whole-file sha256."""
    path = checked_path(artifact, entry)
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if entry["size"] else bytearray()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    data = torch.frombuffer(mapped, dtype=torch.uint8) if entry["size"] else torch.empty(0, dtype=torch.uint8)
    if not verify:
        return data, lambda: None
    view = memoryview(mapped)
    chunked = entry.get(CHUNKED_KEY)
    if isinstance(chunked, dict):
        size = int(chunked.get("chunk_bytes", CHUNK_BYTES))
        pieces = [pool.submit(piece_digest, view[s : s + size]) for s in range(0, max(1, len(view)), size)]

        def check() -> None:
            got = chunked_digest([p.result() for p in pieces], size)
            if got != chunked:
                raise MismatchError(
                    f"{path}: chunked sha256 {got['digest']} does not match the manifest ({chunked.get('digest')})"
                )

        return data, check
    whole = pool.submit(lambda: hashlib.sha256(view).hexdigest())

    def check_whole() -> None:
        if whole.result() != entry[WHOLE_KEY]:
            raise MismatchError(f"{path}: sha256 {whole.result()} does not match the manifest ({entry[WHOLE_KEY]})")

    return data, check_whole
