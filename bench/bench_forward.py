"""Per-tensor forward and inverse time of the layouts of the slow rows of `bench_vs_vllm.py`
(and the convert profiles), one thread, at gpt-oss size (H = I = 2880), in one process: where a
layer's layout time goes, tensor by tensor, and which engine each tensor took.

    .venv/bin/python bench/bench_forward.py [--experts 4] [--repeat 5] [--only TRITON]

Times (`--clock`: wall, or the thread's CPU time) are the best of `--repeat` calls after a
warm-up (the gather plans are built before timing, as convert builds them once). `--engines`
adds the same call forced onto each engine (gather, torch, strided where the move has one).
Compare only runs made in the same session.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxconvert.core.dtypes import torch_dtype  # noqa: E402
from mxconvert.formats.mxfp4.canonical import canonical_specs  # noqa: E402
from mxconvert.layouts import nvfp4_layout, resolve_layout  # noqa: E402
from mxconvert.layouts.engine.plans import gather_plan, prepare  # noqa: E402
from mxconvert.target.backends import Mxfp4Backend as B  # noqa: E402
from mxconvert.target.backends import Nvfp4Backend as N  # noqa: E402
from mxconvert.target.profiles import get_profile  # noqa: E402
from mxconvert.target.revisions import get_revision  # noqa: E402

MXFP4 = [
    ("TRITON Hopper (h100)", B.TRITON, "h100"),
    ("TRITON Blackwell (b200)", B.TRITON, "b200"),
    ("TRITON CDNA4 (mi355x)", B.TRITON, "mi355x"),
    ("TRTLLM_MXFP4_BF16 (b200)", B.FLASHINFER_TRTLLM_MXFP4_BF16, "b200"),
    ("AITER_MXFP4_BF16 CK (mi355x)", B.AITER_MXFP4_BF16, "mi355x-aiter"),
]
NVFP4 = [
    ("NVFP4 FLASHINFER_TRTLLM", N.FLASHINFER_TRTLLM),
    ("NVFP4 FLASHINFER_CUTLASS", N.FLASHINFER_CUTLASS),
    ("NVFP4 VLLM_CUTLASS", N.VLLM_CUTLASS),
    ("NVFP4 FLASHINFER_CUTEDSL", N.FLASHINFER_CUTEDSL),
]


CLOCK = time.perf_counter


def _best(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = CLOCK()
        fn()
        best = min(best, CLOCK() - start)
    return best


def _random(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    if dtype == torch.float8_e4m3fn:
        return torch.randint(0x30, 0x40, shape, dtype=torch.uint8, generator=g).view(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def targets(experts: int, hidden: int, inter: int):
    """(label, layout, {name: (dtype, shape)}) of every row."""
    rev = get_revision("vllm-0.33")
    for label, backend, profile_name in MXFP4:
        profile = get_profile(profile_name)
        hp, ip = rev.round_up(backend, profile.platform, hidden, inter)
        yield label, resolve_layout(backend, rev, profile), canonical_specs(experts, hp, ip)
    rev4 = get_revision("vllm-0.33", "nvfp4")
    specs4 = {
        "w13_weight": (torch.uint8, (experts, 2 * inter, hidden // 2)),
        "w13_weight_scale": (torch.float8_e4m3fn, (experts, 2 * inter, hidden // 16)),
        "w2_weight": (torch.uint8, (experts, hidden, inter // 2)),
        "w2_weight_scale": (torch.float8_e4m3fn, (experts, hidden, inter // 16)),
    }
    for label, backend in NVFP4:
        yield label, nvfp4_layout(backend, rev4, hidden, inter, experts), specs4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated substrings of the labels to run")
    parser.add_argument("--engines", action="store_true", help="also time engine='gather' and 'torch'")
    parser.add_argument("--no-inverse", action="store_true")
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="thread: this thread's CPU time (every call runs on it alone), which a loaded "
        "machine's other processes move far less than the wall time",
    )
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    grand_fwd = grand_inv = 0.0
    for label, layout, specs in targets(args.experts, args.hidden, args.intermediate):
        if args.only and not any(s.strip() and s.strip() in label for s in args.only.split(",")):
            continue
        print(f"== {label}", flush=True)
        row_fwd = row_inv = 0.0
        for name, t in layout.tensors.items():
            if name not in specs:
                continue
            dtype, shape = torch_dtype(specs[name][0]), specs[name][1]
            x = _random(dtype, shape, g)
            prepare(t, shape, dtype)
            meta = t.split.split(torch.empty(shape, dtype=dtype, device="meta"))
            plan = gather_plan(t, tuple(meta.shape[1:]))
            mb = x.numel() * x.element_size() / 1e6
            fwd = _best(lambda t=t, x=x: t.forward(x), args.repeat)
            row_fwd += fwd
            engine = getattr(plan, "engine", "gather" if plan.fine_grained else "arrange")
            line = f"  {name:18} {mb:7.1f} MB  run {plan.mean_run:9.1f}  {engine:8} fwd {fwd * 1e3:8.2f} ms"
            if args.engines:
                others = ["gather", "torch"] + (["strided"] if getattr(plan, "strided", None) else [])
                times = {e: _best(lambda t=t, x=x, e=e: t.forward(x, engine=e), args.repeat) for e in others}
                line += "  (" + ", ".join(f"{e} {v * 1e3:8.2f}" for e, v in times.items()) + ")"
            if not args.no_inverse:
                y = t.forward(x)
                inv = _best(lambda t=t, y=y, shape=shape, dtype=dtype: t.inverse(y, shape, dtype), args.repeat)
                row_inv += inv
                line += f"  inv {inv * 1e3:8.2f} ms"
            print(line, flush=True)
        grand_fwd += row_fwd
        grand_inv += row_inv
        print(f"  {'total':18} fwd {row_fwd * 1e3:8.2f} ms  inv {row_inv * 1e3:8.2f} ms", flush=True)
    print(f"all rows: fwd {grand_fwd:.3f} s  inv {grand_inv:.3f} s")


if __name__ == "__main__":
    main()
