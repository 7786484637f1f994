#!/bin/bash
# Session 5, issue 11 target 2 (verify <= 1.0x its convert, same memory bound) on the GPU machine's
# 16-core host. The GPU is not used. Two device calls (each well under 10 minutes):
#   PART=1: bench_engine, gpt-oss-20b shape (4 layers x 32 experts), h100/b200/mi355x, before and
#           after, wall and child CPU seconds; plus one sha256 stream's speed on this host
#   PART=2: peak RSS of convert and verify, gpt-oss-120b shape (128 experts), 1 vs 4 layers
#
# Set up from the repository root of the merged main (`before` = 540de15, the start of session 5):
#   D=.gpucheck/verifyfast; rm -rf $D; mkdir -p $D/after $D/before
#   cp -r mxconvert bench $D/after/ && cp tools/gpu_check/session5_verify_run.sh $D/
#   git archive 540de15 mxconvert | tar -x -C $D/before
# then run (carry [".gpucheck/verifyfast"]):
#   bash .gpucheck/verifyfast/session5_verify_run.sh $OUT 1
#   bash .gpucheck/verifyfast/session5_verify_run.sh $OUT 2
set -u
OUT=${1:-out}; PART=${2:-1}; mkdir -p "$OUT"
cd "$(dirname "$0")"; HERE=$(pwd)
nproc; python3 -c "import torch, os; print(torch.__version__, len(os.sched_getaffinity(0)))"
if [ "$PART" = 1 ]; then
  python3 - <<'PY' 2>&1 | tee "$OUT/sha256-speed.txt"
import hashlib, time
data = bytes(512 << 20)
best = min((lambda t: (hashlib.sha256(data).digest(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
print(f"one sha256 stream: {len(data) / best / 1e9:.2f} GB/s")
PY
  timeout 500 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 \
    --profiles h100,b200,mi355x --before "$HERE/before" --json-out "$OUT/engine-20b.json" 2>&1 | tee "$OUT/engine-20b.txt"
else
  timeout 550 python3 after/bench/bench_engine.py --tmp /tmp --experts 128 --rss --rss-layers 1,4 \
    --no-convert --profiles h100,b200 --json-out "$OUT/rss-after.json" 2>&1 | tee "$OUT/rss-after.txt"
fi
