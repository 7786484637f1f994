#!/bin/bash
# `--device cuda` on the GPU machine (issue #11 target 8), from the root of a copy of this checkout:
#   bash tools/gpu_check/device_check.sh OUTDIR [BIG_EXPERTS] [NVFP4_EXPERTS]
# 1. device_convert_check.py: every backend/profile/revision/TP target of every example plus a
#    synthetic gpt-oss-size layer (and an NVFP4 layer of Qwen3-30B-A3B size), converted on the host
#    and on CUDA, every tensor compared byte for byte, the CUDA artifact verified on CUDA;
# 2. the CLI itself: `mxconvert convert/verify --device cuda` on an example.
# Uses python3's torch, safetensors and numpy (typer/rich only for step 2).
set -u
OUT=${1:-out}
BIG=${2:-32}
NV=${3:-32}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, os; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'cores', len(os.sched_getaffinity(0)))" | tee -a "$OUT/device.txt"
timeout 480 python3 tools/gpu_check/device_convert_check.py --device cuda --big-experts "$BIG" --nvfp4-big "$NV" \
  --tmp /tmp --json-out "$OUT/device-check.json" > "$OUT/device-check.txt" 2>&1
echo "device_convert_check exit $?" | tee -a "$OUT/device-check.txt"
grep -v '^OK ' "$OUT/device-check.txt" | tail -20
rm -rf /tmp/cli-cpu /tmp/cli-cuda
{
  python3 -m mxconvert convert examples/tiny-gpt-oss --profile h100 -o /tmp/cli-cpu --json > /dev/null && \
  python3 -m mxconvert convert examples/tiny-gpt-oss --profile h100 -o /tmp/cli-cuda --device cuda --json > /dev/null && \
  diff -r /tmp/cli-cpu /tmp/cli-cuda && echo "CLI convert --device cuda: same files as the CPU" && \
  python3 -m mxconvert verify /tmp/cli-cuda --device cuda && echo "CLI verify --device cuda: exit 0"
  python3 -m mxconvert convert examples/tiny-gpt-oss --profile h100 -o /tmp/cli-bad --device cuda:7
  echo "CLI convert --device cuda:7 (absent): exit $? (expected 2)"
} 2>&1 | tee "$OUT/cli.txt"
