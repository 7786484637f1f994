"""Scale run (issue #11 targets 7 and 8): a gpt-oss-120b-shaped checkpoint, convert on the CPU and on CUDA.

    python3 bench/bench_scale.py --layers 12 --experts 128 --profiles h100,b200 --tps 1,4 \
        --devices cpu,cuda --tmp /tmp --json-out scale.json

A synthetic checkpoint (bench/synthetic.py: 128 experts, H = I = 2880, about 1.7 GB a layer) is
written once (reused when --tmp already holds one of that shape), read once to warm the page cache,
and copied with `cp -r` + `sync` as the baseline. Each (profile, TP, device) conversion then runs in
a fresh subprocess (its peak RSS, anonymous plus file-backed: the child's own VmHWM); the figures
are the checkpoint's bytes over the wall time, and the full model's time extrapolated from the
layers run (36 layers for gpt-oss-120b): the start-up (imports, plan, device initialisation; timed
on its own) once, plus the rest of the run scaled by 36 / layers. The CPU and CUDA artifacts of
one target must hold the same bytes: their manifests' file digests are compared. One row is
printed (and the JSON rewritten) as each run ends, so a run cut short by a time limit keeps what
it measured. Only mxconvert's Python API is used.
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

from bench_engine import _HWM_TAG, _peak_rss_kib, _run_timed  # the child timer and its peak-RSS line

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FULL_MODEL_LAYERS = 36


def _child(argv: list[str]) -> None:
    try:
        _child_work(argv)
    finally:
        print(f"{_HWM_TAG} {_peak_rss_kib()}", flush=True)


def _child_work(argv: list[str]) -> None:
    src, out, profile, tp, device, jobs = argv[0], Path(argv[1]), argv[2], int(argv[3]), argv[4], int(argv[5])
    sys.path.insert(0, str(ROOT))
    from mxconvert.formats.registry import format_of, open_model
    from mxconvert.pipeline.convert import execute
    from mxconvert.pipeline.plan import make_plan
    from mxconvert.selection import Deployment
    from mxconvert.target.profiles import get_profile
    from mxconvert.target.revisions import get_revision

    if device == "cpu-portable":  # the device path on the host (to try this script without a GPU)
        import torch

        from mxconvert.layouts.device import Compute

        device = Compute(torch.device("cpu"))
    ckpt = open_model(src)
    plan = make_plan(ckpt, get_profile(profile), get_revision(None, format_of(ckpt).name), Deployment(tp=tp), "auto")
    if str(out) == "-":  # start-up only: imports, plan, the device's initialisation
        from mxconvert.layouts.device import compute_for

        compute = compute_for(device)
        if not compute.on_host:  # a CUDA device (the host needs no initialisation, nor torch)
            import torch

            torch.ones(1, device=compute.device).cpu()  # type: ignore[union-attr]
        return
    execute(plan, out, device=device, **({"jobs": jobs} if jobs else {}))
    print(plan.selection.backend.value)


def _run(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GiB of the child, stdout): bench_engine's child timer, with this
    checkout's package first on the child's path."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    return _run_timed(cmd, env)[:3]


def _source(tmp: Path, layers: int, experts: int) -> tuple[Path, float]:
    """The synthetic checkpoint (reused if present with this shape) and the seconds spent writing it."""
    from synthetic import write_synthetic

    src = tmp / f"scale-src-{layers}x{experts}"
    config = src / "config.json"
    if config.is_file():
        cfg = json.loads(config.read_text())
        if (cfg.get("num_hidden_layers"), cfg.get("num_local_experts")) == (layers, experts):
            return src, 0.0
    shutil.rmtree(src, ignore_errors=True)
    start = time.perf_counter()
    write_synthetic(src, layers, experts)
    subprocess.run(["sync"], check=False)
    return src, time.perf_counter() - start


def _warm(src: Path) -> float:
    start = time.perf_counter()
    for p in sorted(src.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass
    return time.perf_counter() - start


def _digests(out: Path) -> dict[str, str]:
    manifest = json.loads((out / "mxconvert.json").read_text())
    files = [f for r in manifest["ranks"] for f in r["files"]] + manifest["shared"]["files"]
    return {f["file"]: f["sha256"] for f in files}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--profiles", default="h100,b200")
    parser.add_argument("--tps", default="1,4")
    parser.add_argument("--devices", default="cpu,cuda")
    parser.add_argument("--jobs", type=int, default=0, help="0: the cores available")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep-source", action="store_true", help="leave the checkpoint in --tmp for a later run")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        if args.json_out:
            args.json_out.write_text(json.dumps(rows, indent=1))

    src, write_s = _source(args.tmp, args.layers, args.experts)
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    warm_s = _warm(src)
    dst = args.tmp / "scale-cp-copy"
    shutil.rmtree(dst, ignore_errors=True)
    cp, cp_rss, _ = _run(["sh", "-c", f"cp -r '{src}' '{dst}' && sync"])
    shutil.rmtree(dst)
    emit(
        {
            "baseline": "cp -r + sync",
            "layers": args.layers,
            "experts": args.experts,
            "bytes": size,
            "s": cp,
            "gb_s": size / cp / 1e9,
            "write_synthetic_s": write_s,
            "warm_read_s": warm_s,
            "cpus": os.cpu_count(),
            "cpus_available": len(os.sched_getaffinity(0)),
        }
    )
    print(
        f"checkpoint {args.layers} layers x {args.experts} experts, {size / 1e9:.2f} GB (written in {write_s:.1f} s, "
        f"read warm in {warm_s:.1f} s); cp -r + sync {cp:.2f} s ({size / cp / 1e9:.2f} GB/s); "
        f"{len(os.sched_getaffinity(0))} cores",
        flush=True,
    )
    startup = {}
    for device in args.devices.split(","):  # what every run pays once, whatever its layer count
        startup[device] = min(
            _run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "_child",
                    str(src),
                    "-",
                    args.profiles.split(",")[0],
                    "1",
                    device,
                    "0",
                ]
            )[0]
            for _ in range(1)
        )
        emit({"startup": device, "s": startup[device]})
    print("start-up (import, plan, device init): " + ", ".join(f"{d} {s:.2f} s" for d, s in startup.items()))
    print(
        f"{'profile':8} {'tp':>2} {'device':8} {'backend':30} {'convert s':>9} {'GB/s':>6} {'x cp':>5} "
        f"{'RSS GiB':>7} {'36 layers s':>11} same bytes as cpu",
        flush=True,
    )
    for tp in (int(t) for t in args.tps.split(",")):  # TP=1 of every profile first: the main figures
        for profile in args.profiles.split(","):
            reference: dict[str, str] | None = None
            for device in args.devices.split(","):
                out = args.tmp / f"scale-out-{profile}-tp{tp}-{device}"
                shutil.rmtree(out, ignore_errors=True)
                cmd = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "_child",
                    str(src),
                    str(out),
                    profile,
                    str(tp),
                    device,
                    str(args.jobs),
                ]
                wall, rss, text = _run(cmd)
                digests = _digests(out)
                shutil.rmtree(out)
                same = None if reference is None else digests == reference
                reference = reference or digests
                row = {
                    "profile": profile,
                    "tp": tp,
                    "device": device,
                    "backend": text.strip().splitlines()[-1],
                    "layers": args.layers,
                    "experts": args.experts,
                    "bytes": size,
                    "convert_s": wall,
                    "gb_s": size / wall / 1e9,
                    "x_cp": wall / cp,
                    "peak_rss_gib": rss,
                    "full_model_s": startup[device] + (wall - startup[device]) * FULL_MODEL_LAYERS / args.layers,
                    "same_bytes_as_first_device": same,
                    "files": len(digests),
                }
                emit(row)
                print(
                    f"{profile:8} {tp:2} {device:8} {row['backend']:30} {wall:9.2f} {row['gb_s']:6.2f} "
                    f"{row['x_cp']:5.2f} {rss:7.2f} {row['full_model_s']:11.1f} "
                    f"{'-' if same is None else same}",
                    flush=True,
                )
    if not args.keep_source:
        shutil.rmtree(src)
    if any(r.get("same_bytes_as_first_device") is False for r in rows):
        raise SystemExit("the devices wrote different bytes")


if __name__ == "__main__":
    main()
