#!/bin/bash
# Session 4 "forward path" figures on the GPU machine's host (bench/README.md, "Session 4: forward
# path"), before/after in one call. Run from the folder that holds after/ (this branch's mxconvert,
# bench, tools) and before/ (main's mxconvert package before the branch):
#   bash after/tools/gpu_check/fastmove_run.sh "$OUT"
# Uses only torch, safetensors and numpy (no vLLM: the host has no network; bench_vs_vllm.py runs
# where .venv-vllm is). Every step has its own timeout so that one slow step cannot eat the others.
set -u
OUT=${1:-out}
mkdir -p "$OUT"
HERE=$(pwd)
nproc; python3 -c "import torch, os; print(torch.__version__, len(os.sched_getaffinity(0)))"
for i in 1 2; do /usr/bin/time -f "import torch %e s" python3 -c "import torch"; done 2>&1 | tee "$OUT/import-torch.txt"
# 1. layout work alone, per tensor, forward and inverse, one thread, 16 experts (in process, no I/O): before, after
mkdir -p "$HERE/before/bench" && cp "$HERE/after/bench/bench_forward.py" "$HERE/before/bench/"
for side in before after; do
  timeout 150 python3 "$HERE/$side/bench/bench_forward.py" --experts 16 --repeat 2 \
    2>&1 | tee "$OUT/forward-$side.txt"
done
# 2. convert + verify (wall, peak RSS), before and after, gpt-oss-20b shape (4 layers x 32 experts)
timeout 330 python3 "$HERE/after/bench/bench_engine.py" --tmp /tmp --layers 4 --experts 32 \
  --profiles h100,b200,mi355x --before "$HERE/before" --json-out "$OUT/convert-20b.json" 2>&1 | tee "$OUT/convert-20b.txt"
# 3. peak RSS, gpt-oss-120b shape: after, 1 vs 4 layers (plans now also hold word indices)
timeout 240 python3 "$HERE/after/bench/bench_engine.py" --tmp /tmp --experts 128 --rss --rss-layers 1,4 \
  --no-convert --profiles h100,b200 --json-out "$OUT/rss-after.json" 2>&1 | tee "$OUT/rss-after.txt"
