#!/bin/bash
# Session 5 figures on the GPU machine's 16-core host (issue 11, targets 1, 2, 3, 6), before and
# after in the same call. The GPU is not used. Layout of the folder this script sits in:
#   after/  = `git archive <merged main> mxconvert bench tools examples`, before/ = `git archive 540de15
#   mxconvert bench examples` (each side runs its own bench_forward.py; bench_engine.py and
#   bench_startup.py of `after` run both packages), wheels/ = typer, rich, click, pydantic and
#   their dependencies (the host's python3 has torch, numpy and safetensors but not these).
#   PART=1: start-up, import torch, one sha256 stream, bench_forward, convert + verify (20b shape)
#   PART=2: peak RSS of convert and verify, gpt-oss-120b shape (128 experts), 1 vs 4 layers
set -u
OUT=${1:-out}; PART=${2:-1}; mkdir -p "$OUT"
cd "$(dirname "$0")"; HERE=$(pwd)
nproc; python3 -c "import torch, numpy, os; print(torch.__version__, numpy.__version__, len(os.sched_getaffinity(0)))"
pip install -q --no-index --no-deps --break-system-packages wheels/*.whl 2>&1 | tail -2
if [ "$PART" = 1 ]; then
  timeout 150 python3 after/bench/bench_startup.py --repeat 5 --bytecode cached --before before \
    --json-out "$OUT/startup.json" 2>&1 | tee "$OUT/startup.txt"
  for i in 1 2; do /usr/bin/time -f "import torch %e s" python3 -c "import torch"; done 2>&1 | tee "$OUT/import-torch.txt"
  python3 -c "
import hashlib, time
data = bytes(512 << 20)
best = min((lambda t: (hashlib.sha256(data).digest(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
print(f'one sha256 stream: {len(data) / best / 1e9:.2f} GB/s')" 2>&1 | tee -a "$OUT/import-torch.txt"
  for side in before after; do
    timeout 100 python3 $side/bench/bench_forward.py --experts 16 --repeat 2 2>&1 | tee "$OUT/forward-$side.txt"
  done
  timeout 330 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 \
    --profiles h100,b200,mi355x --before "$HERE/before" --json-out "$OUT/engine-20b.json" 2>&1 | tee "$OUT/engine-20b.txt"
else
  timeout 550 python3 after/bench/bench_engine.py --tmp /tmp --experts 128 --rss --rss-layers 1,4 \
    --no-convert --profiles h100,b200 --json-out "$OUT/rss-after.json" 2>&1 | tee "$OUT/rss-after.txt"
fi
