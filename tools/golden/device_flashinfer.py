#!/usr/bin/env python3
"""Run FlashInfer's CUDA-only layout functions on a GPU for the golden data (tools/golden/ only).

Called on the lent GPU machine by `make_mxfp4_goldens.py --prepare-device` / the command it prints;
it can also be run with `--build-only` on a CPU machine that has nvcc, to check that the JIT builds
compile. Inputs: `<in>/fi_inputs.safetensors` with uint8 tensors named

    sm90w.<key>   [E, n, k/2]   -> FlashInfer SM90 mixed-GEMM fp4 weight interleave
    bsi.<key>     [E, M, Ks]    -> flashinfer.block_scale_interleave (the 128x4 swizzle)

Outputs (under --out): one `fi_out_<n>.safetensors` per ~12 MB of results (same names, results as
the functions return them: sm90w same shape, bsi 1-D per call), and `fi_report.json` (versions,
GPU, build times, errors).

What is called:
  * `flashinfer.block_scale_interleave(x)` -- the public API, its JIT module
    `fp4_quantization_90` is built from the wheel by FlashInfer's own JIT (`build_and_load`).
  * SM90 weight interleave: the public `flashinfer.fused_moe.prepare.interleave_moe_weights_for_sm90_mixed_gemm`
    needs the whole `fused_moe_90` module (220 generated CUTLASS files; far beyond one 10-minute
    call). Instead FlashInfer's JIT (`flashinfer.jit.gen_jit_spec(...).build_and_load()`, its sm90a
    nvcc flags) builds the wheel's UNMODIFIED `moe_gemm_mixed_utils.cu` (the kernel
    `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` and its launcher) together with the
    tiny entry point `tools/golden/fi_sm90_interleave_binding.cu` (the per-expert loop of
    flashinfer's own binding, quant_type=1 "fp4").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _sm90_interleave_spec():
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.core import gen_jit_spec, sm90a_nvcc_flags

    csrc = jit_env.FLASHINFER_CSRC_DIR
    return gen_jit_spec(
        "mxconvert_golden_sm90_fp4_interleave",
        [
            HERE / "fi_sm90_interleave_binding.cu",
            csrc / "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu",
        ],
        # the flags of gen_cutlass_fused_moe_sm90_module (none of them is read by this kernel file)
        extra_cuda_cflags=sm90a_nvcc_flags + ["-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP4"],
        extra_include_paths=[
            csrc,
            csrc / "nv_internal",
            csrc / "nv_internal" / "include",
            csrc / "nv_internal/tensorrt_llm/kernels/cutlass_kernels",
        ],
    )


def _fp4_quant_spec():
    from flashinfer.jit.fp4_quantization import gen_fp4_quantization_sm90_module

    return gen_fp4_quantization_sm90_module()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=Path, default=Path(".whl/fi_inputs.safetensors"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/fi_out")))
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"argv": sys.argv, "python": sys.version, "host": platform.node(), "steps": []}

    def step(name, fn):
        t0 = time.time()
        try:
            r = fn()
            report["steps"].append({"step": name, "ok": True, "seconds": round(time.time() - t0, 1)})
            print(f"[ok {time.time() - t0:6.1f}s] {name}", flush=True)
            return r
        except Exception as e:  # noqa: BLE001
            report["steps"].append(
                {
                    "step": name,
                    "ok": False,
                    "seconds": round(time.time() - t0, 1),
                    "error": f"{type(e).__name__}: {e}"[:4000],
                    "traceback": traceback.format_exc()[-6000:],
                }
            )
            print(f"[FAIL] {name}: {type(e).__name__}: {e}"[:3000], flush=True)
            return None

    def save_report():
        (args.out / "fi_report.json").write_text(json.dumps(report, indent=1, default=str))

    import flashinfer
    import torch

    report["torch"] = torch.__version__
    report["torch_cuda"] = torch.version.cuda
    report["flashinfer"] = flashinfer.__version__
    try:
        report["flashinfer_file"] = flashinfer.__file__
        from flashinfer import _build_meta  # type: ignore

        report["flashinfer_git_commit"] = getattr(_build_meta, "__git_commit__", None)
    except Exception:  # noqa: BLE001
        pass
    try:
        report["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout[-200:]
    except Exception as e:  # noqa: BLE001
        report["nvcc"] = repr(e)
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
        report["capability"] = list(torch.cuda.get_device_capability(0))

    # 1. builds (ninja, FlashInfer JIT)
    sm90 = step(
        "build sm90 fp4 weight interleave (wheel's moe_gemm_mixed_utils.cu + entry point)",
        lambda: (
            _sm90_interleave_spec().build(verbose=False)
            if args.build_only
            else _sm90_interleave_spec().build_and_load()
        ),
    )
    step(
        "build fp4_quantization_90 (FlashInfer's own JIT module for block_scale_interleave)",
        lambda: _fp4_quant_spec().build(verbose=False) if args.build_only else _fp4_quant_spec().build_and_load(),
    )
    save_report()
    if args.build_only:
        return

    # 2. run
    from safetensors.torch import load_file, save_file

    inputs = load_file(str(args.inputs))
    outs: dict = {}

    def run_sm90():
        for k, x in sorted(inputs.items()):
            if k.startswith("sm90w."):
                xc = x.cuda().contiguous()
                y = torch.empty_like(xc)
                sm90.interleave_fp4_moe_weights(xc, y)
                torch.cuda.synchronize()
                outs[k] = y.cpu()

    def run_bsi():
        from flashinfer import block_scale_interleave

        for k, x in sorted(inputs.items()):
            if k.startswith("bsi."):
                outs[k] = block_scale_interleave(x.cuda().contiguous()).cpu()
        torch.cuda.synchronize()

    if sm90 is not None:
        step("run sm90 fp4 weight interleave", run_sm90)
    step("run flashinfer.block_scale_interleave", run_bsi)

    # 3. write: bundle into files of at most ~12 MB
    files, cur, size = [], {}, 0
    for k in sorted(outs):
        n = outs[k].numel() * outs[k].element_size()
        if cur and size + n > 12_000_000:
            files.append(cur)
            cur, size = {}, 0
        cur[k] = outs[k].contiguous()
        size += n
    if cur:
        files.append(cur)
    for i, f in enumerate(files):
        save_file(f, str(args.out / f"fi_out_{i}.safetensors"))
    report["outputs"] = {f"fi_out_{i}.safetensors": sorted(f) for i, f in enumerate(files)}
    report["missing"] = sorted(k for k in inputs if k not in outs)
    save_report()
    print(json.dumps({"outputs": {k: len(v) for k, v in report["outputs"].items()}, "missing": report["missing"]}))


if __name__ == "__main__":
    main()
