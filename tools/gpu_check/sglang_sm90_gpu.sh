#!/usr/bin/env bash
# GPU run for tests_sglang/data/sm90_interleave/: FlashInfer 0.7.2's (SGLang 0.5.23's pin) SM90 fp4 weight
# interleave of the inputs SGLang 0.5.23's path A hands it (FLASHINFER_CUTLASS_MXFP4_BF16,
# `_process_weights_for_sm90_cutlass`: examples/tiny-gpt-oss at TP=1 and TP=2 ranks 0/1, plus the two
# random-checkpoint cases of tools/golden/sglang_mxfp4_cutlass.py). The same kernel run as vLLM's
# (tools/gpu_check/sm90_interleave_gpu.sh, tests_vllm/data/sm90_interleave/README.md), with SGLang's pin:
# the kernel source (moe_gemm_mixed_utils.cu/.h), the binding and nv_internal/ are byte-identical in the
# 0.7.2 and 0.7.2.post1 wheels. The lent GPU machine has torch + CUDA + nvcc but no FlashInfer and no
# network: everything comes in the carried folder D (default .gpucheck/sglang_sm90):
#   D/sglang_sm90_inputs.safetensors  .venv-sglang/bin/python tools/gpu_check/sglang_sm90_record.py D
#   D/fi_trim.tar.xz                  flashinfer_python-0.7.2 wheel, trimmed to its Python files (+ .json,
#                                     .txt) + data/{include,spdlog,csrc/*.h,csrc/nv_internal} + METADATA
#   D/wheels/*.whl                    apache-tvm-ffi (cp312) ninja nvidia-ml-py requests urllib3 idna certifi
#                                     charset-normalizer packaging tqdm einops click tabulate
#   D/sm90_interleave_device.py, D/sglang_sm90_gpu.sh   copies of tools/gpu_check's
# Device call: run(command="bash .gpucheck/sglang_sm90/sglang_sm90_gpu.sh", carry=[".gpucheck/sglang_sm90"])
# Outputs under $OUT: fi_sm90_outputs.safetensors, fi_sm90_report.json (tools/golden/ of the tree is the
# golden root: device_flashinfer.py's build spec, the binding, device_results.json's probes).
set -euo pipefail
D=${1:-.gpucheck/sglang_sm90}
OUT=${OUT:-/tmp/sglang_sm90_out}
SITE=/tmp/sglang_sm90_site
mkdir -p "$SITE" "$OUT"
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$D"/wheels/*.whl
python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$D/fi_trim.tar.xz" "$SITE"
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" FLASHINFER_CUDA_ARCH_LIST=9.0a
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
python3 "$D/sm90_interleave_device.py" --inputs "$D/sglang_sm90_inputs.safetensors" --out "$OUT" \
    --golden-root tools/golden 2>&1 | tail -40
