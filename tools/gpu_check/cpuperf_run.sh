#!/bin/bash
# verify vs convert and peak RSS on the GPU machine's host, before/after (bench/README.md,
# "verify without the second pass"). Run from the folder that holds after/ (this worktree's
# mxconvert + bench) and before/ (main's mxconvert package):
#   bash after/tools/gpu_check/cpuperf_run.sh OUTDIR
set -u
OUT=${1:-out}
mkdir -p "$OUT"
HERE=$(pwd)
B="python3 $HERE/after/bench/bench_engine.py --tmp /tmp"
nproc; python3 -c "import torch, os; print(torch.__version__, torch.cuda.get_device_name(0), len(os.sched_getaffinity(0)))"
# 1. convert + verify, before and after, gpt-oss-20b shape (4 layers x 32 experts)
timeout 130 $B --layers 4 --experts 32 --profiles h100,b200 --before "$HERE/before" \
  --json-out "$OUT/convert-20b.json" 2>&1 | tee "$OUT/convert-20b.txt"
# 2. peak RSS and verify/convert, gpt-oss-120b shape, 1 layer, before and after
timeout 90 $B --experts 128 --rss --rss-layers 1 --no-convert --profiles h100,b200 --before "$HERE/before" \
  --json-out "$OUT/rss-120b.json" 2>&1 | tee "$OUT/rss-120b.txt"
