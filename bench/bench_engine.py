"""End-to-end speed and memory of convert / verify / load against baselines measured in the same run.

    python bench/bench_engine.py --layers 4 --experts 32 --profiles h100,b200,mi355x
    python bench/bench_engine.py --layers 4 --experts 32 --before /tmp/mxconvert-before   # old code beside
    python bench/bench_engine.py --rss --experts 128 --rss-layers 1,4 --profiles h100    # RSS flat in layers
    python bench/bench_engine.py --load --device cuda                                    # load_artifact vs load_file
    python bench/bench_engine.py --repeat 3 --variants default,no-fsync,file-sha256       # durability and digest costs
    python bench/bench_engine.py --layers 24 --real-sizes --profiles h100,b200            # gpt-oss-20b, full size
    python bench/bench_engine.py --layers 36 --experts 128 --real-sizes --disk-budget-gb 40   # 120b: layers that fit

A gpt-oss-shaped synthetic checkpoint (bench/synthetic.py; H = I = 2880) is written once into a
temporary folder. Every timed command runs in a fresh subprocess (so its peak RSS, anonymous plus
file-backed, is its own: the child's VmHWM, not `wait4`'s ru_maxrss, which includes the parent's)
with the page cache warm, and is compared with a
baseline timed in the same run: `cp -r` + `sync` of the same checkpoint for convert, the convert
that made the artifact for verify, safetensors' `load_file` for `load_artifact`. `--before DIR`
runs the same steps with the package found in DIR (a checkout of an older mxconvert) as well.
convert and verify run the command line in the child (`mxconvert._entry.main`, start-up
included, as users run it), so the CLI's dependencies (typer, rich) must be installed.

`--variants` converts each profile several ways, each best of `--repeat`: `default` (what users
run: tree digests, durable writes), `no-fsync` (`MXCONVERT_FAULT=no-fsync`: the cost of durable
writes is default minus this), `no-writeback` (durable, but the flush left to the final fsync:
what starting the writeback early gains or costs), `file-sha256` (`--file-sha256`: the cost
of the whole-file sha256), `buffered` and `direct` (`--write-mode`: the files written through
the page cache or past it, where the default chooses by the cores). verify runs on the default
artifact.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# ---- what the subprocesses run ----------------------------------------------------------------------
def _child(argv: list[str]) -> None:
    try:
        _child_work(argv)
    finally:
        sys.stdout.flush()
        print(f"{_HWM_TAG} {_peak_rss_kib()}", flush=True)


#: Last line a child prints: its own peak RSS. `wait4`'s ru_maxrss is not that: Linux carries the
#: high-water mark of the memory a process had before `exec` into it, i.e. the parent's, so every
#: child of a parent holding a 1.6 GiB synthetic layer in memory reported >= 1.6 GiB.
_HWM_TAG = "BENCH-PEAK-RSS-KIB"


def _peak_rss_kib() -> int:
    """VmHWM of this process's memory map (created at `exec`): its peak RSS, anonymous plus
    file-backed plus shared, nothing inherited."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _child_work(argv: list[str]) -> None:
    what = argv[0]
    if what == "convert":  # the command line, as users run it (its start-up included)
        src, out, profile, jobs = argv[1], argv[2], argv[3], int(argv[4])
        tp = argv[5] if len(argv) > 5 else "1"
        shard = os.environ.get(SHARD_ENV)  # --max-shard-size in bytes (unset: the command's default)
        extra = os.environ.get(EXTRA_ENV, "").split()  # the variant's options (--file-sha256)
        _cli(
            [
                "convert",
                *extra,
                src,
                "-o",
                out,
                "-p",
                profile,
                "--tp",
                tp,
                *(["--jobs", str(jobs)] if jobs else []),
                *(["--max-shard-size", shard] if shard else []),
            ]
        )
    elif what == "verify":
        jobs = int(argv[2])
        _cli(["verify", argv[1], *(["--jobs", str(jobs)] if jobs else [])])
    elif what == "import":
        import mxconvert.cli.main  # noqa: F401
    elif what == "load":
        _load(Path(argv[1]), argv[2], int(argv[3]))
    else:
        raise SystemExit(f"unknown child command {what}")


def _cli(args: list[str]) -> None:
    """Run `mxconvert ARGS` in this process; a failure ends the child with the command's output."""
    from mxconvert._entry import main

    sys.argv = ["mxconvert", *args]
    try:
        main()
    except SystemExit as exc:
        if exc.code:
            raise SystemExit(f"mxconvert {' '.join(args)} failed with exit {exc.code}") from None


