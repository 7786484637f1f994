"""The worker pool of convert and verify: ordered, bounded, thread based.

Layouts are expert-separable, so a layer is cut into chunks of experts that are laid out (or
inverted and compared) independently. numpy, torch and hashlib release the GIL in their inner
loops, so threads keep all cores busy without copying chunks between processes. Results come back
in submission order whatever the thread count, which is what makes the output bytes identical for
`--jobs 1` and `--jobs N`; at most `in_flight` chunks are held at once, which bounds memory.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np
else:  # imported when a buffer is first asked for (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np

T = TypeVar("T")
R = TypeVar("R")

#: Bytes of output chunks a conversion keeps in flight, summed over all workers (each running
#: worker also holds a few transient copies of its chunk: canonical, gathered, encoded).
IN_FLIGHT_BYTES = 192 << 20
MAX_CHUNK_BYTES = 64 << 20
#: Bytes of chunk buffers a conversion keeps for reuse (`BufferPool`): the chunks in flight's
#: source reads and moved copies, twice the in-flight budget.
REUSED_BYTES = 2 * IN_FLIGHT_BYTES


def default_jobs() -> int:
    """The cores this process may run on (affinity / cgroup cpusets), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def chunk_bytes_for(jobs: int) -> int:
    """Output bytes per chunk: small enough that `jobs + 2` chunks fit the in-flight budget,
    large enough that per-chunk overhead stays small."""
    return max(4 << 20, min(MAX_CHUNK_BYTES, IN_FLIGHT_BYTES // (jobs + 2)))


def chunk_workers(jobs: int, serial_streams: int) -> int:
    """Threads for the chunk work (layouts, comparisons) of a command that also runs
    `serial_streams` sha256 streams (a file's whole-file digest is one stream that cannot be
    split): each stream gets a core of its own where at least as many cores are left for the
    chunks, since the streams bound the command's time (bench/CHANGELOG.md, "Session 6": with every
    core laying out, convert's whole-file digest ran at 0.97 instead of 1.16 GB/s on 16 cores).
    On a small machine every thread shares the cores."""
    left = jobs - serial_streams
    return left if left >= max(2, serial_streams) else jobs


def ordered_map(fn: Callable[[T], R], items: Iterable[T], jobs: int) -> Iterator[R]:
    """`map(fn, items)` on `jobs` threads, results in order, at most `jobs + 2` in flight.

    With `jobs == 1` everything runs on the calling thread. An exception in `fn` is raised when
    its result is reached; the chunks still queued are cancelled."""
    if jobs <= 1:
        for item in items:
            yield fn(item)
        return
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(jobs, thread_name_prefix="mxconvert") as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= jobs + 2:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


class BufferPool:
    """Host buffers that the chunks of a conversion reuse instead of fresh ones per chunk.

    A fresh buffer of a chunk's size is fresh pages, which the kernel zeroes on first touch:
    with glibc told to map every buffer of 1 MiB or more on its own (`release_freed_buffers`),
    that zeroing was 39% of convert's CPU seconds on the 2-core machine (bench/README.md,
    "Where convert's CPU goes"). A pooled buffer is handed out again only once nothing but the
    pool refers to it: every numpy view of it and every memoryview of it (a write or a leaf
    digest still pending) holds a reference to it, so its reference count tells when its last
    user is gone, and no caller gives anything back. At most `max_bytes` are pooled; a request
    beyond that gets a fresh buffer, as without a pool, so the pool bounds what it keeps."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buffers: list[np.ndarray] = []  # oldest first
        self._lock = threading.Lock()

    def empty(self, nbytes: int) -> np.ndarray:
        """A uint8 array of `nbytes` whose contents are undefined (as `np.empty`'s)."""
        with self._lock:
            buffers = self._buffers
            for i in range(len(buffers)):
                if buffers[i].nbytes == nbytes and _unused(buffers, i):
                    return buffers[i][:]  # the view is a reference: taken until it and its views are gone
            pooled = sum(b.nbytes for b in buffers)
            i = 0
            while pooled + nbytes > self.max_bytes and i < len(buffers):
                if _unused(buffers, i):  # make room: unused buffers of other sizes go, oldest first
                    pooled -= buffers.pop(i).nbytes
                else:
                    i += 1
            if pooled + nbytes > self.max_bytes:
                return np.empty(nbytes, dtype=np.uint8)
            buffers.append(np.empty(nbytes, dtype=np.uint8))
            return buffers[-1][:]

    def pooled_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._buffers)


def _unused(buffers: list, i: int) -> bool:
    """Whether only the list refers to `buffers[i]` (the other reference is getrefcount's argument)."""
    return sys.getrefcount(buffers[i]) == 2


def _refcounts_tell_use() -> bool:
    """Whether this interpreter's reference counts show a view's hold on its array as the pool
    reads them (CPython's do); where they do not, no buffer is pooled."""
    owner = [np.empty(8, dtype=np.uint8)]
    alone = _unused(owner, 0)
    view = owner[0][:]
    held = not _unused(owner, 0)
    del view
    return alone and held and _unused(owner, 0)


_pool: BufferPool | None = None
_pool_users = 0
_pool_lock = threading.Lock()


@contextmanager
def reused_buffers(max_bytes: int):
    """While inside, `host_buffer` serves from one process-wide `BufferPool` of `max_bytes`
    (conversions running at once share it); its buffers are dropped when the last one leaves."""
    global _pool, _pool_users
    with _pool_lock:
        if _pool is None and _refcounts_tell_use():
            _pool = BufferPool(max_bytes)
        _pool_users += 1
    try:
        yield
    finally:
        with _pool_lock:
            _pool_users -= 1
            if _pool_users == 0:
                _pool = None


def host_buffer(nbytes: int) -> np.ndarray:
    """`np.empty(nbytes, dtype=np.uint8)`: from the pool while a conversion runs
    (`reused_buffers`), else fresh. Its contents are undefined; every byte must be written."""
    pool = _pool
    return np.empty(nbytes, dtype=np.uint8) if pool is None else pool.empty(nbytes)


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def release_freed_buffers() -> None:
    """Make glibc serve every allocation of 1 MiB or more with its own mapping, returned to the
    system when freed. By default glibc raises that threshold (up to 32 MiB) after the first such
    free, after which chunk-sized buffers are recycled inside per-thread arenas that keep their
    pages: with 16 workers that was ~0.7 GiB of peak RSS holding nothing (bench/CHANGELOG.md).
    No-op where glibc is not the C library."""
    global _released
    if _released:
        return
    _released = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):
        pass


_released = False


@contextmanager
def torch_threads(jobs: int, uses_torch: bool = True):
    """With several workers each torch op runs on its worker's thread alone (no oversubscription
    of torch's own intra-op pool); restored afterwards. `uses_torch=False`: the work runs no torch
    op (the numpy host path, mxconvert/bits.py), so torch is left alone, and not imported."""
    release_freed_buffers()
    if jobs <= 1 or not (uses_torch or "torch" in sys.modules):
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
