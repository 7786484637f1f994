#!/usr/bin/env bash
# GPU run for tests_vllm/data/sm90_interleave/: FlashInfer 0.7.2.post1's SM90 fp4 weight interleave of
# the inputs vLLM 0.33.0's path A hands it (FLASHINFER_CUTLASS_MXFP4_BF16, examples/tiny-gpt-oss,
# TP=1 and TP=2 ranks 0/1). The lent GPU machine has torch + CUDA + nvcc but no FlashInfer and no
# network: everything comes in the carried folder D (default .gpucheck/sm90eq):
#   D/fi_sm90_inputs.safetensors   tools/gpu_check/sm90_interleave_record.py D   (.venv-vllm, CPU)
#   D/fi_trim.tar.xz               flashinfer_python-0.7.2.post1 wheel, trimmed to its Python files +
#                                  data/{include,spdlog,csrc/*.h,csrc/nv_internal} (what this JIT build reads)
#   D/wheels/*.whl                 apache-tvm-ffi (cp312) ninja nvidia-ml-py requests urllib3 idna certifi
#                                  charset-normalizer packaging tqdm einops click tabulate
#                                  (pip download --no-deps --only-binary=:all: --python-version 3.12)
#   D/sm90_interleave_device.py    this folder's script (the run copies the main tree, not a worktree)
# Device call: run(command="bash .gpucheck/sm90eq/sm90_interleave_gpu.sh", carry=[".gpucheck/sm90eq"])
# (the script is copied into D too). Outputs under $OUT: fi_sm90_outputs.safetensors, fi_sm90_report.json.
set -euo pipefail
D=${1:-.gpucheck/sm90eq}
OUT=${OUT:-/tmp/sm90eq_out}
SITE=/tmp/sm90eq_site
mkdir -p "$SITE" "$OUT"
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$D"/wheels/*.whl
python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$D/fi_trim.tar.xz" "$SITE"
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" FLASHINFER_CUDA_ARCH_LIST=9.0a
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
python3 "$D/sm90_interleave_device.py" --inputs "$D/fi_sm90_inputs.safetensors" --out "$OUT" \
    --golden-root tools/golden 2>&1 | tail -40
