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
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Bytes of output chunks a conversion keeps in flight, summed over all workers (each running
#: worker also holds a few transient copies of its chunk: canonical, gathered, encoded).
IN_FLIGHT_BYTES = 192 << 20
MAX_CHUNK_BYTES = 64 << 20


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
