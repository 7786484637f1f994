#!/usr/bin/env python3
"""The SGLang loader's install of an artifact's MoE layers, without SGLang: the digests checked first
and each tensor read when the install asks (`prepare(layers)`, the installer alone: "sync") against
the loader's load path (`prepare(layers, overlapped=True)` ... `finish()`: the digests computed beside
the reads, the tensors read ahead, `prefetch_bytes` default: "overlapped"; and `prefetch_bytes` 0:
"overlapped-no-read-ahead").

    python bench/bench_sglang_load.py [--layers 4] [--experts 32] [--reps 3] [--work DIR]

Makes a gpt-oss-shaped synthetic checkpoint (bench/synthetic.py: H = I = 2880), converts it with
`mxconvert convert --runtime sglang==0.5.23 --profile b200` (FLASHINFER_TRTLLM_MXFP4_MXFP8), then per
mode, best of `--reps` after one warm-up run (page cache warm), times `prepare` through `finish` on
stand-in layers holding the parameters SGLang 0.5.23's `Mxfp4MoEMethod.create_weights` allocates (the
padded sizes the sealed target records), installed on CPU by `postprocess` (install.py's TRT-LLM
install: the same code the GPU runs, only the device differs). SGLang's own reads of `shared/` and
its other modules' post-processing are not in the figure. Scratch goes under `--work` (default: a
temporary folder under /tmp), deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from synthetic import write_synthetic  # noqa: E402 - bench/synthetic.py, by path

from mxconvert.core.parallel import default_jobs  # noqa: E402
from mxconvert.runtimes.common.load_overlap import PREFETCH_BYTES  # noqa: E402
from mxconvert.runtimes.sglang.checks import LiveSglang, SglangLayer  # noqa: E402
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller  # noqa: E402

LIVE = LiveSglang("0.5.23", "cuda", [10, 0], "0.7.2")  # the B200 scheduler process the artifact is for
#: mode -> (overlapped, prefetch_bytes)
MODES = {"sync": (False, 0), "overlapped": (True, PREFETCH_BYTES), "overlapped-no-read-ahead": (True, 0)}


def stand_in_layers(artifact: Path) -> list[tuple[str, torch.nn.Module, SglangLayer]]:
    """One module per MoE layer of the artifact, with the checkpoint-shaped parameters SGLang allocates."""
    manifest = json.loads((artifact / "mxconvert.json").read_text())
    target, config = manifest["target"], json.loads((artifact / "config.json").read_text())
    experts, hp, ip = config["num_local_experts"], target["hidden_size_padded"], target["intermediate_size_padded"]
    allocated = {
        "w13_weight": ((experts, 2 * ip, hp // 2), torch.uint8),
        "w13_weight_scale": ((experts, 2 * ip, hp // 32), torch.uint8),
        "w13_weight_bias": ((experts, 2 * ip), torch.bfloat16),
        "w2_weight": ((experts, hp, ip // 2), torch.uint8),
        "w2_weight_scale": ((experts, hp, ip // 32), torch.uint8),
        "w2_weight_bias": ((experts, hp), torch.bfloat16),
    }
    out = []
    for layer_id in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer_id}.mlp.experts"
        module = torch.nn.Module()
        for name, (shape, dtype) in allocated.items():
            module.register_parameter(name, torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False))
        module.num_local_experts = experts
        runner = argparse.Namespace(gemm1_alpha=None, gemm1_clamp_limit=None)  # SGLang's defaults apply
        object.__setattr__(module, "moe_runner_config", runner)  # a plain attribute, as FusedMoE holds it
        live = SglangLayer(prefix, target["backend"], hp, ip, 1, 1, 0, experts)
        out.append((prefix, module, live))
    return out


def load_once(artifact: Path, overlapped: bool, prefetch_bytes: int) -> float:
    """Seconds from `prepare` to `finish` (both included) for every MoE layer."""
    installer = SglangArtifactInstaller(artifact, prefetch_bytes=prefetch_bytes)
    installer.check_runtime(LIVE)
    layers = stand_in_layers(artifact)
    started = time.perf_counter()
    installer.prepare(layers, overlapped)
    for _, module, _ in layers:
        installer.postprocess(module, method=None)
    installer.finish()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (created, then deleted)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sglang-load-", dir=args.work))
    try:
        checkpoint, artifact = work / "ckpt", work / "art"
        write_synthetic(checkpoint, args.layers, args.experts, 2880, 2880)
        convert = [sys.executable, "-m", "mxconvert", "convert", str(checkpoint), "--runtime", "sglang==0.5.23"]
        subprocess.run([*convert, "--profile", "b200", "--out", str(artifact)], check=True, capture_output=True)
        shutil.rmtree(checkpoint)
        size = sum(f.stat().st_size for f in artifact.rglob("*.safetensors"))
        print(f"artifact: {args.layers} layers x {args.experts} experts, {size / 1e9:.2f} GB, {default_jobs()} cores")
        best = {}
        for mode, (overlapped, prefetch_bytes) in MODES.items():
            load_once(artifact, overlapped, prefetch_bytes)  # warm-up: page cache, allocator
            runs = [load_once(artifact, overlapped, prefetch_bytes) for _ in range(args.reps)]
            best[mode] = min(runs)
            print(f"{mode:26s} best {best[mode]:.2f} s  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
        print(f"overlapped / sync: {best['overlapped'] / best['sync']:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
