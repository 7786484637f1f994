#!/usr/bin/env python3
"""Record what SGLang 0.5.23's path A hands FlashInfer's SM90 fp4 weight interleave (CPU, .venv-sglang).

For FLASHINFER_CUTLASS_MXFP4_BF16 (`--moe-runner-backend flashinfer_mxfp4` on SM90), SGLang's
`Mxfp4MoEMethod._process_weights_for_sm90_cutlass` (layers/quantization/mxfp4.py) calls
`flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")` on the padded
[up; gate] w13 and the padded w2, a CUDA-only op. This script runs SGLang's own loading and
post-processing of examples/tiny-gpt-oss (tools/golden/sglang_mxfp4_cutlass.py) with the recording
stand-in of tests_vllm/harness_sm90.py (`Sm90Interleave("record")`, same key scheme
`sm90w.<shape>.<sha256>`) for TP 1 and TP 2 ranks 0 and 1, both MoE layers, and for the tool's two
random-checkpoint cases (`CASES`), and writes every input
to OUT/sglang_sm90_inputs.safetensors: the input of tools/gpu_check/sm90_interleave_device.py on the
GPU machine (the same kernel run as vLLM's, tests_vllm/data/sm90_interleave/README.md).

Inputs that tests_vllm/data/sm90_interleave/fi_sm90_outputs.safetensors already holds are listed
(they need no GPU run); the SM120 path has no CUDA-only op left once its scale swizzle is stood in
by FlashInfer's pure-torch 128x4 swizzle (see sglang_mxfp4_cutlass.py), so nothing else is recorded.

    .venv-sglang/bin/python tools/gpu_check/sglang_sm90_record.py [OUT]   # OUT default .gpucheck
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "golden"))

#: (TP size, rank) of every case whose path A is recorded (the example goldens' cases).
PARALLEL = ((1, 0), (2, 0), (2, 1))


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / ".gpucheck"
    import sglang_mxfp4_cutlass as cutlass
    from safetensors import safe_open
    from safetensors.torch import save_file
    from sglang_common import pinned_flashinfer, sglang_wheel, wheel_reader

    pinned_flashinfer()
    S = cutlass.sm90_interleave_module()
    recorder = S.Sm90Interleave("record")
    fns = cutlass.compile_cutlass(wheel_reader(sglang_wheel()), cutlass.cutlass_namespace("cutlass_sm90", recorder))
    config = cutlass.example_config()
    for tp, rank in PARALLEL:
        for layer in range(config["num_hidden_layers"]):
            cutlass.rank_layer(fns, "cutlass_sm90", config, layer, tp, rank)
    for case in range(len(cutlass.CASES)):  # the random-checkpoint goldens
        cutlass.random_case(fns, "cutlass_sm90", case)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "sglang_sm90_inputs.safetensors"
    save_file(recorder.inputs, str(target))
    with safe_open(str(S.RESULTS_FILE), "pt") as f:
        have = set(f.keys())
    for key in sorted(recorder.inputs):
        print(key, "(already in tests_vllm/data/sm90_interleave)" if key in have else "(new)")
    new = sum(key not in have for key in recorder.inputs)
    print(f"{len(recorder.inputs)} inputs ({new} not yet run on a GPU) -> {target}")


if __name__ == "__main__":
    main()
