"""What bounds convert on a host (bench/CHANGELOG.md, "Session 7"): sha256 and memory-copy throughput
on 1-16 threads at once, whole-file sha256 streams of a checkpoint's files from the page cache, and
the time to build a b200 conversion's layout plans alone and beside those streams.

    python3 tools/gpu_check/host_probe.py PKGROOT CHECKPOINT   # PKGROOT: folder holding mxconvert/
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time

import numpy as np


def _parallel(count: int, work) -> float:
    """Wall seconds of `work(i)` for i < count, each on a thread of its own, all at once."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def _compute_scaling() -> None:
    size = 256 << 20
    sources = [np.random.randint(0, 255, size, dtype=np.uint8) for _ in range(16)]
    targets = [np.empty(size, np.uint8) for _ in range(16)]
    for count in (1, 2, 4, 8, 16):
        hashed = _parallel(count, lambda i: hashlib.sha256(sources[i]).digest())
        copied = _parallel(count, lambda i: np.copyto(targets[i], sources[i]))
        print(
            f"threads {count:2}: sha256 {count * size / hashed / 1e9:6.2f} GB/s total "
            f"({size / hashed / 1e9:.2f} each); copy {count * size / copied / 1e9:6.2f} GB/s total"
        )


def _streams_and_plans(checkpoint: str) -> None:
    from mxconvert.core.digest import sha256_stream
    from mxconvert.formats.registry import format_of, open_model
    from mxconvert.layouts.engine import plans as base
    from mxconvert.pipeline.plan import make_plan
    from mxconvert.selection import Deployment
    from mxconvert.target.profiles import get_profile
    from mxconvert.target.revisions import get_revision

    files = sorted(os.path.join(checkpoint, f) for f in os.listdir(checkpoint) if f.endswith(".safetensors"))[:4]
    for count in (1, 2, 4):
        took = _parallel(count, lambda i: sha256_stream(files[i]))
        size = sum(os.path.getsize(f) for f in files[:count])
        print(f"file streams {count}: {size / took / 1e9:.2f} GB/s total, {took:.2f} s")
    for streams in (0, 1, 4):
        base._gather_plan.cache_clear()
        ckpt = open_model(checkpoint)
        plan = make_plan(ckpt, get_profile("b200"), get_revision(None, format_of(ckpt).name), Deployment(), "auto")
        specs = plan.geometry.specs(plan.ranks[0].num_experts)
        hashing = [threading.Thread(target=sha256_stream, args=(files[i],)) for i in range(streams)]
        for thread in hashing:
            thread.start()
        start = time.perf_counter()
        base.prepare_all(plan.layout.tensors, specs, 16)
        on_16 = time.perf_counter() - start
        base._gather_plan.cache_clear()
        start = time.perf_counter()
        base.prepare_all(plan.layout.tensors, specs, 1)
        on_1 = time.perf_counter() - start
        for thread in hashing:
            thread.join()
        print(f"prepare_all beside {streams} hash streams: 16 threads {on_16:.2f} s, then 1 thread {on_1:.2f} s")


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    _compute_scaling()
    _streams_and_plans(sys.argv[2])
