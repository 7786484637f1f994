"""The Hopper value layout's host pass (`layouts/hopper_host.py`) on several threads at once: GB/s
of canonical bytes laid out, summed over the threads, for each block size (words per numpy step).

Why: the pass is a Python loop of ~9 numpy calls per block. Each call holds the GIL while it
starts, so on many cores the threads may queue for the GIL rather than run (convert's h100 CPU
seconds grow faster with cores than b200's, bench/README.md). A block size that scales on 16
threads and stays fast on one is the one to keep.

    python bench/bench_hopper_threads.py --threads 1,2,4,8,16 --blocks 14,16,18,20
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

import mxconvert.layouts.hopper_host as hopper_host
from mxconvert.layouts.triton import _pack_tables


def _rate(threads: int, seconds: float, shape: tuple[int, int, int], cap: int = 0) -> float:
    """GB/s of canonical bytes laid out by `threads` threads for about `seconds`, at most `cap`
    of them inside the pass at once (0: no cap)."""
    gate = threading.BoundedSemaphore(cap or threads)
    layout = hopper_host.HopperValueHost(16, 32, _pack_tables)
    data = [np.random.default_rng(i).integers(0, 256, size=shape, dtype=np.uint8) for i in range(threads)]
    layout._forward(data[0], 0)  # tables built, caches warm (the pass without its gate)
    done = [0] * threads
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def work(i: int) -> None:
        start.wait()
        while time.perf_counter() < stop_at[0]:
            with gate:
                layout._forward(data[i], 0)
            done[i] += data[i].nbytes

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    stop_at[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start.wait()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - t0) / 1e9


def _one_process(args: tuple[int, float, tuple[int, int, int], int]) -> float:
    log2, seconds, shape, _ = args
    hopper_host._BLOCK_WORDS = 1 << log2
    return _rate(1, seconds, shape)


def _processes(count: int, log2: int, seconds: float, shape: tuple[int, int, int]) -> float:
    """The same work in `count` processes of one thread: no GIL shared. Where these scale and the
    threads do not, the GIL is what holds the threads back, not the memory or the cores."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(count) as pool:
        return sum(pool.map(_one_process, [(log2, seconds, shape, i) for i in range(count)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2,4,8,16")
    parser.add_argument("--blocks", default="14,16,18,20", help="log2 of the words per block")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--experts", type=int, default=2, help="experts per call (a convert chunk holds 1-4)")
    parser.add_argument("--processes", action="store_true", help="also each count as processes of one thread")
    parser.add_argument("--caps", default="", help="also: the largest thread count, at most C at once, C in this list")
    args = parser.parse_args()
    shape = (args.experts, 5760, 1440)  # gpt-oss gate_up: N = 2 x 2880 rows, K / 2 = 1440 bytes
    print(f"shape {shape}, {np.prod(shape) / 1e6:.1f} MB a call; numpy {np.__version__}")
    print("block\t" + "\t".join(f"{t} thr" for t in args.threads.split(",")))
    for log2 in (int(b) for b in args.blocks.split(",")):
        hopper_host._BLOCK_WORDS = 1 << log2
        rates = [_rate(int(t), args.seconds, shape) for t in args.threads.split(",")]
        print(f"2^{log2}\t" + "\t".join(f"{r:.2f}" for r in rates), flush=True)
        if args.caps:
            most = max(int(t) for t in args.threads.split(","))
            caps = args.caps.split(",")
            rates = [_rate(most, args.seconds, shape, int(c)) for c in caps]
            capped = ", ".join(f"{c}: {r:.2f}" for c, r in zip(caps, rates))
            print(f"2^{log2} {most} thr, at most {capped}", flush=True)
        if args.processes:
            rates = [_processes(int(t), log2, args.seconds, shape) for t in args.threads.split(",")]
            print(f"2^{log2} proc\t" + "\t".join(f"{r:.2f}" for r in rates), flush=True)


if __name__ == "__main__":
    main()
