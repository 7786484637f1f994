#!/usr/bin/env python3
"""Record what a vLLM release's path A hands FlashInfer's SM90 fp4 weight interleave (CPU).

For FLASHINFER_CUTLASS_MXFP4_BF16 on SM90, tests_vllm/test_sm90.py's path A (vLLM's own GPT-OSS
loading of examples/tiny-gpt-oss and its `process_weights_after_loading`) calls
`flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm`, a CUDA-only op. This script runs
that path A with the recording stand-in (tests_vllm/harness_sm90.py) for TP=1 and TP=2 ranks 0 and 1
and writes every input it received, under its replay key, to OUT/fi_sm90_inputs.safetensors: the
input of tools/gpu_check/sm90_interleave_device.py on the GPU machine.

In a thin release venv (tools/vllm_env/release_env.sh) it runs that release's path A the way
tests_vllm/test_release_rows_backends.py does (harness_rows.path_a under `flashinfer_ops()`), for
the rows whose `cutlass_sm90_layout` is "sm90-interleave-0.6" (vLLM 0.22.0-0.28.0, FlashInfer
0.6.11.post2-0.6.16.post3). An OUT/fi_sm90_inputs.safetensors already there is kept and added to,
so one folder collects the inputs of several releases (keys are input digests: equal inputs merge).

    .venv-vllm/bin/python tools/gpu_check/sm90_interleave_record.py OUT
    for v in 0.22.0 0.26 0.28.0; do .venv-vllm-$v/bin/python tools/gpu_check/sm90_interleave_record.py OUT; done
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(REPO / "tests_vllm"))


def main() -> None:
    out = Path(sys.argv[1])
    import harness as H
    import harness_rows as R
    import harness_sm90 as S
    from safetensors.torch import load_file, save_file
    from vllm.utils.import_utils import import_triton_kernels

    recorder = S.Sm90Interleave("record")
    if R.RELEASE in (None, "0.33.0"):
        import_triton_kernels()
        for tp, rank in S.PARALLEL.values():
            H.reset_opt_flags()
            S.path_a(H.Target(S.BACKEND, S.HOPPER, tp, rank), recorder)
    else:  # as tests_vllm/conftest.py prepares a thin venv: the CPU platform, then vLLM's triton_kernels
        R.use_cpu_platform()
        import_triton_kernels()
        for tp, rank in S.PARALLEL.values():
            H.reset_opt_flags()
            with R.flashinfer_ops(), S.sm90_interleave(recorder):
                R.path_a(H.Target(S.BACKEND, S.HOPPER, tp, rank))
    out.mkdir(parents=True, exist_ok=True)
    target = out / "fi_sm90_inputs.safetensors"
    before = load_file(str(target)) if target.exists() else {}
    print(f"vLLM {R.RELEASE or '0.33.0'}: {len(recorder.inputs)} inputs, {len(set(recorder.inputs) - set(before))} new")
    recorder.inputs.update(before)
    save_file(recorder.inputs, str(target))
    for key in sorted(recorder.inputs):
        print(key)
    print(f"{len(recorder.inputs)} inputs -> {out / 'fi_sm90_inputs.safetensors'}")


if __name__ == "__main__":
    main()
