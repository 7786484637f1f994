"""File digests: sha256 of the whole file (what the manifest, `verify` and external tools use),
and a chunked sha256 that can be computed on all cores at once (what `load_artifact` checks).

The chunked digest of a file is the sha256 of the concatenated 32-byte sha256 digests of its
consecutive `CHUNK_BYTES` pieces (the last one shorter). Each piece hashes independently, so a
loader that reads a file in pieces on several threads checks it at the speed of the reads; the
whole-file sha256 is one sequential stream (about 1.5-2 GB/s on one core). Both are recorded;
neither replaces the other.
"""

from __future__ import annotations

import hashlib
import itertools
from concurrent.futures import Executor, Future, ThreadPoolExecutor

CHUNK_BYTES = 4 << 20
CHUNKED_KEY = "sha256_chunked"  # manifest field of a file entry: {"chunk_bytes": n, "digest": hex}


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


def file_digests(path, chunk_bytes: int = CHUNK_BYTES, pieces: Executor | None = None) -> tuple[str, dict]:
    """(sha256 hex, chunked digest) of a file, read once, a piece at a time.

    With `pieces` (a pool whose tasks never wait on other tasks), each piece's digest runs there,
    the whole-file digest runs on a thread of its own, and this thread reads the next pieces
    meanwhile into a ring of up to `READ_AHEAD` buffers (a buffer is refilled once both digests of the
    piece it holds are done). A file then takes one sha256 pass of wall time, not a pass plus
    its reads: the whole-file digest streams at 1-2 GB/s on one core and cannot be split, so it
    is what bounds `verify` by the largest artifact file (bench/README.md, "Session 6": reading
    in the same thread as that digest took a 1.7 GB file 2.9 s instead of ~1.5 s)."""
    if pieces is None or not 0 < chunk_bytes <= MAX_PARALLEL_PIECE:
        whole, chunked = hashlib.sha256(), ChunkedSha256(chunk_bytes)
        buffer = memoryview(bytearray(CHUNK_BYTES))
        with open(path, "rb", buffering=0) as f:
            while n := _fill(f, buffer):
                whole.update(buffer[:n])
                chunked.update(buffer[:n])
        return whole.hexdigest(), chunked.result()
    whole, digests = hashlib.sha256(), []
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
                in_use[slot] = [pieces.submit(piece_digest, piece), serial.submit(whole.update, piece)]
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
    return whole.hexdigest(), chunked_digest([d.result() for d in digests], chunk_bytes)


def _fill(f, buffer: memoryview) -> int:
    """Read into `buffer` until it is full or the file ends; the number of bytes read."""
    done = 0
    while done < len(buffer):
        got = f.readinto(buffer[done:])
        if not got:
            break
        done += got
    return done
