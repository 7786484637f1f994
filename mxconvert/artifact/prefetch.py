"""Read an artifact's tensors ahead of the runtime that consumes them, on several threads.

A runtime installs expert tensors layer by layer, in its own order and on its own thread (vLLM's
`process_weights_after_loading` walks the modules one by one). Read one tensor at a time there,
and the load is bounded by one thread's `pread` from the page cache plus the copy to the device,
each waiting on the other. `Prefetcher` reads the tensors of that order on `threads` threads into
host memory, at most `budget_bytes` ahead of the consumer (plus one tensor, so a tensor larger than
the budget is still read), so the disk, the cores and the host-to-device copies overlap and host
memory stays bounded whatever the model's size.

It checks nothing itself: the manifest's digests are checked by whoever hands it the artifact
(artifact/checksums.py; the vLLM plugin computes them while this reads, and checks them before it
hands the model back), and each tensor it reads is the one the manifest names, read with the same
validated `ShardReader` as an unprefetched read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from mxconvert.artifact.manifest import artifact_file
from mxconvert.storage.safetensors_io import ShardReader

#: (file relative to the artifact, safetensors key)
TensorRef = tuple[str, str]


class Prefetcher:
    """Reads `order` (tensor references with their sizes in bytes) ahead of `get`, in that order.

    `get(ref)` returns the host tensor of `ref` (waiting for its read) and frees its place in the
    budget; a reference that is not in `order`, or asked for twice, is read then, unprefetched.
    `close()` stops reading ahead (reads in flight finish and are dropped) and closes the files; a
    `get` after it still reads, opening and closing the file for that one tensor.
    Thread-safe.
    """

    def __init__(
        self,
        root: Path,
        order: Sequence[tuple[TensorRef, int]],
        budget_bytes: int,
        threads: int,
    ):
        self.root = root
        self._order = list(order)
        self._budget = max(0, budget_bytes)
        self._lock = threading.Lock()
        self._readers: dict[str, ShardReader] = {}
        self._pending: dict[TensorRef, tuple[Future, int]] = {}
        self._next = 0
        self._ahead = 0  # bytes submitted and not yet taken
        self._closed = False
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="mxconvert-prefetch")
        #: tensors handed out, their bytes, and the seconds from the start to the last one handed out
        self.taken = 0
        self.taken_bytes = 0
        self.seconds = 0.0
        self._started = time.perf_counter()
        self._submit_more()

    def _read(self, ref: TensorRef) -> torch.Tensor:
        rel, key = ref
        with self._lock:
            reader = None if self._closed else self._readers.get(rel)
            if reader is None and not self._closed:
                reader = self._readers[rel] = ShardReader(artifact_file(self.root, rel))
        if reader is not None:
            return reader.get(key)
        # after close(): the files are closed; read with a reader of this call alone, closed again,
        # so a late `get` neither fails nor leaves a file open until garbage collection
        once = ShardReader(artifact_file(self.root, rel))
        try:
            return once.get(key)
        finally:
            once.close()

    def _submit_more(self) -> None:
        with self._lock:
            while not self._closed and self._next < len(self._order):
                ref, nbytes = self._order[self._next]
                if self._pending and self._ahead + nbytes > self._budget:
                    return
                self._next += 1
                if ref in self._pending:
                    continue
                self._ahead += nbytes
                self._pending[ref] = (self._pool.submit(self._read, ref), nbytes)

    def get(self, ref: TensorRef) -> torch.Tensor:
        with self._lock:
            pending = self._pending.pop(ref, None)
        if pending is None:
            return self._handed_out(self._read(ref))
        future, nbytes = pending
        try:
            return self._handed_out(future.result())
        finally:
            with self._lock:
                self._ahead -= nbytes
            self._submit_more()

    def ahead(self) -> list[TensorRef]:
        """The tensors submitted for reading and not yet handed out, in order."""
        with self._lock:
            return list(self._pending)

    def _handed_out(self, tensor: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.taken += 1
            self.taken_bytes += tensor.numel() * tensor.element_size()
            self.seconds = time.perf_counter() - self._started
        return tensor

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        for future, _ in pending:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for reader in self._readers.values():
            reader.close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
