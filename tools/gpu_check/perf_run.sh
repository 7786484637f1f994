#!/bin/bash
# The engine figures on the GPU machine's host (bench/README.md). Run from the folder that holds
# after/ (this worktree's mxconvert + bench) and before/ (the old mxconvert package):
#   bash after/tools/gpu_check/perf_run.sh OUTDIR
# Uses only torch, safetensors and numpy (no CLI dependencies needed).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
HERE=$(pwd)
B="python3 $HERE/after/bench/bench_engine.py --tmp /tmp"
nproc; python3 -c "import torch, os; print(torch.__version__, torch.cuda.get_device_name(0), len(os.sched_getaffinity(0)))"
for i in 1 2 3; do /usr/bin/time -f "import torch %e s" python3 -c "import torch"; done 2>&1 | tee "$OUT/import-torch.txt"
# 1. convert + verify, before and after, gpt-oss-20b shape (4 layers x 32 experts)
timeout 300 $B --layers 4 --experts 32 --profiles h100,b200,mi355x --before "$HERE/before" \
  --json-out "$OUT/convert-20b.json" 2>&1 | tee "$OUT/convert-20b.txt"
# 2. load_artifact(device=cuda) vs load_file, before and after
timeout 120 $B --layers 1 --experts 32 --no-convert --load --device cuda --profiles h100 --before "$HERE/before" \
  --json-out "$OUT/load.json" 2>&1 | tee "$OUT/load.txt"
# 3. peak RSS, gpt-oss-120b shape: after 1 vs 4 layers
timeout 240 $B --experts 128 --rss --rss-layers 1,4 --no-convert --profiles h100,b200 \
  --json-out "$OUT/rss-after.json" 2>&1 | tee "$OUT/rss-after.txt"
