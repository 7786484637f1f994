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


def file_digests(path, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, dict]:
    """(sha256 hex, chunked digest) of a file, read once."""
    whole, chunked = hashlib.sha256(), ChunkedSha256(chunk_bytes)
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            whole.update(block)
            chunked.update(block)
    return whole.hexdigest(), chunked.result()
