"""File digests. The manifest's integrity digest of every file mxconvert writes is the *tree
digest*: the sha256 of the concatenated 32-byte sha256 digests of the file's consecutive
`CHUNK_BYTES` pieces (the leaves; the last one shorter, an empty file one empty leaf),
docs/artifact.md "The tree digest". Each leaf hashes independently, so the digest is computed on
all cores while a file is written (`ParallelChunkedSha256`) and checked on all cores when it is
read (`tree_digest_file`); the whole-file sha256 is one sequential stream (about 1-2 GB/s on one
core), kept for copied and source files and, with `convert --file-sha256`, for external tools.

The leaves are sha256, not BLAKE3: BLAKE3 hashes ~2.5x faster per core, but on all cores the
tree of sha256 leaves already outruns the disk a conversion writes to, needs no dependency, and
is checked with coreutils (`split` + `sha256sum`, docs/artifact.md); bench/README.md has the figures.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from collections import deque
from concurrent.futures import Executor, Future, ThreadPoolExecutor

CHUNK_BYTES = 4 << 20
CHUNKED_KEY = "sha256_chunked"  # manifest field of a file entry: {"chunk_bytes": n, "digest": hex}
WHOLE_KEY = "sha256"  # manifest field of a file entry: the whole-file sha256 hex (`convert --file-sha256`)


def piece_digest(data) -> bytes:
    return hashlib.sha256(data).digest()


def chunked_digest(pieces: list[bytes], chunk_bytes: int = CHUNK_BYTES) -> dict:
    return {"chunk_bytes": chunk_bytes, "digest": hashlib.sha256(b"".join(pieces)).hexdigest()}


class ChunkedSha256:
    """Incremental chunked digest over a stream written in order (the streaming writer's)."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._pieces: list[bytes] = []
        self._current = hashlib.sha256()
        self._filled = 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.chunk_bytes - self._filled)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk_bytes:
                self._pieces.append(self._current.digest())
                self._current, self._filled = hashlib.sha256(), 0

    def result(self) -> dict:
        pieces = self._pieces + ([self._current.digest()] if self._filled or not self._pieces else [])
        return chunked_digest(pieces, self.chunk_bytes)


#: Bytes of leaves a `ParallelChunkedSha256` lets wait for its pool before `update` blocks: the
#: buffers they reference stay alive until hashed.
PENDING_BYTES = 64 << 20


def pieces_digest(pieces: list) -> bytes:
    """`piece_digest` of the concatenation of `pieces`, hashed one after the other (no copy)."""
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.digest()


