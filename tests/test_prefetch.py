"""artifact/prefetch.py: tensors read ahead on threads, in the consumer's order, within a budget."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from safetensors.torch import save_file

from mxconvert.artifact.prefetch import Prefetcher
from mxconvert.core.errors import InputError
from mxconvert.storage.safetensors_io import ShardReader


@pytest.fixture
def shard(tmp_path):
    tensors = {f"t{i}": torch.full((64,), i, dtype=torch.uint8) for i in range(8)}
    save_file(tensors, str(tmp_path / "rank.safetensors"))
    return tmp_path, tensors


def order(n: int, size: int = 64):
    return [(("rank.safetensors", f"t{i}"), size) for i in range(n)]


def test_every_tensor_is_the_stored_one_whatever_the_budget(shard):
    root, tensors = shard
    for budget in (0, 1, 64, 10**9):
        with Prefetcher(root, order(8), budget, threads=3) as reads:
            for i in range(8):
                assert torch.equal(reads.get(("rank.safetensors", f"t{i}")), tensors[f"t{i}"])
            assert reads.taken == 8 and reads.taken_bytes == 8 * 64


def test_reads_stay_within_the_budget(shard):
    """With a budget of two tensors, two are submitted; taking one submits the next (the
    submissions happen in `__init__` and `get`, so this needs no waiting)."""
    root, _ = shard
    with Prefetcher(root, order(8), 128, threads=4) as reads:
        assert reads.ahead() == [("rank.safetensors", "t0"), ("rank.safetensors", "t1")]
        reads.get(("rank.safetensors", "t0"))
        assert reads.ahead() == [("rank.safetensors", "t1"), ("rank.safetensors", "t2")]


def test_one_tensor_larger_than_the_budget_is_still_read_ahead(shard):
    root, _ = shard
    with Prefetcher(root, order(3), 1, threads=2) as reads:
        assert reads.ahead() == [("rank.safetensors", "t0")]


def test_a_tensor_outside_the_order_is_read_when_asked(shard):
    root, tensors = shard
    with Prefetcher(root, order(2), 64, threads=2) as reads:
        assert torch.equal(reads.get(("rank.safetensors", "t5")), tensors["t5"])
        assert torch.equal(reads.get(("rank.safetensors", "t0")), tensors["t0"])
        assert torch.equal(reads.get(("rank.safetensors", "t0")), tensors["t0"])  # twice: read again


def test_a_missing_tensor_fails_when_it_is_asked_for(shard):
    root, _ = shard
    with (
        Prefetcher(root, [(("rank.safetensors", "nope"), 64)], 64, threads=1) as reads,
        pytest.raises(InputError, match="no tensor 'nope'"),
    ):
        reads.get(("rank.safetensors", "nope"))


def test_a_read_after_close_leaves_no_file_open(shard):
    root, tensors = shard
    opened: list[ShardReader] = []
    real_init = ShardReader.__init__

    def tracking_init(self, path):
        real_init(self, path)
        opened.append(self)

    with mock.patch.object(ShardReader, "__init__", tracking_init):
        reads = Prefetcher(root, order(2), 64, threads=2)
        reads.close()
        assert torch.equal(reads.get(("rank.safetensors", "t3")), tensors["t3"])
    assert opened and all(r._fd is None for r in opened)  # every file the prefetcher opened is closed
