"""The artifact's file digests, checked by the readers (`load_artifact`, the vLLM plugin): each
listed file inside the artifact, a regular file of its recorded size, whose bytes hash to the
manifest's digest (docs/artifact.md, "The tree digest").

A file with a tree digest (`sha256_chunked`: every file a schema /2 convert writes, and the
files of /1 artifacts that recorded one) is checked by it, its leaves read and hashed on all
cores; a file with only a whole-file sha256 (copied files, older /1 files) by that. Where an
entry holds both (`convert --file-sha256`, /1), the tree digest covers every byte just as well
and is the one checked; `verify` checks both.

`check_files` checks and returns; `FileChecks` is the same check started in the background, for a
reader that reads the files meanwhile and checks the verdict before it hands anything on (the vLLM
plugin: docs/vllm-plugin.md, "Loader options"); `map_checked` hashes a file `load_artifact` maps.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file
from mxconvert.core.digest import CHUNK_BYTES, CHUNKED_KEY, WHOLE_KEY, chunked_digest, piece_digest, tree_digest_file
from mxconvert.core.errors import InputError, MismatchError, MxconvertError
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
    with FileChecks(artifact, entries, jobs) as checks:
        checks.check()


class FileChecks:
    """`check_files` in the background: the digests are computed from construction on, while the
    caller reads the same files (the vLLM plugin's read-ahead), and `check()` waits for them.

    The constructor checks every path and size (`checked_path`, raising as `check_files` does)
    before any byte is hashed; then the tree digests are computed one file after the other in the
    listed order, each file's leaves on `jobs` threads, and the whole-file sha256 of the files
    that only have one on `WHOLE_THREADS` threads beside them. With `nice` > 0 each hashing
    thread lowers its own CPU priority by that much (Linux: a thread's nice value is its own,
    setpriority(2)), so that hashing takes the cores the readers leave idle instead of starving
    them. `close()` (or leaving the `with` block) stops whatever is not hashed yet and joins the
    threads; nothing is left running after it.
    """

    def __init__(self, artifact: Path, entries: list[dict], jobs: int | None = None, nice: int = 0):
        self.paths = [checked_path(artifact, entry) for entry in entries]  # before any byte is hashed
        self.entries = list(entries)
        self.bytes = sum(int(entry["size"]) for entry in self.entries)
        #: seconds from the start to the last digest computed (None until every digest is)
        self.seconds: float | None = None
        self._started = time.perf_counter()
        self._closed = False
        self._verdict: MxconvertError | None = None
        priority = _lowered_priority(nice)
        self._leaves = _hashing_pool(jobs or default_jobs(), "mxconvert-leaf", priority)
        self._trees = _hashing_pool(1, "mxconvert-tree", priority)
        self._streams = _hashing_pool(WHOLE_THREADS, "mxconvert-sha256", priority)
        self._digests: list[Future] = []
        for entry, path in zip(self.entries, self.paths):
            recorded = entry.get(CHUNKED_KEY)
            if isinstance(recorded, dict):
                digest = self._trees.submit(self._tree_digest, path, int(recorded["chunk_bytes"]))
            else:
                digest = self._streams.submit(_read_or_refuse, sha256_file, path)
            self._digests.append(digest)
        if not self._digests:
            self.seconds = 0.0
        for digest in self._digests:
            digest.add_done_callback(self._finished)

    def _tree_digest(self, path: Path, chunk_bytes: int) -> dict:
        return _read_or_refuse(tree_digest_file, path, self._leaves, chunk_bytes)

    def _finished(self, _digest: Future) -> None:
        if all(d.done() for d in self._digests):
            self.seconds = time.perf_counter() - self._started

    def check(self) -> None:
        """Wait for the digests; raise for the first file that differs, in the listed order (the
        messages of `check_files`), or that cannot be read (`InputError`): the same error at
        every call."""
        if self._verdict is not None:
            raise self._verdict
        if self._closed:
            raise AssertionError("FileChecks.check after close()")
        try:
            self._compare()
        except MxconvertError as exc:
            self._verdict = exc
            raise

    def _compare(self) -> None:
        for entry, path, digest in zip(self.entries, self.paths, self._digests):
            got = digest.result()
            recorded = entry.get(CHUNKED_KEY)
            if not isinstance(recorded, dict):
                if got != entry[WHOLE_KEY]:
                    raise MismatchError(f"{path}: sha256 {got} does not match the manifest ({entry[WHOLE_KEY]})")
            elif got != recorded:
                raise MismatchError(
                    f"{path}: sha256 tree digest {got['digest']} does not match the manifest "
                    f"({recorded.get('digest')}, field {CHUNKED_KEY})"
                )

    def mismatch(self) -> MxconvertError | None:
        """The error `check()` raises, or None where every file matched (it waits as `check` does)."""
        try:
            self.check()
        except MxconvertError as exc:
            return exc
        return None

    def close(self) -> None:
        """Stop the hashing not started yet and join every hashing thread (a leaf being hashed
        finishes first); idempotent."""
        self._closed = True
        for digest in self._digests:
            digest.cancel()
        self._leaves.shutdown(wait=False, cancel_futures=True)  # a tree digest in flight then ends early
        self._trees.shutdown(wait=True, cancel_futures=True)
        self._streams.shutdown(wait=True, cancel_futures=True)
        self._leaves.shutdown(wait=True)

    def __enter__(self) -> FileChecks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hashing_pool(threads: int, name: str, priority: int | None) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=_set_priority, initargs=(priority,))


def _lowered_priority(nice: int) -> int | None:
    """The nice value of this thread plus `nice` (at most 19), for the hashing threads to set:
    None where they keep what they inherit (`nice` <= 0, or not Linux: elsewhere a thread id is no
    process id and the nice value is the process's). Computed here once, as a thread inherits its
    creator's nice value (the leaf threads are started by the niced tree thread)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return None
    try:
        return min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)  # who=0: the calling thread (Linux)
    except OSError:
        return None


def _set_priority(priority: int | None) -> None:
    """Set this thread's nice value (Linux, setpriority(2): a thread's nice value is its own). Best
    effort: raising one's own nice value is always allowed, and a thread left at its inherited
    priority only yields the cores less readily."""
    if priority is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), priority)
    except OSError:
        pass


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
