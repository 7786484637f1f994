"""The artifact's digests checked beside the reads, as both runtime loaders do it (docs/vllm-plugin.md,
"Loader options"; docs/sglang.md, "Loader").

A loader that hands the runtime a model only after `finish` (or raises through `abort`) may read the
artifact's tensors while the digests are computed: every path and size is checked before any byte
is read (`FileChecks`' constructor), the tree digests are computed in the background at a lower CPU
priority (`CHECK_NICE`, on every core but one: `check_threads`) while `Prefetcher` reads the expert
tensors ahead of the runtime's layer-by-layer install (`prefetch_bytes` ahead), and `finish` waits
for the digests and raises the first file's `MismatchError` before the loader returns. Nothing read
from a file that differs is then ever used: the runtime never gets the model back.

Moved here from runtimes/vllm/installer.py (the vLLM plugin's behaviour and messages unchanged) so
that the SGLang loader (runtimes/sglang/installer.py) runs the same code.
"""

from __future__ import annotations

import logging
import time

from mxconvert.artifact.checksums import FileChecks
from mxconvert.artifact.prefetch import Prefetcher
from mxconvert.core.errors import InputError
from mxconvert.core.parallel import default_jobs

#: How far (bytes of expert tensors) a loader reads ahead of the runtime's layer-by-layer processing;
#: `model_loader_extra_config={"prefetch_bytes": N}` changes it, 0 reads each tensor when asked.
PREFETCH_BYTES = 4 << 30
#: The digests are computed while the expert tensors are read ahead and the runtime processes the
#: layers: their threads run at this lower CPU priority (a nice value), so they take the cores the
#: reads and the runtime's own thread leave idle rather than starving them (`FileChecks`, Linux), and
#: leave one core to the runtime's thread where the priority cannot be lowered (`check_threads`).
CHECK_NICE = 10


def check_threads() -> int:
    """Threads hashing the leaves of the tree digests beside the read-ahead: every core but one."""
    return max(1, default_jobs() - 1)


def checked_prefetch_bytes(value: object) -> int:
    """`prefetch_bytes` of `model_loader_extra_config`, a whole number of bytes >= 0 (else `InputError`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"model_loader_extra_config prefetch_bytes={value!r}: expected a whole number of bytes >= 0")
    return value


def finish_load(
    reads: Prefetcher | None,
    checks: FileChecks | None,
    prefetch_bytes: int,
    logger: logging.Logger,
    runtime: str,
) -> None:
    """After the runtime processed every layer: stop reading ahead and wait for the digests, raising the
    `MismatchError` of the first file that differs (nothing read from the artifact may be used then);
    log what the reads and the checks took (`runtime` names who asked for the tensors)."""
    if reads is not None:
        reads.close()
        if reads.taken:
            ahead = f"up to {prefetch_bytes / 2**30:g} GiB ahead on {reads.threads} threads"
            logger.info(
                "mxconvert: reading %d expert tensors (%.2f GB) from the artifact took %.2f s (%s)",
                reads.taken,
                reads.taken_bytes / 1e9,
                reads.seconds,
                ahead if prefetch_bytes else f"each when {runtime} asked for it",
            )
    if checks is None:
        return
    reads_done = time.perf_counter()
    try:
        checks.check()
    finally:
        checks.close()
    logger.info(
        "mxconvert: checksums of %d artifact files (%.2f GB) took %.2f s on %d threads, overlapped with the "
        "reads (the load waited %.2f s for them after the reads)",
        len(checks.entries),
        checks.bytes / 1e9,
        checks.seconds or 0.0,
        check_threads(),
        time.perf_counter() - reads_done,
    )


def abort_load(reads: Prefetcher | None, checks: FileChecks | None, error: BaseException) -> None:
    """After a failure while the artifact was read or installed (`error`): stop reading and hashing
    and, where a file's digest differs, raise that instead (the cause a corrupted header or tensor
    has; `error` becomes its `__cause__`); else return, for the caller to re-raise `error`. An
    interrupt does not wait for the digests."""
    if reads is not None:
        reads.close()
    if checks is None:
        return
    try:
        verdict = checks.mismatch() if isinstance(error, Exception) else None
    finally:
        checks.close()
    if verdict is not None and verdict is not error:
        raise verdict from error
