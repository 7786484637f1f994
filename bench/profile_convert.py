"""Where `convert` and `verify` spend their time: cProfile of one run on one thread (`--jobs 1`,
so that every chunk's work is on the profiled thread), top functions by own time.

    .venv/bin/python bench/profile_convert.py --profile h100 [--layers 1 --experts 32] [--top 25]

A gpt-oss-shaped synthetic checkpoint (bench/synthetic.py) is written into a temporary folder.
The absolute times are those of a profiled single thread; what matters is the split.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--tmp", type=Path)
    args = parser.parse_args()
    import synthetic

    from mxconvert.convert import execute, make_plan
    from mxconvert.formats import format_of, open_model
    from mxconvert.profiles import get_profile
    from mxconvert.revisions import get_revision
    from mxconvert.selection import Deployment
    from mxconvert.verify import verify_artifact

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        src = Path(tmp) / "src"
        synthetic.write_synthetic(src, args.layers, args.experts)
        ckpt = open_model(str(src))
        revision = get_revision(None, format_of(ckpt).name)
        plan = make_plan(ckpt, get_profile(args.profile), revision, Deployment(), "auto")
        for what, call in (("convert", lambda: execute(plan, Path(tmp) / "out", jobs=1)),
                           ("verify", lambda: verify_artifact(Path(tmp) / "out", jobs=1))):
            prof = cProfile.Profile()
            prof.runcall(call)
            print(f"==== {what} --profile {args.profile}, {args.layers} layer(s) x {args.experts} experts, --jobs 1")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
