"""Start-up time of the command line (issue 11, target 6: `--help`, `profiles` and `select` in
<= 0.5 s), against `python -c pass` measured in the same run. The NVFP4 `select` row reads the
checkpoint's global and input scale values (Marlin on a100: a layout with derived tensors);
`convert --dry-run` plans without writing (its `-o` folder is never created).

    python bench/bench_startup.py                      # this checkout
    python bench/bench_startup.py --before /tmp/old    # an older checkout (its own package) beside

Every command is a fresh subprocess run from the root of the checkout it measures (so that
checkout's `mxconvert` is the one imported; PYTHONPATH points there too), repeated `--repeat`
times with the versions and commands interleaved, so a busy machine slows all of them alike.
Printed per command: the median wall time, the median CPU time (user + sys, from `wait4`: less
sensitive to other load on a shared machine than wall time) and the wall ratio to `python -c pass`.

`--bytecode none` (the default, as in session 4): no bytecode is written or read for the checkouts'
modules (PYTHONDONTWRITEBYTECODE=1), so every run compiles every mxconvert module it imports;
site-packages (torch, typer, rich) use their installed bytecode either way. `--bytecode cached`:
bytecode goes to a temporary PYTHONPYCACHEPREFIX (the checkouts stay clean), filled by one untimed
run of each command first, as an installed package runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "mxconvert --version": ["-m", "mxconvert", "--version"],
    "mxconvert --help": ["-m", "mxconvert", "--help"],
    "mxconvert profiles": ["-m", "mxconvert", "profiles"],
    "mxconvert select tiny-gpt-oss -p b200": ["-m", "mxconvert", "select", "examples/tiny-gpt-oss", "-p", "b200"],
    "mxconvert select tiny-gpt-oss -p b200 --json": [
        "-m",
        "mxconvert",
        "select",
        "examples/tiny-gpt-oss",
        "-p",
        "b200",
        "--json",
    ],
    "mxconvert select tiny-nvfp4-modelopt-qwen3 -p a100": [
        "-m",
        "mxconvert",
        "select",
        "examples/tiny-nvfp4-modelopt-qwen3",
        "-p",
        "a100",
    ],
    "mxconvert convert tiny-gpt-oss -p h100 --dry-run": [
        "-m",
        "mxconvert",
        "convert",
        "examples/tiny-gpt-oss",
        "-p",
        "h100",
        "-o",
        "/nonexistent/mxconvert-bench",
        "--dry-run",
    ],
}


def run_once(args: list[str], root: Path, pycache: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `python ARGS` run from `root`; exits on a failure.
    `pycache`: a PYTHONPYCACHEPREFIX for the bytecode (None: none written or read)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{' '.join(args)} (in {root}) exited {code}: {err.strip()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", type=Path, help="root of an older checkout to measure beside this one")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--bytecode",
        choices=("none", "cached"),
        default="none",
        help="none: every run compiles the checkout's modules; cached: as installed (see above)",
    )
    args = parser.parse_args()
    versions = {"after": ROOT} if args.before is None else {"before": args.before.resolve(), "after": ROOT}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mxconvert-bench-pycache-") as prefix:
        pycache = prefix if args.bytecode == "cached" else None
        if pycache is not None:  # fill the bytecode cache (untimed)
            for cmd in COMMANDS.values():
                for root in versions.values():
                    run_once(cmd, root, pycache)
        for _ in range(args.repeat):
            for label, cmd in COMMANDS.items():
                for version, root in versions.items():
                    samples.setdefault((version, label), []).append(run_once(cmd, root, pycache))
    base = statistics.median(w for w, _ in samples[("after", "python -c pass")])
    print(
        f"CLI start-up ({args.bytecode} bytecode for the checkouts' modules), median of {args.repeat} runs; "
        f"baseline `python -c pass` "
        f"(after's interpreter, same run) = {base:.3f} s wall; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    rows = []
    for label in COMMANDS:
        for version in versions:
            walls = [w for w, _ in samples[(version, label)]]
            cpus = [c for _, c in samples[(version, label)]]
            wall = statistics.median(walls)
            row = {
                "version": version,
                "command": label,
                "bytecode": args.bytecode,
                "wall_s": wall,
                "cpu_s": statistics.median(cpus),
                "min_wall_s": min(walls),
                "ratio_to_pass": wall / base,
            }
            rows.append(row)
            print(
                f"  {version:7} {label:40} wall {row['wall_s']:6.3f} s (min {row['min_wall_s']:6.3f})  "
                f"cpu {row['cpu_s']:6.3f} s  {row['ratio_to_pass']:5.1f}x pass"
            )
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
