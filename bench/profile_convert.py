"""Where `convert` and `verify` spend their time: cProfile of one run on one thread (`--jobs 1`,
so that every chunk's work is on the profiled thread), top functions by own CPU time, and the CPU
split between that thread and the helper threads (hashing), which cProfile does not see.

    .venv/bin/python bench/profile_convert.py --profile h100 [--layers 1 --experts 32] [--top 25]
    .venv/bin/python bench/profile_convert.py --profile b200 --only verify --package /tmp/vf-before

A gpt-oss-shaped synthetic checkpoint (bench/synthetic.py) is written into a temporary folder.
The absolute times are those of a profiled single thread; what matters is the split. `--package
DIR` profiles the mxconvert package found in DIR (an older checkout) instead of this one.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--only", choices=("convert", "verify"), help="print only this command's profile")
    parser.add_argument("--package", type=Path, help="folder holding the mxconvert package to profile")
    parser.add_argument("--tmp", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(args.package.resolve() if args.package else HERE.parent))
    sys.path.insert(0, str(HERE))
    import synthetic
    import torch

    from mxconvert.formats.registry import format_of, open_model
    from mxconvert.pipeline.convert import execute
    from mxconvert.pipeline.plan import make_plan
    from mxconvert.pipeline.verify import verify_artifact
    from mxconvert.selection import Deployment
    from mxconvert.target.profiles import get_profile
    from mxconvert.target.revisions import get_revision

    torch.set_num_threads(1)  # torch ops on the profiled thread too, not on torch's own pool
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        src = Path(tmp) / "src"
        synthetic.write_synthetic(src, args.layers, args.experts)
        ckpt = open_model(str(src))
        revision = get_revision(None, format_of(ckpt).name)
        plan = make_plan(ckpt, get_profile(args.profile), revision, Deployment(), "auto")
        for what, call in (
            ("convert", lambda: execute(plan, Path(tmp) / "out", jobs=1)),
            ("verify", lambda: verify_artifact(Path(tmp) / "out", jobs=1)),
        ):
            prof = cProfile.Profile(time.thread_time)  # CPU time: the machine may be shared
            wall, cpu, thread = time.perf_counter(), _process_cpu(), time.thread_time()
            result = prof.runcall(call)
            wall, cpu, thread = time.perf_counter() - wall, _process_cpu() - cpu, time.thread_time() - thread
            if what == "verify" and not result.ok:
                raise SystemExit(f"verify failed: {result.problems[:3]}")
            if args.only not in (None, what):
                continue
            print(
                f"==== {what} --profile {args.profile}, {args.layers} layer(s) x {args.experts} experts, --jobs 1: "
                f"wall {wall:.2f} s, CPU {cpu:.2f} s (profiled thread {thread:.2f} s, other threads "
                f"{cpu - thread:.2f} s)"
            )
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
