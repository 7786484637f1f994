"""Run the command line over a matrix of targets and keep everything it writes, so that two
versions of the package can be compared byte for byte (docs/architecture.md, "Changing the tree").

Every example checkpoint x every built-in profile x every runtime revision x (TP 1, TP 2, EP 2):
`convert` (the artifact, stdout, stderr and exit code), then `verify` and `inspect` of what it
wrote; plus `select`, `profiles`, `backends` and `inspect` of each checkpoint, text and `--json`.

Usage: python tools/restructure/matrix.py OUT [--python PY] [--jobs N] [--examples DIR]
The artifacts land in OUT/run/... with the same absolute paths on each run, so a run of the old
tree and one of the new tree, each moved aside after it finishes, compare with `diff -r`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REVISIONS = ["vllm-0.33", "vllm-0.20", "vllm-0.15"]
PARALLEL = [("tp1", ["--tp", "1"]), ("tp2", ["--tp", "2"]), ("ep2", ["--ep", "2"])]


def run(py: str, args: list[str], where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(COLUMNS="200", NO_COLOR="1", PYTHONHASHSEED="0")
    proc = subprocess.run([py, "-m", "mxconvert", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    (where / "stdout").write_text(proc.stdout)
    (where / "stderr").write_text(proc.stderr)
    (where / "rc").write_text(f"{proc.returncode}\n")


def target(py: str, out: Path, example: Path, profile: str, revision: str, par: str, par_args: list[str]) -> None:
    name = f"{example.name}/{profile}/{revision}/{par}"
    art = out / "art" / name
    run(
        py,
        ["convert", str(example), "--profile", profile, "--runtime", revision, *par_args, "-o", str(art), "--json"],
        out / "log" / name / "convert",
    )
    if art.exists():
        run(py, ["verify", str(art), "--json"], out / "log" / name / "verify")
        run(py, ["inspect", str(art), "--json"], out / "log" / name / "inspect")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--examples",
        type=Path,
        default=ROOT / "examples",
        help="the checkpoints (give both runs the same folder: paths are recorded)",
    )
    args = parser.parse_args()
    out: Path = args.out.resolve()
    py = args.python
    profiles = [
        p["name"]
        for p in json.loads(
            subprocess.run(
                [py, "-m", "mxconvert", "profiles", "--json"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout
        )["profiles"]  # a list before `profiles --json` became a document with its schema name
    ]
    jobs = []
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for cmd in (["profiles"], ["profiles", "--json"], ["backends"], ["backends", "--json"]):
            jobs.append(pool.submit(run, py, cmd, out / "log" / "-".join(c.strip("-") for c in cmd)))
        for example in sorted(p for p in args.examples.resolve().iterdir() if p.is_dir()):
            for fmt in ("", "--json"):
                jobs.append(
                    pool.submit(
                        run,
                        py,
                        ["inspect", str(example), *([fmt] if fmt else [])],
                        out / "log" / example.name / f"inspect{fmt}",
                    )
                )
            for profile in profiles:
                for revision in REVISIONS:
                    jobs.append(
                        pool.submit(
                            run,
                            py,
                            ["select", str(example), "--profile", profile, "--runtime", revision, "--json"],
                            out / "log" / example.name / profile / revision / "select",
                        )
                    )
                    jobs.append(
                        pool.submit(
                            run,
                            py,
                            ["select", str(example), "--profile", profile, "--runtime", revision],
                            out / "log" / example.name / profile / revision / "select-text",
                        )
                    )
                    for par, par_args in PARALLEL:
                        jobs.append(pool.submit(target, py, out, example, profile, revision, par, par_args))
        for job in jobs:
            job.result()
    print(f"{len(jobs)} jobs; outputs under {out}")


if __name__ == "__main__":
    main()
