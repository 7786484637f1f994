#!/bin/bash
# Session 4 final figures on the GPU host. PART=1: start-up, forward path, convert/verify; PART=2: peak RSS.
set -u
OUT=${1:-out}; PART=${2:-1}; mkdir -p "$OUT"
cd "$(dirname "$0")"; HERE=$(pwd)
nproc; python3 -c "import torch, os; print(torch.__version__, len(os.sched_getaffinity(0)))"
if [ "$PART" = 1 ]; then
  pip install -q --no-index --no-deps --break-system-packages wheels/*.whl 2>&1 | tail -2
  python3 -c "import typer, rich; print('typer', typer.__version__)"
  timeout 100 python3 after/bench/bench_startup.py --repeat 5 --before before --json-out "$OUT/startup.json" 2>&1 | tee "$OUT/startup.txt"
  for i in 1 2; do /usr/bin/time -f "import torch %e s" python3 -c "import torch"; done 2>&1 | tee "$OUT/import-torch.txt"
  mkdir -p before/bench && cp after/bench/bench_forward.py before/bench/
  for side in before after; do
    timeout 100 python3 $side/bench/bench_forward.py --experts 16 --repeat 2 2>&1 | tee "$OUT/forward-$side.txt"
  done
  timeout 300 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 \
    --profiles h100,b200,mi355x --before "$HERE/before" --json-out "$OUT/convert-20b.json" 2>&1 | tee "$OUT/convert-20b.txt"
else
  timeout 500 python3 after/bench/bench_engine.py --tmp /tmp --experts 128 --rss --rss-layers 1,4 \
    --no-convert --profiles h100,b200 --json-out "$OUT/rss-after.json" 2>&1 | tee "$OUT/rss-after.txt"
fi
