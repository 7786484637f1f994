#!/usr/bin/env python3
"""Record what vLLM 0.33.0's path A hands FlashInfer's SM90 fp4 weight interleave (CPU, .venv-vllm).

For FLASHINFER_CUTLASS_MXFP4_BF16 on SM90, tests_vllm/test_sm90.py's path A (vLLM's own GPT-OSS
loading of examples/tiny-gpt-oss and its `process_weights_after_loading`) calls
`flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm`, a CUDA-only op. This script runs
that path A with the recording stand-in (tests_vllm/harness_sm90.py) for TP=1 and TP=2 ranks 0 and 1
and writes every input it received, under its replay key, to OUT/fi_sm90_inputs.safetensors: the
input of tools/gpu_check/sm90_interleave_device.py on the GPU machine.

    .venv-vllm/bin/python tools/gpu_check/sm90_interleave_record.py OUT
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
    import harness_sm90 as S
    from safetensors.torch import save_file
    from vllm.utils.import_utils import import_triton_kernels

    import_triton_kernels()
    recorder = S.Sm90Interleave("record")
    for tp, rank in S.PARALLEL.values():
        H.reset_opt_flags()
        S.path_a(H.Target(S.BACKEND, S.HOPPER, tp, rank), recorder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(recorder.inputs, str(out / "fi_sm90_inputs.safetensors"))
    for key in sorted(recorder.inputs):
        print(key)
    print(f"{len(recorder.inputs)} inputs -> {out / 'fi_sm90_inputs.safetensors'}")


if __name__ == "__main__":
    main()
