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
from concurrent.futures import Executor

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


def file_digests(path, chunk_bytes: int = CHUNK_BYTES, pieces: Executor | None = None) -> tuple[str, dict]:
    """(sha256 hex, chunked digest) of a file, read once, a piece at a time into one buffer.

    With `pieces` (a pool whose tasks never wait on other tasks), each piece's digest runs there
    while this thread adds the same bytes to the whole-file digest: a file then takes one sha256
    pass of wall time instead of two (each digest streams at 1-2 GB/s on one core, and the
    whole-file one cannot be split), which is what bounded `verify` by the largest artifact file."""
    if pieces is None or not 0 < chunk_bytes <= MAX_PARALLEL_PIECE:
        whole, chunked = hashlib.sha256(), ChunkedSha256(chunk_bytes)
        buffer = memoryview(bytearray(CHUNK_BYTES))
        with open(path, "rb", buffering=0) as f:
            while n := _fill(f, buffer):
                whole.update(buffer[:n])
                chunked.update(buffer[:n])
        return whole.hexdigest(), chunked.result()
    whole, digests = hashlib.sha256(), []
    buffer = memoryview(bytearray(chunk_bytes))
    with open(path, "rb", buffering=0) as f:
        while n := _fill(f, buffer):
            piece = pieces.submit(piece_digest, buffer[:n])
            whole.update(buffer[:n])
            digests.append(piece.result())  # before the buffer is refilled
            if n < chunk_bytes:
                break
    return whole.hexdigest(), chunked_digest(digests or [piece_digest(b"")], chunk_bytes)


def _fill(f, buffer: memoryview) -> int:
    """Read into `buffer` until it is full or the file ends; the number of bytes read."""
    done = 0
    while done < len(buffer):
        got = f.readinto(buffer[done:])
        if not got:
            break
        done += got
    return done
