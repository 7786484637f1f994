"""The Hopper pass on the host (layouts/hopper_host.py) cut into blocks, and its bound on the
threads inside it at once (bench/README.md, "The Hopper pass and the GIL").

The block size and the bound change how fast the pass runs, never its bytes: blocks of one
16-row group, of a few groups with a partial last block, and the whole tensor in one block give
the gather plan's bytes, forward and inverse."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mxconvert.core.dtypes import DType
from mxconvert.layouts import hopper_host
from mxconvert.layouts.triton import TritonChoice, triton_tensors

U8 = DType("uint8")


def _value(generation: str):
    choice = TritonChoice("HopperMXValueLayout", "HopperMXScaleLayout", False, 8, generation, 0)
    return triton_tensors(choice)[0]


@pytest.mark.parametrize("generation", ["3.5.1", "3.6.0"])
@pytest.mark.parametrize("block_words", [1, 3 * 4 * 96, 1 << 18])  # one group a block; 3 (+ a partial); all
def test_blocks_do_not_change_the_bytes(monkeypatch, generation, block_words):
    layout = _value(generation)
    x = np.random.default_rng(7).integers(0, 256, size=(5, 200, 90), dtype=np.uint8)  # 13 groups an expert
    expected, _ = layout.forward_bits(x, U8, "gather")
    monkeypatch.setattr(hopper_host, "_BLOCK_WORDS", block_words)
    fused, _ = layout.forward_bits(x, U8, "auto")
    assert np.array_equal(fused, expected)
    back = layout.inverse_bits(fused, x.shape, U8, "auto")
    assert np.array_equal(back, x)


def test_at_most_the_bound_run_the_pass_at_once(monkeypatch):
    """Four threads, a bound of two: two get in, the other two wait until one leaves."""
    monkeypatch.setattr(hopper_host, "_AT_ONCE", 2)
    monkeypatch.setattr(hopper_host, "_gate", None)
    inside, most, lock = [0], [0], threading.Condition()
    leave = threading.Event()

    def held(self, x, fill):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            lock.notify_all()
        assert leave.wait(60)
        with lock:
            inside[0] -= 1
        return x

    monkeypatch.setattr(hopper_host.HopperValueHost, "_forward", held)
    layout = hopper_host.HopperValueHost(16, 32, lambda: None)
    threads = [threading.Thread(target=layout.forward, args=(np.zeros(1), 0)) for _ in range(4)]
    for t in threads:
        t.start()
    with lock:
        assert lock.wait_for(lambda: inside[0] == 2, timeout=60)
    gate = hopper_host._gate
    assert gate is not None and not gate.acquire(blocking=False)  # both places taken: the others wait
    leave.set()
    for t in threads:
        t.join(60)
    assert most[0] == 2 and inside[0] == 0


def test_the_default_bound_is_half_the_cores_and_at_least_two(monkeypatch):
    monkeypatch.setattr(hopper_host, "default_jobs", lambda: 16)
    assert hopper_host._default_at_once() == 8
    monkeypatch.setattr(hopper_host, "default_jobs", lambda: 2)
    assert hopper_host._default_at_once() == 2
