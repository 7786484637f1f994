"""Writing a file through the page cache (write() + fsync) against O_DIRECT from aligned blocks
(the writes queued on threads, the last block padded and the file truncated), and reading it
back: wall and process CPU (user + system, all threads) of each, alternating, best of N.

    python bench/bench_direct_io.py DIR [--gb 1.9] [--repeat 3] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PIECE = 64 << 20


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_buffered(path: Path, source: np.ndarray, pieces: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(pieces):
            os.write(fd, source)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_direct(path: Path, source: np.ndarray, pieces: int, block: int, depth: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
    blocks = [mmap.mmap(-1, block) for _ in range(depth + 1)]
    views = [np.frombuffer(b, dtype=np.uint8) for b in blocks]
    pending: list = [None] * (depth + 1)
    current = fill = offset = 0
    with ThreadPoolExecutor(depth) as pool:
        for _ in range(pieces):
            pos = 0
            while pos < source.size:
                n = min(block - fill, source.size - pos)
                views[current][fill : fill + n] = source[pos : pos + n]
                fill += n
                pos += n
                if fill == block:
                    pending[current] = pool.submit(os.pwrite, fd, blocks[current], offset)
                    offset += block
                    fill = 0
                    current = (current + 1) % len(blocks)
                    if pending[current] is not None:
                        pending[current].result()
                        pending[current] = None
        for done in pending:
            if done is not None:
                done.result()
    os.fsync(fd)
    os.close(fd)


def read_back(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(PIECE)
        while f.readinto(buf):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--gb", type=float, default=1.9)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ways", default="8x2,8x4,32x2", help="direct writes: MiB per block x blocks in flight")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    source = np.random.default_rng(0).integers(0, 256, PIECE, dtype=np.uint8)
    pieces = max(1, round(args.gb * 1e9 / PIECE))
    ways = {"buffered + fsync": lambda p: write_buffered(p, source, pieces)}
    for way in args.ways.split(","):
        mib, depth = (int(v) for v in way.split("x"))
        ways[f"direct {mib} MiB x {depth}"] = lambda p, b=mib << 20, d=depth: write_direct(p, source, pieces, b, d)
    results: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": [], "read": []} for name in ways}
    path = args.dir / "bench-direct-io.bin"
    for _ in range(args.repeat):
        for name, way in ways.items():
            path.unlink(missing_ok=True)
            os.sync()
            t, c = time.perf_counter(), _cpu()
            way(path)
            results[name]["wall"].append(time.perf_counter() - t)
            results[name]["cpu"].append(_cpu() - c)
            t = time.perf_counter()
            read_back(path)
            results[name]["read"].append(time.perf_counter() - t)
    path.unlink(missing_ok=True)
    gb = pieces * PIECE / 1e9
    print(f"{gb:.2f} GB, {os.cpu_count()} CPUs, best of {args.repeat} (all runs in brackets)")
    for name, r in results.items():
        runs = " ".join(f"{w:.2f}" for w in r["wall"])
        print(
            f"{name:18s} write {min(r['wall']):.2f} s ({runs}) = {gb / min(r['wall']):.2f} GB/s,"
            f" CPU {min(r['cpu']):.2f} s; read back {min(r['read']):.2f} s"
        )
    if args.json_out:
        args.json_out.write_text(json.dumps({"gb": gb, "cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
