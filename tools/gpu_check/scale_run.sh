#!/bin/bash
# Issue #11 targets 7 and 8 on the GPU machine's host, from the root of a copy of this checkout:
#   bash tools/gpu_check/scale_run.sh OUTDIR [LAYERS]
# A synthetic gpt-oss-120b-shaped checkpoint (128 experts, H = I = 2880, LAYERS layers, ~1.7 GB
# each), converted for h100 and b200 with TP=1 and TP=4 on the CPU (all cores) and with
# --device cuda; `cp -r` + `sync` of it beside (bench/bench_scale.py prints the table).
set -u
OUT=${1:-out}
LAYERS=${2:-12}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{ nproc; free -g | head -2; df -h /tmp | tail -1; nvidia-smi --query-gpu=name --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"; } 2>&1 | tee "$OUT/host.txt"
timeout 470 python3 bench/bench_scale.py --layers "$LAYERS" --experts 128 --profiles h100,b200 --tps 1,4 \
  --devices cpu,cuda --tmp /tmp --json-out "$OUT/scale.json" 2>&1 | tee "$OUT/scale.txt"
