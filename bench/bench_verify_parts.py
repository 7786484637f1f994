"""The two parts of `verify` that session 5 changed, each against the code it replaced, in one
process (issue 11, target 2):

1. the byte comparison of a chunk: torch.equal on uint8 views (before) vs `verify._same_bytes`
   (int64 views), thread CPU time, best of --repeat;
2. one artifact file's digests (sha256 + chunked sha256): both on the reading thread (before)
   vs the pieces on a pool while the reading thread takes the whole-file sha256; wall time (the
   longest single task of verify when the file is the largest) and process CPU time.

    .venv/bin/python bench/bench_verify_parts.py [--mb 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mxconvert.core.digest import CHUNK_BYTES, ChunkedSha256, file_digests  # noqa: E402
from mxconvert.pipeline.verify import _same_bytes  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _old_digests(path: Path) -> tuple[str, dict]:
    """file_digests as it was at 540de15: both digests on the reading thread."""
    whole, chunked = hashlib.sha256(), ChunkedSha256(CHUNK_BYTES)
    with open(path, "rb") as f:
        while block := f.read(CHUNK_BYTES):
            whole.update(block)
            chunked.update(block)
    return whole.hexdigest(), chunked.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tmp", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    a = torch.randint(0, 256, (args.mb << 20,), dtype=torch.uint8)
    b = a.clone()

    def thread_best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            start = time.thread_time()
            assert fn()
            times.append(time.thread_time() - start)
        return min(times)

    old = thread_best(lambda: torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
    new = thread_best(lambda: _same_bytes(a, b))
    print(
        f"compare {args.mb} MiB, thread CPU: torch.equal uint8 {old:.3f} s, _same_bytes {new:.3f} s ({old / new:.1f}x)"
    )
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = Path(tmp) / "file"
        path.write_bytes(a.numpy().tobytes())
        with open(path, "rb") as f:  # page cache warm
            while f.read(64 << 20):
                pass
        rows = {}
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for label, fn in (
                ("both on one thread (before)", lambda: _old_digests(path)),
                ("pieces on a pool (after)", lambda: file_digests(path, CHUNK_BYTES, pool)),
            ):
                best = (float("inf"), 0.0)
                for _ in range(args.repeat):
                    wall, cpu = time.perf_counter(), _cpu()
                    rows[label] = fn()
                    best = min(best, (time.perf_counter() - wall, _cpu() - cpu))
                print(f"digests of one {args.mb} MiB file, {label}: wall {best[0]:.3f} s, CPU {best[1]:.3f} s")
        first, second = rows.values()
        assert first == second, "the two digests differ"


if __name__ == "__main__":
    main()
