"""Gather-plan build time (issue 11, target 1): the plans of the TRITON layouts convert uses for
h100 (Hopper), b200 (Blackwell) and mi355x (CDNA4), one expert at gpt-oss-20b size (H = I = 2880),
one thread, and the Hopper fp4 pack tables; plans are built on numpy positions
(mxconvert/layouts/positions.py) since session 6, on a torch `arange` before.

    python bench/bench_plans.py                      # this checkout
    python bench/bench_plans.py --before /tmp/old    # an older checkout (its own package) beside

Each checkout runs in fresh subprocesses (its own `mxconvert` first on PYTHONPATH, one thread:
OMP/MKL/OPENBLAS_NUM_THREADS=1 and, where torch is loaded, `torch.set_num_threads(1)`), the
checkouts interleaved `--repeat` times. Printed per checkout: `cold`, the median wall time of the
first build of every plan and the tables in a fresh process (what a conversion pays before its
first chunk, imports included: torch before, numpy alone now), whether torch got imported, and
per tensor the best build time of the plan itself (the cached builder's uncached body, warm
process); then the ratios after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Run inside the measured checkout; prints one JSON line.
CHILD = r"""
import json, sys, time
start = time.perf_counter()
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.formats.mxfp4.canonical import canonical_specs
from mxconvert.layouts import resolve_layout
from mxconvert.layouts.engine.plans import _gather_plan
from mxconvert.layouts.triton import _pack_tables
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision

hidden = inter = HIDDEN
rev = get_revision("vllm-0.33")
work = []
for profile_name in ("h100", "b200", "mi355x"):
    profile = get_profile(profile_name)
    hp, ip = rev.round_up(Mxfp4Backend.TRITON, profile.platform, hidden, inter)
    specs = canonical_specs(1, hp, ip)
    for name, tensor in resolve_layout(Mxfp4Backend.TRITON, rev, profile).tensors.items():
        if name in specs:
            work.append((f"{profile_name} {name}", tensor.arrange, tuple(tensor.split.split_shape(specs[name][1])[1:])))
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(1)
for _, arrange, shape in work:
    _gather_plan(arrange, shape)
_pack_tables()
cold = time.perf_counter() - start
torch_loaded = "torch" in sys.modules
if torch_loaded:
    sys.modules["torch"].set_num_threads(1)
warm = {}
for label, arrange, shape in work:
    best = float("inf")
    for _ in range(REPEAT):
        t = time.perf_counter()
        _gather_plan.__wrapped__(arrange, shape)
        best = min(best, time.perf_counter() - t)
    warm[label] = best
best = float("inf")
for _ in range(REPEAT):
    t = time.perf_counter()
    _pack_tables.__wrapped__()
    best = min(best, time.perf_counter() - t)
warm["pack tables"] = best
print(json.dumps({"cold": cold, "torch": torch_loaded, "warm": warm}))
"""


def run_once(root: Path, hidden: int, repeat: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    code = CHILD.replace("HIDDEN", str(hidden)).replace("REPEAT", str(repeat))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"the plan build in {root} failed: {out.stderr.strip()[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="root of an older checkout to measure beside this one")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per checkout (interleaved)")
    parser.add_argument("--builds", type=int, default=3, help="warm builds per plan in each process (best kept)")
    parser.add_argument("--hidden", type=int, default=2880, help="H = I")
    args = parser.parse_args()
    roots = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    runs: dict[str, list[dict]] = {k: [] for k in roots}
    for _ in range(args.repeat):
        for key, root in roots.items():
            runs[key].append(run_once(root, args.hidden, args.builds))
    summary = {}
    for key, results in runs.items():
        warm = {label: min(r["warm"][label] for r in results) for label in results[0]["warm"]}
        summary[key] = {
            "cold": statistics.median(r["cold"] for r in results),
            "torch": any(r["torch"] for r in results),
            "warm": warm,
        }
    labels = list(summary["after"]["warm"])
    header = f"{'':28}" + "".join(f"{k:>12}" for k in summary) + ("       ratio" if "before" in summary else "")
    print(f"H = I = {args.hidden}, 1 expert, one thread; seconds ({args.repeat} processes per checkout)")
    print(header)

    def row(label: str, values: list[float]) -> str:
        line = f"{label:28}" + "".join(f"{v:12.3f}" for v in values)
        if len(values) == 2 and values[1] > 0:
            line += f"{values[0] / values[1]:12.2f}"
        return line

    print(row("cold (fresh process)", [s["cold"] for s in summary.values()]))
    print(f"{'torch imported':28}" + "".join(f"{str(s['torch']):>12}" for s in summary.values()))
    for label in labels:
        print(row(label, [s["warm"][label] for s in summary.values()]))
    print(row("sum of warm builds", [sum(s["warm"].values()) for s in summary.values()]))


if __name__ == "__main__":
    main()