def _load(artifact: Path, device: str, repeat: int) -> None:
    """In one process: safetensors' load_file of the rank's files vs load_artifact (checksums on
    and off), best of `repeat`, page cache warm. Prints one JSON line."""
    import torch
    from safetensors.torch import load_file

    import mxconvert

    manifest = json.loads((artifact / "mxconvert.json").read_text())
    files = [artifact / f["file"] for f in manifest["ranks"][0]["files"] + manifest["shared"]["files"]]

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def best(fn):
        times = []
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            result = fn()
            sync()
            times.append(time.perf_counter() - start)
            del result
        return min(times)

    raw = best(lambda: [load_file(str(f), device=device) for f in files])
    checked = best(lambda: mxconvert.load_artifact(artifact, 0, device=device))
    unchecked = best(lambda: mxconvert.load_artifact(artifact, 0, device=device, verify_checksums=False))
    size = sum(f.stat().st_size for f in files)
    print(
        json.dumps({"bytes": size, "load_file": raw, "load_artifact": checked, "load_artifact_no_checksums": unchecked})
    )


# ---- the parent ----------------------------------------------------------------------------------------
def _run(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GiB of the child, stdout)."""
    return _run_timed(cmd, env)[:3]


def _run_timed(cmd: list[str], env: dict | None = None) -> tuple[float, float, str, float]:
    """`_run` plus the child's CPU seconds (user + system, all its threads): the work done, which
    on a shared machine moves far less with the load than the wall time does."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        # run from a neutral folder: `python -c` / `-m` put the working folder first on sys.path
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=tempfile.gettempdir())
        _, status, rusage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text, error = out.read().decode(), err.read().decode()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{error[-3000:]}")
    peak_kib = rusage.ru_maxrss  # an upper bound that includes the parent's (see _HWM_TAG)
    lines = text.rstrip("\n").split("\n")
    if lines and lines[-1].startswith(_HWM_TAG):
        peak_kib, text = int(lines[-1].split()[1]), "\n".join(lines[:-1]) + "\n"
    return wall, peak_kib / (1 << 20), text, rusage.ru_utime + rusage.ru_stime


#: The convert children's --max-shard-size, in bytes (set by the parent's --max-shard-bytes).
SHARD_ENV = "MXCONVERT_BENCH_SHARD_BYTES"
#: Extra convert options of a variant, and the variants: name -> (environment, convert options).
EXTRA_ENV = "MXCONVERT_BENCH_CONVERT_ARGS"
VARIANTS = {
    "default": ({}, ""),
    "no-fsync": ({"MXCONVERT_FAULT": "no-fsync"}, ""),
    "no-writeback": ({"MXCONVERT_FAULT": "no-writeback"}, ""),
    "file-sha256": ({}, "--file-sha256"),
    "buffered": ({}, "--write-mode buffered"),
    "direct": ({}, "--write-mode direct"),
}


def _env(package_root: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(package_root), PYTHONDONTWRITEBYTECODE="1")


def _child_cmd(*args: object) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "_child", *map(str, args)]


def _cp_baseline(src: Path, tmp: Path, repeat: int) -> float:
    """Best wall time of `cp -r` + `sync`. Dirty pages written before (the synthetic checkpoint
    itself, just made) are flushed first, untimed: the `sync` would otherwise write them too
    (a 1-repeat run measured 2.16 s against 1.39 s for the same copy flushed alone)."""
    best = float("inf")
    for _ in range(repeat):
        dst = tmp / "cp-copy"
        subprocess.run(["sync"], check=False)
        wall, _, _ = _run(["sh", "-c", f"cp -r '{src}' '{dst}' && sync"])
        best = min(best, wall)
        shutil.rmtree(dst)
    return best


def _warm(src: Path) -> None:
    for p in src.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass


