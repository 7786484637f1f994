#!/usr/bin/env python3
"""Peak host memory of loading one MoE layer into vLLM 0.33.0 (CPU): vLLM's normal path (checkpoint ->
checkpoint-shaped parameters -> vLLM's conversion) versus the mxconvert plugin (artifact -> kernel-format
tensors; the checkpoint-shaped parameters are never filled). MXFP4: a GPT-OSS layer; NVFP4: a Qwen3-MoE
layer of a ModelOpt and of a compressed-tensors checkpoint (examples/make_tiny_nvfp4_moe.py).

Run with the vLLM environment:  .venv-vllm/bin/python bench/bench_vllm_plugin_memory.py [CASE ...]
Each path runs in its own fresh process; the number is the process's peak RSS while the layer is
built and loaded (VmHWM, reset through /proc/self/clear_refs just before) minus its RSS at that
moment (after imports and vLLM's config). Same layer size, same
machine, same script: only the ratio means something. Stand-ins: tests_vllm/harness.py and
harness_nvfp4.py (the CUDA-only ops of vLLM's conversion are CPU references, path A only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(layers=1, experts=16, hidden=2048, intermediate=2048)  # ~100 MiB of MXFP4 experts (generator RAM-bound)
#: NVFP4: the same expert count and sizes (E2M1 codes, one E4M3 scale per 16 values: ~106 MiB per layer)
NVFP4_SHAPE = dict(num_layers=1, num_experts=16, hidden_size=2048, moe_intermediate_size=2048, vocab_size=512)
#: case -> (checkpoint format, backend vLLM's oracle picks, profile, capability, extra convert args)
CASES = {
    "TRITON-hopper": ("mxfp4", "TRITON", "h100", (9, 0), ()),
    "TRTLLM_BF16": ("mxfp4", "FLASHINFER_TRTLLM_MXFP4_BF16", "b200", (10, 0), ()),
    "NVFP4-modelopt-TRTLLM": ("modelopt", "FLASHINFER_TRTLLM", "b200", (10, 0), ()),
    "NVFP4-ct-FI_CUTLASS": (
        "compressed-tensors",
        "FLASHINFER_CUTLASS",
        "b200",
        (10, 0),
        ("--backend", "flashinfer_cutlass"),
    ),
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Linux: restart the process's peak-RSS count (VmHWM) from its current RSS, so the peak of the
    measured span is not an earlier high-water mark (vLLM's imports and config parsing peak higher
    than an NVFP4 layer and free it again)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def child(path: str, case: str, ckpt: str, art: str) -> None:
    sys.path.insert(0, str(REPO / "tests_vllm"))
    import harness as H
    from vllm.utils.import_utils import import_triton_kernels

    import_triton_kernels()
    fmt, backend, _profile, cap, _args = CASES[case]
    if fmt == "mxfp4":
        H.EXAMPLE, H.NUM_LAYERS = Path(ckpt), SHAPE["layers"]
        target = H.Target(backend, cap, 1, 0)
        H.vllm_config()  # imports and config parsing outside the measured span
        paths = (H.path_a, H.path_b)
    else:
        import harness_nvfp4 as N

        N.NUM_LAYERS = NVFP4_SHAPE["num_layers"]
        target = N.Target("ct" if fmt == "compressed-tensors" else "modelopt", backend, cap, 1, 0, Path(ckpt))
        N.vllm_config(target)
        paths = (N.path_a, N.path_b)
    base = rss_bytes()
    reset_peak()
    model = paths[0](target) if path == "A" else paths[1](target, Path(art))[0]
    peak = peak_bytes()
    print(
        json.dumps(
            {
                "path": path,
                "case": case,
                "peak_over_base_MiB": round((peak - base) / 2**20, 1),
                "held_after_MiB": round((rss_bytes() - base) / 2**20, 1),
            }
        ),
        flush=True,
    )
    del model


def make_checkpoint(fmt: str, out: Path) -> None:
    if fmt == "mxfp4":
        subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / "make_tiny_gpt_oss.py"),
                "--out",
                str(out),
                *[f"--{k}={v}" for k, v in SHAPE.items()],
            ],
            check=True,
            capture_output=True,
        )
        return
    sys.path.insert(0, str(REPO / "examples"))
    from make_tiny_nvfp4_moe import write_tiny_nvfp4_moe

    write_tiny_nvfp4_moe(out, fmt=fmt, **NVFP4_SHAPE)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:])
        return
    cases = sys.argv[1:] or list(CASES)
    tmp = Path(tempfile.mkdtemp(prefix="mxconvert-bench-"))
    made: dict[str, Path] = {}
    for case in cases:
        fmt, _backend, profile, _cap, args = CASES[case]
        if fmt not in made:
            made[fmt] = tmp / f"ckpt-{fmt}"
            make_checkpoint(fmt, made[fmt])
            expert_mib = sum(p.stat().st_size for p in made[fmt].glob("*.safetensors")) / 2**20
            print(
                f"checkpoint {fmt}: {SHAPE if fmt == 'mxfp4' else NVFP4_SHAPE}, {expert_mib:.0f} MiB of safetensors",
                flush=True,
            )
        art = tmp / f"art-{case}"
        subprocess.run(
            [sys.executable, "-m", "mxconvert", "convert", str(made[fmt]), "--profile", profile, *args, "-o", str(art)],
            check=True,
            capture_output=True,
        )
        for path in ("A", "B"):
            subprocess.run([sys.executable, __file__, "child", path, case, str(made[fmt]), str(art)], check=True)


if __name__ == "__main__":
    main()
