#!/bin/bash
# Session 6 figures on the GPU machine's 16-core host (issue 11, targets 1, 2, 3), before and
# after in the same call: the host data path on numpy bit arrays (mxconvert/bits.py), no torch
# import for GPT-OSS convert / verify. The GPU is not used. Layout of the folder this script sits in:
#   after/  = `git archive <main> mxconvert bench examples`, before/ = `git archive c646d95
#   mxconvert bench examples` (bench_engine.py of `after` runs both packages), wheels/ = typer,
#   rich, click, pydantic and their dependencies (the host's python3 has torch, numpy and
#   safetensors but not these).
#   PART=1: import torch, one sha256 stream, torch-free check, convert + verify (20b shape, 4 layers)
#   PART=2: peak RSS of convert and verify, gpt-oss-120b shape (128 experts), 1 vs 4 layers
#   PART=3: convert + verify before/after at each of SHARDS (bytes; 0 = the default 4 GiB, one
#           file for the 1.7 GB rank; default "0 1073741824": 1 GiB gives two files)
set -u
OUT=${1:-out}; PART=${2:-1}; mkdir -p "$OUT"
cd "$(dirname "$0")"; HERE=$(pwd)
nproc; python3 -c "import torch, numpy, os; print(torch.__version__, numpy.__version__, len(os.sched_getaffinity(0)))"
pip install -q --no-index --no-deps --break-system-packages wheels/*.whl 2>&1 | tail -2
if [ "$PART" = 1 ]; then
  for i in 1 2; do /usr/bin/time -f "import torch %e s" python3 -c "import torch"; done 2>&1 | tee "$OUT/import-torch.txt"
  python3 -c "
import hashlib, time
data = bytes(512 << 20)
best = min((lambda t: (hashlib.sha256(data).digest(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
print(f'one sha256 stream: {len(data) / best / 1e9:.2f} GB/s')" 2>&1 | tee -a "$OUT/import-torch.txt"
  (cd after && python3 -c "
import sys
from mxconvert._entry import main
for args in (['convert', 'examples/tiny-gpt-oss', '-p', 'b200', '-o', '/tmp/tf-b200', '--force'],
             ['verify', '/tmp/tf-b200']):
    sys.argv = ['mxconvert', *args]
    try:
        main()
    except SystemExit as exc:
        print('exit', exc.code)
print('torch imported:', 'torch' in sys.modules)") 2>&1 | tail -3 | tee "$OUT/torch-free.txt"
  timeout 420 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 --repeat 2 \
    --profiles h100,b200,mi355x --before "$HERE/before" --json-out "$OUT/engine-20b.json" 2>&1 | tee "$OUT/engine-20b.txt"
elif [ "$PART" = 2 ]; then
  timeout 550 python3 after/bench/bench_engine.py --tmp /tmp --experts 128 --rss --rss-layers 1,4 \
    --no-convert --profiles h100,b200 --json-out "$OUT/rss-after.json" 2>&1 | tee "$OUT/rss-after.txt"
else
  for shard in ${SHARDS:-0 1073741824}; do
    timeout 280 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 --profiles h100,b200,mi355x \
      --repeat 2 --before "$HERE/before" --max-shard-bytes $shard --json-out "$OUT/engine-20b-shard$shard.json" \
      2>&1 | tee "$OUT/engine-20b-shard$shard.txt"
  done
fi
