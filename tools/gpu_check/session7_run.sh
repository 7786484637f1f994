#!/bin/bash
# Session 7 probes on the GPU machine's 16-core host (issue 11, targets 1 and 2): what bounds a
# convert of the 20b-shaped 4-layer checkpoint (one 1.7 GB rank file), through the CLI. Run it from
# a folder holding copies of this script, host_probe.py, convert_timeline.py, verify_timeline.py and
# _timeline.py (tools/gpu_check/), with after/ = `git archive <main> mxconvert bench examples`,
# before/ = the same of an older commit (PART 1 only) and wheels/ = typer, rich, click, pydantic
# and their dependencies (the host's python3 has torch, numpy and safetensors only).
#   PART=1: machine facts, numpy import, b200 / h100 convert timelines, before/after engine run
#   PART=2: convert timelines at --jobs 16, 8, 6 and the --jobs sweep (is convert core-bound?)
#   PART=3: h100 convert and verify timelines, verify against its convert (3 repeats)
set -u
OUT=${1:-out}; PART=${2:-1}; mkdir -p "$OUT"
cd "$(dirname "$0")"; HERE=$(pwd)
pip install -q --no-index --no-deps --break-system-packages wheels/*.whl 2>&1 | grep -v WARNING | tail -2
[ -f /tmp/src20/model-00001-of-00005.safetensors ] || python3 after/bench/synthetic.py /tmp/src20 --layers 4 --experts 32 > /dev/null
cat /tmp/src20/* > /dev/null
if [ "$PART" = 1 ]; then
  (lscpu | grep -E '^CPU\(s\)|Thread|Core|Socket|Model name|NUMA node\(s\)'; grep -o -w -m1 sha_ni /proc/cpuinfo) 2>&1 | tee "$OUT/machine.txt"
  for v in "" "OPENBLAS_NUM_THREADS=1"; do for i in 1 2 3; do env $v python3 -c "import time; t=time.perf_counter(); import numpy; print('$v numpy import', round(time.perf_counter()-t,3))"; done; done 2>&1 | tee -a "$OUT/machine.txt"
  python3 host_probe.py after /tmp/src20 2>&1 | tee "$OUT/host-probe.txt"
  for p in b200 h100; do for v in before after; do for i in 1 2; do
    python3 convert_timeline.py $v /tmp/src20 /tmp/tl-$p-$v $p > "$OUT/timeline-$p-$v.txt" 2>&1
  done; done; done
  rm -rf /tmp/tl-*
  timeout 400 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 --repeat 2 \
    --profiles h100,b200,mi355x --before "$HERE/before" --json-out "$OUT/engine-20b.json" 2>&1 | tee "$OUT/engine-20b.txt"
elif [ "$PART" = 2 ]; then
  for j in 16 8 6; do for i in 1 2; do
    python3 convert_timeline.py after /tmp/src20 /tmp/tl-b200 b200 --jobs $j > "$OUT/tl-b200-j$j.txt" 2>&1
  done; done
  rm -rf /tmp/tl-*
  timeout 400 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 --repeat 2 --no-verify \
    --profiles b200,h100 --jobs 16,12,10,8,6,4 2>&1 | tee "$OUT/jobs.txt"
else
  for i in 1 2; do
    python3 convert_timeline.py after /tmp/src20 /tmp/tl-h100 h100 > "$OUT/timeline-convert-h100.txt" 2>&1
    python3 verify_timeline.py after /tmp/tl-h100 > "$OUT/timeline-verify-h100.txt" 2>&1
  done
  rm -rf /tmp/tl-h100
  timeout 420 python3 after/bench/bench_engine.py --tmp /tmp --layers 4 --experts 32 --repeat 3 \
    --profiles h100,b200 --json-out "$OUT/engine-20b.json" 2>&1 | tee "$OUT/engine-20b.txt"
fi
