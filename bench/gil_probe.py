"""Does each numpy step of the Hopper pass (`layouts/hopper_host.py`) release the GIL, and what
does a thread running Python code beside it cost it? For each step, on one block of the pass:
its time alone, its time while another thread spins in pure Python, and how fast that spinner
ran meanwhile against its speed with this thread asleep (near 100%: the step leaves the GIL free).

    python bench/gil_probe.py [SWITCH_INTERVAL_SECONDS]

Session 16, GPU host (`results/gil-h100-s16/`): every step but the mixed-type `bitwise_or` releases
the GIL; beside a spinner each call took ~5.4 ms whatever its own length (the 5 ms switch interval:
the spinner keeps the GIL until forced to switch), 0.35-0.7 ms with a 0.2 ms interval. Converts
with a shorter interval were no faster (`switch.txt`): nothing in a conversion spins like that.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import numpy as np

import mxconvert.layouts.hopper_host as hopper_host
from mxconvert.layouts.triton import _pack_tables

KBP = 1440  # gpt-oss gate_up: bytes a row
GROUPS = max(1, (1 << 18) // (4 * KBP))  # one block of the pass


def _steps() -> dict[str, Callable[[], object]]:
    t01 = _pack_tables()[0]
    first = hopper_host._word_sources(KBP)[0]
    halves = np.random.default_rng(0).integers(0, 256, size=(GROUPS, 2, 8, KBP), dtype=np.uint8)
    pairs = np.empty((GROUPS, 8, KBP), dtype=np.uint16)
    lanes = np.empty((GROUPS, 4 * KBP), dtype=np.uint16)
    index = np.empty((GROUPS, 4 * KBP), dtype=np.intp)
    words = np.empty((GROUPS, 4 * KBP), dtype=np.uint32)
    high = np.empty((GROUPS, 4 * KBP), dtype=np.uint32)
    flat = pairs.reshape(GROUPS, 8 * KBP)
    as_bytes = pairs.view(np.uint8).reshape(GROUPS, 8, KBP, 2)
    return {
        "left_shift dtype=u16": lambda: np.left_shift(halves[:, 1], 8, out=pairs, dtype=np.uint16),
        "bitwise_or u16|u8": lambda: np.bitwise_or(pairs, halves[:, 0], out=pairs),
        "bytes copy x2": lambda: (np.copyto(as_bytes[..., 0], halves[:, 0]), np.copyto(as_bytes[..., 1], halves[:, 1])),
        "take axis=1 (move)": lambda: np.take(flat, first, axis=1, out=lanes, mode="clip"),
        "method take axis=1": lambda: flat.take(first, axis=1, out=lanes, mode="clip"),
        "copyto u16->intp": lambda: np.copyto(index, lanes),
        "take table": lambda: np.take(t01, index, out=words, mode="clip"),
        "words |= high": lambda: np.bitwise_or(words, high, out=words),
    }


def _beside_spinner(work: Callable[[float], int], seconds: float = 1.0) -> tuple[int, float, float]:
    """(calls, elapsed, spinner loops a second) of `work` run for `seconds` beside a pure-Python spinner."""
    stop, count = [False], [0]

    def spin() -> None:
        c = 0
        while not stop[0]:
            c += 1
        count[0] = c

    spinner = threading.Thread(target=spin)
    spinner.start()
    t0 = time.perf_counter()
    calls = work(seconds)
    elapsed = time.perf_counter() - t0
    stop[0] = True
    spinner.join()
    return calls, elapsed, count[0] / elapsed


def _looping(step: Callable[[], object]) -> Callable[[float], int]:
    def work(seconds: float) -> int:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step()
            calls += 1
        return calls

    return work


def _asleep(seconds: float) -> int:
    time.sleep(seconds)  # the GIL free all along: the spinner's speed alone
    return 1


def main() -> None:
    if len(sys.argv) > 1:
        sys.setswitchinterval(float(sys.argv[1]))
    print(f"switch interval {sys.getswitchinterval() * 1e3:.2f} ms; one block: {GROUPS} groups of {KBP} bytes a row")
    _, _, alone = _beside_spinner(_asleep)
    for name, step in _steps().items():
        step()
        t0 = time.perf_counter()
        calls = _looping(step)(0.5)
        solo = 1e6 * (time.perf_counter() - t0) / calls
        calls, elapsed, rate = _beside_spinner(_looping(step))
        print(
            f"{name:24s} alone {solo:7.1f} us/call, beside the spinner {1e6 * elapsed / calls:8.1f} us/call; "
            f"spinner at {100 * rate / alone:5.1f}% of its speed alone"
        )


if __name__ == "__main__":
    main()
