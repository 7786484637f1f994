#!/bin/bash
# Session 5 "layout work" figures on the GPU machine's host (bench/README.md, "Session 5: layout
# work"), before/after in one call. Run from the folder that holds after/ (this branch's mxconvert,
# bench, tools) and before/ (main 540de15's mxconvert and bench):
#   bash after/tools/gpu_check/session5_layoutspeed_run.sh "$OUT"
# Layout work alone (bench_forward.py: every tensor's forward and inverse, one thread, thread CPU
# time), 4 and 32 experts, H = I = 2880. Uses only torch and numpy (no vLLM: the host has no
# network; bench_vs_vllm.py runs where .venv-vllm is). Each step has its own timeout.
set -u
OUT=${1:-out}
mkdir -p "$OUT"
HERE=$(pwd)
nproc; python3 -c "import torch, numpy, os; print(torch.__version__, numpy.__version__, len(os.sched_getaffinity(0)))"
for experts in 4 32; do
  for side in before after; do
    timeout 240 python3 "$HERE/$side/bench/bench_forward.py" --experts "$experts" --repeat 3 --clock thread \
      2>&1 | tee "$OUT/forward-$side-e$experts.txt"
  done
done
