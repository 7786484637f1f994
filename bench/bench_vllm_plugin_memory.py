#!/usr/bin/env python3
"""Peak host memory of loading one GPT-OSS MoE layer into vLLM 0.33.0 (CPU): vLLM's normal path
(checkpoint -> checkpoint-shaped parameters -> vLLM's conversion) versus the mxconvert plugin
(artifact -> kernel-format tensors; the checkpoint-shaped parameters are never filled).

Run with the vLLM environment:  .venv-vllm/bin/python bench/bench_vllm_plugin_memory.py
Each path runs in its own fresh process; the number is the process's peak RSS (ru_maxrss) minus
its RSS just before the layer is built (after imports and vLLM's config). Same layer, same
machine, same script: only the ratio means something.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(layers=1, experts=16, hidden=2048, intermediate=2048)  # ~100 MiB of experts (generator RAM-bound)
CASES = {"TRITON-hopper": ("TRITON", "h100", (9, 0)), "TRTLLM_BF16": ("FLASHINFER_TRTLLM_MXFP4_BF16", "b200", (10, 0))}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(path: str, case: str, ckpt: str, art: str) -> None:
    sys.path.insert(0, str(REPO / "tests_vllm"))
    import harness as H
    from vllm.utils.import_utils import import_triton_kernels

    import_triton_kernels()
    H.EXAMPLE, H.NUM_LAYERS = Path(ckpt), SHAPE["layers"]
    backend, _profile, cap = CASES[case]
    target = H.Target(backend, cap, 1, 0)
    H.vllm_config()  # imports and config parsing outside the measured span
    base = rss_bytes()
    model = H.path_a(target) if path == "A" else H.path_b(target, Path(art))[0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"path": path, "case": case, "peak_over_base_MiB": round((peak - base) / 2**20, 1),
                      "held_after_MiB": round((rss_bytes() - base) / 2**20, 1)}))
    del model


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:])
        return
    tmp = Path(tempfile.mkdtemp(prefix="mxconvert-bench-"))
    ckpt = tmp / "ckpt"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_tiny_gpt_oss.py"), "--out", str(ckpt),
                    *[f"--{k}={v}" for k, v in SHAPE.items()]], check=True, capture_output=True)
    expert_mib = sum(p.stat().st_size for p in ckpt.glob("*.safetensors")) / 2**20
    print(f"checkpoint: {SHAPE}, {expert_mib:.0f} MiB of safetensors")
    for case, (_backend, profile, _cap) in CASES.items():
        art = tmp / f"art-{case}"
        subprocess.run([sys.executable, "-m", "mxconvert", "convert", str(ckpt), "--profile", profile, "-o", str(art)],
                       check=True, capture_output=True)
        for path in ("A", "B"):
            subprocess.run([sys.executable, __file__, "child", path, case, str(ckpt), str(art)], check=True)


if __name__ == "__main__":
    main()