def _bench_convert(args, src: Path, tmp: Path, versions: dict[str, Path], rows: list[dict]) -> None:
    _warm(src)
    cp = _cp_baseline(src, tmp, args.repeat)
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    print(
        f"checkpoint {args.layers} layers x {args.experts} experts, {size / 1e9:.2f} GB; cp -r + sync: {cp:.2f} s "
        f"({size / cp / 1e9:.2f} GB/s); {os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} available"
    )
    rows.append({"baseline": "cp -r + sync", "layers": args.layers, "experts": args.experts, "bytes": size, "cp_s": cp})
    print(
        f"{'version':8} {'profile':8} {'variant':11} {'jobs':>4} {'convert s':>9} {'x cp':>6} {'GB/s':>5} "
        f"{'RSS GiB':>7} {'verify s':>8} {'/conv':>6} {'RSS GiB':>7} {'cpu conv':>8} {'cpu ver':>8}"
    )
    variants = args.variants.split(",")
    for profile in args.profiles.split(","):
        for version, root in versions.items():
            for jobs in args.jobs:
                if version == "before" and jobs:
                    jobs = 0  # the old code has no --jobs
                for variant in variants if version == "after" else ["default"]:
                    env_extra, options = VARIANTS[variant]
                    env = {**_env(root), **env_extra, EXTRA_ENV: options}
                    out = tmp / f"out-{version}-{profile}-{jobs}-{variant}"
                    best = (float("inf"), 0.0, 0.0)
                    for _ in range(args.repeat):
                        shutil.rmtree(out, ignore_errors=True)
                        subprocess.run(["sync"], check=False)  # the previous run's dirty pages, untimed
                        wall, rss, _, cpu = _run_timed(_child_cmd("convert", src, out, profile, jobs, args.tp), env)
                        best = min(best, (wall, rss, cpu))
                    vbest = (float("inf"), 0.0, 0.0)
                    if not args.no_verify and variant == "default":
                        for _ in range(args.repeat):
                            wall, rss, _, cpu = _run_timed(_child_cmd("verify", out, jobs), _env(root))
                            vbest = min(vbest, (wall, rss, cpu))
                    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
                    shutil.rmtree(out, ignore_errors=True)
                    row = {
                        "version": version,
                        "profile": profile,
                        "variant": variant,
                        "jobs": jobs or "default",
                        "layers": args.layers,
                        "experts": args.experts,
                        "bytes": size,
                        "written_bytes": written,
                        "cp_s": cp,
                        "convert_s": best[0],
                        "convert_x_cp": best[0] / cp,
                        "convert_gb_s": written / best[0] / 1e9,
                        "convert_rss_gib": best[1],
                        "verify_s": vbest[0] if vbest[0] != float("inf") else None,
                        "verify_x_convert": vbest[0] / best[0] if vbest[0] != float("inf") else None,
                        "verify_rss_gib": vbest[1] if vbest[0] != float("inf") else None,
                        "convert_cpu_s": best[2],
                        "verify_cpu_s": vbest[2] if vbest[0] != float("inf") else None,
                    }
                    rows.append(row)
                    verify = (
                        f"{vbest[0]:8.2f} {vbest[0] / best[0]:6.2f} {vbest[1]:7.2f}"
                        if row["verify_s"] is not None
                        else f"{'-':>8} {'-':>6} {'-':>7}"
                    )
                    print(
                        f"{version:8} {profile:8} {variant:11} {str(row['jobs']):>4} {best[0]:9.2f} "
                        f"{best[0] / cp:6.2f} {row['convert_gb_s']:5.2f} {best[1]:7.2f} {verify} {best[2]:8.2f} "
                        f"{vbest[2] if row['verify_s'] is not None else 0.0:8.2f}",
                        flush=True,
                    )
                    if args.json_out:  # what was measured so far survives a run cut short
                        args.json_out.write_text(json.dumps(rows, indent=1))
                if version == "before":
                    break