class ParallelChunkedSha256:
    """The tree digest of a stream written in order, its leaves hashed on `pool` while the next
    bytes are produced (the writer's: the leaves of a file hash on all cores as it is written).

    Every leaf is hashed from the caller's buffers, never copied: a leaf inside one `update`
    from a view of it, a leaf split across updates from the views of its pieces, hashed one after
    the other (a copy of the pieces into a leaf buffer of its own was fresh pages per update:
    bench/README.md, "Where convert's CPU goes"). A buffer passed to `update` therefore stays
    referenced, and must not change, until the leaves it holds are hashed. At most
    `max_pending_bytes` of leaves wait for the pool: `update` blocks beyond that, which bounds the
    memory held. `pool`'s tasks must never wait on other tasks of it."""

    def __init__(self, pool: Executor, chunk_bytes: int = CHUNK_BYTES, max_pending_bytes: int = PENDING_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._pool = pool
        self._leaves: list[Future] = []
        self._pending: deque[tuple[Future, int]] = deque()
        self._pending_bytes = 0
        self._max_pending = max(max_pending_bytes, chunk_bytes)
        self._partial: list[memoryview] = []  # the pieces of a leaf split across updates, in order
        self._filled = 0  # their bytes
        self._result: dict | None = None

    def update(self, data) -> None:
        if self._result is not None:
            raise AssertionError("update after result()")
        view = memoryview(data).cast("B")
        if self._filled:
            take = min(len(view), self.chunk_bytes - self._filled)
            self._partial.append(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk_bytes:
                self._submit_partial()
        while len(view) >= self.chunk_bytes:
            self._submit(piece_digest, view[: self.chunk_bytes], self.chunk_bytes)
            view = view[self.chunk_bytes :]
        if len(view):
            self._partial, self._filled = [view], len(view)

    def _submit_partial(self) -> None:
        pieces, nbytes = self._partial, self._filled
        self._partial, self._filled = [], 0
        if len(pieces) == 1:
            self._submit(piece_digest, pieces[0], nbytes)
        else:
            self._submit(pieces_digest, pieces, nbytes)

    def _submit(self, digest, leaf, nbytes: int) -> None:
        future = self._pool.submit(digest, leaf)
        self._leaves.append(future)
        self._pending.append((future, nbytes))
        self._pending_bytes += nbytes
        while self._pending and (self._pending_bytes > self._max_pending or self._pending[0][0].done()):
            done, n = self._pending.popleft()
            done.result()  # a leaf that failed fails the write at once
            self._pending_bytes -= n

    def result(self) -> dict:
        """The tree digest (`chunked_digest`) of everything updated so far; no update after it."""
        if self._result is None:
            if self._filled:  # the last, shorter leaf
                self._submit_partial()
            elif not self._leaves:  # an empty stream: one empty leaf
                self._submit(piece_digest, b"", 0)
            self._result = chunked_digest([leaf.result() for leaf in self._leaves], self.chunk_bytes)
            self._pending.clear()
        return self._result

    def wait(self) -> None:
        """Wait until no leaf references a caller's buffer any more (after a failure: errors ignored)."""
        for future, _ in self._pending:
            future.exception()
        self._pending.clear()
        self._pending_bytes = 0


#: Leaves up to this size are read into one buffer per thread of `tree_digest_file` (reused:
#: no fresh pages per leaf); larger ones into a buffer of their own.
_REUSED_LEAF_BYTES = 16 << 20


def tree_digest_file(path, pool: Executor | None = None, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """The tree digest of a file: its leaves read (`os.preadv`) and hashed on `pool`'s threads
    (all cores: the read and the hash of every leaf are independent), or on this thread without
    a pool. A file that is shorter than its size when read is an `OSError`."""
    local = threading.local()
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size

        def leaf(start: int) -> bytes:
            n = min(chunk_bytes, size - start)
            if chunk_bytes <= _REUSED_LEAF_BYTES:
                if getattr(local, "buffer", None) is None:
                    local.buffer = memoryview(bytearray(chunk_bytes))
                buffer = local.buffer[:n]
            else:
                buffer = memoryview(bytearray(n))
            done = 0
            while done < n:
                got = os.preadv(fd, [buffer[done:]], start + done)
                if not got:
                    raise OSError(f"{path}: ended at byte {start + done} while read, its size was {size}")
                done += got
            return piece_digest(buffer)

        starts = range(0, size, chunk_bytes)
        if size == 0:  # an empty file is one empty leaf
            digests = [piece_digest(b"")]
        elif pool is None:
            digests = [leaf(start) for start in starts]
        else:
            digests = list(pool.map(leaf, starts))
    return chunked_digest(digests, chunk_bytes)


#: Pieces larger than this are not hashed in parallel by `file_digests` (each would be a buffer
#: that large); their digest is still computed, streaming. Artifacts use CHUNK_BYTES.
MAX_PARALLEL_PIECE = 64 << 20


def sha256_stream(path, block_bytes: int = CHUNK_BYTES) -> str:
    """sha256 hex of a file, read in blocks into one reused buffer (no fresh pages per block)."""
    whole = hashlib.sha256()
    buffer = memoryview(bytearray(block_bytes))
    with open(path, "rb", buffering=0) as f:
        while n := _fill(f, buffer):
            whole.update(buffer[:n])
            if n < block_bytes:
                break
    return whole.hexdigest()


#: Buffers `file_digests` reads into ahead of the digests (each `chunk_bytes`), within
#: `READ_AHEAD_BYTES` per file (at least 2): 4 of the 4 MiB pieces artifacts use, 2 of a 64 MiB
#: piece a manifest may name. verify hashes up to `--jobs` files at once.
READ_AHEAD = 4
READ_AHEAD_BYTES = 16 << 20


def file_digests(
    path, chunk_bytes: int = CHUNK_BYTES, pieces: Executor | None = None, *, whole: bool = True
) -> tuple[str | None, dict]:
    """(sha256 hex, chunked digest) of a file, read once, a piece at a time. With `whole=False`
    (a manifest entry without a whole-file sha256): (None, the tree digest), its leaves read and
    hashed on `pieces` (`tree_digest_file`), nothing sequential.

    With `pieces` (a pool whose tasks never wait on other tasks), each piece's digest runs there,
    the whole-file digest runs on a thread of its own, and this thread reads the next pieces
    meanwhile into a ring of up to `READ_AHEAD` buffers (a buffer is refilled once both digests of the
    piece it holds are done). A file then takes one sha256 pass of wall time, not a pass plus
    its reads: the whole-file digest streams at 1-2 GB/s on one core and cannot be split, so it
    is what bounds `verify` by the largest artifact file (bench/CHANGELOG.md, "Session 6": reading
    in the same thread as that digest took a 1.7 GB file 2.9 s instead of ~1.5 s)."""
    if not whole:
        return None, tree_digest_file(path, pieces if 0 < chunk_bytes <= MAX_PARALLEL_PIECE else None, chunk_bytes)
    if pieces is None or not 0 < chunk_bytes <= MAX_PARALLEL_PIECE:
        stream, chunked = hashlib.sha256(), ChunkedSha256(chunk_bytes)
        buffer = memoryview(bytearray(CHUNK_BYTES))
        with open(path, "rb", buffering=0) as f:
            while n := _fill(f, buffer):
                stream.update(buffer[:n])
                chunked.update(buffer[:n])
        return stream.hexdigest(), chunked.result()
    stream, digests = hashlib.sha256(), []
    ring = [memoryview(bytearray(chunk_bytes)) for _ in range(max(2, min(READ_AHEAD, READ_AHEAD_BYTES // chunk_bytes)))]
    in_use: list[list[Future]] = [[] for _ in ring]
    with (
        ThreadPoolExecutor(1, thread_name_prefix="mxconvert-sha256-whole") as serial,
        open(path, "rb", buffering=0) as f,
    ):
        try:
            for count in itertools.count():
                slot = count % len(ring)
                for future in in_use[slot]:
                    future.result()  # both digests of the piece this buffer held are done
                n = _fill(f, ring[slot])
                if n == 0 and count:
                    break
                piece = ring[slot][:n]
                in_use[slot] = [pieces.submit(piece_digest, piece), serial.submit(stream.update, piece)]
                digests.append(in_use[slot][0])
                if n < chunk_bytes:
                    break
            for futures in in_use:  # the last pieces' digests, whose buffers were not refilled:
                for future in futures:  # one that failed fails the call (never a partial digest)
                    future.result()
        finally:
            for futures in in_use:  # no buffer is released while a digest still reads it
                for future in futures:
                    future.exception()
    return stream.hexdigest(), chunked_digest([d.result() for d in digests], chunk_bytes)


def _fill(f, buffer: memoryview) -> int:
    """Read into `buffer` until it is full or the file ends; the number of bytes read."""
    done = 0
    while done < len(buffer):
        got = f.readinto(buffer[done:])
        if not got:
            break
        done += got
    return done
