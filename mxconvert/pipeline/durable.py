"""Durable writes (docs/artifact.md, "Writing OUT"): every file and folder of the staging folder
is fsynced before the rename into place (`sync_tree`), and OUT's parent folder after it
(`sync_folder`, called by `output.replace`), so an artifact that carries its final name survives a
crash of the machine right after `convert` returned, not only the end of the process. `Writeback`
starts the disk writes while the files are still being written, so that the fsync finds little
left to do (where cores are to spare: `writeback_pays`). `MXCONVERT_FAULT=no-fsync` turns all of
it off, `no-writeback` only the early start; both for benchmarks only (the cost of durability is
measured against them: bench/README.md).
"""

from __future__ import annotations

import ctypes
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mxconvert.core.errors import InputError
from mxconvert.core.faults import disabled as faults_disable


def durable() -> bool:
    """Whether writes are made durable (fsync): always, unless `MXCONVERT_FAULT=no-fsync` (benchmarks)."""
    return not faults_disable("fsync")


#: Files fsynced at once by `sync_tree` (their writeback is independent; the journal commits are not).
SYNC_THREADS = 8


def sync_tree(folder: Path) -> None:
    """fsync every regular file under `folder`, then every folder, deepest first, `folder` last:
    what the rename into place publishes is then on disk, contents and names. An error (EIO,
    ENOSPC surfacing at writeback) raises, and the artifact is not put in place."""
    if not durable():
        return
    files: list[Path] = []
    folders: list[Path] = []
    for dirpath, _dirs, filenames in os.walk(folder, onerror=_raise):  # an unlisted folder is not synced
        folders.append(Path(dirpath))
        files += [Path(dirpath) / name for name in filenames]
    if files:
        with ThreadPoolExecutor(min(SYNC_THREADS, len(files)), thread_name_prefix="mxconvert-fsync") as pool:
            for done in [pool.submit(_fsync_path, path, os.O_RDONLY) for path in files]:
                done.result()
    for path in sorted(folders, key=lambda p: -len(p.parts)):
        _fsync_path(path, os.O_RDONLY | os.O_DIRECTORY)


def _raise(exc: OSError) -> None:
    raise exc


def sync_folder(folder: Path) -> None:
    """fsync a folder (its entries: a rename into it is on disk once this returns)."""
    if durable():
        _fsync_path(folder, os.O_RDONLY | os.O_DIRECTORY)


def _fsync_path(path: Path, flags: int) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Bytes of a file written before `Writeback` starts writing them to disk.
WRITEBACK_BYTES = 64 << 20


#: Cores from which `convert` starts the writeback while it writes. On the 2-core machine starting
#: it early cost more than it saved (bench/README.md: a 1.7 GB convert +1.7 s with it, +0.3-0.6 s
#: with the whole flush left to the final fsync): the kernel's writeback work takes the cores the
#: layouts need. Where cores are to spare, the flush overlaps the conversion instead of following it.
WRITEBACK_MIN_CORES = 8


def writeback_pays(jobs: int) -> bool:
    """Whether a conversion on `jobs` cores starts its files' writeback while writing them
    (`MXCONVERT_FAULT=no-writeback` turns it off, to measure it)."""
    return jobs >= WRITEBACK_MIN_CORES and not faults_disable("writeback")


#: `convert --write-mode` values.
WRITE_MODES = ("auto", "direct", "buffered")


def check_write_mode(mode: str) -> None:
    """Refuse a `--write-mode` that is none of `WRITE_MODES` (before anything is read)."""
    if mode not in WRITE_MODES:
        raise InputError(f"--write-mode must be one of {', '.join(WRITE_MODES)}, not {mode!r}")


def direct_writes(mode: str, jobs: int) -> bool:
    """Whether a conversion on `jobs` cores writes its files past the page cache (O_DIRECT,
    storage/output_file.py). "auto": where cores are few (`WRITEBACK_MIN_CORES`, the same line as
    for the early writeback). On the 2-core machine the page cache's own work (copying every byte
    in, allocating and flushing its pages) took 2-5 CPU seconds for 1.9 GB and direct writes made a
    1.7 GB convert 1.0-2.0 s faster; on the GPU host's 16 cores, with cores to spare for it, the
    two were within noise and a buffered artifact stays cached for a verify or load right after
    (bench/README.md, "Direct writes")."""
    check_write_mode(mode)
    return mode == "direct" or (mode == "auto" and jobs < WRITEBACK_MIN_CORES)


class Writeback:
    """Starts the disk writes of files while they are being written, `WRITEBACK_BYTES` at a time
    (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which queues the range's dirty pages for
    writing and returns; on a thread of its own), so the fsync before the rename (`sync_tree`)
    finds little left: the flush overlaps the conversion instead of following it. An optimisation
    only: where the call is missing or fails, `sync_tree` still writes everything."""

    def __init__(self, step_bytes: int | None = None, enabled: bool = True) -> None:
        self.step_bytes = step_bytes or WRITEBACK_BYTES
        self._started: dict[Path, int] = {}
        self._call = _sync_file_range() if enabled and durable() else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mxconvert-writeback") if self._call else None

    def written(self, path: Path, size: int) -> None:
        """`path` now holds `size` bytes: start writing what is new, once a step's worth."""
        start = self._started.get(path, 0)
        if self._pool is None or size - start < self.step_bytes:
            return
        self._started[path] = size
        self._pool.submit(self._start, path, start, size - start)

    def _start(self, path: Path, offset: int, nbytes: int) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return  # removed meanwhile (a failed run): nothing to write
        try:
            assert self._call is not None
            self._call(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)
        finally:
            os.close(fd)

    def close(self, cancel: bool = False) -> None:
        """Wait for the writes started (`cancel`: drop those not started yet, after a failure)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)


_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h


def _sync_file_range():
    """libc's `sync_file_range` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return call