def layers_that_fit(budget_gb: float, experts: int, layers: int, real_sizes: bool) -> int:
    """The most layers (up to `layers`) whose checkpoint and artifact fit in `budget_gb` at once
    (the `cp` copy is removed before convert runs), the non-expert tensors counted too."""
    from synthetic import layer_bytes

    per_layer = 2 * layer_bytes(experts) + (2 * 53_000_000 if real_sizes else 0)  # source + artifact
    fixed = 2 * (2 * 201088 * 2880 * 2 if real_sizes else 0)
    return max(1, min(layers, int((budget_gb * 1e9 - fixed) // per_layer)))


def _bench_rss(args, tmp: Path, versions: dict[str, Path], rows: list[dict]) -> None:
    from synthetic import write_synthetic

    layers = [int(n) for n in args.rss_layers.split(",")]
    print(f"peak RSS (GiB), {args.experts} experts, H = I = 2880, layers {layers}")
    for n in layers:
        src = write_synthetic(tmp / f"rss-{n}", n, args.experts)
        _warm(src)
        for profile in args.profiles.split(","):
            for version, root in versions.items():
                out = tmp / f"rss-out-{n}-{version}"
                shutil.rmtree(out, ignore_errors=True)
                jobs = 0 if version == "before" else (args.jobs[0] or 0)
                cw, crss, _ = _run(_child_cmd("convert", src, out, profile, jobs), _env(root))
                vw, vrss, _ = _run(_child_cmd("verify", out, jobs), _env(root))
                shutil.rmtree(out)
                rows.append(
                    {
                        "rss": True,
                        "version": version,
                        "profile": profile,
                        "layers": n,
                        "experts": args.experts,
                        "convert_s": cw,
                        "convert_rss_gib": crss,
                        "verify_s": vw,
                        "verify_rss_gib": vrss,
                    }
                )
                print(
                    f"  {version:8} {profile:8} layers {n}: convert {cw:6.2f} s {crss:5.2f} GiB; "
                    f"verify {vw:6.2f} s {vrss:5.2f} GiB",
                    flush=True,
                )
        shutil.rmtree(src)


def _bench_imports(versions: dict[str, Path], rows: list[dict], repeat: int) -> None:
    for version, root in versions.items():
        cmds = {
            "import mxconvert.cli.main": [sys.executable, "-c", "import mxconvert.cli.main"],
            "mxconvert --help": [sys.executable, "-m", "mxconvert", "--help"],
            "mxconvert profiles": [sys.executable, "-m", "mxconvert", "profiles"],
            "mxconvert select": [
                sys.executable,
                "-m",
                "mxconvert",
                "select",
                str(ROOT / "examples" / "tiny-gpt-oss"),
                "--profile",
                "b200",
            ],
        }
        for label, cmd in cmds.items():
            try:
                wall = min(_run(cmd, _env(root))[0] for _ in range(repeat))
            except SystemExit as exc:
                print(f"  {version}: {label}: skipped ({str(exc).splitlines()[-1][:80]})")
                continue
            rows.append({"version": version, "startup": label, "s": wall})
            print(f"  {version:8} {label:22} {wall:6.2f} s", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--profiles", default="h100,b200,mi355x")
    parser.add_argument("--jobs", default="0", help="comma list of --jobs values; 0 = default (all cores)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument(
        "--max-shard-bytes",
        type=int,
        default=0,
        help="convert's --max-shard-size in bytes (default: each version's default)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--before", type=Path, help="folder holding an older mxconvert package to run beside")
    parser.add_argument("--no-convert", action="store_true")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--rss", action="store_true", help="peak RSS for --rss-layers layer counts")
    parser.add_argument("--rss-layers", default="1,4")
    parser.add_argument("--imports", action="store_true", help="start-up time of the CLI")
    parser.add_argument("--load", action="store_true", help="load_artifact vs safetensors load_file")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tmp", type=Path, help="where the synthetic checkpoint goes (default: a temp folder)")
    parser.add_argument("--variants", default="default", help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--real-sizes", action="store_true", help="gpt-oss's vocabulary and attention tensors too")
    parser.add_argument(
        "--disk-budget-gb", type=float, default=0.0, help="fewer --layers where checkpoint + artifact exceed it"
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    args.jobs = [int(j) for j in args.jobs.split(",")]
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if args.max_shard_bytes:
        os.environ[SHARD_ENV] = str(args.max_shard_bytes)  # the children inherit it
        print(f"convert --max-shard-size {args.max_shard_bytes} bytes")
    versions = {"after": ROOT}
    if args.before:
        versions = {"before": args.before.resolve(), "after": ROOT}
    rows: list[dict] = []
    sys.path.insert(0, str(HERE))
    from synthetic import write_synthetic

    if args.disk_budget_gb:
        fit = layers_that_fit(args.disk_budget_gb, args.experts, args.layers, args.real_sizes)
        print(f"--disk-budget-gb {args.disk_budget_gb}: {fit} of {args.layers} layers fit")
        args.layers = fit

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp_name:
        tmp = Path(tmp_name)
        if args.imports:
            _bench_imports(versions, rows, max(3, args.repeat))
        if not args.no_convert or args.load:
            src = write_synthetic(tmp / "src", args.layers, args.experts, real_sizes=args.real_sizes)
            if not args.no_convert:
                _bench_convert(args, src, tmp, versions, rows)
            if args.load:
                for version, root in versions.items():
                    out = tmp / f"load-{version}"
                    _run(_child_cmd("convert", src, out, args.profiles.split(",")[0], 0), _env(root))
                    _run(_child_cmd("load", out, args.device, 1), _env(root))  # warm
                    _, _, text = _run(_child_cmd("load", out, args.device, 5), _env(root))
                    result = json.loads(text.strip().splitlines()[-1])
                    rows.append({"version": version, "load": True, "device": args.device, **result})
                    print(
                        f"  {version:8} load ({args.device}, {result['bytes'] / 1e6:.0f} MB): load_file "
                        f"{result['load_file']:.3f} s, load_artifact {result['load_artifact']:.3f} s "
                        f"({result['load_artifact'] / result['load_file']:.2f}x), without checksums "
                        f"{result['load_artifact_no_checksums']:.3f} s",
                        flush=True,
                    )
                    shutil.rmtree(out)
            shutil.rmtree(src)
        if args.rss:
            _bench_rss(args, tmp, versions, rows)
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
