"""Layout throughput at gpt-oss size (H = I = 2880), per backend: forward (canonical -> kernel
bytes) and inverse (kernel bytes -> canonical, with the padding check), in GB/s of canonical
bytes, single process, CPU. Also the end-to-end `convert` of a synthetic checkpoint.

    .venv/bin/python bench/bench_layouts.py [--experts 8] [--repeat 3] [--convert]

Numbers depend on the machine; compare only runs made on the same machine in the same session.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from mxconvert.core.dtypes import torch_dtype
from mxconvert.formats.mxfp4.canonical import canonical_specs
from mxconvert.layouts import resolve_layout
from mxconvert.target.backends import Mxfp4Backend as B
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision

TARGETS = [
    (B.FLASHINFER_TRTLLM_MXFP4_BF16, "b200", "vllm-0.33", None),
    (B.TRITON, "h100", "vllm-0.33", None),
    (B.TRITON, "h100", "vllm-0.20", None),
    (B.TRITON, "b200", "vllm-0.33", None),
    (B.TRITON, "mi355x", "vllm-0.33", None),
    (B.FLASHINFER_CUTLASS_MXFP4_BF16, "h100", "vllm-0.33", None),
    (B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "b200", "vllm-0.33", None),
    (B.MARLIN, "a100", "vllm-0.33", None),
    (B.MARLIN, "l40s", "vllm-0.33", "fp8"),
    (B.AITER_MXFP4_BF16, "mi355x-aiter", "vllm-0.33", None),
]


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_layouts(experts: int, repeat: int) -> None:
    g = torch.Generator().manual_seed(0)
    print(
        f"{'backend':34} {'target':22} {'fwd arrange':>11} {'fwd auto':>9} {'inverse':>8}   (GB/s of canonical bytes)"
    )
    for backend, profile_name, rev_name, marlin in TARGETS:
        profile, revision = get_profile(profile_name), get_revision(rev_name)
        layout = resolve_layout(backend, revision, profile, marlin_input_dtype=marlin)
        hp, ip = revision.round_up(backend, profile.platform, 2880, 2880)
        fwd_torch = fwd = inv = 0.0
        nbytes = 0
        for name, (dtype_name, shape) in canonical_specs(experts, hp, ip).items():
            dtype = torch_dtype(dtype_name)
            x = (
                torch.randint(0, 250, shape, dtype=torch.uint8, generator=g)
                if dtype == torch.uint8
                else torch.randn(shape, generator=g).to(dtype)
            )
            t = layout.tensors[name]
            y = t.forward(x)
            t.inverse(y, shape, dtype)  # builds and caches the index outside the timing
            fwd_torch += _best(lambda t=t, x=x: t.forward(x, engine="torch"), repeat)
            fwd += _best(lambda t=t, x=x: t.forward(x), repeat)
            inv += _best(lambda t=t, y=y, shape=shape, dtype=dtype: t.inverse(y, shape, dtype), repeat)
            nbytes += x.numel() * x.element_size()
        label = f"{profile_name}/{rev_name}" + (f"/{marlin}" if marlin else "")
        print(
            f"{backend.value:34} {label:22} {nbytes / fwd_torch / 1e9:11.3f} {nbytes / fwd / 1e9:9.3f} "
            f"{nbytes / inv / 1e9:8.3f}"
        )


def bench_convert(experts: int) -> None:
    import importlib.util
    import sys

    from mxconvert.formats.mxfp4.checkpoint import open_checkpoint
    from mxconvert.pipeline.convert import execute
    from mxconvert.pipeline.plan import make_plan
    from mxconvert.selection import Deployment

    path = Path(__file__).resolve().parents[1] / "examples" / "make_tiny_gpt_oss.py"
    spec = importlib.util.spec_from_file_location("make_tiny_gpt_oss", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_tiny_gpt_oss"] = mod
    spec.loader.exec_module(mod)
    with tempfile.TemporaryDirectory() as tmp:
        src = mod.write_tiny_gpt_oss(
            Path(tmp) / "src", num_layers=2, num_experts=experts, hidden_size=2880, intermediate_size=2880, num_shards=2
        )
        ckpt = open_checkpoint(str(src))
        expert_bytes = sum(ckpt.info(n).end - ckpt.info(n).begin for n in ckpt.expert_names())
        for profile in ("h100", "b200"):
            plan = make_plan(ckpt, get_profile(profile), get_revision(None), Deployment(), "auto")
            start = time.perf_counter()
            execute(plan, Path(tmp) / f"out-{profile}")
            took = time.perf_counter() - start
            print(
                f"convert {profile} ({plan.selection.backend.value}): {took:.2f} s for {expert_bytes / 1e6:.0f} MB "
                f"of experts = {expert_bytes / took / 1e9:.2f} GB/s (includes sha256 of source and output)"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--convert", action="store_true", help="also time convert end to end")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    bench_layouts(args.experts, args.repeat)
    if args.convert:
        bench_convert(args.experts)


if __name__ == "__main__":
    main()
