"""Which leaf hash for the tree digest (issue 24 item 1): sha256 against BLAKE3 (the maintained
`blake3` binding, if importable), one core and all cores, on one buffer in memory.

    python bench/bench_digest.py [--mib 512] [--repeat 5]

Prints one JSON line, GB/s: `sha256_1core` (hashlib, one stream), `sha256_tree` (4 MiB leaves on a
pool of every available core: what mxconvert computes), `blake3_1thread`, `blake3_auto` (its own
Rayon threads), `blake3_tree` (4 MiB BLAKE3 leaves on the same pool).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

LEAF = 4 << 20


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.mib << 20
    data = memoryview(os.urandom(n))
    cores = len(os.sched_getaffinity(0))
    starts = range(0, n, LEAF)
    result: dict[str, float | int | str] = {"cores": cores, "mib": args.mib}
    with ThreadPoolExecutor(cores) as pool:

        def tree(leaf_hash) -> bytes:
            return leaf_hash(b"".join(pool.map(lambda s: leaf_hash(data[s : s + LEAF]), starts)))

        result["sha256_1core"] = n / _best(lambda: hashlib.sha256(data).digest(), args.repeat) / 1e9
        result["sha256_tree"] = n / _best(lambda: tree(lambda b: hashlib.sha256(b).digest()), args.repeat) / 1e9
        try:
            import blake3
        except ImportError:
            result["blake3"] = "not installed"
        else:
            result["blake3_1thread"] = n / _best(lambda: blake3.blake3(data).digest(), args.repeat) / 1e9
            auto = blake3.blake3.AUTO
            result["blake3_auto"] = n / _best(lambda: blake3.blake3(data, max_threads=auto).digest(), args.repeat) / 1e9
            result["blake3_tree"] = n / _best(lambda: tree(lambda b: blake3.blake3(b).digest()), args.repeat) / 1e9
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
