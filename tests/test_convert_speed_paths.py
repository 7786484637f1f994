"""The CPU-saving paths of `convert` (issue 24 item 3, bench/README.md "Where convert's CPU goes"):
chunk buffers reused from a pool by reference count (core/parallel.py `BufferPool`), tree-digest
leaves split across writes hashed from their pieces without a copy (core/digest.py), and the
pooled results of the layout moves (layouts/engine/moves.py). Bytes and behaviour only: nothing
here is timed."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import EXAMPLE, run_cli, tree_digest

from mxconvert.core import parallel
from mxconvert.core.digest import ParallelChunkedSha256
from mxconvert.core.parallel import BufferPool, host_buffer, reused_buffers
from mxconvert.layouts.engine import moves
from mxconvert.storage.safetensors_io import ShardReader, StreamingWriter


def _tree(data: bytes, leaf: int) -> str:
    leaves = [data[i : i + leaf] for i in range(0, len(data), leaf)] or [b""]
    return hashlib.sha256(b"".join(hashlib.sha256(x).digest() for x in leaves)).hexdigest()


# ---- the pool -------------------------------------------------------------------------------------
def test_a_pooled_buffer_is_reused_only_once_nothing_refers_to_it():
    pool = BufferPool(1 << 20)
    first = pool.empty(4096)
    first[:] = 7
    address = first.ctypes.data
    held = pool.empty(4096)  # `first` is still referenced: a different buffer
    assert held.ctypes.data != address
    del first
    again = pool.empty(4096)
    assert again.ctypes.data == address  # the same pages, not fresh ones
    assert pool.pooled_bytes() == 2 * 4096


@pytest.mark.parametrize("hold", ["view", "memoryview", "reshaped", "torch-free bytes view"])
def test_any_view_of_a_pooled_buffer_keeps_it_taken(hold):
    pool = BufferPool(1 << 20)
    buffer = pool.empty(4096)
    address = buffer.ctypes.data
    keep = {
        "view": lambda b: b[10:20],
        "memoryview": lambda b: memoryview(b)[100:],
        "reshaped": lambda b: b.view(np.uint32).reshape(32, 32),
        "torch-free bytes view": lambda b: memoryview(b.data).cast("B")[:8],
    }[hold](buffer)
    del buffer
    assert pool.empty(4096).ctypes.data != address  # still referenced through `keep`
    del keep
    assert pool.empty(4096).ctypes.data == address


def test_the_pool_keeps_at_most_its_bytes_and_makes_room_from_unused_buffers():
    pool = BufferPool(10_000)
    a = pool.empty(6000)
    b = pool.empty(6000)  # over the bound while `a` is held: fresh, not pooled
    assert pool.pooled_bytes() == 6000 and b.nbytes == 6000
    del a, b
    c = pool.empty(8000)  # the unused 6000-byte buffer goes to make room
    assert pool.pooled_bytes() == 8000 and c.nbytes == 8000


def test_host_buffer_pools_only_inside_reused_buffers():
    assert parallel._pool is None
    outside = host_buffer(64)
    assert outside.nbytes == 64 and parallel._pool is None
    with reused_buffers(1 << 20):
        with reused_buffers(1 << 20):  # nested / concurrent conversions share one pool
            pool = parallel._pool
            assert pool is not None
            host_buffer(128)
        assert parallel._pool is pool and pool.pooled_bytes() == 128
    assert parallel._pool is None  # dropped with the last user


# ---- tree digest leaves split across writes --------------------------------------------------------
@pytest.mark.parametrize("sizes", [[5000, 3000, 100, 9000], [1, 4095, 4097, 1], [4096, 4096], [12288], [7] * 1300])
def test_split_leaves_hash_from_their_pieces_to_the_definition(sizes):
    rng = np.random.default_rng(len(sizes))
    pieces = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    with ThreadPoolExecutor(3) as pool:
        hasher = ParallelChunkedSha256(pool, 4096, max_pending_bytes=8192)
        for piece in pieces:
            hasher.update(piece)
        got = hasher.result()
    assert got == {"chunk_bytes": 4096, "digest": _tree(b"".join(p.tobytes() for p in pieces), 4096)}


def test_a_split_leaf_holds_its_pieces_not_a_copy():
    """The pieces of a split leaf stay referenced until hashed (the writer's contract), so a
    pooled buffer holding one is not handed out again meanwhile."""
    pool = BufferPool(1 << 20)
    with ThreadPoolExecutor(1) as leaves:
        hasher = ParallelChunkedSha256(leaves, 4096)
        piece = pool.empty(1000)
        piece[:] = 3
        address = piece.ctypes.data
        hasher.update(piece)  # shorter than a leaf: its view waits for the next bytes
        del piece
        assert pool.empty(1000).ctypes.data != address
        hasher.update(np.full(3096, 3, dtype=np.uint8))
        assert hasher.result()["digest"] == _tree(b"\x03" * 4096, 4096)


def test_streaming_writer_with_pooled_pieces_writes_and_digests_their_bytes(tmp_path):
    """Pieces written from pooled buffers that are released at once and reused for the next
    piece: the file and its tree digest hold every piece's own bytes."""
    pool = BufferPool(1 << 20)
    path = tmp_path / "x.safetensors"
    with ThreadPoolExecutor(2) as leaves:
        writer = StreamingWriter(path, [("t", "uint8", (6, 3000))], leaves=leaves, whole_sha256=True)
        for row in range(6):
            piece = pool.empty(3000)
            piece[:] = row + 1
            writer.write("t", piece.reshape(1, 3000))
            del piece
        writer.close()
        digest, whole = writer.chunked_sha256, writer.sha256
    data = path.read_bytes()
    assert data.endswith(b"".join(bytes([r + 1]) * 3000 for r in range(6)))
    assert digest["digest"] == _tree(data, digest["chunk_bytes"]) and whole == hashlib.sha256(data).hexdigest()
    assert ShardReader(path).get_bits("t").tolist() == [[r + 1] * 3000 for r in range(6)]


# ---- the moves' pooled results -----------------------------------------------------------------------
def test_read_chunks_and_moved_chunks_do_not_share_buffers_while_held(tmp_path):
    """Two chunks read and moved one after the other inside a conversion's pool: the first,
    still held, keeps its bytes (no buffer of it is handed out for the second)."""
    path = tmp_path / "s.safetensors"
    writer = StreamingWriter(path, [("w", "uint8", (4, 64))])
    writer.write("w", np.arange(256, dtype=np.uint8).reshape(4, 64))
    writer.close()
    reader = ShardReader(path)
    with reused_buffers(1 << 20):
        first = reader.get_slice("w").bits((slice(0, 2),))
        second = reader.get_slice("w").bits((slice(2, 4),))
        assert first.tolist() == np.arange(128).reshape(2, 64).tolist()
        assert second.tolist() == np.arange(128, 256).reshape(2, 64).tolist()
        buf = moves._buffer((2, 8), np.dtype(np.uint16))
        assert buf.shape == (2, 8) and buf.dtype == np.uint16 and buf.flags.c_contiguous
    reader.close()


def test_convert_inside_a_pool_writes_what_it_writes_without_one(tmp_path, monkeypatch):
    """The example converted with the pool and with it switched off (every buffer fresh):
    identical files and manifests."""
    outs = {}
    for pooled in (True, False):
        if not pooled:
            monkeypatch.setattr(parallel, "_refcounts_tell_use", lambda: False)
        out = tmp_path / f"out-{pooled}"
        result = run_cli("convert", str(EXAMPLE), "-o", str(out), "-p", "h100", "--jobs", "2")
        assert result.exit_code == 0, result.output
        outs[pooled] = out
    assert tree_digest(outs[True]) == tree_digest(outs[False])  # the manifest too: same source, same bytes
    assert len(tree_digest(outs[True])) > 2
