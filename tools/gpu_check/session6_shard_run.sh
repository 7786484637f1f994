#!/bin/bash
# Copy of .gpucheck/final6/shard.sh (same folder layout as session6_final_run.sh); SHARDS="0 1073741824" for both sizes
# convert + verify before/after at the default shard size and at 1 GiB (2 files of the 1.7 GB rank)
OUT=$1; cd "$(dirname "$0")"; HERE=$(pwd)
pip install -q --no-index --no-deps --break-system-packages wheels/*.whl 2>&1 | tail -1
for shard in ${SHARDS:-1073741824}; do
  timeout 280 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 --profiles h100,b200,mi355x \
    --repeat 2 --before "$HERE/before" --max-shard-bytes $shard --json-out "$OUT/engine-20b-shard$shard.json" 2>&1 | tee "$OUT/engine-20b-shard$shard.txt"
done
